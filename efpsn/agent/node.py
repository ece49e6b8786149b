"""One EFPSN agent as a gRPC service: register, phase I with neighbours, phase II rounds, results.

Crash safety: the assignment is saved before phase I, the mask before phase II, and the phase II
state every `checkpoint_every` rounds (efpsn/agent/state.py). An agent restarted with the same
command reloads all of it (it never redraws its mask and never calls the coordinator again),
rebinds the port it advertised, and replays the rounds since its checkpoint: its neighbours keep
their last `keep_rounds` outboxes and serve them through Agent.GetRound, and since batches are a
pure function of (seed, agent, round) the replay recomputes bit-identical iterates.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from efpsn import paillier
from efpsn.agent.mailbox import Mailbox, NeighbourTimeout
from efpsn.agent.state import Checkpoint, SavedAssignment, StateError, StateStore
from efpsn.algorithms import AgentState, Message, StepContext, make_algorithm
from efpsn.cli_common import write_json
from efpsn.config import RunConfig
from efpsn.masking import MaskCoefficients, Masker, independent_mask, noise_generator
from efpsn.net import (
    Reject,
    RejectionLog,
    Server,
    add_service,
    call_with_retry,
    guarded,
    open_channel,
    split_address,
    start_server,
    write_port_file,
)
from efpsn.problem import Problem, build_problem
from efpsn.schedules import make_schedule
from efpsn.tls import TlsConfig, caller_names
from efpsn.wire import serde
from efpsn.wire.serde import Phase, WireError
from efpsn.wire.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
)

log = logging.getLogger("efpsn.agent")

StatusCode = grpc.StatusCode


class AgentFailure(RuntimeError):
    """The run cannot go on at this agent (a neighbour failed, timed out or misbehaved)."""


@dataclass(frozen=True, kw_only=True)
class AgentOptions:
    """How this agent runs; the run's parameters come from the coordinator."""

    name: str
    listen: str
    coordinator: str
    advertise: str | None = None  # host:port neighbours dial; default: listen host + bound port
    results_dir: Path = Path("results")
    register_timeout: float = 600.0
    port_file: str | None = None
    # Mutual TLS (None: plaintext, only with an explicit --insecure). The certificate must name
    # this agent; peers are verified against their agent names, the coordinator against
    # coordinator_name.
    tls: TlsConfig | None = None
    coordinator_name: str = "coordinator"
    # Crash safety: state folder (default RESULTS/NAME/state), checkpoint interval, and how many
    # recent outboxes to keep for neighbours that restart (must exceed checkpoint_every + 2 at
    # every agent of the run).
    state_dir: Path | None = None
    checkpoint_every: int = 50
    keep_rounds: int = 128
    # Test and debugging hooks. Both break privacy; never use them in a real deployment.
    insecure_noise_seed: int | None = None  # reproducible noise (to compare with the simulator)
    debug_expose_mask: bool = False  # write this agent's mask numerators into result.json
    allow_insecure_keys: bool = False  # accept Paillier keys below 2048 bits

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.keep_rounds < self.checkpoint_every + 3:
            raise ValueError(
                f"keep_rounds ({self.keep_rounds}) must exceed checkpoint_every + 2 "
                f"({self.checkpoint_every + 2}): a neighbour restarted from its last checkpoint "
                "replays up to checkpoint_every + 2 rounds from our history"
            )
        if self.tls is not None:
            self.tls.require_name(self.name)

    @property
    def state_folder(self) -> Path:
        return self.state_dir or Path(self.results_dir) / self.name / "state"


@dataclass
class Session:
    """What the agent knows once assigned: the run, its neighbours and the public problem."""

    assignment: serde.Assignment
    config: RunConfig
    problem: Problem
    names: dict[int, str]  # neighbour index -> name
    addresses: dict[str, str]  # neighbour name -> host:port
    message_shapes: dict[str, tuple[int, ...]]  # what a round message must carry

    @property
    def run_id(self) -> str:
        return self.assignment.run_id

    @property
    def index(self) -> int:
        return self.assignment.index

    @property
    def neighbour_names(self) -> frozenset[str]:
        return frozenset(self.addresses)

    def weights(self) -> dict[int, float]:
        out = {self.index: self.assignment.self_weight}
        out.update({p.index: p.weight for p in self.assignment.neighbours})
        return out


@dataclass
class Status:
    phase: Phase = Phase.PHASE_UNSPECIFIED
    round: int = 0
    loss: float = math.nan
    accuracy: float = math.nan
    error: str = ""
    finished: bool = False


def _short(text: str, limit: int = 64) -> str:
    """repr of (the start of) an untrusted string, for error messages."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _within_run(round_: int, session: Session) -> int:
    """The round, if the run has it (rounds 0..iterations); WireError otherwise."""
    last = session.config.iterations
    if round_ > last:
        raise WireError(f"round {round_} is beyond the run's last round {last}")
    return round_


class AgentService(agent_pb2_grpc.AgentServicer):
    """The gRPC edge: authenticate, validate, decode, drop into the mailbox.

    Every handler checks, before it touches any state: the caller's certificate names the
    claimed sender (mutual TLS), the sender is a neighbour, run id, phase and round window, and
    the payload (shapes, dtypes, finiteness; key size; ciphertext range and key fingerprint). A
    duplicate must repeat the first copy exactly. Refusals are counted (GetStatus.rejections)
    and logged; no exception escapes as UNKNOWN (efpsn.net.guarded).
    """

    def __init__(self, node: AgentNode) -> None:
        self.node = node
        self.rejections = node.rejections

    # ---------------------------------------------------------------- checks

    def _authenticate(self, context: grpc.aio.ServicerContext, claimed: str) -> None:
        """Under mutual TLS the claimed sender must be a name in the caller's certificate."""
        if self.node.options.tls is None:
            return
        names = caller_names(context)
        if not names:
            raise Reject(StatusCode.UNAUTHENTICATED,
                         "this agent requires mutual TLS: the call carries no client certificate")
        if claimed not in names:
            raise Reject(
                StatusCode.PERMISSION_DENIED,
                f"the caller's certificate is for {sorted(names)}, but the message claims to "
                f"come from {_short(claimed)}",
            )

    def _session(self) -> Session:
        session = self.node.session
        if session is None:
            # Not assigned (or not restored) yet: the sender retries UNAVAILABLE with backoff.
            raise Reject(StatusCode.UNAVAILABLE, "agent not assigned to a run yet")
        return session

    def _check_header(
        self, header: common_pb2.Header, context: grpc.aio.ServicerContext, phase: Phase,
        *, round_: int | None = None,
    ) -> tuple[Session, serde.Header]:
        if not isinstance(header, common_pb2.Header):
            raise TypeError(f"expected efpsn.v1.Header, got {type(header).__name__}")
        self._authenticate(context, header.sender)
        s = self._session()
        if header.sender not in s.neighbour_names:
            raise Reject(
                StatusCode.PERMISSION_DENIED,
                f"sender {_short(header.sender)} is not a neighbour of {self.node.options.name} "
                f"in run {s.run_id} (neighbours: {', '.join(sorted(s.neighbour_names))})",
            )
        parsed = serde.validate_header(header, run_id=s.run_id, phase=phase, round=round_)
        return s, parsed

    def _late_phase_one(self, kind: str, sender: str, digest: bytes) -> common_pb2.Ack | None:
        """After a restart phase I is over: a retry of a message the previous process received
        (its ack may have been lost in the crash) is acknowledged if it is identical to what was
        received, as recorded next to the saved mask; anything else is refused."""
        if not self.node.phase_one_restored:
            return None
        if self.node.mailbox.digest(kind, 0, sender) != digest:
            raise Reject(StatusCode.FAILED_PRECONDITION,
                         f"phase I is over at this agent (it resumed from its saved mask), and "
                         f"this {kind} message is not the one it received from {sender}")
        return common_pb2.Ack(accepted=True, detail="duplicate of a phase I message")

    # ---------------------------------------------------------------- phase I

    @guarded
    async def PutPublicKey(
        self, request: agent_pb2.PublicKeyMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        _, header = self._check_header(request.header, context, Phase.KEYS, round_=0)
        n = serde.public_key_from_proto(request.key)
        late = self._late_phase_one("key", header.sender, serde.key_fingerprint(n))
        if late is not None:
            return late
        key = paillier.public_key_from_n(n)
        paillier.check_key_size(key, allow_insecure=self.node.options.allow_insecure_keys)
        fresh = self.node.mailbox.put("key", 0, header.sender, key, serde.key_fingerprint(n))
        return common_pb2.Ack(accepted=True, detail="" if fresh else "duplicate ignored")

    @guarded
    async def PutShares(
        self, request: agent_pb2.SharesMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        s, header = self._check_header(request.header, context, Phase.SHARES, round_=0)
        late = self._late_phase_one("shares", header.sender, serde.shares_digest(request.batch))
        if late is not None:
            return late
        masker = self.node.masker
        if masker is None:
            raise Reject(StatusCode.UNAVAILABLE, "phase I key not ready yet")
        batch = serde.ciphertexts_from_proto(
            request.batch,
            expected_fingerprint=paillier.fingerprint(masker.public_key),
            expected_num_coefficients=s.config.N,
            expected_packed=s.config.packed,
        )
        if len(batch.ciphertexts) != masker.ciphertexts_per_neighbour:
            raise WireError(
                f"expected {masker.ciphertexts_per_neighbour} ciphertexts, "
                f"got {len(batch.ciphertexts)}"
            )
        for i, c in enumerate(batch.ciphertexts):
            try:
                paillier.validate_ciphertext(masker.public_key, c)
            except ValueError as exc:
                raise WireError(f"ciphertext {i}: {exc}") from None
        fresh = self.node.mailbox.put(
            "shares", 0, header.sender, list(batch.ciphertexts), serde.shares_digest(request.batch)
        )
        return common_pb2.Ack(accepted=True, detail="" if fresh else "duplicate ignored")

    # ---------------------------------------------------------------- phase II

    @guarded
    async def PutRound(
        self, request: agent_pb2.RoundMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        s, header = self._check_header(request.header, context, Phase.OPTIMIZE)
        node = self.node
        t = _within_run(header.round, s)
        current = node.status.round
        if t < current:
            # A retry (or a neighbour's bit-identical replay after its restart) of a round we
            # consumed: acknowledge it if it matches what we got, refuse it otherwise.
            known = node.mailbox.digest("round", t, header.sender)
            if known is None and node.resumed_from is not None and t < node.resumed_from:
                # consumed by this agent's previous process (which reached a later checkpoint,
                # so it had this message); a retry whose ack the crash lost: nothing to do
                return common_pb2.Ack(accepted=True,
                                      detail="round consumed before this agent restarted")
            if known is None:
                raise Reject(
                    StatusCode.FAILED_PRECONDITION,
                    f"round {t} is behind this agent (at round {current}) and older than the "
                    f"rounds it remembers",
                )
            if known != serde.round_digest(request):
                raise WireError(
                    f"round {t} from {header.sender} conflicts with the copy already received"
                )
            return common_pb2.Ack(accepted=True, detail="duplicate of a consumed round")
        if t > current + 1:
            # A neighbour ahead of us while we catch up after a restart: let it retry later
            # instead of buffering an unbounded number of rounds.
            raise Reject(
                StatusCode.UNAVAILABLE,
                f"this agent is at round {current}; round {t} is ahead of its window, retry",
            )
        tensors = node.decode_round(request, sender=header.sender, round_=t)
        fresh = node.mailbox.put("round", t, header.sender, tensors, serde.round_digest(request))
        return common_pb2.Ack(accepted=True, detail="" if fresh else "duplicate ignored")

    @guarded
    async def GetRound(
        self, request: agent_pb2.RoundRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RoundReply:
        s, header = self._check_header(request.header, context, Phase.OPTIMIZE)
        node = self.node
        t = _within_run(header.round, s)
        message = node.sent.get(t)
        if message is not None:
            return serde.round_reply(message, latest_round=node.produced)
        if t > node.produced:
            return serde.round_reply(None, latest_round=node.produced)
        held = f"{min(node.sent)}..{max(node.sent)}" if node.sent else "none"
        raise Reject(
            StatusCode.NOT_FOUND,
            f"round {t} is no longer held by {node.options.name} (it keeps rounds {held})",
        )

    @guarded
    async def GetStatus(
        self, request: agent_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.AgentStatus:
        node = self.node
        s = node.session
        if request.run_id and s is not None and request.run_id != s.run_id:
            raise Reject(StatusCode.NOT_FOUND,
                         f"this agent is in run {s.run_id}, not {_short(request.run_id)}")
        st = node.status
        reply = agent_pb2.AgentStatus(
            run_id=s.run_id if s else "", name=node.options.name, phase=int(st.phase),
            round=st.round, total_rounds=s.config.iterations if s else 0, loss=st.loss,
            accuracy=st.accuracy, error=st.error, finished=st.finished,
            rejections=dict(node.rejections.counts),
        )
        if node.resumed_from is not None:
            reply.resumed_from_round = node.resumed_from
        return reply


@dataclass
class AgentNode:
    """Drives one agent from registration to results. Transport here; math in the core."""

    options: AgentOptions
    mailbox: Mailbox = field(default_factory=Mailbox)
    status: Status = field(default_factory=Status)
    session: Session | None = None
    masker: Masker | None = None
    server: Server | None = None
    timings: dict[str, float] = field(default_factory=dict)
    rejections: RejectionLog = field(init=False)
    # phase II bookkeeping: my outboxes of the last keep_rounds rounds (served by GetRound)
    sent: collections.OrderedDict[int, agent_pb2.RoundMessage] = field(
        default_factory=collections.OrderedDict)
    produced: int = -1  # newest round whose outbox exists
    resumed_from: int | None = None  # round this process resumed at (None: fresh start)
    phase_one_restored: bool = False  # mask loaded from disk: phase I messages are stale
    history: list[dict[str, float]] = field(default_factory=list)
    _pull_from: set[str] = field(default_factory=set)  # neighbours that may hold lost rounds
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    _store: StateStore | None = None
    _saved: SavedAssignment | None = None
    _final_outbox: Message | None = None

    def __post_init__(self) -> None:
        self.rejections = RejectionLog(log, self.options.name)
        self._store = StateStore(self.options.state_folder)

    @property
    def store(self) -> StateStore:
        assert self._store is not None
        return self._store

    # ---------------------------------------------------------------- lifecycle

    async def run(self) -> dict[str, Any]:
        """Serve, register (or resume), mask, optimise, write results. Returns the result."""
        opts = self.options
        try:
            saved = self.store.load_assignment()
        except StateError as exc:
            raise AgentFailure(str(exc)) from None
        listen = opts.listen
        if saved is not None:
            self._check_resumable(saved)
            host, port = split_address(listen)
            if port == 0:  # rebind the port neighbours know
                listen = f"{host}:{saved.port}"
        credentials = opts.tls.server_credentials() if opts.tls else None
        self.server = await start_server(listen, add_servicers=self._add_servicers,
                                         credentials=credentials)
        await self.server.set_serving(True)
        write_port_file(opts.port_file, self.server.port)
        try:
            if saved is None:
                assignment = await self._register()
                self.session = await self._open_session(assignment)
                self._saved = SavedAssignment(assignment=assignment, advertise=self._advertised(),
                                              port=self.server.port, finished=False)
                self.store.save_assignment(assignment, advertise=self._saved.advertise,
                                           port=self.server.port)
                start = time.perf_counter()
                mask = await self._phase_one()
                self.timings["phase1_seconds"] = time.perf_counter() - start
                self.store.save_mask(mask, run_id=assignment.run_id, stats=dict(self.timings),
                                     received=self._phase_one_digests())
            else:
                self._saved = saved
                if self._advertised() != saved.advertise:
                    raise AgentFailure(
                        f"{opts.name} advertised {saved.advertise} in run "
                        f"{saved.assignment.run_id}, but would now be reached at "
                        f"{self._advertised()}: restart it with the same --listen/--advertise"
                    )
                session = await self._open_session(saved.assignment)
                mask = self._restore(session)
                self.session = session
            start = time.perf_counter()
            state = await self._phase_two(mask, resume=saved is not None)
            self.timings["phase2_seconds"] = time.perf_counter() - start
            assert self.session is not None
            rounds = self.session.config.iterations - (self.resumed_from or 0)
            self.timings["seconds_per_round"] = self.timings["phase2_seconds"] / max(1, rounds)
            result = self._write_results(state, mask)
            self.store.mark_finished(self._saved)
            self.status.phase = Phase.DONE
            self.status.finished = True
            await self._final_barrier()
            return result
        except Exception as exc:
            self.status.error = str(exc) or type(exc).__name__
            raise
        finally:
            for channel in self._channels.values():
                await channel.close()
            await self.server.stop(grace=0.5)

    def _check_resumable(self, saved: SavedAssignment) -> None:
        opts = self.options
        where = self.store.folder
        if saved.assignment.name != opts.name:
            raise AgentFailure(f"the state in {where} belongs to {saved.assignment.name}, "
                               f"not {opts.name}")
        if saved.finished:
            raise AgentFailure(
                f"{opts.name} already finished run {saved.assignment.run_id} (state in {where}); "
                "remove that folder (or give another --results/--state-dir) to start a new run"
            )
        if not self.store.mask_path.exists():
            raise AgentFailure(
                f"{opts.name} was stopped during phase I of run {saved.assignment.run_id}: its "
                f"mask was never saved (state in {where}), and drawing a new one would break "
                "the zero sum of the masks. This run cannot continue: start a new run"
            )

    def _restore(self, session: Session) -> MaskCoefficients:
        """Reload the saved mask (a resumed agent never redraws it)."""
        try:
            saved_mask = self.store.load_mask(run_id=session.run_id)
        except StateError as exc:
            raise AgentFailure(f"{self.options.name} cannot resume: {exc}") from None
        if saved_mask is None or saved_mask.mask.num_coefficients != session.config.N:
            raise AgentFailure(f"{self.options.name} cannot resume: no usable mask for "
                               f"{session.config.N} coefficients in {self.store.mask_path}")
        self.timings.update(saved_mask.stats)
        for kind, by_sender in saved_mask.received.items():
            for sender, digest in by_sender.items():
                self.mailbox.remember(kind, 0, sender, digest)
        self.phase_one_restored = True
        self._pull_from = set(session.neighbour_names)
        return saved_mask.mask

    def _phase_one_digests(self) -> dict[str, dict[str, bytes]]:
        """Digests of the phase I messages received from each neighbour (saved with the mask)."""
        assert self.session is not None
        out: dict[str, dict[str, bytes]] = {}
        for kind in ("key", "shares"):
            for name in self.session.neighbour_names:
                digest = self.mailbox.digest(kind, 0, name)
                if digest is not None:
                    out.setdefault(kind, {})[name] = digest
        return out

    def _add_servicers(self, server: grpc.aio.Server) -> list[str]:
        return [add_service(server, AgentService(self),
                            agent_pb2.DESCRIPTOR.services_by_name["Agent"])]

    def _advertised(self) -> str:
        if self.options.advertise:
            return self.options.advertise
        host, _, _ = self.options.listen.rpartition(":")
        if host in ("0.0.0.0", "[::]", ""):
            raise ValueError(
                f"--listen {self.options.listen} binds every interface: give --advertise HOST:PORT"
            )
        assert self.server is not None
        return f"{host}:{self.server.port}"

    def _open(self, address: str, server_name: str) -> grpc.aio.Channel:
        tls = self.options.tls
        if tls is None:
            return open_channel(address)
        return open_channel(address, credentials=tls.channel_credentials(),
                            server_name=server_name)

    async def _register(self) -> serde.Assignment:
        opts = self.options
        loop = asyncio.get_running_loop()
        channel = self._open(opts.coordinator, opts.coordinator_name)
        self._channels["coordinator"] = channel
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        request = coordinator_pb2.RegisterRequest(name=opts.name, address=self._advertised())
        deadline = loop.time() + opts.register_timeout
        try:
            reply = await call_with_retry(
                lambda: stub.Register(request, timeout=max(0.1, deadline - loop.time())),
                deadline=deadline, what=f"coordinator {opts.coordinator}",
            )
        except grpc.aio.AioRpcError as exc:
            raise AgentFailure(
                f"coordinator {opts.coordinator} refused {opts.name}: {exc.code().name}: "
                f"{exc.details()}"
            ) from None
        assignment = serde.assignment_from_proto(reply)
        if assignment.name != opts.name:
            raise AgentFailure(f"coordinator assigned name {assignment.name!r} to {opts.name}")
        return assignment

    async def _open_session(self, assignment: serde.Assignment) -> Session:
        config = RunConfig.from_dict(assignment.params)
        problem = await asyncio.to_thread(build_problem, config)
        expected = set(problem.graph.neighbours(assignment.index))
        got = {p.index for p in assignment.neighbours}
        if expected != got:
            raise AgentFailure(
                f"coordinator assigned neighbours {sorted(got)} but the topology "
                f"{config.topology!r} gives {sorted(expected)}"
            )
        shape = tuple(problem.initial_params().shape)
        keys = make_algorithm(config.algorithm).message_keys
        log.info("%s is agent index %d of run %s; neighbours %s", self.options.name,
                 assignment.index, assignment.run_id,
                 ", ".join(p.name for p in assignment.neighbours))
        return Session(
            assignment=assignment, config=config, problem=problem,
            names={p.index: p.name for p in assignment.neighbours},
            addresses={p.name: p.address for p in assignment.neighbours},
            message_shapes={k: shape for k in keys},
        )

    # ---------------------------------------------------------------- sending

    def _stub(self, name: str) -> agent_pb2_grpc.AgentStub:
        assert self.session is not None
        channel = self._channels.get(name)
        if channel is None:
            channel = self._open(self.session.addresses[name], name)
            self._channels[name] = channel
        return agent_pb2_grpc.AgentStub(channel)

    async def _call(self, name: str, method: str, request: Any, *, deadline: float,
                    what: str) -> Any:
        """One RPC to a neighbour, retried while it is unreachable or not ready; errors name the
        neighbour, its address and what was being done."""
        assert self.session is not None
        loop = asyncio.get_running_loop()
        rpc: Callable[..., Awaitable[Any]] = getattr(self._stub(name), method)
        address = self.session.addresses[name]
        try:
            return await call_with_retry(
                lambda: rpc(request, timeout=max(0.1, deadline - loop.time())),
                deadline=deadline, what=f"{what} neighbour {name} ({address})",
            )
        except grpc.aio.AioRpcError as exc:
            raise AgentFailure(
                f"neighbour {name} ({address}) refused {what}: {exc.code().name}: "
                f"{exc.details()}"
            ) from None
        except TimeoutError as exc:
            raise AgentFailure(str(exc)) from None

    async def _send(self, name: str, method: str, request: Any, *, timeout: float) -> None:
        """Deliver one message to a neighbour (phase and round in every error)."""
        loop = asyncio.get_running_loop()
        what = f"{Phase(request.header.phase).name} round {request.header.round}"
        ack = await self._call(name, method, request, deadline=loop.time() + timeout,
                               what=f"sending {what} to")
        if not ack.accepted:
            assert self.session is not None
            raise AgentFailure(f"neighbour {name} ({self.session.addresses[name]}) refused "
                               f"{what}: {ack.detail}")

    async def _send_all(self, method: str, make: Callable[[str], Any], *, timeout: float) -> None:
        assert self.session is not None
        await asyncio.gather(*(
            self._send(name, method, make(name), timeout=timeout)
            for name in sorted(self.session.addresses)
        ))

    async def _collect(self, kind: str, round_: int, *, timeout: float) -> dict[int, Any]:
        """Wait for one message per neighbour; keyed by neighbour index."""
        s = self.session
        assert s is not None
        try:
            got = await self.mailbox.collect(kind, round_, s.neighbour_names, timeout=timeout)
        except NeighbourTimeout as exc:
            where = ", ".join(f"{m} ({s.addresses[m]})" for m in exc.missing)
            raise AgentFailure(f"{self.options.name}: {exc} [{where}]") from None
        index = {name: i for i, name in s.names.items()}
        return {index[name]: payload for name, payload in got.items()}

    def _header(self, phase: Phase, round_: int) -> Any:
        assert self.session is not None
        return serde.make_header(
            run_id=self.session.run_id, sender=self.options.name, round=round_, phase=phase
        )

    # ---------------------------------------------------------------- phase I

    async def _phase_one(self) -> MaskCoefficients:
        s = self.session
        assert s is not None
        cfg, problem = s.config, s.problem
        rng = noise_generator(self.options.insecure_noise_seed, s.index)
        spec = problem.noise_spec
        degree = len(s.addresses)
        if cfg.mask == "none":
            return MaskCoefficients((0,) * spec.num_coefficients, spec.precision)
        if cfg.mask == "independent":
            return independent_mask(rng, degree=degree, spec=spec)
        timeout = cfg.round_timeout_seconds
        self.status.phase = Phase.KEYS
        t0 = time.perf_counter()
        self.masker = await asyncio.to_thread(
            Masker, agent=s.index, neighbours=sorted(s.names), spec=spec, rng=rng,
            layout=problem.layout, key_bits=cfg.key_bits,
            allow_insecure=self.options.allow_insecure_keys,
        )
        self.timings["keygen_seconds"] = time.perf_counter() - t0
        own_key = self.masker.public_key
        await self._send_all(
            "PutPublicKey",
            lambda name: serde.public_key_message(
                header=self._header(Phase.KEYS, 0), n=own_key.n
            ),
            timeout=timeout,
        )
        keys = await self._collect("key", 0, timeout=timeout)
        self.status.phase = Phase.SHARES
        t0 = time.perf_counter()
        outgoing = await asyncio.to_thread(self.masker.outgoing, keys)
        self.timings["encrypt_seconds"] = time.perf_counter() - t0
        index = {name: i for i, name in s.names.items()}
        await self._send_all(
            "PutShares",
            lambda name: serde.shares_message(
                header=self._header(Phase.SHARES, 0),
                fingerprint=paillier.fingerprint(keys[index[name]]),
                ciphertexts=outgoing[index[name]], num_coefficients=cfg.N, packed=cfg.packed,
            ),
            timeout=timeout,
        )
        incoming = await self._collect("shares", 0, timeout=timeout)
        t0 = time.perf_counter()
        mask = await asyncio.to_thread(self.masker.finish, incoming)
        self.timings["decrypt_seconds"] = time.perf_counter() - t0
        self.timings["encryptions"] = self.masker.encryptions
        self.timings["decryptions"] = self.masker.decryptions
        return mask

    # ---------------------------------------------------------------- phase II

    def decode_round(
        self, pb: agent_pb2.RoundMessage, *, sender: str, round_: int
    ) -> dict[str, torch.Tensor]:
        """Validate a neighbour's round message (pushed or pulled): header, names, shapes,
        float64, finite. Raises WireError saying what is wrong."""
        s = self.session
        assert s is not None
        serde.validate_header(pb.header, run_id=s.run_id, phase=Phase.OPTIMIZE,
                              senders={sender}, round=round_)
        tensors = serde.message_from_proto(pb, expected_shapes=s.message_shapes)
        for name, tensor in tensors.items():
            if tensor.dtype != torch.float64:
                raise WireError(f"tensor {name!r} must be float64, got {tensor.dtype}")
            if not bool(torch.isfinite(tensor).all()):
                raise WireError(f"tensor {name!r} has non-finite entries")
        return tensors

    async def _phase_two(self, mask: MaskCoefficients, *, resume: bool) -> AgentState:
        s = self.session
        assert s is not None
        cfg, problem = s.config, s.problem
        algorithm = make_algorithm(cfg.algorithm)
        schedule = make_schedule(cfg.schedule, iterations=cfg.iterations)
        ctx = StepContext(
            agent=s.index, weights=s.weights(), lr=schedule(0),
            oracle=problem.objective(s.index, mask),
        )
        state, outbox = algorithm.init(problem.initial_params(), ctx)
        checkpoint = self._load_checkpoint(state) if resume else None
        if resume:
            self.resumed_from = checkpoint.round if checkpoint else 0
            log.warning("%s resumes run %s at round %d (saved mask reloaded; %s)",
                        self.options.name, s.run_id, self.resumed_from,
                        "from its checkpoint" if checkpoint else "no checkpoint yet")
        if checkpoint is None:
            self.history = [self._evaluate(state, 0)]
        else:
            state = AgentState(t=checkpoint.round, tensors=checkpoint.tensors)
            # an outbox is the state's message tensors (true of every algorithm's step)
            outbox = {k: state[k] for k in algorithm.message_keys}
            self.history = list(checkpoint.history)
            self._evaluate(state, checkpoint.round)
        self.status.round = state.t
        self.status.phase = Phase.OPTIMIZE
        every = self.options.checkpoint_every
        for t in range(state.t, cfg.iterations):
            self.status.round = t
            inbox = await self._exchange(outbox, t, timeout=cfg.round_timeout_seconds)
            state, outbox = algorithm.step(state, inbox, dataclasses.replace(ctx, lr=schedule(t)))
            self.status.round = t + 1
            self.mailbox.discard_before("round", t + 1)
            self.mailbox.forget_before("round", t + 1 - self.options.keep_rounds)
            if (t + 1) % cfg.eval_every == 0 or t + 1 == cfg.iterations:
                self.history.append(self._evaluate(state, t + 1))
            if (t + 1) % every == 0 and t + 1 < cfg.iterations:
                self.store.save_checkpoint(run_id=s.run_id, round_=t + 1, tensors=state.tensors,
                                           history=self.history)
        self.status.round = cfg.iterations
        self._final_outbox = outbox
        return state

    def _load_checkpoint(self, initial: AgentState) -> Checkpoint | None:
        """The newest intact checkpoint with the same tensors as the algorithm's state."""
        s = self.session
        assert s is not None
        expected = {k: tuple(v.shape) for k, v in initial.tensors.items()}
        try:
            return self.store.load_checkpoint(run_id=s.run_id, expected=expected)
        except StateError as exc:
            raise AgentFailure(f"{self.options.name} cannot resume: {exc}") from None

    def _remember(self, t: int, request: agent_pb2.RoundMessage) -> None:
        """Keep my round-t outbox for GetRound (the newest keep_rounds rounds)."""
        self.sent[t] = request
        self.produced = max(self.produced, t)
        while len(self.sent) > self.options.keep_rounds:
            self.sent.popitem(last=False)

    async def _exchange(self, outbox: Message, t: int, *, timeout: float) -> dict[int, Message]:
        """Send my round-t message to every neighbour while collecting theirs (pulling rounds a
        neighbour sent to this agent's previous process, after a restart)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        request = serde.message_to_proto(outbox, header=self._header(Phase.OPTIMIZE, t))
        self._remember(t, request)
        sending = asyncio.ensure_future(
            self._send_all("PutRound", lambda name: request, timeout=timeout)
        )
        try:
            await self._pull_missing(t, deadline=deadline)
            inbox = await self._collect("round", t, timeout=max(0.0, deadline - loop.time()))
            await sending
        finally:
            if not sending.done():
                sending.cancel()
        return inbox

    async def _pull_missing(self, t: int, *, deadline: float) -> None:
        """After a restart, ask neighbours for round-t messages that were pushed to this agent's
        previous process. A neighbour that has not reached round t yet will push it (to this
        process), so it is not asked again."""
        wanted = [n for n in sorted(self._pull_from) if not self.mailbox.has("round", t, n)]
        if wanted:
            await asyncio.gather(*(self._pull(name, t, deadline=deadline) for name in wanted))

    async def _pull(self, name: str, t: int, *, deadline: float) -> None:
        request = serde.round_request(header=self._header(Phase.OPTIMIZE, t))
        reply = await self._call(name, "GetRound", request, deadline=deadline,
                                 what=f"pulling OPTIMIZE round {t} from")
        if not reply.available:
            self._pull_from.discard(name)
            return
        try:
            tensors = self.decode_round(reply.message, sender=name, round_=t)
            self.mailbox.put("round", t, name, tensors, serde.round_digest(reply.message))
        except ValueError as exc:
            raise AgentFailure(f"neighbour {name} served a bad round {t}: {exc}") from None

    async def _final_barrier(self) -> None:
        """Push my final outbox (round T) and wait, still serving GetRound, until every
        neighbour has finished too (or the round deadline passes): a neighbour that restarts
        near the end can then still replay the rounds it needs from us."""
        s = self.session
        assert s is not None
        t = s.config.iterations
        timeout = s.config.round_timeout_seconds
        try:
            assert self._final_outbox is not None
            await self._exchange(self._final_outbox, t, timeout=timeout)
        except AgentFailure as exc:
            log.warning("%s finished, but not every neighbour confirmed it did: %s",
                        self.options.name, exc)

    def _evaluate(self, state: AgentState, t: int) -> dict[str, float]:
        """Local, unmasked metrics of this agent's iterate (what one agent can know)."""
        s = self.session
        assert s is not None
        x = state["x"]
        shard = s.problem.shards[s.index]
        loss, _ = s.problem.task.loss_and_grad(x, shard.images, shard.labels)
        accuracy = float(s.problem.task.accuracy(x, s.problem.test))
        self.status.loss, self.status.accuracy = float(loss), accuracy
        return {"round": t, "loss": float(loss), "accuracy": accuracy}

    # ---------------------------------------------------------------- results

    def _write_results(self, state: AgentState, mask: MaskCoefficients) -> dict[str, Any]:
        s = self.session
        assert s is not None
        folder = Path(self.options.results_dir) / self.options.name
        folder.mkdir(parents=True, exist_ok=True)
        x = state["x"].detach().cpu().numpy().astype("<f8")
        tmp = folder / "model.npy.part"
        with open(tmp, "wb") as fh:
            np.save(fh, x, allow_pickle=False)
        tmp.replace(folder / "model.npy")
        result: dict[str, Any] = {
            "settings": s.config.to_dict(),
            "run_id": s.run_id,
            "name": self.options.name,
            "index": s.index,
            "neighbours": [p.name for p in s.assignment.neighbours],
            "history": self.history,
            "final": self.history[-1],
            "timings": self.timings,
            "resumed_from_round": self.resumed_from,
            "rejections": dict(self.rejections.counts),
            "model": "model.npy",
        }
        if self.options.debug_expose_mask:
            log.warning("%s: writing its mask into result.json (debug hook; not private)",
                        self.options.name)
            result["debug_mask_numerators"] = [str(v) for v in mask.numerators]
        write_json(folder / "result.json", result)
        return result
