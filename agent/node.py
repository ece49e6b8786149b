"""One EFPSN agent from start to results: it composes the rooms and sequences them.

serve (agent/servicer.py) -> a fresh start (agent/bootstrap.py) or a restart
(agent/resume.py) -> phase I (agent/phase_one.py) -> phase II (agent/phase_two.py, through
agent/exchange.py) -> results (agent/results.py). Each phase gets the narrow things it needs;
nothing reaches into this object.

Crash safety: the assignment is saved before phase I, the mask before phase II, and the phase II
state every `checkpoint_every` rounds (agent/state.py). An agent restarted with the same command
reloads all of it (it never redraws its mask and never calls the coordinator again), rebinds
the port it advertised, and replays the rounds since its checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from agent import departure_state
from agent.assembly import assemble, serve
from agent.bootstrap import bootstrap
from agent.concurrency import to_completion
from agent.departing import LocalDepartures, Silence
from agent.exchange import RoundLink
from agent.fixed_terms import EdgeTerms, save_phase_one
from agent.options import AgentFailure, AgentOptions
from agent.phase_one import run_phase_one, shares_packed
from agent.phase_one_leave import PhaseOneDepartures, phase_one_departures
from agent.phase_two import make_driver, run_phase_two
from agent.prepare import Prepared, prepare
from agent.rejoin import Rejoin
from agent.results import write_failure, write_results
from agent.resume import (
    Replay,
    check_address,
    check_resumable,
    mask_provider,
    reload_checkpoint,
    reload_phase_one,
)
from agent.secure_sum import (
    TOTALS_FILE,
    load_totals,
    run_secure_sum,
    save_totals,
    standardised_session,
)
from agent.servicer import ShareCheck
from agent.session import Session, open_session
from agent.state import SavedAssignment, StateError
from efpsn.algorithms import make_algorithm
from efpsn.crypto import paillier
from efpsn.ledger import RoundLedger
from efpsn.masks.refresh import MaskProvider
from efpsn.masks.seeds import EdgeSeeds, SeedExchange
from efpsn.masks.zero_sum import MaskCoefficients, Masker, noise_generator
from efpsn.optimize.driver import checkpoint_shapes
from efpsn.optimize.stopping import StopRule
from efpsn.params.config import RunConfig
from efpsn.process.runtime import peak_rss_mb, pss_mb
from efpsn.wire.net import (
    Server,
    split_address,
    write_port_file,
)

__all__ = ["AgentFailure", "AgentNode", "AgentOptions"]

log = logging.getLogger("efpsn.agent")


class AgentNode:
    """Drives one agent from registration to results. Transport at the edges; math in the core."""

    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.timings: dict[str, float] = {}
        parts = assemble(options)  # agent/assembly.py: the one wiring of an agent's rooms
        self.parts = parts
        self.status, self.store, self.mailbox = parts.status, parts.store, parts.mailbox
        self.outbox, self.peers, self.rejections = parts.outbox, parts.peers, parts.rejections
        self.service = parts.service
        self.life = parts.status.life  # agent/life.py: this node advances it
        self.server: Server | None = None
        self._keypair: asyncio.Future[Any] | None = None
        self._masker: Masker | None = None  # the fixed mask's per-edge terms (departures)
        self._terms: EdgeTerms | None = None  # ... decrypted and saved when phase I ends
        self._left: PhaseOneDepartures | None = None  # departures decided in phase I

    async def run(self) -> dict[str, Any]:
        """Serve, register (or resume), mask, optimise, write results. Returns the result."""
        opts = self.options
        try:
            saved = self.store.load_assignment()
        except StateError as exc:
            raise AgentFailure(str(exc)) from None
        listen = opts.listen
        if saved is not None:
            check_resumable(saved, name=opts.name, store=self.store)
            host, port = split_address(listen)
            if port == 0:  # rebind the port neighbours know
                listen = f"{host}:{saved.port}"
        self.server = await serve(self.parts, listen)
        write_port_file(opts.port_file, self.server.port)
        try:
            if saved is None:
                result = await self._fresh()
            else:
                result = await self._resumed(saved)
            return result
        except Exception as exc:
            self.life.fail(str(exc) or type(exc).__name__)
            if opts.failure_file is not None:
                write_failure(opts.failure_file, name=opts.name, error=exc)
            raise
        finally:
            if self._keypair is not None and not self._keypair.cancel():  # ended before phase I?
                self._keypair.exception()  # done: retrieved, so never logged as unhandled
            await to_completion(self._close())

    async def _fresh(self) -> dict[str, Any]:
        """Bootstrap through the coordinator, save the assignment, phase I, save the mask."""
        opts = self.options
        address = self._advertised()
        channel = self.peers.coordinator()
        prepared, assignment = await bootstrap(channel, options=opts, address=address,
                                               on_parameters=self._generate_keys)
        session = await open_session(assignment, name=opts.name, prepared=prepared)
        saved = SavedAssignment(assignment=assignment, config=prepared.config, advertise=address,
                                port=self._port(), finished=False)
        self.store.save_assignment(assignment, config=prepared.config, advertise=address,
                                   port=saved.port)
        standard = session.config.scale.standard  # phase II's numbers wait for the totals
        ledger = self._ledger(session, resumed_from=None)
        self.life.assign(session, None if standard else ledger)
        self.timings["phase1_started_at"] = time.time()  # wall clock, for start-up
        start = time.perf_counter()
        seed = opts.insecure_noise_seed
        self._left = phase_one_departures(session, options=opts, peers=self.peers,
                                          mailbox=self.mailbox, service=self.service)
        result = await run_phase_one(
            session=session, peers=self.peers, life=self.life, timings=self.timings,
            rng=noise_generator(seed, session.index),
            seed_rng=None if seed is None else noise_generator(seed, session.index),
            keypair=self._keypair, on_masker=self._expect_shares,
            allow_insecure_keys=opts.allow_insecure_keys, leave=self._left)
        self.service.phase_one.close()
        self.timings["phase1_seconds"] = time.perf_counter() - start
        received = self.service.phase_one.received()
        if self._left is not None:  # before the result: a restart must know who left
            self._left.save(self.store.folder)
            if self._masker is not None:  # the fixed mask's per-edge terms too (fixed_terms)
                self._terms, cost = await asyncio.to_thread(
                    save_phase_one, self._masker, self.store.folder, run_id=assignment.run_id)
                self.timings.update(cost)
        if isinstance(result, EdgeSeeds):
            self.store.save_seeds(result.to_json(), run_id=assignment.run_id,
                                  stats=dict(self.timings), received=received)
        else:
            self.store.save_mask(result, run_id=assignment.run_id, stats=dict(self.timings),
                                 received=received)
        if standard:  # its departures drop their seeds from `result` (agent/secure_sum.py)
            session, ledger, result = await self._secure_sum(session, prepared, result)
        return await self._phase_two(session, saved, ledger, mask_provider(session, result),
                                     history=[], replay=set())

    async def _resumed(self, saved: SavedAssignment) -> dict[str, Any]:
        """Restart with the same command: reload everything and carry on (agent/resume.py)."""
        opts = self.options
        name = opts.name
        check_address(saved, name=name, advertised=self._advertised())
        config = saved.config
        prepared = await asyncio.to_thread(prepare, config, opts)
        session = await open_session(saved.assignment, name=name, prepared=prepared)
        phase_one, stats, received = reload_phase_one(self.store, name=name, session=session)
        self.timings.update(stats)
        self.service.phase_one.restore(received)
        if config.scale.standard:  # the totals saved before phase II, never summed again
            session = await self._reload_totals(session, prepared)
            config = session.config
        # the state's tensors, the stop rule's window and its check round's state
        shapes = checkpoint_shapes(make_algorithm(config.algorithm).state_keys,
                                   tuple(session.problem.initial_params().shape),
                                   stop=StopRule.for_run(config, session.problem.weights).active)
        checkpoint = reload_checkpoint(self.store, name=name, run_id=session.run_id,
                                       expected=shapes)
        resumed_from = checkpoint.round if checkpoint else 0
        sent = self.outbox.restore()
        log.info("%s reloaded %d sent round messages (rounds up to %d)", name, sent,
                 self.outbox.produced)
        log.warning("%s resumes run %s at round %d (saved %s reloaded; %s)", name,
                    session.run_id, resumed_from,
                    "seeds" if isinstance(phase_one, EdgeSeeds) else "mask",
                    "from its checkpoint" if checkpoint else "no checkpoint yet")
        ledger = self._ledger(session, resumed_from=resumed_from)
        self.life.assign(session, ledger)
        history = list(checkpoint.history) if checkpoint else []
        return await self._phase_two(session, saved, ledger,
                                     mask_provider(session, phase_one), history=history,
                                     replay=set(session.neighbour_names), checkpoint=checkpoint)

    async def _phase_two(self, session: Session, saved: SavedAssignment, ledger: RoundLedger,
                         masks: MaskProvider, *, history: list[dict[str, float]],
                         replay: set[str], checkpoint: Any = None) -> dict[str, Any]:
        opts, cfg = self.options, session.config
        driver = make_driver(session, masks, checkpoint)
        first = driver.t
        silence = self._silence(session, masks)
        if silence is not None:  # a restart after a departure re-applies it (departing.py)
            if self._left is not None and self._left.decided:  # agent/phase_one_leave.py
                await silence.adopt(self._left, driver)
            else:  # a restart: what it applied, or what phase I decided and it had not adopted
                await silence.restart(driver)
                replay = set(session.neighbour_names) if replay else replay
        deadline = opts.departure_deadline or cfg.round_timeout_seconds
        link = RoundLink(
            peers=self.peers, outbox=self.outbox, run_id=session.run_id, name=opts.name,
            neighbours=list(session.neighbour_names),
            timeout=cfg.round_timeout_seconds if silence is None else deadline,
            replay=Replay(peers=self.peers, intake=self.parts.intake, mailbox=self.mailbox,
                          neighbours=replay, describe_loss=self._describe_loss(session, first),
                          on_loss=self.store.mark_unresumable))
        self.timings["phase2_started_at"] = time.time()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            done = await run_phase_two(
                session=session, driver=driver, link=link, ledger=ledger, mailbox=self.mailbox,
                store=self.store, status=self.status, checkpoint_every=opts.checkpoint_every,
                name=opts.name, history=history,
                on_evaluation=None if opts.quiet else self._progress(cfg.iterations.total),
                silence=silence)
        except BaseException:
            await link.abandon()
            raise
        rounds = max(1, driver.t - first)  # the stop rule's round, at most the rounds
        self.timings["rounds"] = driver.t
        self.timings["phase2_seconds"] = time.perf_counter() - start
        self.timings["seconds_per_round"] = self.timings["phase2_seconds"] / rounds
        # this process's CPU (every thread: gRPC's too) per round: what a round costs
        self.timings["cpu_seconds_per_round"] = (time.process_time() - cpu) / rounds
        rss, pss = peak_rss_mb(), pss_mb()
        if rss is not None:
            self.timings["max_rss_mb"] = rss
        if pss is not None:  # at the end of phase II, while its neighbours still run
            self.timings["pss_mb"] = pss
        result = write_results(
            Path(opts.results_dir) / opts.name, session=session, name=opts.name,
            x=done.state["x"], history=done.history, timings=self.timings,
            resumed_from=ledger.resumed_from, rejections=dict(self.rejections.counts),
            departures=None if silence is None else silence.departures.to_json(),
            expose_mask=masks.coefficients(0) if opts.debug_expose_mask else None)
        self.outbox.stop_logging()  # deleted with the checkpoints; memory serves the rest
        self.store.mark_finished(saved)
        (Path(self.store.folder) / TOTALS_FILE).unlink(missing_ok=True)  # with the seeds
        departure_state.discard(self.store.folder)  # the new edges' seeds, likewise
        self.life.done()
        if silence is not None and (silence.departures.window is not None
                                    or silence.departures.capped is not None):
            await link.abandon()  # the run had ended: no neighbour needs a message of mine
            return result
        if silence is not None:  # the certificate's stop or the cap: a departure after it
            await silence.finished(driver)
        await link.finish(done.state.t, done.final_outbox)
        return result

    def _silence(self, session: Session, masks: MaskProvider) -> Silence | None:
        """How a silent neighbour is handled in phase II (agent/departing.py); None when
        departures are off (--departure-deadline 0)."""
        opts = self.options
        if opts.departure_deadline == 0:
            return None
        channel = self.peers.coordinator()
        deadline = opts.departure_deadline or session.config.round_timeout_seconds
        # the others report up to a few rounds later: wait for their deadline too
        return Silence(departures=LocalDepartures(session, masks, self._terms),
                       coordinator=channel,
                       mailbox=self.mailbox, store=self.store,
                       timeout=deadline + session.config.round_timeout_seconds,
                       rejoin=Rejoin(session=session, peers=self.peers, mailbox=self.mailbox,
                                     service=self.service, noise_seed=opts.insecure_noise_seed,
                                     allow_insecure_keys=opts.allow_insecure_keys,
                                     folder=self.store.folder))

    def _progress(self, iterations: int) -> Any:
        """A progress line per evaluation, for this agent's own operator (its log)."""
        def say(record: dict[str, float]) -> None:
            # its own loss and accuracy, and how far it still moves and disagrees with its
            # neighbours (efpsn.optimize.driver.progress; relative to max(1, ||x||))
            figures = ", ".join(f"{k.replace('relative_', '')} {record[k]:.4g}"
                                for k in ("loss", "accuracy", "relative_step", "relative_gap")
                                if k in record)
            log.info("%s: round %d/%d: %s", self.options.name, int(record["round"]),
                     iterations, figures)
        return say

    def _ledger(self, session: Session, *, resumed_from: int | None) -> RoundLedger:
        """Phase II's receive rules for `session` (the life holds them once round messages
        may be taken: a scale standard run's wait for its totals)."""
        return RoundLedger(last=session.config.iterations.count or 1,
                           keep=self.options.keep_rounds, position=resumed_from or 0,
                           resumed_from=resumed_from)

    async def _secure_sum(self, session: Session, prepared: Prepared,
                          phase_one: MaskCoefficients | EdgeSeeds,
                          ) -> tuple[Session, RoundLedger, MaskCoefficients | EdgeSeeds]:
        """scale standard: the totals by secure summation (agent/secure_sum.py), saved, the
        session phase II runs (resolved with them, data standardised) and its phase I result
        (without the seeds of a neighbour that left during the sum)."""
        start = time.perf_counter()
        totals, seeds = await run_secure_sum(
            session=session, peers=self.peers, life=self.life, prepared=prepared,
            seeds=phase_one if isinstance(phase_one, EdgeSeeds) else None, leave=self._left)
        if seeds is not None:
            phase_one = seeds
        self.service.stats.close()
        if self._left is not None:  # those who left during the sum, before the totals
            self._left.save(self.store.folder)
        save_totals(self.store.folder, totals, run_id=session.run_id)
        self.timings["stats_seconds"] = time.perf_counter() - start
        session = await asyncio.to_thread(standardised_session, session, prepared, totals,
                                          who=self.options.name)
        ledger = self._ledger(session, resumed_from=None)
        self.life.standardised(session, ledger)
        return session, ledger, phase_one

    async def _reload_totals(self, session: Session, prepared: Prepared) -> Session:
        name = self.options.name
        try:
            totals = load_totals(self.store.folder, run_id=session.run_id)
        except StateError as exc:
            raise AgentFailure(f"{name} cannot resume: {exc}") from None
        if totals is None:
            raise AgentFailure(
                f"{name} was stopped during the secure sum of column statistics of run "
                f"{session.run_id} (no totals in {self.store.folder}); the sum is not "
                "replayed: start a new run")
        self.service.stats.close()
        return await asyncio.to_thread(standardised_session, session, prepared, totals,
                                       who=name)

    def _describe_loss(self, session: Session, resumed_from: int) -> Any:
        def describe(neighbour: str, t: int, detail: str) -> str:
            return (f"run {session.run_id} cannot resume at {self.options.name}: it must replay "
                    f"round {t} from its checkpoint {resumed_from}, and {neighbour} no longer "
                    f"holds that round ({detail}); start a new run")
        return describe

    def _expect_shares(self, masker: Masker | SeedExchange) -> None:
        session = self.life.session
        assert session is not None
        self._masker = masker if isinstance(masker, Masker) else None
        self.service.shares = ShareCheck(public_key=masker.public_key,
                                         count=masker.ciphertexts_per_neighbour,
                                         packed=shares_packed(session.config))

    async def _close(self) -> None:
        """Close my streams and channels, stop the server (its grace period lets in-flight
        calls end; the neighbours' round streams end with it)."""
        try:
            await self.peers.close()
        finally:
            assert self.server is not None
            await self.server.stop(grace=0.5)

    def _generate_keys(self, config: RunConfig) -> None:
        """Start generating this agent's Paillier key pair (zero-sum masks only); phase I
        awaits it. The key depends on nothing but the run's key size: generating it while this
        agent loads its data and waits for the others takes it off the run's critical path."""
        if config.mask != "zero-sum" or self._keypair is not None:
            return

        def generate() -> tuple[Any, float]:
            start = time.perf_counter()
            keypair = paillier.generate_keypair(
                config.key_bits, allow_insecure=self.options.allow_insecure_keys)
            return keypair, time.perf_counter() - start

        self._keypair = asyncio.ensure_future(asyncio.to_thread(generate))

    def _port(self) -> int:
        assert self.server is not None
        return self.server.port

    def _advertised(self) -> str:
        if self.options.advertise:
            return self.options.advertise
        host, _, _ = self.options.listen.rpartition(":")
        if host in ("0.0.0.0", "[::]", ""):
            raise ValueError(
                f"--listen {self.options.listen} binds every interface: give --advertise HOST:PORT"
            )
        return f"{host}:{self._port()}"
