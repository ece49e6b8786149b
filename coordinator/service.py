"""The coordinator's gRPC service: registration until the run is complete, then status only."""

from __future__ import annotations

import asyncio
import logging
import uuid

import grpc

from coordinator.departures import DepartureBoard, Refused, Report
from coordinator.joins import JoinBoard, JoinRefused
from coordinator.registry import Declaration, NotExpected, Registry, RunCancelled, default_names
from efpsn.departure.joins import join_reconfiguration
from efpsn.departure.membership import Reconfiguration
from efpsn.optimize.stopping import StopRule
from efpsn.params.config import RunConfig
from efpsn.wire import limits, records
from efpsn.wire.guard import Admission, Gatekeeper, Reject, RejectionLog, add_service, guarded
from efpsn.wire.net import Server, install_stop_signals, start_server, write_port_file
from efpsn.wire.tls import TlsConfig, caller_names
from efpsn.wire.v1 import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger("efpsn.coordinator")
SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name


class CoordinatorService(coordinator_pb2_grpc.CoordinatorServicer):
    """Holds Register calls open until every agent has registered, then answers them all.

    Under mutual TLS (tls_required) a caller may only register under a name in its client
    certificate, and only expected names are accepted at all; refusals are counted
    (GetRunStatus.rejections) and logged.
    """

    def __init__(self, registry: Registry, *, register_timeout: float,
                 tls_required: bool = False, operator_names: frozenset[str] = frozenset()
                 ) -> None:
        self.registry = registry
        self.register_timeout = register_timeout
        self.tls_required = tls_required
        # who sees the run id, names and rejections in GetRunStatus besides expected agents:
        # the coordinator's own certificate names (its operator)
        self.operator_names = operator_names
        self.settled = asyncio.Event()  # complete, or cancelled
        self.answered: set[str] = set()  # agents that received their assignment
        self.done = asyncio.Event()  # every agent has its assignment, or the run is cancelled
        self.rejections = RejectionLog(log, "coordinator")
        self.board: DepartureBoard | None = None  # phase II's departures, once assigned
        self._decision = asyncio.Event()  # set (and replaced) at every decision
        # seats that join later: the members' polls and the joins (coordinator/joins.py)
        self.joins = JoinBoard(members=set()) if registry.late else None

    def _authenticate(self, context: grpc.aio.ServicerContext, name: str) -> None:
        if not self.tls_required:
            return
        names = caller_names(context)
        if not names:
            raise Reject(grpc.StatusCode.UNAUTHENTICATED,
                         "the coordinator requires mutual TLS: no client certificate")
        if name not in names:
            shown = name if len(name) <= 64 else name[:64] + "..."
            raise Reject(grpc.StatusCode.PERMISSION_DENIED,
                         f"the caller's certificate is for {sorted(names)}; it cannot register "
                         f"as {shown!r}")

    def gatekeeper(self) -> Gatekeeper:
        """This service's admission, for its server's interceptors (efpsn.wire.guard)."""
        return Gatekeeper(SERVICE, self.admit, rejections=self.rejections)

    def admit(self, method: str, context: grpc.aio.ServicerContext) -> Admission:
        """The Coordinator service's gate, before the body is read: under mutual TLS a Register
        caller's certificate must name an expected agent (efpsn.wire.guard.Gatekeeper); bodies
        are small."""
        if method == "Register" and self.tls_required:
            names = caller_names(context)
            if not names:
                raise Reject(grpc.StatusCode.UNAUTHENTICATED,
                             "the coordinator requires mutual TLS: no client certificate")
            expected = self.registry.expected_names
            if expected is not None and not names & expected:
                raise Reject(grpc.StatusCode.PERMISSION_DENIED,
                             f"the caller's certificate is for {sorted(names)[:4]}, not an "
                             "agent this run expects")
        if method == "Register":
            return Admission(limits.COORDINATOR_RECEIVE_BYTES)
        return Admission(limits.SMALL_REQUEST_BYTES)

    @guarded
    async def Register(
        self, request: coordinator_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.Assignment:
        self._authenticate(context, request.name)
        declaration = Declaration(
            input_shape=request.input_shape, classes=request.classes,
            model_fingerprint=request.model_fingerprint, failure=request.failure,
        )
        try:
            self.registry.register(request.name, request.address, declaration)
        except NotExpected as exc:
            raise Reject(grpc.StatusCode.PERMISSION_DENIED, str(exc)) from None
        except RunCancelled as exc:
            self.settled.set()  # release every held Register call with the reason
            log.error("run %s cancelled: %s", self.registry.run_id, exc)
            raise self._cancelled() from None
        log.info("registered %s at %s (%d/%d)", request.name, request.address,
                 len(self.registry.addresses), self.registry.config.agents)
        if self.registry.complete:
            self.settled.set()
        remaining = context.time_remaining()
        timeout = self.register_timeout if remaining is None else min(remaining, self.register_timeout)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            async with asyncio.timeout(max(0.0, timeout)):
                await self.settled.wait()
        except TimeoutError:
            have = sorted(self.registry.addresses)
            raise Reject(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"only {len(have)} of {self.registry.config.agents} agents registered "
                f"({', '.join(have)}) before the registration deadline",
            ) from None
        if self.registry.cancelled is not None:
            raise self._cancelled()
        self.answered.add(request.name)
        if len(self.answered) == self.registry.config.agents:
            self.done.set()
        return records.assignment_to_proto(self.registry.assignments()[request.name])

    def _cancelled(self) -> Reject:
        """The refusal of a cancelled run, naming (as trailing metadata) the agent that caused
        it; the run is over for this coordinator."""
        self.done.set()
        return Reject(grpc.StatusCode.FAILED_PRECONDITION, self.registry.cancelled or "",
                      metadata=((records.CANCELLED_BY, self.registry.cancelled_by),))

    @guarded
    async def ReportSilence(
        self, request: coordinator_pb2.SilenceReport, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.Departures:
        """Held until the departure is decided (coordinator/departures.py) or the deadline."""
        self._authenticate(context, request.sender)
        if not self.registry.complete or request.run_id != self.registry.run_id:
            raise Reject(grpc.StatusCode.FAILED_PRECONDITION,
                         f"no report for run {request.run_id[:64]!r}: this coordinator "
                         f"bootstraps run {self.registry.run_id}")
        board = self._departures()
        if request.finished:  # it stopped on the certificate: accounted for, answered at once
            try:
                if board.finish(request.sender, int(request.finished),
                                capped=request.capped):
                    self._announce()
            except Refused as exc:
                self._announce()
                raise Reject(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
            log.info("%s finished at round %d %s", request.sender, request.finished,
                     "(its cap)" if request.capped else "on the stop rule's certificate")
            return self._decisions(request.sender, int(request.epoch))
        report = Report(request.sender, int(request.round), frozenset(request.silent),
                        int(request.epoch), phase_one=request.phase_one, last=int(request.last))
        decided = False
        try:
            try:
                if board.report(report):
                    self._announce()
            except Refused as exc:
                self._announce()  # a contradiction stops every waiting agent too
                raise Reject(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
            log.warning("%s misses %s at round %d", report.sender,
                        ", ".join(sorted(report.silent)) or "nobody", report.round)
            remaining = context.time_remaining()  # the agent's deadline, at most ours
            async with asyncio.timeout(self.register_timeout if remaining is None
                                       else min(remaining, self.register_timeout)):
                while board.epoch <= report.epoch and board.failure is None:
                    await self._decision.wait()
            if board.epoch <= report.epoch:
                raise Reject(grpc.StatusCode.FAILED_PRECONDITION, board.failure or "")
            decided = True
        except TimeoutError:
            raise Reject(grpc.StatusCode.DEADLINE_EXCEEDED,
                         "no departure decided before the deadline: not every agent still in "
                         "the run reported a silent neighbour") from None
        finally:
            if not decided:
                board.withdraw(request.sender)
        return self._decisions(request.sender, report.epoch)

    def _departures(self) -> DepartureBoard:
        """The departure board, made at the first report (seats by index; those that have not
        joined yet are no part of the run)."""
        if self.board is None:
            registry = self.registry
            seats = registry.seats
            self.board = DepartureBoard(
                seats, iterations=registry.config.iterations.count or 0, graph=registry.graph,
                extend=self._extended_cap,
                absent={seats.index(n) for n in registry.late - set(registry.joined)})
        return self.board

    @guarded
    async def Join(
        self, request: coordinator_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.Assignment:
        """A late seat's party asks to join: checked, decided (coordinator/joins.py), answered
        with its assignment at the join's round."""
        self._authenticate(context, request.name)
        registry, joins = self.registry, self.joins
        if joins is None:
            raise Reject(grpc.StatusCode.FAILED_PRECONDITION,
                         f"run {registry.run_id} has no seat that joins later (--late-seats)")
        declaration = Declaration(input_shape=request.input_shape, classes=request.classes,
                                  model_fingerprint=request.model_fingerprint,
                                  failure=request.failure)
        self._start_members()
        board = self._departures()  # before the seat is taken: absent until it joins
        try:
            if any(n == request.name for _, _, n in joins.decided):  # restarted before the
                registry.seat_of(request.name, request.address, declaration)  # answer came
                return self._join_assignment(request.name)
            index = registry.seat_of(request.name, request.address, declaration)
            pending = [d.rebase_round for d in board.decided if d.stopped is None
                       and d.capped is None and d.rebase_round > joins.furthest]
            last = board.iterations or registry.config.iterations.total
            join = joins.decide(index, pending_until=max(pending, default=None),
                                last=last)
            members = [i for i, n in enumerate(registry.seats) if n not in board.gone
                       and i not in board.absent and i != index]
            recon = join_reconfiguration(board.graph, members=members, join=join,
                                         topology=registry.config.topology,
                                         seed=registry.config.seed)
        except (NotExpected, ValueError) as exc:
            raise Reject(grpc.StatusCode.FAILED_PRECONDITION,
                         f"{request.name} cannot join run {registry.run_id}: {exc}") from None
        registry.take_seat(request.name, request.address, declaration)
        board.joined(index, recon.graph)
        joins.record(join, request.name, graph=recon, last=last)
        log.warning("run %s: %s joins at round %d (neighbours %s)", registry.run_id,
                    request.name, join.round,
                    ", ".join(registry.seats[j] for j in recon.graph.neighbours(index)))
        return self._join_assignment(request.name)

    def _start_members(self) -> None:
        """The members of the run as it started (once it is complete), for the join board."""
        assert self.joins is not None
        if not self.joins.members and self.registry.complete:
            self.joins.members.update(self.registry.seats[i]
                                      for i in self.registry.config.starting_members)

    def _join_assignment(self, name: str) -> coordinator_pb2.Assignment:
        """A joiner's assignment at its join's round (records.Assignment: its neighbours and
        weights then, the members' graph)."""
        assert self.joins is not None
        registry = self.registry
        epoch, join = next((e, j) for e, j, n in self.joins.decided if n == name)
        recon = self.joins.graphs[join.agent]
        seats, i = registry.seats, join.agent
        peers = tuple(records.Peer(name=seats[j], index=j, address=registry.addresses[seats[j]],
                                   weight=float(recon.weights[i, j]))
                      for j in recon.graph.neighbours(i))
        return records.assignment_to_proto(records.Assignment(
            run_id=registry.run_id, index=i, name=name, neighbours=peers,
            self_weight=float(recon.weights[i, i]), num_agents=registry.config.agents,
            members=tuple(seats), join_round=join.round, join_epoch=epoch,
            edges=recon.graph.edges, join_cap=self.joins.caps[join.agent]))

    @guarded
    async def PollMembership(
        self, request: coordinator_pb2.MembershipPoll, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.MembershipNews:
        """A member before stepping a check round: the joins it does not know yet."""
        self._authenticate(context, request.sender)
        registry, joins = self.registry, self.joins
        if joins is None or not registry.complete or request.run_id != registry.run_id:
            raise Reject(grpc.StatusCode.FAILED_PRECONDITION,
                         f"no membership for run {request.run_id[:64]!r} here")
        self._start_members()
        try:
            joins.poll(request.sender, int(request.round), finished=request.finished)
        except JoinRefused as exc:
            raise Reject(grpc.StatusCode.PERMISSION_DENIED, str(exc)) from None
        news = []
        for epoch, join, name in joins.decided[int(request.known):]:
            news.append(coordinator_pb2.JoinNews(
                name=name, index=join.agent, round=join.round,
                address=registry.addresses[name], epoch=epoch, cap=joins.caps[join.agent],
                edges=[coordinator_pb2.Edge(a=a, b=b)
                       for a, b in joins.graphs[join.agent].graph.edges],
                ends=[coordinator_pb2.Peer(name=registry.seats[i], index=i,
                                           address=registry.addresses[registry.seats[i]])
                      for i in sorted({i for e in joins.graphs[join.agent].new_edges
                                       for i in e})]))
        return coordinator_pb2.MembershipNews(run_id=registry.run_id, joins=news)

    def _decisions(self, sender: str, epoch: int) -> coordinator_pb2.Departures:
        """Every departure decided (when `sender` lacks some: it applied `epoch` of them) and
        `sender`'s new neighbours."""
        board = self.board
        assert board is not None
        return coordinator_pb2.Departures(
            run_id=self.registry.run_id, epoch=board.epoch,
            departed=[coordinator_pb2.Departed(
                agent=board.names[d.agent], round=d.round, rebase_round=d.rebase_round,
                late=[board.names[j] for j in d.late], index=d.agent, late_index=d.late,
                phase_one=d.phase_one, stopped=d.stopped or 0, capped=d.capped or 0)
                for d in board.since(epoch)],
            joining=[coordinator_pb2.Peer(name=board.names[j], index=j,
                                          address=self.registry.addresses[board.names[j]])
                     for j in board.joining(sender, epoch)])

    def _extended_cap(self, recon: Reconfiguration, origin: int, cap: int) -> int:
        """The cap the agents take at a re-base round (efpsn/optimize/stopping.py,
        StopRule.rebased): the same public numbers here, so a later departure is judged against
        it."""
        try:
            return StopRule.rebased(self.registry.config, recon.remaining_weights(),
                                    origin=origin, until=None, cap=cap).cap
        except ValueError:  # --scale standard: the L2 weight is the agents' (secure sum)
            return cap  # the reporters give theirs (Report.last)

    def _announce(self) -> None:
        """Wake every held ReportSilence call (a decision, or a contradiction)."""
        assert self.board is not None
        if self.board.decided and self.board.failure is None:
            log.warning("run %s: departures decided: %s", self.registry.run_id,
                        "; ".join(d.label() for d in self.board.decided))
        event, self._decision = self._decision, asyncio.Event()
        event.set()

    @guarded
    async def GetRunParameters(
        self, request: coordinator_pb2.RunParametersRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.RunParameters:
        """The public run parameters: an agent loads and checks its data and model first."""
        return records.run_parameters_to_proto(self.registry.config.to_dict())

    @guarded
    async def GetRunStatus(
        self, request: coordinator_pb2.RunStatusRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.RunStatus:
        names = sorted(self.registry.addresses)
        status = coordinator_pb2.RunStatus(registered=len(names),
                                           expected=self.registry.config.agents,
                                           assigned=self.registry.complete)
        if self.tls_required:
            caller = caller_names(context) or frozenset()
            insiders = set(self.registry.expected_names or ()) | self.operator_names
            if not caller & insiders:
                return status  # counts only: run id and names are for the run's members
        status.run_id = self.registry.run_id
        status.names.extend(names)
        status.rejections.update(self.rejections.counts)
        status.addresses.update(self.registry.addresses)  # where `efpsn status` asks each agent
        if self.board is not None:
            status.departed.extend(self.board.names[d.agent] for d in self.board.decided)
        return status


async def serve(
    config: RunConfig,
    *,
    listen: str,
    run_id: str | None = None,
    port_file: str | None = None,
    register_timeout: float = 600.0,
    expected_names: set[str] | None = None,
    tls: TlsConfig | None = None,
    stop: asyncio.Event | None = None,
    linger: float | None = 10.0,
    final: bool = False,
) -> None:
    """Serve until stopped (SIGINT/SIGTERM or `stop`), or `linger` seconds after the run's
    bootstrap ended (every agent has its assignment, or the run was cancelled): the agents
    never need the coordinator again. linger=None serves until stopped.

    expected_names defaults to agent1..agentN; tls=None serves plaintext (--insecure); final:
    the process ends with this call and ignores stop signals once one has come
    (efpsn.wire.net.install_stop_signals)."""
    registry = Registry(config, run_id=run_id or uuid.uuid4().hex[:16],
                        expected_names=expected_names or default_names(config.agents))
    service = CoordinatorService(registry, register_timeout=register_timeout,
                                 tls_required=tls is not None,
                                 operator_names=tls.names if tls is not None else frozenset())

    def add(server: grpc.aio.Server) -> list[str]:
        return [add_service(server, service,
                            coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"])]

    server: Server = await start_server(
        listen, add_servicers=add, credentials=tls.server_credentials() if tls else None,
        max_receive_bytes=limits.COORDINATOR_RECEIVE_BYTES, rejections=service.rejections,
        interceptors=[service.gatekeeper()],
    )
    await server.set_serving(True)
    write_port_file(port_file, server.port)
    log.info("coordinator for run %s listening on port %d (%s), expecting %d agents (%s): %s",
             registry.run_id, server.port, "mutual TLS" if tls else "PLAINTEXT, --insecure",
             config.agents, config.topology, ", ".join(sorted(registry.expected_names or ())))
    stop = stop or asyncio.Event()
    install_stop_signals(stop, what="coordinator", final=final)
    try:
        if linger is None:
            await stop.wait()
        else:
            await _until_done(stop, service, linger=linger)
    finally:
        await server.stop(grace=0.5)


async def _until_done(stop: asyncio.Event, service: CoordinatorService, *, linger: float) -> None:
    """Until `stop`, or `linger` seconds after the service is done (then say so)."""
    stopped = asyncio.ensure_future(stop.wait())
    done = asyncio.ensure_future(service.done.wait())
    try:
        await asyncio.wait({stopped, done}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            return
        outcome = ("cancelled: " + (service.registry.cancelled or "")
                   if service.registry.cancelled else "every agent has its assignment")
        log.info("run %s: bootstrap over (%s); exiting in %.0fs", service.registry.run_id,
                 outcome, linger)
        try:
            async with asyncio.timeout(linger):
                await stop.wait()
        except TimeoutError:
            pass
    finally:
        stopped.cancel()
        done.cancel()
