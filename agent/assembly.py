"""One agent's rooms wired together, once: AgentNode, the tests' harness and the benchmarks all
build an agent here (state folder, mailbox, outbox and its log, client side, servicer with its
identity, rejection log), serve it behind its Gatekeeper, and (the harness, the benchmarks)
place it in a run's phase II without the coordinator.

    parts = assemble(options)                      # nothing served, nothing assigned
    server = await serve(parts, options.listen)    # the Agent service, admitted by its gate
    async with local_agents(folder, config, run_id=..., assign=...) as agents: ...
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent.intake import Intake
from agent.mailbox import Mailbox
from agent.options import AgentOptions
from agent.outbox import Outbox, OutboxLog
from agent.peers import Peers
from agent.prepare import prepare
from agent.servicer import AgentService, Identity
from agent.session import Session, open_session
from agent.state import StateStore
from agent.status import Status
from efpsn.ledger import RoundLedger
from efpsn.params.config import RunConfig
from efpsn.wire.guard import RejectionLog, add_service
from efpsn.wire.net import Server, start_server
from efpsn.wire.records import Assignment
from efpsn.wire.tls import TlsConfig, generate_certificates
from efpsn.wire.v1 import agent_pb2

__all__ = ["AgentParts", "assemble", "local_agents", "serve"]

log = logging.getLogger("efpsn.agent")

# certificates the local runs issue besides the agents' (callers the tests play)
EXTRA_NAMES = ("coordinator", "intruder", "mallory", "ops")


@dataclass
class AgentParts:
    """One agent's rooms, wired: what AgentNode sequences and the harness drives."""

    options: AgentOptions
    store: StateStore
    status: Status
    mailbox: Mailbox
    intake: Intake
    outbox: Outbox
    peers: Peers
    rejections: RejectionLog
    service: AgentService
    session: Session | None = None  # the local runs' (AgentNode keeps its own)
    ledger: RoundLedger | None = None
    server: Server | None = None

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def address(self) -> str:
        assert self.server is not None, f"{self.name} is not served"
        return f"127.0.0.1:{self.server.port}"


def assemble(options: AgentOptions) -> AgentParts:
    """The rooms of the agent `options` describe, wired (nothing served, nothing assigned): the
    outbox logs to its state folder, the servicer knows the key policy."""
    store = StateStore(options.state_folder)
    status, mailbox = Status(), Mailbox()
    outbox = Outbox(options.keep_rounds, OutboxLog(
        store.outbox_folder, keep=options.keep_rounds, segment=options.checkpoint_every))
    peers = Peers(options, mailbox, status.life)
    rejections = RejectionLog(log, options.name)
    intake = Intake(life=status.life, mailbox=mailbox)
    service = AgentService(
        identity=Identity(name=options.name, tls=options.tls is not None,
                          operator=options.operator,
                          allow_insecure_keys=options.allow_insecure_keys),
        mailbox=mailbox, intake=intake, outbox=outbox, status=status, rejections=rejections,
        waiting=lambda: set(mailbox.waiting_for) | set(peers.unacknowledged))
    return AgentParts(options=options, store=store, status=status, mailbox=mailbox,
                      intake=intake, outbox=outbox, peers=peers, rejections=rejections,
                      service=service)


async def serve(parts: AgentParts, listen: str) -> Server:
    """Serve the agent's service on `listen` (mutual TLS when its options have it), every call
    admitted by its Gatekeeper before a byte of the body is read; reported SERVING."""
    opts = parts.options

    def add(server: grpc.aio.Server) -> list[str]:
        return [add_service(server, parts.service,
                            agent_pb2.DESCRIPTOR.services_by_name["Agent"])]

    server = await start_server(listen, add_servicers=add,
                                credentials=opts.tls.server_credentials() if opts.tls else None,
                                rejections=parts.rejections,
                                interceptors=[parts.service.gatekeeper()])
    await server.set_serving(True)
    parts.server = server
    return server


Assign = Callable[[RunConfig, Mapping[str, str]], Mapping[str, Assignment]]


@contextlib.asynccontextmanager
async def local_agents(folder: Path, config: RunConfig, *, run_id: str, assign: Assign,
                       names: Sequence[str] = ("agent1",), serve_names: Sequence[str] = ("agent1",),
                       tls: bool = True, round_: int = 0, keep_rounds: int = 128,
                       ports: Mapping[str, int] | None = None, new_certificates: bool = True,
                       ) -> AsyncIterator[dict[str, AgentParts]]:
    """Agents `names` of a run of `config` (resolved, as the coordinator announces it), each
    assembled here, in phase II at round `round_`. `assign(config, addresses)` gives every
    agent's assignment from every agent's address (the served ones at their real address, the
    others at `ports` or unused loopback ports); certificates in FOLDER/tls (new ones unless
    `new_certificates` is False)."""
    config = config.resolved()
    all_names = [f"agent{i}" for i in range(1, config.agents + 1)]
    ports = ports or {}
    tls_dir = folder / "tls"
    if tls and new_certificates:
        generate_certificates(tls_dir, [*all_names, *EXTRA_NAMES], overwrite=True)
    agents: dict[str, AgentParts] = {}
    try:
        for name in names:
            options = AgentOptions(name=name, listen=f"127.0.0.1:{ports.get(name, 0)}",
                                   coordinator="127.0.0.1:1",
                                   tls=TlsConfig.from_dir(tls_dir, name) if tls else None,
                                   results_dir=folder / "results", keep_rounds=keep_rounds)
            agents[name] = parts = assemble(options)
            if name in serve_names:
                await serve(parts, options.listen)
        addresses = {name: agents[name].address if name in agents and agents[name].server
                     else f"127.0.0.1:{ports.get(name, 40000 + i)}"
                     for i, name in enumerate(all_names, start=1)}
        assignments = assign(config, addresses)
        for name, parts in agents.items():
            session = await open_session(assignments[name], name=name,
                                         prepared=prepare(config, parts.options))
            ledger = RoundLedger(last=config.iterations.total, keep=keep_rounds, position=round_)
            parts.status.life.assign(session, ledger)  # as a restart at round_
            parts.status.life.optimizing(round_)
            parts.session, parts.ledger = session, ledger
        yield agents
    finally:
        for parts in agents.values():
            await parts.peers.close()
        for parts in agents.values():
            if parts.server is not None:
                await parts.server.stop(0)
