"""Client side of Agent.GetStatus and Coordinator.GetRunStatus: plain status records for
`efpsn up`, `efpsn status`, tests and monitors."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import grpc

from efpsn.wire.net import open_channel
from efpsn.wire.records import Phase  # not serde: torch-free, the launcher polls with this
from efpsn.wire.tls import TlsConfig
from efpsn.wire.v1 import agent_pb2, agent_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc


@dataclass(frozen=True)
class NeighbourView:
    """A neighbour as an agent sees it: where it is reached, and the seconds since the agent
    last let in one of its messages (None: never yet)."""

    name: str
    address: str
    heard_ago: float | None


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
    neighbour_count: int = 0
    departed_count: int = 0
    last_round: int = 0  # the run's last round as it stands there (0: before phase II)
    neighbours: tuple[NeighbourView, ...] = ()  # shown to the run's parties only
    departed: tuple[str, ...] = ()  # shown to the run's parties only

    @property
    def rounds_left(self) -> int | None:
        """Rounds to the run's last round as it stands (the stop rule may end it at an earlier
        check); None before phase II."""
        if self.phase not in (Phase.OPTIMIZE, Phase.DONE) or not self.last_round:
            return None
        return 0 if self.finished else max(0, self.last_round - self.round)


@dataclass(frozen=True)
class RunView:
    """What the coordinator tells about its run (names, addresses and departures only to the
    run's parties and its operator; others get the counts)."""

    run_id: str
    registered: int
    expected: int
    assigned: bool
    addresses: dict[str, str] = field(default_factory=dict)
    departed: tuple[str, ...] = ()


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
        waiting_for=tuple(s.waiting_for), neighbour_count=s.neighbour_count,
        departed_count=s.departed_count, last_round=s.last_round,
        neighbours=tuple(NeighbourView(v.name, v.address, v.heard_seconds_ago
                                       if v.heard_seconds_ago >= 0 else None)
                         for v in s.neighbours),
        departed=tuple(s.departed),
    )


async def fetch_run_view(address: str, *, tls: TlsConfig | None = None,
                         name: str = "coordinator", timeout: float = 2.0) -> RunView:
    """One GetRunStatus call to the coordinator at `address` (its certificate must carry
    `name`); ConnectionError naming the address and gRPC's reason when it does not answer."""
    async with _channel(name, address, tls) as channel:
        try:
            s = await coordinator_pb2_grpc.CoordinatorStub(channel).GetRunStatus(
                coordinator_pb2.RunStatusRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise ConnectionError(f"the coordinator at {address} did not answer: "
                                  f"{exc.code().name} {exc.details() or ''}".strip()) from None
    return RunView(run_id=s.run_id, registered=s.registered, expected=s.expected,
                   assigned=s.assigned, addresses=dict(sorted(s.addresses.items())),
                   departed=tuple(s.departed))


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
