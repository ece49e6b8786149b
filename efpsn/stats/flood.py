"""The secure sum of column statistics over a network, sans-I/O: every agent learns every masked
vector by flooding them over its neighbours for D rounds (D the graph's diameter, public).

Round r (0 <= r < D): agent i sends each neighbour the masked vectors of every agent within r
hops of i (efpsn/stats/column_sums.py's masked_vector: its own, plus what it learned). A neighbour
j's round-r message must name exactly the agents within r hops of j (the graph is public), and a
vector seen twice must be the same both times. After D rounds agent i holds all n masked vectors
(an agent within D hops of i is within D - 1 hops of one of i's neighbours), sums them mod M and
decodes the totals: every agent sums the same n integers, so every agent and the simulator
(efpsn/stats/standardise.py network_totals) get the same Totals bit for bit.

After a departure in phase I (or during the flood) the flood starts again on the remaining
graph (StatsFlood's `gone`): the remaining agents' vectors only, in rounds numbered from
flood_round_base(epoch, n) on the wire, with fresh pads (secure_stats.masked_vector's epoch).

What travels: only masked vectors, each a one-time pad of the agent's local statistics under its
edges' statistics keys (the disclosure column_sums.py names); what comes out: the totals.
A vector on the wire is STAT_BITS/8 bytes per entry, little-endian (encode_vector).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from efpsn.stats.column_sums import MODULUS, STAT_BITS, Totals, decode_totals, sum_masked
from efpsn.topology import Graph

__all__ = ["ENTRY_BYTES", "StatsFlood", "ball", "decode_vector", "encode_vector",
           "flood_round_base", "flood_rounds", "flood_wire_rounds"]

ENTRY_BYTES = STAT_BITS // 8
"""Bytes of one masked entry on the wire (an integer in [0, 2^STAT_BITS), little-endian)."""


def ball(graph: Graph, agent: int, radius: int) -> frozenset[int]:
    """The agents within `radius` hops of `agent` (itself included)."""
    seen, frontier = {agent}, [agent]
    for _ in range(radius):
        frontier = [k for j in frontier for k in graph.neighbours(j) if k not in seen]
        seen.update(frontier)
        if not frontier:
            break
    return frozenset(seen)


def flood_rounds(graph: Graph, gone: Collection[int] = ()) -> int:
    """D, the graph's diameter in hops (0 for one agent): the flood's rounds. With `gone`
    (agents that left in phase I, isolated in a reconfigured graph: efpsn.departure.membership's
    reconfigure), the diameter of the remaining agents' graph."""
    members = [i for i in range(graph.n) if i not in set(gone)]
    if not gone:
        graph.require_connected()
    worst = 0
    for i in members:
        radius = 0
        while len(ball(graph, i, radius)) < len(members):
            if radius >= graph.n:
                raise ValueError("the remaining agents' graph is not connected")
            radius += 1
        worst = max(worst, radius)
    return worst


def flood_round_base(epoch: int, agents: int) -> int:
    """The wire round of a flood's round 0 after `epoch` departure decisions: epoch * agents
    (a flood has fewer than `agents` rounds), so a flood started again after a departure never
    takes a message of an earlier one."""
    return epoch * agents


def flood_wire_rounds(agents: int) -> int:
    """The wire rounds any flood of a run of `agents` may use: fewer than `agents` floods (at
    least one agent remains), each below the next one's base."""
    return agents * agents


def encode_vector(values: Sequence[int]) -> bytes:
    """A masked vector as bytes: ENTRY_BYTES little-endian bytes per entry."""
    out = bytearray()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MODULUS:
            raise ValueError(f"a masked statistic must be an integer in [0, 2^{STAT_BITS})")
        out += v.to_bytes(ENTRY_BYTES, "little")
    return bytes(out)


def decode_vector(data: bytes, *, length: int) -> list[int]:
    """The masked vector of `length` entries in `data`; ValueError for any other size."""
    if len(data) != length * ENTRY_BYTES:
        raise ValueError(f"a masked statistics vector of {length} entries is "
                         f"{length * ENTRY_BYTES} bytes, got {len(data)}")
    return [int.from_bytes(data[k * ENTRY_BYTES:(k + 1) * ENTRY_BYTES], "little")
            for k in range(length)]


class StatsFlood:
    """One agent's flood: what it sends in round r, what it accepts, and the totals at the end.

    `own` is this agent's masked vector (secure_stats.masked_vector), of 1 + 2d entries.
    `gone`: the agents that left in phase I; `graph` is then the remaining graph (the
    departed isolated, the pieces joined: efpsn.departure.membership's reconfigure) and the totals
    are the remaining agents'."""

    def __init__(self, *, graph: Graph, agent: int, own: Sequence[int],
                 gone: Collection[int] = ()) -> None:
        self.gone = frozenset(gone)
        if not 0 <= agent < graph.n or agent in self.gone:
            raise ValueError(f"agent must be a remaining agent of [0, {graph.n}), got {agent}")
        if any(graph.neighbours(j) for j in self.gone):
            raise ValueError(f"the departed agents {sorted(self.gone)} still have edges")
        self.graph = graph
        self.agent = agent
        self.length = len(own)
        self.rounds = flood_rounds(graph, self.gone)
        encode_vector(own)  # checked: integers mod M
        self.known: dict[int, tuple[int, ...]] = {agent: tuple(own)}

    def outgoing(self, r: int) -> dict[int, tuple[int, ...]]:
        """Round r's message to every neighbour: the vectors of the agents within r hops."""
        self._check_round(r)
        wanted = ball(self.graph, self.agent, r)
        missing = sorted(wanted - set(self.known))
        if missing:
            raise RuntimeError(f"round {r} needs the vectors of agents {missing}: merge rounds "
                               f"0..{r - 1} first")
        return {j: self.known[j] for j in sorted(wanted)}

    def expected(self, sender: int, r: int) -> frozenset[int]:
        """The agents a neighbour's round-r message must carry: those within r hops of it."""
        self._check_round(r)
        if sender not in self.graph.neighbours(self.agent):
            raise ValueError(f"agent {sender} is not a neighbour of agent {self.agent}")
        return ball(self.graph, sender, r)

    def merge(self, sender: int, r: int, vectors: Mapping[int, Sequence[int]]) -> None:
        """Take neighbour `sender`'s round-r vectors; ValueError (naming what is wrong) for the
        wrong agents, the wrong length, or a vector that differs from one already seen."""
        wanted = self.expected(sender, r)
        if set(vectors) != wanted:
            raise ValueError(f"round {r} of the statistics flood from agent {sender} must carry "
                             f"agents {sorted(wanted)}, got {sorted(vectors)}")
        for j, vector in vectors.items():
            if len(vector) != self.length:
                raise ValueError(f"agent {j}'s masked statistics have {len(vector)} entries, "
                                 f"expected {self.length}")
            known = self.known.get(j)
            if known is not None and known != tuple(vector):
                raise ValueError(f"agent {j}'s masked statistics differ between two messages "
                                 f"(the latest from agent {sender}, round {r})")
        for j, vector in vectors.items():
            self.known.setdefault(j, tuple(vector))

    def totals(self) -> Totals:
        """The network's totals, once every agent's vector is known."""
        members = [j for j in range(self.graph.n) if j not in self.gone]
        if sorted(self.known) != members:
            raise RuntimeError(f"the flood knows {len(self.known)} of {len(members)} vectors")
        return decode_totals(sum_masked([list(self.known[j]) for j in members]))

    def _check_round(self, r: int) -> None:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.rounds:
            raise ValueError(f"the statistics flood has rounds 0..{self.rounds - 1}, got {r}")
