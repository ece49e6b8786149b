"""What an assigned agent knows: its run, its neighbours and the problem as it sees it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.options import AgentFailure
from agent.prepare import Prepared
from efpsn.algorithms import make_algorithm
from efpsn.params.config import RunConfig
from efpsn.problem import Problem
from efpsn.stats.flood import ENTRY_BYTES
from efpsn.topology import Graph, metropolis_weights
from efpsn.wire import limits
from efpsn.wire.records import Assignment

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("efpsn.agent")


@dataclass
class Session:
    """What the agent knows once assigned: the run, its neighbours and the public problem."""

    assignment: Assignment
    config: RunConfig
    problem: Problem
    names: dict[int, str]  # neighbour index -> name
    addresses: dict[str, str]  # neighbour name -> host:port
    message_shapes: dict[str, tuple[int, ...]]  # what a round message must carry
    request_limits: dict[str, int]  # method -> largest request it can legitimately carry
    # scale standard, once the secure sum is over: the network's (mean, std) per feature
    standardisation: tuple[np.ndarray, np.ndarray] | None = None
    departed: dict[str, str] = field(default_factory=dict)  # gone neighbour -> why refused
    # new neighbours after a departure cut the graph: name -> (index, address, the re-base round
    # from which they exchange round messages); until then only the new edge's seed exchange
    joining: dict[str, tuple[int, str, int]] = field(default_factory=dict)
    # former neighbours (a join dropped the edge at round R): name -> R; still admitted, so that
    # one restarted from a checkpoint before R can fetch this agent's rounds before R again
    former: dict[str, int] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.assignment.run_id

    @property
    def index(self) -> int:
        return self.assignment.index

    @property
    def neighbour_names(self) -> frozenset[str]:
        return frozenset(self.addresses)

    @property
    def admitted_names(self) -> frozenset[str]:
        """Who may call this agent: its neighbours, its new neighbours to come, and its former
        neighbours (for the rounds they shared)."""
        return frozenset(self.addresses) | frozenset(self.joining) | frozenset(self.former)

    def address_of(self, name: str) -> str:
        if name in self.addresses:
            return self.addresses[name]
        return self.joining[name][1]

    def round_senders(self, t: int) -> frozenset[str]:
        """Whose round-t messages are taken: the neighbours, a new neighbour from its re-base
        round on (it can be a round ahead of this agent), a former one before its edge went."""
        return (self.neighbour_names
                | frozenset(n for n, (_, _, r) in self.joining.items() if t >= r)
                | frozenset(n for n, r in self.former.items() if t < r))

    def join(self, name: str) -> None:
        """A new neighbour (agent/departure/new_edges.py) from its re-base round on: a neighbour
        like the others."""
        index, address, _ = self.joining.pop(name)
        self.addresses[name] = address
        self.names = dict(sorted({**self.names, index: name}.items()))

    def unlink(self, name: str, *, until: int | None = None) -> None:
        """A neighbour this agent no longer shares an edge with (a join rewired the graph,
        efpsn/departure/joins.py): no round messages to or from it from round `until` on; it
        is still in the run, and may still fetch the rounds before `until` (a restart)."""
        if until is not None and name in self.addresses:
            self.former[name] = until
        self.addresses.pop(name, None)
        self.names = {i: n for i, n in self.names.items() if n != name}

    def drop(self, name: str, *, reason: str) -> None:
        """A neighbour that left for good (agent/departure/silence.py): no more messages to or from
        it; its messages are refused with `reason`."""
        self.addresses.pop(name, None)
        self.names = {i: n for i, n in self.names.items() if n != name}
        self.departed[name] = reason

    def weights(self) -> dict[int, float]:
        out = {self.index: self.assignment.self_weight}
        out.update({p.index: p.weight for p in self.assignment.neighbours})
        return out


async def open_session(assignment: Assignment, *, name: str, prepared: Prepared) -> Session:
    """The assigned run: the problem as this agent sees it (its own shard, built once when it
    prepared), checked against the assignment (as many agents as the run parameters it took
    from GetRunParameters say, the neighbours its topology gives)."""
    if assignment.num_agents != prepared.config.agents:
        raise AgentFailure(f"the coordinator's assignment for {name} is for "
                           f"{assignment.num_agents} agents, but the run it announced before "
                           f"registration has {prepared.config.agents}")
    config = prepared.config
    problem = await asyncio.to_thread(prepared.problem_for, assignment.index)
    if assignment.join_round:  # a party that joins: the members' graph from its join on
        graph = Graph(config.agents, assignment.edges, name=problem.graph.name)
        problem = dataclasses.replace(
            problem, graph=graph, weights=metropolis_weights(graph),
            members=tuple(i for i in range(config.agents) if graph.degree(i) > 0))
    expected = set(problem.graph.neighbours(assignment.index))
    got = {p.index for p in assignment.neighbours}
    if expected != got:
        raise AgentFailure(
            f"coordinator assigned neighbours {sorted(got)} but the topology "
            f"{config.topology!r} gives {sorted(expected)}"
        )
    shape = tuple(problem.initial_params().shape)
    keys = make_algorithm(config.algorithm).message_keys
    shapes = {k: shape for k in keys}
    request_limits = legitimate_request_bytes(config, shapes, coefficients=problem.N)
    if config.scale.standard:  # the secure sum's flood messages (agent/phases/secure_sum.py)
        request_limits["PutStats"] = stats_request_bytes(
            agents=config.agents, features=math.prod(problem.task.shape))
    largest = max(request_limits, key=request_limits.__getitem__)
    if request_limits[largest] > limits.AGENT_RECEIVE_BYTES and largest == "PutStats":
        raise AgentFailure(
            f"this run's secure sum of column statistics moves {request_limits[largest]} bytes "
            f"in a message, more than the {limits.AGENT_RECEIVE_BYTES} an agent receives: give "
            "public scales in schema.json (scale none, unit or div:...)")
    if request_limits[largest] > limits.AGENT_RECEIVE_BYTES:
        raise AgentFailure(
            f"this run's {largest} messages can be {request_limits[largest]} bytes, more than "
            f"the {limits.AGENT_RECEIVE_BYTES} an agent receives: use --packed or fewer "
            "coefficients (--N)"
        )
    log.info("%s is agent index %d of run %s; neighbours %s", name,
             assignment.index, assignment.run_id,
             ", ".join(p.name for p in assignment.neighbours))
    return Session(
        assignment=assignment, config=config, problem=problem,
        names={p.index: p.name for p in assignment.neighbours},
        addresses={p.name: p.address for p in assignment.neighbours},
        message_shapes=shapes, request_limits=request_limits,
    )


def stats_request_bytes(*, agents: int, features: int) -> int:
    """The largest flood message of the secure sum: every agent's masked vector of 1 + 3d
    entries (efpsn/stats/column_sums.py), with framing."""
    return HEADER_BYTES + agents * ((1 + 3 * features) * ENTRY_BYTES + 16)


# A Header (run id and sender of at most a few dozen characters, round, phase) with framing.
HEADER_BYTES = 1024


def legitimate_request_bytes(config: RunConfig, shapes: dict[str, tuple[int, ...]], *,
                             coefficients: int) -> dict[str, int]:
    """The largest request each Agent method can carry in this run, so a bigger body is refused
    unread: a round message is the model's float64 tensors plus names, shapes and a header;
    phase I shares are at most `coefficients` (N) ciphertexts below n^2 (2 * key_bits bits) each."""
    per_tensor = [8 * math.prod(shape) + 64 + 11 * len(shape) for shape in shapes.values()]
    ciphertext = 2 * config.key_bits // 8 + 1 + 8  # minimal big-endian bytes + field framing
    return {
        "PutRound": HEADER_BYTES + sum(per_tensor),
        "StreamRounds": HEADER_BYTES + sum(per_tensor),  # per message of the stream
        "GetRound": HEADER_BYTES,
        "PutPublicKey": HEADER_BYTES + 2 * (limits.MAX_KEY_BITS // 8) + 64,
        "PutShares": HEADER_BYTES + 64 + coefficients * ciphertext,
        "GetStatus": limits.SMALL_REQUEST_BYTES,
    }
