"""Torch-free wire records shared by both services: headers, run parameters, assignments.

The coordinator imports only this module (and the generated coordinator stubs), so its import
closure has no torch and no Paillier; every service imports these names from here.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from efpsn.wire.v1 import common_pb2, coordinator_pb2

# Trailing metadata of the coordinator's refusal of a Register call when the run is cancelled:
# the agent that caused it, so agents and `efpsn up` never parse the message text.
CANCELLED_BY = "efpsn-cancelled-by"
UINT32_END = 2**32
UINT64_END = 2**64
_WEIGHT_TOLERANCE = 1e-9


class WireError(ValueError):
    """A message (or a value headed for one) breaks the efpsn.v1 wire contract."""


class Phase(enum.IntEnum):
    """Mirror of efpsn.v1.Phase, so callers need not import the generated stubs."""

    PHASE_UNSPECIFIED = 0
    KEYS = 1
    SHARES = 2
    OPTIMIZE = 3
    DONE = 4
    STATS = 5



# --------------------------------------------------------------------------------------- headers


@dataclass(frozen=True)
class Header:
    """Plain form of efpsn.v1.Header."""

    run_id: str
    sender: str
    round: int
    phase: Phase


def make_header(*, run_id: str, sender: str, round: int, phase: Phase) -> common_pb2.Header:
    """Build a Header; run_id and sender non-empty, 0 <= round < 2^64, phase specified."""
    header = Header(run_id, sender, round, phase)
    _check_header(header)
    return common_pb2.Header(run_id=run_id, sender=sender, round=round, phase=int(phase))


def header_from_proto(pb: common_pb2.Header) -> Header:
    """Decode and sanity-check a Header (non-empty ids, known phase)."""
    if not isinstance(pb, common_pb2.Header):
        raise TypeError(f"expected efpsn.v1.Header, got {type(pb).__name__}")
    try:
        phase = Phase(pb.phase)
    except ValueError:
        raise WireError(f"header phase {pb.phase} is not a known Phase") from None
    header = Header(pb.run_id, pb.sender, pb.round, phase)
    _check_header(header)
    return header


def validate_header(
    pb: common_pb2.Header,
    *,
    run_id: str,
    phase: Phase,
    senders: Collection[str] | None = None,
    round: int | None = None,
) -> Header:
    """Decode a Header and check it belongs to this run, phase, sender set and (if given) round."""
    header = header_from_proto(pb)
    if header.run_id != run_id:
        raise WireError(f"message is for run {header.run_id!r}, expected run {run_id!r}")
    if header.phase != phase:
        raise WireError(f"message is for phase {header.phase.name}, expected {Phase(phase).name}")
    if senders is not None and header.sender not in senders:
        raise WireError(f"sender {header.sender!r} is not one of {sorted(senders)}")
    if round is not None and header.round != round:
        raise WireError(f"message is for round {header.round}, expected round {round}")
    return header


_PHASES = frozenset(Phase)


def _check_header(header: Header) -> None:
    if not isinstance(header.run_id, str) or not header.run_id:
        raise WireError(f"header run_id must be a non-empty string, got {header.run_id!r}")
    if not isinstance(header.sender, str) or not header.sender:
        raise WireError(f"header sender must be a non-empty string, got {header.sender!r}")
    r = header.round
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < UINT64_END:
        raise WireError(f"header round must be an int in [0, 2^64), got {r!r}")
    if not isinstance(header.phase, int) or header.phase not in _PHASES:
        raise WireError(f"header phase must be a Phase, got {header.phase!r}")
    if header.phase == Phase.PHASE_UNSPECIFIED:
        raise WireError("header phase must not be PHASE_UNSPECIFIED")



# ------------------------------------------------------------------------- coordinator messages

RUN_PARAMETER_FIELDS: tuple[str, ...] = tuple(
    field.name for field in coordinator_pb2.RunParameters.DESCRIPTOR.fields
)


def run_parameters_to_proto(values: Mapping[str, Any]) -> coordinator_pb2.RunParameters:
    """Encode a plain dict with exactly the RUN_PARAMETER_FIELDS keys (e.g. RunConfig.to_dict())."""
    missing = sorted(set(RUN_PARAMETER_FIELDS) - set(values))
    unknown = sorted(set(values) - set(RUN_PARAMETER_FIELDS))
    if missing or unknown:
        raise WireError(f"run parameters: missing {missing}, unknown {unknown}")
    fields = coordinator_pb2.RunParameters.DESCRIPTOR.fields_by_name
    kwargs = {name: _check_scalar(name, fields[name].type, values[name]) for name in values}
    return coordinator_pb2.RunParameters(**kwargs)


def run_parameters_from_proto(pb: coordinator_pb2.RunParameters) -> dict[str, Any]:
    """Decode RunParameters to a plain dict (keys in field order; int, float, str, bool values)."""
    if not isinstance(pb, coordinator_pb2.RunParameters):
        raise TypeError(f"expected efpsn.v1.RunParameters, got {type(pb).__name__}")
    return {name: getattr(pb, name) for name in RUN_PARAMETER_FIELDS}


def encode_run_parameters(values: Mapping[str, Any]) -> bytes:
    """The run's parameters as one serialised efpsn.v1.RunParameters message: the form they
    cross a process boundary in (`efpsn up` hands the coordinator this file, the coordinator
    hands the agents the same message), never re-rendered as command-line flags."""
    return run_parameters_to_proto(values).SerializeToString()


def decode_run_parameters(data: bytes) -> dict[str, Any]:
    """Read back encode_run_parameters; WireError for bytes that are not such a message."""
    try:
        pb = coordinator_pb2.RunParameters.FromString(data)
    except DecodeError as exc:
        raise WireError(f"not an efpsn.v1.RunParameters message: {exc}") from None
    return run_parameters_from_proto(pb)


def _check_scalar(name: str, field_type: int, value: Any) -> Any:
    if field_type == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            raise WireError(f"run parameter {name} must be a str, got {value!r}")
        return value
    if field_type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise WireError(f"run parameter {name} must be a bool, got {value!r}")
        return value
    if field_type == FieldDescriptor.TYPE_DOUBLE:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(f"run parameter {name} must be a float, got {value!r}")
        return float(value)
    end = {FieldDescriptor.TYPE_UINT32: UINT32_END, FieldDescriptor.TYPE_UINT64: UINT64_END}
    if field_type in end:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < end[field_type]:
            raise WireError(f"run parameter {name} must be an int in [0, {end[field_type]}), "
                            f"got {value!r}")
        return value
    if field_type == FieldDescriptor.TYPE_SINT32:
        if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**31:
            raise WireError(f"run parameter {name} must be an int in [-2^31, 2^31), got "
                            f"{value!r}")
        return value
    raise AssertionError(f"run parameter {name} has an unhandled protobuf type {field_type}")


@dataclass(frozen=True)
class Peer:
    """Plain form of efpsn.v1.Peer."""

    name: str
    index: int
    address: str
    weight: float


@dataclass(frozen=True)
class Assignment:
    """Plain form of efpsn.v1.Assignment (the run's parameters come once, from
    GetRunParameters: proto/efpsn/wire/v1/coordinator.proto)."""

    run_id: str
    index: int
    name: str
    neighbours: tuple[Peer, ...]
    self_weight: float
    num_agents: int
    # every party's name by index (empty from an older coordinator, or an older saved state)
    members: tuple[str, ...] = ()
    # a party that joined the running network: the round it takes part from (0: it started
    # with the run), its join's number, and the members' graph from then on (index pairs)
    join_round: int = 0
    join_epoch: int = 0
    edges: tuple[tuple[int, int], ...] = ()
    join_cap: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))  # a list, as saved in JSON
        object.__setattr__(self, "edges", tuple((int(a), int(b)) for a, b in self.edges))


def assignment_to_proto(assignment: Assignment) -> coordinator_pb2.Assignment:
    """Encode an Assignment after checking its invariants (see check_assignment)."""
    check_assignment(assignment)
    return coordinator_pb2.Assignment(
        run_id=assignment.run_id,
        index=assignment.index,
        name=assignment.name,
        neighbours=[
            coordinator_pb2.Peer(name=p.name, index=p.index, address=p.address, weight=p.weight)
            for p in assignment.neighbours
        ],
        self_weight=assignment.self_weight,
        num_agents=assignment.num_agents,
        members=assignment.members,
        join_round=assignment.join_round,
        join_epoch=assignment.join_epoch,
        edges=[coordinator_pb2.Edge(a=a, b=b) for a, b in assignment.edges],
        join_cap=assignment.join_cap,
    )


def assignment_from_proto(pb: coordinator_pb2.Assignment) -> Assignment:
    """Decode an Assignment and check its invariants (see check_assignment)."""
    if not isinstance(pb, coordinator_pb2.Assignment):
        raise TypeError(f"expected efpsn.v1.Assignment, got {type(pb).__name__}")
    assignment = Assignment(
        run_id=pb.run_id,
        index=pb.index,
        name=pb.name,
        neighbours=tuple(Peer(p.name, p.index, p.address, p.weight) for p in pb.neighbours),
        self_weight=pb.self_weight,
        num_agents=pb.num_agents,
        members=tuple(pb.members),
        join_round=int(pb.join_round),
        join_epoch=int(pb.join_epoch),
        edges=tuple((int(e.a), int(e.b)) for e in pb.edges),
        join_cap=int(pb.join_cap),
    )
    check_assignment(assignment)
    return assignment


def check_assignment(a: Assignment) -> None:
    """WireError unless: non-empty ids; neighbours ascending, distinct, not self, in range, with
    addresses; weights in (0, 1] summing (with self_weight) to 1. (num_agents against the run's
    agent count: the agent, which holds the run's parameters.)"""
    if not a.run_id or not a.name:
        raise WireError(f"assignment needs a run_id and a name, got {a.run_id!r}, {a.name!r}")
    if not 0 <= a.index < a.num_agents:
        raise WireError(f"index {a.index} is out of range for {a.num_agents} agents")
    if a.members and (len(a.members) != a.num_agents or a.members[a.index] != a.name
                      or len(set(a.members)) != len(a.members) or not all(a.members)):
        raise WireError(f"members must be {a.num_agents} distinct names with {a.name!r} at "
                        f"index {a.index}, got {list(a.members)[:8]}")
    indices = [p.index for p in a.neighbours]
    if any(i == a.index for i in indices):
        raise WireError(f"agent {a.index} lists itself as a neighbour")
    if any(not 0 <= i < a.num_agents for i in indices):
        raise WireError(f"neighbour indices {indices} out of range for {a.num_agents} agents")
    if any(x >= y for x, y in itertools.pairwise(indices)):
        raise WireError(f"neighbour indices must be strictly ascending, got {indices}")
    for p in a.neighbours:
        if not p.name or not p.address:
            raise WireError(f"neighbour {p.index} needs a name and an address, got {p}")
    weights = [a.self_weight] + [p.weight for p in a.neighbours]
    if not all(math.isfinite(w) and 0 <= w <= 1 for w in weights):
        raise WireError(f"mixing weights must be in [0, 1], got {weights}")
    if any(p.weight <= 0 for p in a.neighbours):
        raise WireError(f"neighbour weights must be > 0, got {[p.weight for p in a.neighbours]}")
    if abs(math.fsum(weights) - 1.0) > _WEIGHT_TOLERANCE:
        raise WireError(f"mixing weights must sum to 1, got {math.fsum(weights)!r}")
    if (bool(a.join_round) != bool(a.edges) or (a.join_epoch > 0) != bool(a.join_round)
            or (a.join_cap > a.join_round) != bool(a.join_round)):
        raise WireError(f"a join's assignment has its round, its number and its graph "
                        f"(got round {a.join_round}, number {a.join_epoch}, "
                        f"{len(a.edges)} edges)")
    for x, y in a.edges:
        if not (0 <= x < y < a.num_agents):
            raise WireError(f"edge ({x}, {y}) is no pair of agents 0..{a.num_agents - 1}")
    if a.edges and {b if x == a.index else x for x, b in a.edges
                    if a.index in (x, b)} != set(indices):
        raise WireError(f"the join's graph gives agent {a.index} other neighbours than "
                        f"{indices}")
