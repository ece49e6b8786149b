"""In-process agents for tests and benchmarks, built only through public constructors: agents of a
registered run, each with its servicer, ledger, mailbox, outbox and client side, optionally
served on a loopback port, placed in phase II at a chosen round.

    async with assigned_agents(folder, config, serve=("agent1",), round_=5) as agents:
        a1 = agents["agent1"]            # its AgentService is served at a1.address
        await agents["agent2"].peers.send_round("agent1", 5, a1.round_message(...), timeout=5)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch

from agent.mailbox import Mailbox
from agent.options import AgentOptions
from agent.outbox import Outbox
from agent.peers import Peers
from agent.prepare import prepare
from agent.servicer import AgentService, Identity
from agent.session import Session, open_session
from agent.status import Status
from coordinator.registry import Registry
from efpsn.config import RunConfig
from efpsn.ledger import RoundLedger
from efpsn.wire.guard import RejectionLog, add_service
from efpsn.wire.net import Server, start_server
from efpsn.wire.records import Phase, make_header
from efpsn.wire.rounds import message_to_proto
from efpsn.wire.tls import TlsConfig, generate_certificates
from efpsn.wire.v1 import agent_pb2

__all__ = ["InProcessAgent", "assigned_agents", "round_message"]

EXTRA_NAMES = ("coordinator", "intruder", "mallory", "ops")


def round_message(*, run_id: str, sender: str, t: int, x: torch.Tensor,
                  **tensors: torch.Tensor) -> agent_pb2.RoundMessage:
    """A round message as a neighbour sends it ({"x": x} plus any other named tensors)."""
    return message_to_proto({"x": x, **tensors}, header=make_header(
        run_id=run_id, sender=sender, round=t, phase=Phase.OPTIMIZE))


@dataclass
class InProcessAgent:
    """One agent's rooms, assigned to a run and in phase II."""

    options: AgentOptions
    session: Session
    service: AgentService
    ledger: RoundLedger
    mailbox: Mailbox
    outbox: Outbox
    status: Status
    peers: Peers
    server: Server | None = None

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def address(self) -> str:
        assert self.server is not None, f"{self.name} is not served"
        return f"127.0.0.1:{self.server.port}"

    def message(self, t: int, *, sender: str, value: float = 1.0) -> agent_pb2.RoundMessage:
        """A valid round-t message from `sender` to this agent (every entry value + t)."""
        tensors = {k: torch.full(shape, value + t, dtype=torch.float64)
                   for k, shape in self.session.message_shapes.items()}
        return message_to_proto(tensors, header=make_header(
            run_id=self.session.run_id, sender=sender, round=t, phase=Phase.OPTIMIZE))


async def _serve(service: AgentService, options: AgentOptions,
                 rejections: RejectionLog) -> Server:
    def add(server: grpc.aio.Server) -> list[str]:
        return [add_service(server, service, agent_pb2.DESCRIPTOR.services_by_name["Agent"])]

    server = await start_server(options.listen, add_servicers=add,
                                credentials=options.tls.server_credentials() if options.tls
                                else None, rejections=rejections)
    await server.set_serving(True)
    return server


@contextlib.asynccontextmanager
async def assigned_agents(folder: Path, config: RunConfig, *, run_id: str,
                          names: Sequence[str] = ("agent1",), serve: Sequence[str] = ("agent1",),
                          tls: bool = True, round_: int = 0, keep_rounds: int = 128,
                          ports: Mapping[str, int] | None = None, new_certificates: bool = True,
                          ) -> AsyncIterator[dict[str, InProcessAgent]]:
    """Agents `names` of a run of `config` (every agent registered: the served ones at their
    real address, the others at unused loopback ports), each in phase II at round `round_`
    (the run as the coordinator announces it: resolved). `ports`: fixed loopback ports by name
    (agents in other processes: theirs), with the certificates already in FOLDER/tls when
    `new_certificates` is False."""
    config = config.resolved()
    all_names = [f"agent{i}" for i in range(1, config.agents + 1)]
    ports = ports or {}
    tls_dir = folder / "tls"
    if tls and new_certificates:
        generate_certificates(tls_dir, [*all_names, *EXTRA_NAMES], overwrite=True)
    parts: dict[str, tuple[AgentOptions, AgentService, Mailbox, Outbox, Status, Peers]] = {}
    servers: dict[str, Server] = {}
    try:
        for name in names:
            options = AgentOptions(name=name, listen=f"127.0.0.1:{ports.get(name, 0)}",
                                   coordinator="127.0.0.1:1",
                                   tls=TlsConfig.from_dir(tls_dir, name) if tls else None,
                                   results_dir=folder / "results", keep_rounds=keep_rounds)
            mailbox, outbox, status = Mailbox(), Outbox(keep_rounds), Status()
            peers = Peers(options, mailbox)
            rejections = RejectionLog(logging.getLogger("efpsn.agent"), name)
            service = AgentService(
                identity=Identity(name=name, tls=tls, operator=options.operator),
                mailbox=mailbox, outbox=outbox, status=status, rejections=rejections,
                waiting=lambda mb=mailbox: set(mb.waiting_for))
            parts[name] = (options, service, mailbox, outbox, status, peers)
            if name in serve:
                servers[name] = await _serve(service, options, rejections)
        registry = Registry(config, run_id=run_id, expected_names=set(all_names))
        for i, name in enumerate(all_names, start=1):
            at = (f"127.0.0.1:{servers[name].port}" if name in servers
                  else f"127.0.0.1:{ports.get(name, 40000 + i)}")
            registry.register(name, at)
        agents = {}
        for name, (options, service, mailbox, outbox, status, peers) in parts.items():
            session = await open_session(registry.assignments()[name], name=name,
                                         prepared=prepare(config, options))
            ledger = RoundLedger(last=config.iterations.total, keep=keep_rounds, position=round_)
            service.attach(session, ledger)
            peers.attach(session, ledger)
            status.phase, status.round = Phase.OPTIMIZE, round_
            agents[name] = InProcessAgent(options=options, session=session, service=service,
                                          ledger=ledger, mailbox=mailbox, outbox=outbox,
                                          status=status, peers=peers, server=servers.get(name))
        yield agents
    finally:
        for _, _, _, _, _, peers in parts.values():
            await peers.close()
        for server in servers.values():
            await server.stop(0)
