"""One agent's rooms wired together, once: AgentNode, the tests' harness and the benchmarks all
build an agent here (state folder, mailbox, outbox and its log, client side, the phases, the
membership, the router with its identity, rejection log), serve it behind its Gatekeeper, and
(the harness, the benchmarks) place it in a run's phase II without the coordinator.

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

from agent.departure.subsystem import Departures
from agent.mailbox import Mailbox
from agent.membership import Membership, NoChanges
from agent.options import AgentOptions
from agent.outbox import Outbox, OutboxLog
from agent.peers import Peers
from agent.phases.phase_one import PhaseOne
from agent.phases.phase_two import PhaseTwo
from agent.phases.secure_sum import SecureSum
from agent.pipeline import place_in_phase_two
from agent.prepare import prepare
from agent.router import AgentService, Identity
from agent.session import Session, open_session
from agent.state import StateStore
from agent.status import Status
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
    outbox: Outbox
    peers: Peers
    rejections: RejectionLog
    phase_one: PhaseOne
    secure_sum: SecureSum
    phase_two: PhaseTwo
    membership: Membership
    service: AgentService
    session: Session | None = None  # the local runs' (AgentNode keeps its own)
    server: Server | None = None

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def address(self) -> str:
        assert self.server is not None, f"{self.name} is not served"
        return f"127.0.0.1:{self.server.port}"


def membership_for(options: AgentOptions, *, peers: Peers, mailbox: Mailbox,
                   store: StateStore) -> Membership:
    """The departure subsystem (agent/departure/), or NoChanges when departures are off
    (--departure-deadline 0)."""
    if options.departure_deadline == 0:
        return NoChanges(peers)
    return Departures(options=options, peers=peers, mailbox=mailbox, store=store)


def assemble(options: AgentOptions) -> AgentParts:
    """The rooms of the agent `options` describe, wired (nothing served, nothing assigned): the
    outbox logs to its state folder, each phase owns what comes in for it, the router hands
    it over and knows the key policy."""
    store = StateStore(options.state_folder)
    status, mailbox = Status(), Mailbox()
    outbox = Outbox(options.keep_rounds, OutboxLog(
        store.outbox_folder, keep=options.keep_rounds, segment=options.checkpoint_every))
    peers = Peers(options, mailbox, status.life)
    rejections = RejectionLog(log, options.name)
    phase_one = PhaseOne(name=options.name, peers=peers, mailbox=mailbox, store=store,
                         allow_insecure_keys=options.allow_insecure_keys)
    secure_sum = SecureSum(peers=peers, mailbox=mailbox, store=store)
    phase_two = PhaseTwo(options=options, peers=peers, mailbox=mailbox, outbox=outbox,
                         store=store, status=status)
    membership = membership_for(options, peers=peers, mailbox=mailbox, store=store)
    service = AgentService(
        identity=Identity(name=options.name, tls=options.tls is not None,
                          operator=options.operator,
                          allow_insecure_keys=options.allow_insecure_keys),
        phase_one=phase_one, secure_sum=secure_sum, phase_two=phase_two,
        membership=membership, outbox=outbox, status=status, rejections=rejections,
        waiting=lambda: set(mailbox.waiting_for) | set(peers.unacknowledged))
    return AgentParts(options=options, store=store, status=status, mailbox=mailbox,
                      outbox=outbox, peers=peers, rejections=rejections, phase_one=phase_one,
                      secure_sum=secure_sum, phase_two=phase_two, membership=membership,
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
            place_in_phase_two(parts.status.life, parts.phase_two, session, round_=round_)
            parts.session = session
        yield agents
    finally:
        for parts in agents.values():
            await parts.peers.close()
        for parts in agents.values():
            if parts.server is not None:
                await parts.server.stop(0)

