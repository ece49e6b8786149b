"""One EFPSN agent as a gRPC service: register, phase I with neighbours, phase II rounds, results."""

from __future__ import annotations

import asyncio
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
from efpsn.agent.mailbox import Mailbox
from efpsn.algorithms import AgentState, Message, StepContext, make_algorithm
from efpsn.cli_common import write_json
from efpsn.config import RunConfig
from efpsn.masking import MaskCoefficients, Masker, independent_mask
from efpsn.net import Server, call_with_retry, open_channel, start_server, write_port_file
from efpsn.problem import Problem, build_problem
from efpsn.schedules import make_schedule
from efpsn.simulator import noise_generator
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
    # Test and debugging hooks. Both break privacy; never use them in a real deployment.
    insecure_noise_seed: int | None = None  # reproducible noise (to compare with the simulator)
    debug_expose_mask: bool = False  # write this agent's mask numerators into result.json
    allow_insecure_keys: bool = False  # accept Paillier keys below 2048 bits


@dataclass
class Session:
    """What the agent knows once assigned: the run, its neighbours and the public problem."""

    assignment: serde.Assignment
    config: RunConfig
    problem: Problem
    names: dict[int, str]  # neighbour index -> name
    addresses: dict[str, str]  # neighbour name -> host:port

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


class AgentService(agent_pb2_grpc.AgentServicer):
    """The gRPC edge: validate, decode, drop into the mailbox. Never touches the algorithm."""

    def __init__(self, node: AgentNode) -> None:
        self.node = node

    async def _session(self, context: grpc.aio.ServicerContext) -> Session:
        session = self.node.session
        if session is None:
            # Not assigned yet: the sender retries UNAVAILABLE with backoff.
            await context.abort(grpc.StatusCode.UNAVAILABLE, "agent not assigned to a run yet")
        return session

    async def _reject(self, context: grpc.aio.ServicerContext, what: str, exc: Exception) -> None:
        log.warning("%s: rejected %s: %s", self.node.options.name, what, exc)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {exc}")

    async def PutPublicKey(
        self, request: agent_pb2.PublicKeyMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        s = await self._session(context)
        try:
            header = serde.validate_header(
                request.header, run_id=s.run_id, phase=Phase.KEYS, senders=s.neighbour_names
            )
            n = serde.public_key_from_proto(request.key)
            key = paillier.public_key_from_n(n)
            paillier.check_key_size(key, allow_insecure=self.node.options.allow_insecure_keys)
        except (WireError, ValueError, TypeError) as exc:
            await self._reject(context, "public key", exc)
        fresh = self.node.mailbox.put("key", 0, header.sender, key)
        return common_pb2.Ack(accepted=True, detail="" if fresh else "duplicate ignored")

    async def PutShares(
        self, request: agent_pb2.SharesMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        s = await self._session(context)
        masker = self.node.masker
        if masker is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "phase I key not ready yet")
        try:
            header = serde.validate_header(
                request.header, run_id=s.run_id, phase=Phase.SHARES, senders=s.neighbour_names
            )
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
            for c in batch.ciphertexts:
                paillier.validate_ciphertext(masker.public_key, c)
        except (WireError, ValueError, TypeError) as exc:
            await self._reject(context, "shares", exc)
        fresh = self.node.mailbox.put("shares", 0, header.sender, list(batch.ciphertexts))
        return common_pb2.Ack(accepted=True, detail="" if fresh else "duplicate ignored")

    async def PutRound(
        self, request: agent_pb2.RoundMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        s = await self._session(context)
        node = self.node
        try:
            header = serde.validate_header(
                request.header, run_id=s.run_id, phase=Phase.OPTIMIZE, senders=s.neighbour_names
            )
            current = node.status.round
            if header.round < current and node.mailbox_consumed(header.sender, header.round):
                return common_pb2.Ack(accepted=True, detail="duplicate of a consumed round")
            # A neighbour is at most one round ahead of us (it needs our round-t message to
            # reach round t + 1), so anything outside [current, current + 1] is not protocol.
            if not current <= header.round <= current + 1:
                raise WireError(
                    f"round {header.round} is outside the window [{current}, {current + 1}]"
                )
            tensors = serde.message_from_proto(request, expected_shapes=node.message_shapes)
            for name, tensor in tensors.items():
                if tensor.dtype != torch.float64:
                    raise WireError(f"tensor {name!r} must be float64, got {tensor.dtype}")
                if not bool(torch.isfinite(tensor).all()):
                    raise WireError(f"tensor {name!r} has non-finite entries")
        except (WireError, ValueError, TypeError) as exc:
            await self._reject(context, f"round message from {request.header.sender!r}", exc)
        fresh = node.mailbox.put("round", header.round, header.sender, tensors)
        return common_pb2.Ack(accepted=True, detail="" if fresh else "duplicate ignored")

    async def GetStatus(
        self, request: agent_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.AgentStatus:
        node = self.node
        s = node.session
        st = node.status
        return agent_pb2.AgentStatus(
            run_id=s.run_id if s else "", name=node.options.name, phase=int(st.phase),
            round=st.round, total_rounds=s.config.iterations if s else 0, loss=st.loss,
            accuracy=st.accuracy, error=st.error, finished=st.finished,
        )


@dataclass
class AgentNode:
    """Drives one agent from registration to results. Transport here; math in the core."""

    options: AgentOptions
    mailbox: Mailbox = field(default_factory=Mailbox)
    status: Status = field(default_factory=Status)
    session: Session | None = None
    masker: Masker | None = None
    message_shapes: dict[str, tuple[int, ...]] | None = None
    server: Server | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    _consumed_round: int = -1

    def mailbox_consumed(self, sender: str, round_: int) -> bool:
        """True when round_ was already stepped on (so a re-delivery is a harmless retry)."""
        return round_ <= self._consumed_round

    # ---------------------------------------------------------------- lifecycle

    async def run(self) -> dict[str, Any]:
        """Serve, register, mask, optimise, write results. Returns the result record."""
        opts = self.options
        self.server = await start_server(opts.listen, add_servicers=self._add_servicers)
        await self.server.set_serving(True)
        write_port_file(opts.port_file, self.server.port)
        try:
            self.session = await self._register()
            start = time.perf_counter()
            mask = await self._phase_one()
            self.timings["phase1_seconds"] = time.perf_counter() - start
            start = time.perf_counter()
            state = await self._phase_two(mask)
            self.timings["phase2_seconds"] = time.perf_counter() - start
            self.timings["seconds_per_round"] = (
                self.timings["phase2_seconds"] / self.session.config.iterations
            )
            result = self._write_results(state, mask)
            self.status.phase = Phase.DONE
            self.status.finished = True
            return result
        except Exception as exc:
            self.status.error = str(exc) or type(exc).__name__
            raise
        finally:
            for channel in self._channels.values():
                await channel.close()
            await self.server.stop(grace=0.5)

    def _add_servicers(self, server: grpc.aio.Server) -> list[str]:
        agent_pb2_grpc.add_AgentServicer_to_server(AgentService(self), server)
        return [agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name]

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

    async def _register(self) -> Session:
        opts = self.options
        loop = asyncio.get_running_loop()
        channel = open_channel(opts.coordinator)
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
                f"coordinator {opts.coordinator} refused {opts.name}: {exc.details()}"
            ) from None
        assignment = serde.assignment_from_proto(reply)
        config = RunConfig.from_dict(assignment.params)
        problem = await asyncio.to_thread(build_problem, config)
        expected = set(problem.graph.neighbours(assignment.index))
        got = {p.index for p in assignment.neighbours}
        if expected != got:
            raise AgentFailure(
                f"coordinator assigned neighbours {sorted(got)} but the topology "
                f"{config.topology!r} gives {sorted(expected)}"
            )
        log.info("%s is agent index %d of run %s; neighbours %s", opts.name, assignment.index,
                 assignment.run_id, ", ".join(p.name for p in assignment.neighbours))
        return Session(
            assignment=assignment, config=config, problem=problem,
            names={p.index: p.name for p in assignment.neighbours},
            addresses={p.name: p.address for p in assignment.neighbours},
        )

    # ---------------------------------------------------------------- sending

    def _stub(self, name: str) -> agent_pb2_grpc.AgentStub:
        assert self.session is not None
        channel = self._channels.get(name)
        if channel is None:
            channel = open_channel(self.session.addresses[name])
            self._channels[name] = channel
        return agent_pb2_grpc.AgentStub(channel)

    async def _send(
        self, name: str, method: str, request: Any, *, timeout: float
    ) -> None:
        """Deliver one message to a neighbour, retrying while it is unreachable.

        Errors name the neighbour, its address and what was being sent (phase and round)."""
        assert self.session is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        rpc: Callable[..., Awaitable[common_pb2.Ack]] = getattr(self._stub(name), method)
        address = self.session.addresses[name]
        what = f"{Phase(request.header.phase).name} round {request.header.round}"
        try:
            ack = await call_with_retry(
                lambda: rpc(request, timeout=max(0.1, deadline - loop.time())),
                deadline=deadline, what=f"sending {what} to neighbour {name} ({address})",
            )
        except grpc.aio.AioRpcError as exc:
            raise AgentFailure(
                f"neighbour {name} ({address}) rejected {what}: {exc.code().name}: "
                f"{exc.details()}"
            ) from None
        except TimeoutError as exc:
            raise AgentFailure(str(exc)) from None
        if not ack.accepted:
            raise AgentFailure(f"neighbour {name} ({address}) refused {what}: {ack.detail}")

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
        except TimeoutError as exc:
            missing = getattr(exc, "missing", [])
            where = ", ".join(f"{m} ({s.addresses[m]})" for m in missing)
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

    async def _phase_two(self, mask: MaskCoefficients) -> AgentState:
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
        self.message_shapes = {k: tuple(outbox[k].shape) for k in algorithm.message_keys}
        self.status.phase = Phase.OPTIMIZE
        self.history = [self._evaluate(state, 0)]
        for t in range(cfg.iterations):
            self.status.round = t
            inbox = await self._exchange(outbox, t, timeout=cfg.round_timeout_seconds)
            state, outbox = algorithm.step(state, inbox, dataclasses.replace(ctx, lr=schedule(t)))
            self._consumed_round = t
            self.mailbox.discard_before("round", t + 1)
            if (t + 1) % cfg.eval_every == 0 or t + 1 == cfg.iterations:
                self.history.append(self._evaluate(state, t + 1))
        self.status.round = cfg.iterations
        return state

    async def _exchange(self, outbox: Message, t: int, *, timeout: float) -> dict[int, Message]:
        """Send my round-t message to every neighbour while collecting theirs."""
        request = serde.message_to_proto(outbox, header=self._header(Phase.OPTIMIZE, t))
        sending = asyncio.ensure_future(
            self._send_all("PutRound", lambda name: request, timeout=timeout)
        )
        try:
            inbox = await self._collect("round", t, timeout=timeout)
            await sending
        finally:
            if not sending.done():
                sending.cancel()
        return inbox

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
            "model": "model.npy",
        }
        if self.options.debug_expose_mask:
            log.warning("%s: writing its mask into result.json (debug hook; not private)",
                        self.options.name)
            result["debug_mask_numerators"] = [str(v) for v in mask.numerators]
        write_json(folder / "result.json", result)
        return result
