"""The secure sum's flood messages (StatsMessage) <-> agent index -> masked vector: building
them, and the one validation at the edge (header, agents, sizes) before anything is decoded
into integers."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from efpsn.stats.flood import ENTRY_BYTES, decode_vector, encode_vector
from efpsn.wire.records import Header, Phase, WireError, validate_header
from efpsn.wire.v1 import agent_pb2, common_pb2

__all__ = ["StatsRecord", "parse_stats", "stats_message"]


@dataclass(frozen=True)
class StatsRecord:
    """A neighbour's flood message, checked: sender, round, vectors by agent, digest."""

    sender: str
    round: int
    vectors: dict[int, list[int]]
    digest: bytes


def stats_message(*, header: common_pb2.Header,
                  vectors: Mapping[int, Sequence[int]]) -> agent_pb2.StatsMessage:
    """Round r's flood message: the masked vectors by agent index, sorted."""
    return agent_pb2.StatsMessage(header=header, vectors=[
        agent_pb2.MaskedStats(agent=j, values=encode_vector(vectors[j]))
        for j in sorted(vectors)])


def parse_stats(pb: agent_pb2.StatsMessage, *, run_id: str, senders: Collection[str],
                rounds: int, agents: int, length: int) -> StatsRecord:
    """Every wire check of a flood message: this run, phase STATS, a sender in `senders`, a
    round below `rounds`, agent indices below `agents` in increasing order, every vector of
    `length` entries (sizes checked before any integer is decoded). WireError says what."""
    if not isinstance(pb, agent_pb2.StatsMessage):
        raise TypeError(f"expected efpsn.v1.StatsMessage, got {type(pb).__name__}")
    header: Header = validate_header(pb.header, run_id=run_id, phase=Phase.STATS,
                                     senders=senders)
    if header.round >= rounds:
        raise WireError(f"the statistics flood has rounds 0..{rounds - 1}, got {header.round}")
    if not pb.vectors or len(pb.vectors) > agents:
        raise WireError(f"a flood message carries 1 to {agents} vectors, got {len(pb.vectors)}")
    previous = -1
    for item in pb.vectors:
        if not previous < item.agent < agents:
            raise WireError(f"vector agents must increase within [0, {agents}), got "
                            f"{item.agent} after {previous}")
        previous = item.agent
        if len(item.values) != length * ENTRY_BYTES:
            raise WireError(f"agent {item.agent}'s vector is {len(item.values)} bytes, expected "
                            f"{length * ENTRY_BYTES}")
    vectors = {item.agent: decode_vector(item.values, length=length) for item in pb.vectors}
    digest = hashlib.sha256(pb.SerializeToString(deterministic=True)).digest()
    return StatsRecord(sender=header.sender, round=header.round, vectors=vectors, digest=digest)
