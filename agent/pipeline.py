"""One agent's run as a pipeline of phases, in order, and the only caller of its life's events
(agent/life.py).

    fresh:    bootstrap (agent/bootstrap.py) -> phase I -> (the secure sum) -> phase II -> results
    join:     the join asked for -> its new edges' seeds -> phase II from the join's round
    restart:  each phase's saved result reloaded -> phase II from the newest checkpoint -> results

Each phase (agent/phases/) owns its receive rules, its run and its files; it tells the pipeline
where it has got to (`progress`), and the pipeline moves the life accordingly, so GetStatus and
the router see one state machine. What a neighbour's departure changes is the membership's
(agent/membership.py), asked at its named points by the phases. Crash safety: the assignment
is saved before phase I, the mask (or seeds, and the totals) before phase II, phase II's state
every `checkpoint_every` rounds; an agent restarted with the same command reloads all of it
(it never redraws its mask and never calls the coordinator again) and replays the rounds since
its checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.bootstrap import bootstrap, join_run
from agent.life import Life, Stage
from agent.membership import Membership
from agent.options import AgentFailure, AgentOptions
from agent.outbox import Outbox
from agent.peers import Peers
from agent.phases.phase_one import PhaseOne, PhaseOneResult
from agent.phases.phase_two import PhaseTwo
from agent.phases.secure_sum import SecureSum, standardised_session
from agent.prepare import Prepared, prepare
from agent.results import write_failure, write_results
from agent.resume import check_address, reload_checkpoint
from agent.session import Session, open_session
from agent.state import Checkpoint, SavedAssignment, StateStore
from efpsn.algorithms import make_algorithm
from efpsn.masks.factory import mask_of
from efpsn.masks.refresh import MaskProvider
from efpsn.masks.seeds import EdgeSeeds
from efpsn.masks.zero_sum import noise_generator
from efpsn.optimize.driver import checkpoint_shapes
from efpsn.optimize.stopping import StopRule
from efpsn.process.runtime import peak_rss_mb, pss_mb
from efpsn.wire.guard import RejectionLog

__all__ = ["Pipeline", "place_in_phase_two"]

log = logging.getLogger("efpsn.agent")


def _advance(life: Life, stage: Stage, round_: int) -> None:
    """The life's event for a phase's progress report."""
    if stage is Stage.KEYS:
        life.keys()
    elif stage is Stage.SHARES:
        life.shares()
    elif stage is Stage.STATS:
        life.stats()
    elif stage is Stage.OPTIMIZING and life.stage is Stage.OPTIMIZING:
        life.advance(round_)
    elif stage is Stage.OPTIMIZING:
        life.optimizing(round_)
    else:
        raise ValueError(f"no phase reports the stage {stage.value}")


def place_in_phase_two(life: Life, phase_two: PhaseTwo, session: Session, *,
                       round_: int) -> None:
    """An assembled agent put straight into phase II of `session` at round `round_`, as if
    restarted there (the tests' harness and the benchmarks, without a coordinator)."""
    life.assign(session)
    phase_two.open(session, resumed_from=None, position=round_,
                   last=session.config.iterations.total)
    life.optimizing(round_)


class Pipeline:
    """Runs one agent's phases in order (see the module's docstring)."""

    def __init__(self, *, options: AgentOptions, life: Life, store: StateStore, peers: Peers,
                 outbox: Outbox, rejections: RejectionLog, phase_one: PhaseOne,
                 secure_sum: SecureSum, phase_two: PhaseTwo, membership: Membership) -> None:
        self.options = options
        self.life = life
        self.store = store
        self.peers = peers
        self.outbox = outbox
        self.rejections = rejections
        self.phase_one = phase_one
        self.secure_sum = secure_sum
        self.phase_two = phase_two
        self.membership = membership
        self.timings: dict[str, float] = {}

    def progress(self, stage: Stage, round_: int = 0) -> None:
        """A phase got to `stage` (phase II: to round `round_`)."""
        _advance(self.life, stage, round_)

    async def run(self, saved: SavedAssignment | None, *, address: Callable[[], str],
                  port: int) -> dict[str, Any]:
        """A fresh start through the coordinator (`saved` None) or a restart of the saved
        run, to the results; the failure recorded (its life, its failure file) and raised.
        `address()`: where the neighbours reach this agent (served on `port`)."""
        try:
            if saved is None and self.options.join:
                return await self._join(address=address(), port=port)
            if saved is None:
                return await self._fresh(address=address(), port=port)
            if saved.assignment.join_round and not self.store.phase_one_saved():
                return await self._join(address=address(), port=port, saved=saved)
            return await self._resumed(saved, address=address())
        except Exception as exc:
            self.life.fail(str(exc) or type(exc).__name__)
            if self.options.failure_file is not None:
                write_failure(self.options.failure_file, name=self.options.name, error=exc)
            raise
        finally:
            self.phase_one.abandon_keys()

    # ------------------------------------------------------------------ a fresh start

    async def _fresh(self, *, address: str, port: int) -> dict[str, Any]:
        """Bootstrap through the coordinator, save the assignment, phase I, save the mask."""
        opts = self.options
        prepared, assignment = await bootstrap(self.peers.coordinator(), options=opts,
                                               address=address,
                                               on_parameters=self.phase_one.make_keys)
        session = await open_session(assignment, name=opts.name, prepared=prepared)
        saved = SavedAssignment(assignment=assignment, config=prepared.config, advertise=address,
                                port=port, finished=False)
        self.store.save_assignment(assignment, config=prepared.config, advertise=address,
                                   port=port)
        standard = session.config.scale.standard  # phase II's numbers wait for the totals
        self.life.assign(session)
        if not standard:
            self.phase_two.open(session, resumed_from=None)
        self.timings["phase1_started_at"] = time.time()  # wall clock, for start-up
        start = time.perf_counter()
        seed = opts.insecure_noise_seed
        link = self.membership.phase_one(session)
        result = await self.phase_one.run(
            session, link=link, entered=self.progress, timings=self.timings,
            rng=noise_generator(seed, session.index),
            seed_rng=None if seed is None else noise_generator(seed, session.index))
        self.timings["phase1_seconds"] = time.perf_counter() - start
        # before the result: a restart must know who left, and the fixed mask's edge terms
        self.timings.update(await self.membership.phase_one_ended(session,
                                                                  self.phase_one.masker))
        self.phase_one.save(result, run_id=assignment.run_id, timings=self.timings)
        if standard:  # its departures drop their seeds from `result`
            session, result = await self._secure_sum(session, prepared, result)
        return await self._phase_two(session, saved, self._masks(session, result),
                                     history=[], replay=set())

    async def _secure_sum(self, session: Session, prepared: Prepared, result: PhaseOneResult
                          ) -> tuple[Session, PhaseOneResult]:
        """scale standard: the totals by secure summation (agent/phases/secure_sum.py), saved,
        the session phase II runs (resolved with them, data standardised) and its phase I
        result (without the seeds of a neighbour that left during the sum)."""
        start = time.perf_counter()
        totals, seeds = await self.secure_sum.run(
            session, prepared=prepared, seeds=result if isinstance(result, EdgeSeeds) else None,
            link=self.membership.phase_one(session), entered=self.progress)
        if seeds is not None:
            result = seeds
        self.membership.secure_sum_ended(session)  # who left during the sum, before the totals
        self.secure_sum.save(totals, run_id=session.run_id)
        self.timings["stats_seconds"] = time.perf_counter() - start
        session = await asyncio.to_thread(standardised_session, session, prepared, totals,
                                          who=self.options.name)
        self.phase_two.open(session, resumed_from=None)
        self.life.standardised(session)
        return session, result

    # ------------------------------------------------------------------ a join

    async def _join(self, *, address: str, port: int,
                    saved: SavedAssignment | None = None) -> dict[str, Any]:
        """A party of a seat the run left empty: the join asked for (or, restarted before its
        new edges' seeds were saved, the saved assignment), the seeds exchanged with its new
        neighbours (resumed from the state folder: agent/departure/exchange_file.py), then
        phase II from the join's round R, as the members re-base there."""
        opts = self.options
        edges = self.membership.new_edges
        if edges is None:
            raise AgentFailure(f"{opts.name}: --join needs membership changes on (a departure "
                               "deadline, the default; not --departure-deadline 0)")
        if saved is None:
            prepared, assignment = await join_run(self.peers.coordinator(), options=opts,
                                                  address=address)
            saved = SavedAssignment(assignment=assignment, config=prepared.config,
                                    advertise=address, port=port, finished=False)
            self.store.save_assignment(assignment, config=prepared.config, advertise=address,
                                       port=port)
        else:
            check_address(saved, name=opts.name, advertised=address)
            prepared = await asyncio.to_thread(prepare, saved.config, opts)
            assignment = saved.assignment
        session = await open_session(assignment, name=opts.name, prepared=prepared)
        r = assignment.join_round
        partners = {p.name: p.index for p in assignment.neighbours}
        for p in assignment.neighbours:  # the ends of its new edges: seeds first, rounds from R
            session.unlink(p.name)
            session.joining[p.name] = (p.index, p.address, r)
        self.life.assign(session)
        start = time.perf_counter()
        result = await edges.newcomer_mask(session, partners, rebase_round=r,
                                           number=assignment.join_epoch)
        for name in partners:  # neighbours like the others from R on
            session.join(name)
        self.timings["join_seconds"] = time.perf_counter() - start
        self.phase_one.save(result, run_id=assignment.run_id, timings=self.timings)
        self.phase_two.open(session, resumed_from=None, position=r,
                            last=max(assignment.join_cap, r + 1))
        return await self._phase_two(session, saved, self._masks(session, result),
                                     history=[], replay=set())

    # ------------------------------------------------------------------ a restart

    async def _resumed(self, saved: SavedAssignment, *, address: str) -> dict[str, Any]:
        """Restart with the same command: reload everything and carry on (agent/resume.py)."""
        opts = self.options
        name = opts.name
        check_address(saved, name=name, advertised=address)
        config = saved.config
        prepared = await asyncio.to_thread(prepare, config, opts)
        session = await open_session(saved.assignment, name=name, prepared=prepared)
        result, stats = self.phase_one.reload(session, left=self.membership.left_in_phase_one)
        self.timings.update(stats)
        if config.scale.standard:  # the totals saved before phase II, never summed again
            totals = self.secure_sum.reload(run_id=session.run_id, name=name)
            session = await asyncio.to_thread(standardised_session, session, prepared, totals,
                                              who=name)
            config = session.config
        # the state's tensors, the stop rule's window and its check round's state
        shapes = checkpoint_shapes(make_algorithm(config.algorithm).state_keys,
                                   tuple(session.problem.initial_params().shape),
                                   stop=StopRule.for_run(config, session.problem.member_weights).active)
        checkpoint = reload_checkpoint(self.store, name=name, run_id=session.run_id,
                                       expected=shapes)
        resumed_from = checkpoint.round if checkpoint else 0
        sent = self.outbox.restore()
        log.info("%s reloaded %d sent round messages (rounds up to %d)", name, sent,
                 self.outbox.produced)
        log.warning("%s resumes run %s at round %d (saved %s reloaded; %s)", name,
                    session.run_id, resumed_from,
                    "seeds" if isinstance(result, EdgeSeeds) else "mask",
                    "from its checkpoint" if checkpoint else "no checkpoint yet")
        self.life.assign(session)
        self.phase_two.open(session, resumed_from=resumed_from)
        history = list(checkpoint.history) if checkpoint else []
        return await self._phase_two(session, saved, self._masks(session, result),
                                     history=history, replay=set(session.neighbour_names),
                                     checkpoint=checkpoint)

    # ------------------------------------------------------------------ phase II, results

    @staticmethod
    def _masks(session: Session, result: PhaseOneResult) -> MaskProvider:
        """This agent's mask of every round from phase I's result (efpsn/masks/factory.py); a
        party that joined at round R has only its join's edges, which fade from R."""
        return mask_of(result, spec=session.problem.noise_spec, refresh=session.config.refresh,
                       since=session.assignment.join_round)

    async def _phase_two(self, session: Session, saved: SavedAssignment, masks: MaskProvider,
                         *, history: list[dict[str, float]], replay: set[str],
                         checkpoint: Checkpoint | None = None) -> dict[str, Any]:
        opts = self.options
        rounds = self.membership.rounds(session, masks)
        done = await self.phase_two.run(session, masks=masks, membership=rounds,
                                        progress=self.progress, timings=self.timings,
                                        checkpoint=checkpoint, history=history, replay=replay)
        rss, pss = peak_rss_mb(), pss_mb()
        if rss is not None:
            self.timings["max_rss_mb"] = rss
        if pss is not None:  # at the end of phase II, while its neighbours still run
            self.timings["pss_mb"] = pss
        result = write_results(
            Path(opts.results_dir) / opts.name, session=session, name=opts.name,
            x=done.state["x"], history=done.history, timings=self.timings,
            resumed_from=self.phase_two.resumed_from, rejections=dict(self.rejections.counts),
            departures=rounds.records(),
            expose_mask=masks.coefficients(0) if opts.debug_expose_mask else None)
        self.outbox.stop_logging()  # deleted with the checkpoints; memory serves the rest
        self.store.mark_finished(saved)  # the run's secrets go: mask, seeds, totals, records
        self.life.done()
        await rounds.finish(done.driver, done.link)
        return result
