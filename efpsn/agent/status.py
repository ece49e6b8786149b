"""Client side of Agent.GetStatus: plain status records for launchers and monitors."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import grpc

from efpsn.net import open_channel
from efpsn.wire.serde import Phase
from efpsn.wire.v1 import agent_pb2, agent_pb2_grpc


@dataclass(frozen=True)
class AgentStatus:
    name: str
    phase: Phase
    round: int
    total_rounds: int
    loss: float
    accuracy: float
    error: str
    finished: bool


async def fetch_status(name: str, address: str, *, timeout: float = 1.0) -> AgentStatus | None:
    """One GetStatus call; None when the agent does not answer (not started, gone)."""
    async with open_channel(address) as channel:
        try:
            s = await agent_pb2_grpc.AgentStub(channel).GetStatus(
                agent_pb2.StatusRequest(), timeout=timeout
            )
        except grpc.aio.AioRpcError:
            return None
    try:
        phase = Phase(s.phase)
    except ValueError:
        phase = Phase.PHASE_UNSPECIFIED
    return AgentStatus(
        name=s.name or name, phase=phase, round=s.round, total_rounds=s.total_rounds,
        loss=s.loss if math.isfinite(s.loss) else math.nan,
        accuracy=s.accuracy if math.isfinite(s.accuracy) else math.nan,
        error=s.error, finished=s.finished,
    )


async def fetch_statuses(addresses: dict[str, str]) -> dict[str, AgentStatus]:
    """GetStatus on every agent concurrently; agents that do not answer are absent."""
    pairs = await asyncio.gather(*(fetch_status(n, a) for n, a in addresses.items()))
    return {s.name: s for s in pairs if s is not None}
