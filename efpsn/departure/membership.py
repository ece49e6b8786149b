"""A party that leaves for good, as pure functions: who is left, how they mix, where the
algorithm restarts. No I/O; the simulator (efpsn/departure/replay.py) and the networked agents
apply the same functions.

The public rule, round by round, when agent d leaves at round T (it sends nothing for round T
or later) and the network re-bases at the agreed round R > T:

- rounds T .. R-1 (the transition): each neighbour j of d mixes with the drop-node weights
  (w_jj += w_jd, d's row and column gone: still symmetric and doubly stochastic, and no other
  agent's weights change, so j needs nobody's agreement) and drops the mask terms it shares
  with d (efpsn/departure/remask.py), so the remaining masks sum to zero exactly every round;
- round R: the remaining graph is joined where it fell apart (consecutive components, ordered
  by their smallest agent, are joined by an edge between their smallest agents: `rejoin_edges`),
  the new edges hold fresh phase I seeds, every remaining agent mixes with the Metropolis
  weights of that graph, and the trackers restart from the current local gradients
  (y_i := g_i, `rebase`): from then on sum_i y_i = sum_i g_i over the remaining agents, so
  gradient tracking's fixed point is the optimum of the remaining parties' objective. DSGD keeps
  no sum and needs nothing.

Agents keep their indices: a departed agent is an isolated vertex of the graph (its own row of
the Metropolis matrix is 1 on the diagonal, and nobody mixes with it).
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from efpsn.topology import Graph, metropolis_weights

if TYPE_CHECKING:  # the coordinator decides departures and imports no torch
    from efpsn.algorithms.base import AgentState

__all__ = [
    "MIN_PARTIES",
    "Departure",
    "Reconfiguration",
    "active_components",
    "drop_node_weights",
    "optimum_of",
    "parse_leave",
    "rebase",
    "reconfigure",
    "rejoin_edges",
]

MIN_PARTIES = 2  # a run goes on after departures with at least this many parties
_LEAVE = re.compile(r"^agent(\d+)@(\d+|I)(?::(\d+))?((?:\+agent\d+)*)$")


@dataclass(frozen=True)
class Departure:
    """Agent `agent` (0-based) sends nothing from round `round` on; the network re-bases at
    round `rebase_round` (> round). Round 0 with re-base round 0: it left in phase I, and the
    rest start phase II without it (its edges' seeds dropped, new edges seeded first); round 0
    with a later re-base round: it finished phase I and sent no round message (the agents not
    next to it may step round 0 before anyone knows: the coordinator's decision, R = n).

    `late`: neighbours that did receive its round-`round` message (it died while sending them)
    and stepped that round with it; they drop it one round later. No neighbour can be further
    ahead: the agent's next message needs every neighbour's message of this round.

    `phase_one` (`agentK@I:R`): it left in phase I itself, as the network decides it (a
    neighbour never got its key or its shares). Its neighbours finish phase I without it, its
    seeds (shares) drawn but never sent, so every other edge's are the replay's, and their
    round-0 state and message hold no term of its edges (the replay restarts their round 0,
    RoundDriver.restart); the rest is a departure at round 0 with re-base round R. Its `late`
    neighbours (`agentK@I:R+agentJ`: it died while sending its shares, and they got them) had
    finished phase I with its terms and sent their round-0 message before anyone knew: their
    round 0 is not restarted (their message holds its terms, as for a departure at round 0),
    they drop it at round 0 like the others, and round 0's masks do not cancel (the re-base at
    R makes that harmless)."""

    agent: int
    round: int
    rebase_round: int
    late: tuple[int, ...] = ()
    phase_one: bool = False
    # the run had already stopped at this round on the stop rule's certificate when the
    # departure was decided (efpsn/departure/last_window.py): nobody re-bases, the others end there
    stopped: int | None = None
    # too late to re-base before the cap N (`--iterations`, no certificate stop): the run
    # ended at N; agents far from it finished N, the others end where they wait
    # (efpsn/departure/last_window.py, CapEnd)
    capped: int | None = None

    def __post_init__(self) -> None:
        for end, what in ((self.stopped, "stopped"), (self.capped, "ended at the cap")):
            if end is not None and not self.round < end:
                raise ValueError(f"agent{self.agent + 1} left at round {self.round}: a run "
                                 f"that {what} at round {end} had ended before it")
        if self.stopped is not None and self.capped is not None:
            raise ValueError("a run stops on its certificate or ends at its cap, not both")
        late = tuple(sorted({int(j) for j in self.late}))
        object.__setattr__(self, "late", late)
        if self.agent in late:
            raise ValueError(f"agent{self.agent + 1} cannot be late for its own departure")
        if late and not self.phase_one and (self.round == 0
                                            or self.rebase_round < self.round + 2):
            raise ValueError(f"{self.label()}: neighbours that used agent{self.agent + 1}'s "
                             f"round-{self.round} message drop it at round {self.round + 1}; "
                             "the re-base must come after that")
        if self.phase_one and (self.round != 0 or (late and self.rebase_round < 1)):
            raise ValueError(f"agent{self.agent + 1} left in phase I: its departure is at "
                             "round 0, re-based after round 0 when a neighbour got its "
                             f"shares, got {self.label()}")
        for name in ("agent", "round", "rebase_round"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"departure {name} must be an int >= 0, got {value!r}")
        if self.round > 0 and self.rebase_round <= self.round:
            raise ValueError(f"agent{self.agent + 1} leaves at round {self.round}: the re-base "
                             f"round must come later, got {self.rebase_round}")

    def label(self) -> str:
        """`agentK@T:R[+agentJ...]`, 1-based as the command line writes it."""
        late = "".join(f"+agent{j + 1}" for j in self.late)
        at = "I" if self.phase_one else self.round
        return f"agent{self.agent + 1}@{at}:{self.rebase_round}{late}"

    def to_json(self) -> dict[str, object]:
        record: dict[str, object] = {
            "agent": f"agent{self.agent + 1}", "round": self.round,
            "rebase_round": self.rebase_round, "late": [f"agent{j + 1}" for j in self.late]}
        if self.phase_one:
            record["phase_one"] = True  # it never finished phase I with some neighbour
        if self.stopped is not None:
            record["stopped"] = self.stopped  # the run had stopped there (last_window.py)
        if self.capped is not None:
            record["capped"] = self.capped  # the run ended at its cap (last_window.py)
        return record


def parse_leave(text: str, *, agents: int, lag: int | None = None) -> Departure:
    """`agentK@T`, `agentK@T:R` or `agentK@T:R+agentJ+...` (K 1-based; J the late neighbours,
    Departure.late) -> Departure (`agentK@0`: it left in phase I and everyone knew before
    round 0; `agentK@I[:R]`: it left in phase I as the network decides it, Departure.phase_one).

    R defaults to T + lag, lag to the number of agents at the start: the most rounds any agent
    can run past T before the neighbours of K, waiting for K's round-T message, hold everyone
    up (a synchronous round needs every neighbour's message), so nobody has passed R when the
    departure is agreed. ValueError naming what is wrong."""
    match = _LEAVE.match(text.strip())
    if match is None:
        raise ValueError(f"--leave expects agentK@T or agentK@T:R (K = 1..{agents}, T the first "
                         f"round without agent K or I for phase I, R the re-base round; "
                         f"+agentJ: a neighbour that used K's round-T message, or with I got "
                         f"its phase I shares), got {text!r}")
    k, phase_one = int(match.group(1)), match.group(2) == "I"
    t = 0 if phase_one else int(match.group(2))
    if not 1 <= k <= agents:
        raise ValueError(f"--leave {text}: there is no agent{k} (agents are 1..{agents})")
    default = 0 if t == 0 and not phase_one else t + (lag or agents)
    rebase_round = int(match.group(3)) if match.group(3) else default
    late = [int(j) for j in re.findall(r"\d+", match.group(4))]
    if any(not 1 <= j <= agents for j in late):
        raise ValueError(f"--leave {text}: late neighbours must be agents 1..{agents}")
    return Departure(agent=k - 1, round=t, rebase_round=rebase_round,
                     late=tuple(j - 1 for j in late), phase_one=phase_one)


def check_departures(departures: Sequence[Departure], *, agents: int
                     ) -> tuple[Departure, ...]:
    """The departures sorted by round; ValueError when an agent leaves twice or when fewer
    than MIN_PARTIES would stay. A departure's rounds are checked when it is replayed
    (DepartureReplay), against the cap then (a departure the run never reached is an error of the
    simulator): an earlier re-base may have extended it (StopRule.rebased), and a departure in the
    stop's last window may end the run before any re-base (efpsn/departure/last_window.py)."""
    ordered = tuple(sorted(departures, key=lambda d: (d.round, d.agent)))
    seen = [d.agent for d in ordered]
    if len(set(seen)) != len(seen):
        raise ValueError(f"an agent can leave once; got {[d.label() for d in ordered]}")
    if len(seen) > agents - MIN_PARTIES:
        raise ValueError(f"{len(seen)} of {agents} agents leave: at least {MIN_PARTIES} must "
                         "stay (one party alone has nobody to mix with)")
    for d in ordered:
        if d.agent >= agents:
            raise ValueError(f"{d.label()}: there is no agent{d.agent + 1} (1..{agents})")
    return ordered


def check_rebase(departure: Departure, *, cap: int) -> None:
    """ValueError when the departure's re-base round is not before the run's last round."""
    if departure.rebase_round >= cap:
        raise ValueError(f"{departure.label()}: the re-base round {departure.rebase_round} must "
                         f"come before the last round ({cap} rounds)")


def drop_node_weights(weights: Mapping[int, float], *, agent: int,
                      gone: Iterable[int]) -> dict[int, float]:
    """Agent `agent`'s mixing weights without the agents in `gone`: their weights move to the
    self weight, w_ii = 1 - sum of the remaining w_ij (ascending, as metropolis_weights sums).
    Symmetric and doubly stochastic when every agent applies it, and local: only the
    neighbours of a departed agent change anything."""
    gone = set(gone)
    if agent in gone:
        raise ValueError(f"agent{agent + 1} has left: it has no weights")
    kept = {j: w for j, w in weights.items() if j != agent and j not in gone}
    out = {j: kept[j] for j in sorted(kept)}
    out[agent] = 1.0 - sum(out.values())
    return out


def active_components(graph: Graph, departed: Iterable[int]) -> list[list[int]]:
    """The connected components of the graph without the departed agents, each ascending,
    ordered by their smallest agent."""
    gone = set(departed)
    return [c for c in graph.components() if c[0] not in gone]


def rejoin_edges(graph: Graph, departed: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """The public rule that joins the pieces the departures leave: consecutive components
    (ordered by their smallest agent) joined by an edge between their smallest agents."""
    gone = set(departed)
    pieces = active_components(_without(graph, gone), gone)
    return tuple((a[0], b[0]) for a, b in itertools.pairwise(pieces))


def _without(graph: Graph, gone: set[int]) -> Graph:
    return Graph(graph.n, tuple(e for e in graph.edges if not gone.intersection(e)),
                 name=graph.name)


@dataclass(frozen=True)
class Reconfiguration:
    """The network from a re-base round on: the graph on the same indices (departed agents
    isolated), the edges that went with them, the new edges that need phase I seeds, and the
    Metropolis weights of the new graph."""

    graph: Graph
    departed: tuple[int, ...]
    dropped_edges: tuple[tuple[int, int], ...]
    new_edges: tuple[tuple[int, int], ...]
    weights: np.ndarray

    @property
    def remaining(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.graph.n) if i not in self.departed)

    def agent_weights(self, i: int) -> dict[int, float]:
        """w_ij for j in N_i and w_ii (as Problem.agent_weights)."""
        if i in self.departed:
            raise ValueError(f"agent{i + 1} has left: it has no weights")
        return {j: float(self.weights[i, j]) for j in (i, *self.graph.neighbours(i))}

    def remaining_weights(self) -> np.ndarray:
        """The Metropolis matrix restricted to the remaining agents (what a certificate needs)."""
        keep = list(self.remaining)
        return self.weights[np.ix_(keep, keep)]


def reconfigure(graph: Graph, departed: Iterable[int]) -> Reconfiguration:
    """The remaining graph after `departed` left `graph` (itself maybe an earlier
    reconfiguration's), joined where it fell apart, with its Metropolis weights."""
    gone = set(departed)
    if any(not 0 <= d < graph.n for d in gone):
        raise ValueError(f"departed agents {sorted(gone)} outside 0..{graph.n - 1}")
    if len(gone) >= graph.n:
        raise ValueError("every agent has left")
    kept = _without(graph, gone)
    new = rejoin_edges(graph, gone)
    joined = Graph(graph.n, kept.edges + new, name=graph.name)
    return Reconfiguration(
        graph=joined, departed=tuple(sorted(gone)),
        dropped_edges=tuple(e for e in graph.edges if gone.intersection(e)),
        new_edges=new, weights=metropolis_weights(joined))


def rebase(state: AgentState) -> AgentState:
    """The state from which the remaining agents go on at the re-base round: gradient tracking
    (a state with a tracker y and the last local gradient g) restarts its tracker from the
    current local gradient, y := g; every other state (DSGD) is kept as it is."""
    if "y" in state.tensors and "g" in state.tensors:
        return dataclasses.replace(state, tensors={**state.tensors, "y": state["g"].clone()})
    return state


def optimum_of(agents: Iterable[int]) -> str:
    """"the optimum of agents 1,2,4,5's objective" (1-based)."""
    names = ",".join(str(i + 1) for i in sorted(agents))
    return f"the optimum of agents {names}'s objective"
