"""Client side of Agent.GetStatus: plain status records for `efpsn up`, tests and monitors."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import grpc

from efpsn.wire.net import open_channel
from efpsn.wire.records import Phase  # not serde: torch-free, the launcher polls with this
from efpsn.wire.tls import TlsConfig
from efpsn.wire.v1 import agent_pb2, agent_pb2_grpc


@dataclass(frozen=True)
class AgentStatus:
    run_id: str
    name: str
    phase: Phase
    round: int
    total_rounds: int
    loss: float
    accuracy: float
    error: str
    finished: bool
    rejections: dict[str, int] = field(default_factory=dict)
    resumed_from_round: int | None = None
    waiting_for: tuple[str, ...] = ()  # neighbours it waits for (shown to neighbours, operator)


def _channel(name: str, address: str, tls: TlsConfig | None) -> grpc.aio.Channel:
    if tls is None:
        return open_channel(address)
    return open_channel(address, credentials=tls.channel_credentials(), server_name=name)


async def fetch_status(
    name: str, address: str, *, timeout: float = 1.0, tls: TlsConfig | None = None
) -> AgentStatus | None:
    """One GetStatus call; None when the agent does not answer (not started, gone).

    With mutual TLS the caller presents `tls`'s certificate and checks the agent's certificate
    against `name`. Only the agent's operator (by default the agent's own certificate) sees
    loss, accuracy, run id and rejections; any other certificate gets liveness (NaN figures)."""
    async with _channel(name, address, tls) as channel:
        return await _get_status(channel, name, timeout=timeout)


async def _get_status(channel: grpc.aio.Channel, name: str, *, timeout: float
                      ) -> AgentStatus | None:
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
        run_id=s.run_id, name=s.name or name, phase=phase, round=s.round,
        total_rounds=s.total_rounds,
        loss=s.loss if math.isfinite(s.loss) else math.nan,
        accuracy=s.accuracy if math.isfinite(s.accuracy) else math.nan,
        error=s.error, finished=s.finished, rejections=dict(s.rejections),
        resumed_from_round=s.resumed_from_round if s.HasField("resumed_from_round") else None,
        waiting_for=tuple(s.waiting_for),
    )


class StatusPoller:
    """Polls agents' status again and again over channels kept open between polls (one TLS
    handshake per agent and run, not one per poll); each agent as its operator (tls[name])."""

    def __init__(self, tls: dict[str, TlsConfig] | None = None, *, timeout: float = 1.0) -> None:
        self._tls = tls
        self._timeout = timeout
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}

    async def poll(self, addresses: dict[str, str]) -> dict[str, AgentStatus]:
        """GetStatus on every agent concurrently; agents that do not answer are absent."""
        pairs = await asyncio.gather(*(
            _get_status(self._channel(n, a), n, timeout=self._timeout)
            for n, a in addresses.items()))
        return {s.name: s for s in pairs if s is not None}

    def _channel(self, name: str, address: str) -> grpc.aio.Channel:
        key = (name, address)
        if key not in self._channels:
            self._channels[key] = _channel(name, address, self._tls[name] if self._tls else None)
        return self._channels[key]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


async def fetch_statuses(
    addresses: dict[str, str], *, tls: dict[str, TlsConfig] | None = None
) -> dict[str, AgentStatus]:
    """GetStatus on every agent concurrently, each as its operator (tls[name], e.g. the
    agent's own certificate); agents that do not answer are absent."""
    pairs = await asyncio.gather(*(fetch_status(n, a, tls=tls[n] if tls else None)
                                   for n, a in addresses.items()))
    return {s.name: s for s in pairs if s is not None}
