"""A party that joins a running network, as pure functions: its seat, the round it takes part
from, and the graph from then on. No I/O; the simulator (efpsn/departure/replay.py), the
coordinator (coordinator/joins.py) and the agents apply the same functions.

A run names the seats that start empty (the run parameter `late`); agents keep their indices,
and an empty seat is an isolated vertex, as a departed agent is (efpsn/departure/membership.py).
The graph is always the run's topology over its members: at the start over those present, and
from the round a join takes effect over the members with the newcomer (`graph_over`: the
topology's graph for that many agents, laid on the members in index order; an `edges:FILE`
graph restricted to them: efpsn/topology.py). The public rule at the join of agent k at round R:

- before round R every agent has heard the decision (the coordinator announces it at a check
  round nobody has passed, and R is that round: coordinator/joins.py);
- the edges of the new graph that the old one lacks run phase I (fresh seeds under Paillier,
  drawn as `new_edge_seeds` draws them), the edges it drops lose their mask terms at both ends,
  so the masks of the members sum to zero exactly from round R on, every round;
- at round R every member takes the Metropolis weights of the new graph, and the trackers
  restart from the current local gradients (y_i := g_i, efpsn.departure.membership.rebase); the
  newcomer starts from the model's initial point with the algorithm's init at round R: from
  then on sum_i y_i = sum_i g_i over all members, so the fixed point is the optimum of their
  objective.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass

from efpsn.departure.membership import Reconfiguration
from efpsn.params.config import RunConfig
from efpsn.topology import Graph, graph_over, metropolis_weights

__all__ = ["JOIN_CHECK_EVERY", "JOIN_EPOCHS", "Join", "check_round", "join_reconfiguration",
           "late_for", "parse_join", "seed_epoch"]

_JOIN = re.compile(r"^agent(\d+)@(\d+)$")
# a run with seats that join later: every member polls the coordinator before stepping every
# JOIN_CHECK_EVERY-th round (coordinator/joins.py), where joins take effect
JOIN_CHECK_EVERY = 25
# the new edges of join number n draw their seeds for re-base "epoch" JOIN_EPOCHS + n
# (efpsn.departure.remask.rejoin_generator): never a departure's
JOIN_EPOCHS = 1 << 20


def check_round(t: int, *, last: int) -> bool:
    """Whether a member polls the coordinator before stepping round t: every JOIN_CHECK_EVERY-th
    round but the run's last (`last`: it ends there; its final poll says so)."""
    return 0 < t < last and t % JOIN_CHECK_EVERY == 0


def seed_epoch(number: int) -> int:
    """The epoch the new edges of join number `number` (1, 2, ...) draw their seeds for."""
    if number < 1:
        raise ValueError(f"joins are numbered from 1, got {number}")
    return JOIN_EPOCHS + number


@dataclass(frozen=True)
class Join:
    """Agent `agent` (0-based; a seat the run left empty) takes part from round `round` on;
    `neighbours`: its neighbours then when the operator chose them (the ends of its new edges,
    nothing dropped), else () for the topology's rule (`graph_over`)."""

    agent: int
    round: int
    neighbours: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("agent", "round"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"join {name} must be an int >= 0, got {value!r}")
        if self.round < 1:
            raise ValueError(f"agent{self.agent + 1} joins at round {self.round}: a join takes "
                             "effect at a round of phase II after round 0")
        chosen = tuple(sorted({int(j) for j in self.neighbours}))
        if self.agent in chosen:
            raise ValueError(f"agent{self.agent + 1} cannot be its own neighbour")
        object.__setattr__(self, "neighbours", chosen)

    def label(self) -> str:
        """`agentK@R`, 1-based as the command line writes it."""
        return f"agent{self.agent + 1}@{self.round}"

    def to_json(self) -> dict[str, object]:
        record: dict[str, object] = {"agent": f"agent{self.agent + 1}", "round": self.round}
        if self.neighbours:
            record["chosen_neighbours"] = [f"agent{j + 1}" for j in self.neighbours]
        return record


def parse_join(text: str, *, agents: int) -> Join:
    """`agentK@R` (K 1-based: a seat the run left empty; R the round it takes part from) ->
    Join. ValueError naming what is wrong."""
    match = _JOIN.match(text.strip())
    if match is None:
        raise ValueError(f"--join expects agentK@R (K = 1..{agents}, a seat the run leaves empty "
                         f"at the start; R the first round it takes part in), got {text!r}")
    k = int(match.group(1))
    if not 1 <= k <= agents:
        raise ValueError(f"--join {text}: there is no agent{k} (agents are 1..{agents})")
    return Join(agent=k - 1, round=int(match.group(2)))


def join_reconfiguration(graph: Graph, *, members: Sequence[int], join: Join, topology: str,
                         seed: int = 0) -> Reconfiguration:
    """The network from the join's round on: `graph` (the members' graph before it) becomes
    the topology over the members with the newcomer (`graph_over`), or, with the operator's
    neighbours, `graph` with the newcomer's edges to them; the edges it drops, the new edges
    (which need phase I seeds) and the Metropolis weights of the new graph."""
    before = set(members)
    if join.agent in before:
        raise ValueError(f"agent{join.agent + 1} is already a member of the run")
    after = sorted(before | {join.agent})
    if join.neighbours:
        stray = sorted(set(join.neighbours) - before)
        if stray:
            raise ValueError(f"{join.label()}: its chosen neighbours "
                             f"{[f'agent{j + 1}' for j in stray]} are not members of the run")
        new_graph = Graph(graph.n, graph.edges + tuple((j, join.agent) for j in join.neighbours),
                          name=graph.name)
    else:
        new_graph = graph_over(topology, after, agents=graph.n, seed=seed)
    old, new = set(graph.edges), set(new_graph.edges)
    absent = tuple(i for i in range(graph.n) if i not in set(after))
    return Reconfiguration(graph=new_graph, departed=absent,
                           dropped_edges=tuple(sorted(old - new)),
                           new_edges=tuple(sorted(new - old)),
                           weights=metropolis_weights(new_graph))


def late_for(joins: Sequence[str], config: RunConfig) -> str:
    """The run parameter `late` that `--join agentK@R` needs: the config's, with every joining
    seat added (a seat that joins starts empty)."""
    seats = set(config.late_seats) | {parse_join(text, agents=config.agents).agent
                                      for text in joins}
    return ",".join(f"agent{i + 1}" for i in sorted(seats))
