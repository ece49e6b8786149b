"""One EFPSN agent from start to results: serve, register (or resume), phase I, phase II.

The pieces: agent/servicer.py validates and files incoming messages, agent/peers.py sends,
agent/phase_one.py and agent/phase_two.py drive the two phases, agent/state.py keeps the
crash-safe state on disk. This module only sequences them.

Crash safety: the assignment is saved before phase I, the mask before phase II, and the phase II
state every `checkpoint_every` rounds. An agent restarted with the same command reloads all of it
(it never redraws its mask and never calls the coordinator again), rebinds the port it advertised,
and replays the rounds since its checkpoint: its neighbours keep their last `keep_rounds`
outboxes and serve them through Agent.GetRound, and since batches are a pure function of
(seed, agent, round) the replay recomputes bit-identical iterates.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from agent.bootstrap import bootstrap, prepare
from agent.concurrency import to_completion
from agent.mailbox import Mailbox
from agent.options import AgentFailure, AgentOptions
from agent.outbox_log import OutboxLog
from agent.peers import Peers
from agent.phase_one import run_phase_one
from agent.phase_two import Outboxes, abandon_sending, final_barrier, run_phase_two
from agent.servicer import AgentService
from agent.session import Session, Status, open_session
from agent.state import SavedAssignment, StateError, StateStore
from efpsn import paillier
from efpsn.algorithms import AgentState, Message
from efpsn.cli_common import write_json
from efpsn.config import RunConfig
from efpsn.masking import MaskCoefficients, Masker
from efpsn.runtime import peak_rss_mb
from efpsn.wire.net import (
    RejectionLog,
    Server,
    add_service,
    split_address,
    start_server,
    write_port_file,
)
from efpsn.wire.serde import Phase
from efpsn.wire.v1 import agent_pb2

__all__ = ["AgentFailure", "AgentNode", "AgentOptions", "AgentService"]

log = logging.getLogger("efpsn.agent")


@dataclass
class AgentNode:
    """Drives one agent from registration to results. Transport at the edges; math in the core."""

    options: AgentOptions
    mailbox: Mailbox = field(default_factory=Mailbox)
    status: Status = field(default_factory=Status)
    session: Session | None = None
    masker: Masker | None = None  # phase I; the servicer checks incoming shares against its key
    server: Server | None = None
    timings: dict[str, float] = field(default_factory=dict)
    rejections: RejectionLog = field(init=False)
    peers: Peers = field(init=False)
    outboxes: Outboxes = field(init=False)  # my recent round messages, served by GetRound
    resumed_from: int | None = None  # round this process resumed at (None: fresh start)
    phase_one_restored: bool = False  # mask loaded from disk: phase I messages are stale
    history: list[dict[str, float]] = field(default_factory=list)
    pull_from: set[str] = field(default_factory=set)  # neighbours that may hold lost rounds
    final_outbox: Message | None = None
    sending: asyncio.Future[Any] | None = None  # delivery of my newest round message
    # my Paillier key pair, generated (off the event loop) from the moment the run parameters
    # arrive: phase I then finds it ready instead of every agent generating one at its start
    keypair: asyncio.Future[Any] | None = None
    _store: StateStore | None = None
    _saved: SavedAssignment | None = None

    def __post_init__(self) -> None:
        self.rejections = RejectionLog(log, self.options.name)
        self._store = StateStore(self.options.state_folder)
        self.peers = Peers(self.options, self.mailbox)
        self.outboxes = Outboxes(self.options.keep_rounds, OutboxLog(
            self.store.outbox_folder, keep=self.options.keep_rounds,
            segment=self.options.checkpoint_every))

    @property
    def store(self) -> StateStore:
        assert self._store is not None
        return self._store

    def _enter(self, session: Session) -> None:
        self.session = session
        self.peers.session = session

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
                                         credentials=credentials, rejections=self.rejections)
        await self.server.set_serving(True)
        write_port_file(opts.port_file, self.server.port)
        try:
            if saved is None:
                prepared, assignment = await bootstrap(self.peers, options=opts,
                                                       address=self._advertised(),
                                                       on_parameters=self._generate_keys)
                self._enter(await open_session(assignment, name=opts.name, prepared=prepared))
                self._saved = SavedAssignment(assignment=assignment, advertise=self._advertised(),
                                              port=self.server.port, finished=False)
                self.store.save_assignment(assignment, advertise=self._saved.advertise,
                                           port=self.server.port)
                self.timings["phase1_started_at"] = time.time()  # wall clock, for start-up
                start = time.perf_counter()
                mask = await run_phase_one(self)
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
                config = RunConfig.from_dict(saved.assignment.params)
                prepared = await asyncio.to_thread(prepare, config, opts)
                session = await open_session(saved.assignment, name=opts.name,
                                             prepared=prepared)
                mask = self._restore(session)
                restored = self.outboxes.restore()
                log.info("%s reloaded %d sent round messages (rounds up to %d)", opts.name,
                         restored, self.outboxes.produced)
                self._enter(session)
            self.timings["phase2_started_at"] = time.time()
            start, cpu = time.perf_counter(), time.process_time()
            state = await run_phase_two(self, mask, resume=saved is not None)
            self.timings["phase2_seconds"] = time.perf_counter() - start
            assert self.session is not None
            rounds = max(1, self.session.config.iterations - (self.resumed_from or 0))
            self.timings["seconds_per_round"] = self.timings["phase2_seconds"] / rounds
            # this process's CPU (every thread: gRPC's too) per round: what a round costs
            self.timings["cpu_seconds_per_round"] = (time.process_time() - cpu) / rounds
            rss = peak_rss_mb()
            if rss is not None:
                self.timings["max_rss_mb"] = rss
            result = self._write_results(state, mask)
            self.outboxes.log = None  # deleted with the checkpoints; memory serves the rest
            self.store.mark_finished(self._saved)
            self.status.phase = Phase.DONE
            self.status.finished = True
            await final_barrier(self)
            return result
        except Exception as exc:
            self.status.error = str(exc) or type(exc).__name__
            raise
        finally:
            if self.keypair is not None and not self.keypair.cancel():  # ended before phase I?
                self.keypair.exception()  # done: retrieved, so never logged as unhandled
            await to_completion(self._close())

    async def _close(self) -> None:
        """Stop sending, close my streams and channels, stop the server (its grace period
        lets in-flight calls end; the neighbours' round streams end with it)."""
        try:
            await abandon_sending(self)
            await self.peers.close()
        finally:
            await self.server.stop(grace=0.5)

    def _generate_keys(self, config: RunConfig) -> None:
        """Start generating this agent's Paillier key pair (zero-sum masks only); phase I
        awaits it. The key depends on nothing but the run's key size: generating it while this
        agent loads its data and waits for the others takes it off the run's critical path."""
        if config.mask != "zero-sum" or self.keypair is not None:
            return

        def generate() -> tuple[Any, float]:
            start = time.perf_counter()
            keypair = paillier.generate_keypair(
                config.key_bits, allow_insecure=self.options.allow_insecure_keys)
            return keypair, time.perf_counter() - start

        self.keypair = asyncio.ensure_future(asyncio.to_thread(generate))

    def _check_resumable(self, saved: SavedAssignment) -> None:
        opts = self.options
        where = self.store.folder
        if saved.assignment.name != opts.name:
            raise AgentFailure(f"the state in {where} belongs to {saved.assignment.name}, "
                               f"not {opts.name}")
        unresumable = self.store.unresumable()
        if unresumable is not None:
            raise AgentFailure(unresumable)
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
        self.pull_from = set(session.neighbour_names)
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

    # ---------------------------------------------------------------- results

    def _write_results(self, state: AgentState, mask: MaskCoefficients) -> dict[str, Any]:
        s = self.session
        assert s is not None
        folder = Path(self.options.results_dir) / self.options.name
        folder.mkdir(parents=True, exist_ok=True)
        x = state["x"].detach().cpu().numpy().astype("<f8")
        tmp = folder / "model.npy.part"
        tmp.unlink(missing_ok=True)
        # private like the state: the loss history is values of this agent's f_i
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
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
        write_json(folder / "result.json", result, mode=0o600)
        return result
