"""Communication graphs, Metropolis-Hastings mixing weights and the Laplacian spectrum."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

__all__ = [
    "GRAPH_SPECS",
    "DisconnectedGraphError",
    "Graph",
    "build_graph",
    "complete",
    "describe",
    "erdos_renyi",
    "from_edge_file",
    "grid",
    "laplacian_spectrum",
    "metropolis_weights",
    "path",
    "ring",
    "star",
]

GRAPH_SPECS = (
    "ring",
    "path",
    "star",
    "complete",
    "grid",
    "grid:RxC",
    "erdos-renyi",
    "erdos-renyi:P",
    "edges:FILE",
)
DEFAULT_ER_PROB = 0.5
ER_MAX_TRIES = 1000


class DisconnectedGraphError(ValueError):
    """The graph is not connected (decentralized optimization and Theorem 4.1 need it to be)."""


def _agent(i: int) -> str:
    # Agents are 0-based inside, 1-based for humans.
    return f"agent{i + 1}"


@dataclass(frozen=True)
class Graph:
    """Undirected simple graph on agents 0..n-1; edges normalised to sorted (i < j) pairs."""

    n: int
    edges: tuple[tuple[int, int], ...]
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, (int, np.integer)) or self.n < 1:
            raise ValueError(f"n (number of agents) must be a positive integer, got {self.n!r}")
        normalised = []
        for edge in self.edges:
            if len(edge) != 2:
                raise ValueError(f"an edge is a pair of agents, got {edge!r}")
            i, j = (int(v) for v in edge)
            if not (0 <= i < self.n and 0 <= j < self.n):
                raise ValueError(f"edge ({i}, {j}) names an agent outside 0..{self.n - 1}")
            if i == j:
                raise ValueError(f"self-loop at agent {i} ({_agent(i)}): edges join two agents")
            normalised.append((min(i, j), max(i, j)))
        normalised.sort()
        for a, b in itertools.pairwise(normalised):
            if a == b:
                raise ValueError(f"edge {a} ({_agent(a[0])}-{_agent(a[1])}) is listed twice")
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "edges", tuple(normalised))

    @cached_property
    def _adjacency_lists(self) -> tuple[tuple[int, ...], ...]:
        lists: list[list[int]] = [[] for _ in range(self.n)]
        for i, j in self.edges:
            lists[i].append(j)
            lists[j].append(i)
        return tuple(tuple(sorted(a)) for a in lists)

    def _check_agent(self, i: int) -> None:
        if not 0 <= i < self.n:
            raise ValueError(f"agent index must be in 0..{self.n - 1}, got {i}")

    def neighbours(self, i: int) -> tuple[int, ...]:
        """Neighbours of agent i, ascending."""
        self._check_agent(i)
        return self._adjacency_lists[i]

    def degree(self, i: int) -> int:
        """Number of neighbours of agent i."""
        return len(self.neighbours(i))

    @property
    def degrees(self) -> tuple[int, ...]:
        """Degrees of all agents."""
        return tuple(len(a) for a in self._adjacency_lists)

    @property
    def max_degree(self) -> int:
        """Largest degree."""
        return max(self.degrees)

    def adjacency(self) -> np.ndarray:
        """Symmetric 0/1 adjacency matrix A (float64)."""
        a = np.zeros((self.n, self.n), dtype=np.float64)
        for i, j in self.edges:
            a[i, j] = a[j, i] = 1.0
        return a

    def laplacian(self) -> np.ndarray:
        """Combinatorial Laplacian L = D - A (the covariance structure of the zero-sum noise)."""
        a = self.adjacency()
        return np.diag(a.sum(axis=1)) - a

    def components(self) -> list[list[int]]:
        """Connected components, each ascending, ordered by their smallest agent."""
        seen = [False] * self.n
        out: list[list[int]] = []
        for start in range(self.n):
            if seen[start]:
                continue
            seen[start] = True
            stack, comp = [start], []
            while stack:
                i = stack.pop()
                comp.append(i)
                for j in self._adjacency_lists[i]:
                    if not seen[j]:
                        seen[j] = True
                        stack.append(j)
            out.append(sorted(comp))
        return out

    def induced(self, members: Iterable[int]) -> Graph:
        """The graph on `members` alone, relabelled 0..len-1 in their index order."""
        keep = sorted(set(members))
        position = {i: p for p, i in enumerate(keep)}
        return Graph(len(keep), tuple((position[a], position[b]) for a, b in self.edges
                                      if a in position and b in position), name=self.name)

    def is_connected(self) -> bool:
        """True when every agent can reach every other."""
        return len(self.components()) == 1

    def require_connected(self) -> Graph:
        """Return self, or raise DisconnectedGraphError naming the components."""
        comps = self.components()
        if len(comps) > 1:
            shown = "; ".join("{" + ", ".join(_agent(i) for i in c) + "}" for c in comps)
            raise DisconnectedGraphError(
                f"the graph{' ' + repr(self.name) if self.name else ''} on {self.n} agents is not "
                f"connected: {len(comps)} components: {shown}"
            )
        return self


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


def _check_n(n: int, minimum: int, kind: str) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise ValueError(f"a {kind} graph needs an integer n >= {minimum} agents, got {n!r}")


def ring(n: int) -> Graph:
    """Cycle 0-1-...-(n-1)-0 (n >= 3)."""
    _check_n(n, 3, "ring")
    return Graph(n, tuple((i, (i + 1) % n) for i in range(n)), name="ring")


def path(n: int) -> Graph:
    """Path 0-1-...-(n-1)."""
    _check_n(n, 1, "path")
    return Graph(n, tuple((i, i + 1) for i in range(n - 1)), name="path")


def star(n: int) -> Graph:
    """Agent 0 joined to every other agent (n >= 2)."""
    _check_n(n, 2, "star")
    return Graph(n, tuple((0, i) for i in range(1, n)), name="star")


def complete(n: int) -> Graph:
    """Every pair of agents joined."""
    _check_n(n, 1, "complete")
    return Graph(n, tuple((i, j) for i in range(n) for j in range(i + 1, n)), name="complete")


def grid(rows: int, cols: int) -> Graph:
    """rows x cols lattice, agent r * cols + c at row r, column c (4-neighbourhood)."""
    for label, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"grid {label} must be a positive integer, got {v!r}")
    edges = []
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            if c + 1 < cols:
                edges.append((i, i + 1))
            if r + 1 < rows:
                edges.append((i, i + cols))
    return Graph(rows * cols, tuple(edges), name=f"grid {rows}x{cols}")


def _squarest(n: int) -> tuple[int, int]:
    """rows x cols == n with rows <= cols as close as possible (a prime n gives 1 x n)."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def erdos_renyi(n: int, prob: float, seed: int, *, max_tries: int = ER_MAX_TRIES) -> Graph:
    """G(n, prob), redrawn with the same seeded Generator until connected (at most max_tries)."""
    _check_n(n, 1, "erdos-renyi")
    if not 0.0 < prob <= 1.0:
        raise ValueError(f"erdos-renyi edge probability must be in (0, 1], got {prob!r}")
    rng = np.random.default_rng(seed)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    for _ in range(max_tries):
        keep = rng.random(len(pairs)) < prob
        graph = Graph(
            n,
            tuple(p for p, k in zip(pairs, keep, strict=True) if k),
            name=f"erdos-renyi p={prob:g} seed={seed}",
        )
        if graph.is_connected():
            return graph
    raise ValueError(
        f"no connected erdos-renyi graph with n = {n}, p = {prob:g} in {max_tries} draws "
        f"(seed {seed}); raise p"
    )


_AGENT_TOKEN = re.compile(r"^(?:agent)?(\d+)$", re.IGNORECASE)


def from_edge_file(file: str | Path, *, n: int | None = None) -> Graph:
    """Read "i j" lines of 1-based agent numbers or names (agent1 agent2); '#' starts a comment.

    n defaults to the largest agent number that appears. Connectivity is not checked here
    (build_graph does).
    """
    file = Path(file)
    try:
        text = file.read_text()
    except OSError as err:
        raise ValueError(f"cannot read edge file {str(file)!r}: {err}") from err
    edges: list[tuple[int, int]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.replace(",", " ").split()
        if len(tokens) != 2:
            raise ValueError(
                f"{file}:{lineno}: expected two agents like '1 2' or 'agent1 agent2', "
                f"got {raw.strip()!r}"
            )
        ends = []
        for tok in tokens:
            match = _AGENT_TOKEN.match(tok)
            if match is None or int(match.group(1)) < 1:
                raise ValueError(
                    f"{file}:{lineno}: expected a 1-based agent number or name like "
                    f"'agent3', got {tok!r}"
                )
            ends.append(int(match.group(1)) - 1)
        if ends[0] == ends[1]:
            raise ValueError(f"{file}:{lineno}: self-loop {raw.strip()!r}")
        edges.append((min(ends), max(ends)))
    if not edges:
        raise ValueError(f"edge file {str(file)!r} lists no edges")
    largest = max(j for _, j in edges) + 1
    if n is None:
        n = largest
    elif largest > n:
        raise ValueError(
            f"edge file {str(file)!r} names {_agent(largest - 1)} but there are only {n} agents"
        )
    seen: set[tuple[int, int]] = set()
    for e in edges:
        if e in seen:
            raise ValueError(f"edge file {str(file)!r} lists {_agent(e[0])}-{_agent(e[1])} twice")
        seen.add(e)
    return Graph(n, tuple(edges), name=f"edges from {file.name}")


def build_graph(spec: str, n: int, *, seed: int = 0) -> Graph:
    """Graph from a spec: ring, path, star, complete, grid[:RxC], erdos-renyi[:P], edges:FILE.

    "grid" picks the squarest rows x cols with rows * cols == n; "erdos-renyi" uses p = 0.5 and
    ``seed``. The result is always connected, else DisconnectedGraphError.
    """
    spec = spec.strip()
    kind, _, arg = spec.partition(":")
    kind = kind.lower().replace("_", "-")
    builders = {"ring": ring, "path": path, "star": star, "complete": complete}
    if kind in builders:
        if arg:
            raise ValueError(f"graph spec {spec!r}: {kind!r} takes no argument")
        graph = builders[kind](n)
    elif kind == "grid":
        if arg:
            match = re.fullmatch(r"(\d+)[xX](\d+)", arg.strip())
            if match is None:
                raise ValueError(f"graph spec {spec!r}: expected 'grid:RxC' like 'grid:2x3'")
            rows, cols = int(match.group(1)), int(match.group(2))
            if rows * cols != n:
                raise ValueError(
                    f"graph spec {spec!r}: {rows} x {cols} = {rows * cols} agents, but n = {n}"
                )
        else:
            _check_n(n, 1, "grid")
            rows, cols = _squarest(n)
        graph = grid(rows, cols)
    elif kind in ("erdos-renyi", "er"):
        try:
            prob = float(arg) if arg else DEFAULT_ER_PROB
        except ValueError as err:
            raise ValueError(
                f"graph spec {spec!r}: expected 'erdos-renyi:P' with a number P"
            ) from err
        graph = erdos_renyi(n, prob, seed)
    elif kind == "edges":
        if not arg:
            raise ValueError(f"graph spec {spec!r}: expected 'edges:FILE'")
        graph = from_edge_file(arg, n=n)
    else:
        raise ValueError(f"unknown graph spec {spec!r}: expected one of {', '.join(GRAPH_SPECS)}")
    if graph.n != n:  # pragma: no cover - builders honour n
        raise ValueError(f"graph spec {spec!r} built {graph.n} agents, expected {n}")
    return graph.require_connected()


# --------------------------------------------------------------------------------------------
# Mixing weights and spectrum
# --------------------------------------------------------------------------------------------


def graph_over(spec: str, members: Iterable[int], *, agents: int, seed: int = 0) -> Graph:
    """The graph `spec` over `members` on the run's indices 0..agents-1, the other agents
    isolated (seats still empty, or left): the spec's graph for len(members) agents laid on
    the members in index order; an `edges:FILE` graph restricted to the members, its pieces
    joined (consecutive components, ordered by their smallest agent, by an edge between their
    smallest agents). Every member present: build_graph(spec, agents, seed=seed) itself."""
    present = sorted(set(members))
    if not present or any(not 0 <= i < agents for i in present):
        raise ValueError(f"members {present} outside 0..{agents - 1}")
    if len(present) == agents:
        return build_graph(spec, agents, seed=seed)
    if spec.strip().lower().startswith("edges"):
        full = build_graph(spec, agents, seed=seed)
        absent = set(range(agents)) - set(present)
        kept = tuple(e for e in full.edges if not absent.intersection(e))
        pieces = [c for c in Graph(agents, kept).components() if c[0] not in absent]
        joins = tuple((a[0], b[0]) for a, b in itertools.pairwise(pieces))
        return Graph(agents, kept + joins, name=full.name)
    if len(present) == 1:
        return Graph(agents, (), name=spec)
    if len(present) == 2:  # every connected graph on two agents: one edge
        return Graph(agents, ((present[0], present[1]),), name=spec)
    small = build_graph(spec, len(present), seed=seed)
    return Graph(agents, tuple((present[a], present[b]) for a, b in small.edges),
                 name=small.name)


def metropolis_weights(graph: Graph) -> np.ndarray:
    """Metropolis-Hastings W: w_ij = 1 / (1 + max(d_i, d_j)) on edges, w_ii = 1 - sum_j w_ij.

    Symmetric and doubly stochastic; w_ij > 0 exactly on edges; w_ii >= 1/(1 + d_i) > 0.
    """
    deg = graph.degrees
    w = np.zeros((graph.n, graph.n), dtype=np.float64)
    for i, j in graph.edges:
        w[i, j] = w[j, i] = 1.0 / (1.0 + max(deg[i], deg[j]))
    # Sum the off-diagonal row in ascending order for reproducible floats.
    for i in range(graph.n):
        w[i, i] = 1.0 - sum(w[i, j] for j in graph.neighbours(i))
    return w


def laplacian_spectrum(graph: Graph) -> tuple[float, float]:
    """(mu_2, mu_max): second-smallest and largest eigenvalues of L = D - A.

    mu_2 > 0 exactly when the graph is connected.
    """
    if graph.n < 2:
        raise ValueError(
            f"the Laplacian spectrum (mu_2, mu_max) needs n >= 2 agents, got {graph.n}"
        )
    eig = np.linalg.eigvalsh(graph.laplacian())
    return float(eig[1]), float(eig[-1])


def describe(graph: Graph) -> str:
    """Short human summary, e.g. "ring: 5 agents, 5 edges, degree 2..2, connected, mu2=1.382"."""
    deg = graph.degrees
    parts = [f"{graph.n} agents", f"{len(graph.edges)} edges", f"degree {min(deg)}..{max(deg)}"]
    if graph.is_connected():
        parts.append("connected")
        if graph.n >= 2:
            mu2, mu_max = laplacian_spectrum(graph)
            parts.append(f"mu2={mu2:.4g}, mu_max={mu_max:.4g}")
    else:
        parts.append(f"{len(graph.components())} components")
    return f"{graph.name or 'graph'}: " + ", ".join(parts)
