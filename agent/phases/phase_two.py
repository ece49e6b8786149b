"""Phase II at one agent: the shared round driver (efpsn/optimize/driver.py) fed by the round
exchange (agent/exchange.py), with checkpoints and the agent's own evaluations.

PhaseTwo owns the phase: its receive side (every neighbour's round message, however it arrives
- a PutRound push, a message of its round stream, a restart's pull of a round pushed to the
previous process - is parsed once at the edge, efpsn/wire/rounds.py, judged by its RoundLedger,
efpsn/ledger.py, and filed in the mailbox), its rounds, and its checkpoints (through the state
store, agent/checkpoint_writer.py). What a silent neighbour means is the membership's
(agent/membership.py). The same RoundDriver runs in the in-process simulator; only the message
moving differs, which is why a networked run equals the simulator bit for bit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from agent.checkpoint_writer import CheckpointWriter
from agent.exchange import Replay, RoundLink
from agent.life import Stage
from agent.mailbox import Mailbox
from agent.membership import RoundsMembership
from agent.options import AgentFailure, AgentOptions, NotReady
from agent.outbox import Outbox
from agent.peers import Peers
from agent.session import Session
from agent.state import Checkpoint, StateStore
from agent.status import Status
from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import AgentState, Message, StepContext
from efpsn.ledger import Judgement, RoundLedger, Verdict
from efpsn.masks.refresh import MaskProvider
from efpsn.optimize.driver import RoundDriver
from efpsn.optimize.stopping import StopRule
from efpsn.params.checks import LOCAL_DATA
from efpsn.params.schedules import make_schedule
from efpsn.problem import Problem
from efpsn.wire.rounds import parse_round

__all__ = ["PhaseTwo", "PhaseTwoResult", "evaluate", "make_driver"]

log = logging.getLogger("efpsn.agent")

Progress = Callable[[Stage, int], None]


@dataclass
class PhaseTwoResult:
    """The driver at its last round (its state, and the message of the run's last round, still
    to be pushed: RoundsMembership.finish), the evaluations, and the link that pushes it."""

    driver: RoundDriver
    link: RoundLink
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def state(self) -> AgentState:
        return self.driver.state

    @property
    def final_outbox(self) -> Message:
        return self.driver.outbox


def make_driver(session: Session, masks: MaskProvider,
                checkpoint: Checkpoint | None) -> RoundDriver:
    """The round driver of this agent's run, fresh or from a checkpoint. A party that joined
    (Assignment.join_round R) starts at round R from the model's initial point, under the
    members' stop rule re-based at R and its cap (efpsn/departure/joins.py), as the others
    re-base there."""
    cfg, problem, assignment = session.config, session.problem, session.assignment
    algorithm = make_algorithm(cfg.algorithm, momentum=cfg.momentum.value)
    schedule = make_schedule(cfg.schedule, iterations=cfg.iterations.total)
    start = assignment.join_round
    ctx = StepContext(agent=session.index, weights=session.weights(), lr=schedule(start),
                      oracle=problem.objective(session.index, masks))
    if start:  # the stop rule of the members' graph from the join on, its cap
        stop = StopRule.rebased(cfg, problem.member_weights, origin=start, until=None,
                                cap=assignment.join_cap)
        cap = stop.cap if stop.active else assignment.join_cap
    else:
        stop, cap = StopRule.for_run(cfg, problem.member_weights), cfg.iterations.total
    common = {"algorithm": algorithm, "context": ctx, "schedule": schedule, "iterations": cap,
              "eval_every": cfg.eval_every, "stop": stop}
    if checkpoint is None:
        return RoundDriver(x0=problem.initial_params(), start=start, **common)
    return RoundDriver(resume_from=AgentState(t=checkpoint.round, tensors=checkpoint.tensors),
                       **common)


class PhaseTwo:
    """Phase II at one agent (see the module's docstring)."""

    def __init__(self, *, options: AgentOptions, peers: Peers, mailbox: Mailbox,
                 outbox: Outbox, store: StateStore, status: Status) -> None:
        self.options = options
        self.peers = peers
        self.mailbox = mailbox
        self.outbox = outbox
        self.store = store
        self.status = status
        self.session: Session | None = None
        self.ledger: RoundLedger | None = None  # once round messages may be taken
        self._reported = 0  # the round last reported to the pipeline

    # ------------------------------------------------------------------ what comes in

    def open(self, session: Session, *, resumed_from: int | None,
             position: int | None = None, last: int | None = None) -> None:
        """From now on `session`'s round messages are taken (a scale standard run opens once
        its totals are known): the receive rules of a fresh start, or of a restart at its
        checkpoint's round (`position`, `last`: the round collected first and the last, when
        an agent is placed in phase II without a run of its own: the tests' harness)."""
        self.session = session
        self.ledger = RoundLedger(
            last=session.config.iterations.count or 1 if last is None else last,
            keep=self.options.keep_rounds,
            position=(resumed_from or 0) if position is None else position,
            resumed_from=resumed_from)

    def take_round(self, message: Any, *, senders: Collection[str],
                   round_: int | None = None) -> Judgement:
        """Validate `message` (a RoundMessage: from one of `senders`, of round `round_` when
        given; WireError, a ValueError, otherwise), judge it, file it when accepted, and
        return the judgement (each caller turns it into its own answer: an acknowledgement or
        a refusal; for the replay, going on or failing). NotReady before phase II opens."""
        session, ledger = self.session, self.ledger
        if session is None or ledger is None:
            raise NotReady("phase II has not started here yet")
        record = parse_round(message, run_id=session.run_id, senders=senders,
                             shapes=session.message_shapes, seed=ledger.seed, round_=round_)
        judgement = ledger.judge(record.sender, record.round, record.digest)
        if judgement.verdict == Verdict.ACCEPT:
            self.mailbox.put("round", record.round, record.sender, record.tensors)
        return judgement

    def last_round(self, session: Session) -> int:
        """The run's last round as this agent knows it (a departure's re-base may extend the
        cap past the configured one)."""
        return self.ledger.last if self.ledger is not None else session.config.iterations.total

    @property
    def resumed_from(self) -> int | None:
        return None if self.ledger is None else self.ledger.resumed_from

    # ------------------------------------------------------------------ the rounds

    async def run(self, session: Session, *, masks: MaskProvider, membership: RoundsMembership,
                  progress: Progress, timings: dict[str, float],
                  checkpoint: Checkpoint | None = None,
                  history: list[dict[str, float]] | None = None,
                  replay: set[str] | None = None) -> PhaseTwoResult:
        """Every round from the checkpoint's (0 for a fresh start) to the last, or to the
        run's end decided for the others; what they cost goes into `timings`. `replay`: the
        neighbours that may hold rounds pushed to this agent's previous process (a restart:
        agent/resume.py's Replay)."""
        opts, cfg = self.options, session.config
        assert self.ledger is not None, "phase II runs once opened"
        driver = make_driver(session, masks, checkpoint)
        first = driver.t
        history = list(history or [])
        replay = set(replay or ())
        if await membership.start(driver, restarted=bool(replay)):
            replay = set(session.neighbour_names)  # the neighbours as the restart left them
        link = RoundLink(
            peers=self.peers, outbox=self.outbox, run_id=session.run_id, name=opts.name,
            neighbours=list(session.neighbour_names), timeout=membership.timeout,
            holds=self.ledger.holds,
            replay=Replay(peers=self.peers, take=self.take_round, mailbox=self.mailbox,
                          neighbours=replay, describe_loss=self._describe_loss(session, first),
                          on_loss=self.store.mark_unresumable))
        say = None if opts.quiet else self._progress_line(cfg.iterations.total)
        timings["phase2_started_at"] = time.time()  # wall clock, for start-up
        start, cpu = time.perf_counter(), time.process_time()
        if not history:
            history.append(evaluate(session.problem, session.index, driver.state, self.status))
        else:
            evaluate(session.problem, session.index, driver.state, self.status)
        progress(Stage.OPTIMIZING, driver.t)
        self._reported = driver.t
        checkpoints = CheckpointWriter(self.store, run_id=session.run_id)
        try:
            try:
                await self._rounds(session, driver=driver, link=link, membership=membership,
                                   checkpoints=checkpoints, history=history, progress=progress,
                                   say=say)
            except BaseException:
                await checkpoints.close(failing=True)
                raise
            await checkpoints.close()
        except BaseException:
            await link.abandon()
            raise
        if driver.t >= self._reported:  # the stop rule's round, at most the rounds (the check
            progress(Stage.OPTIMIZING, driver.t)  # round's, below it, after a last window)
        rounds = max(1, driver.t - first)
        timings["rounds"] = driver.t
        timings["phase2_seconds"] = time.perf_counter() - start
        timings["seconds_per_round"] = timings["phase2_seconds"] / rounds
        # this process's CPU (every thread: gRPC's too) per round: what a round costs
        timings["cpu_seconds_per_round"] = (time.process_time() - cpu) / rounds
        return PhaseTwoResult(driver=driver, link=link, history=history)

    async def _rounds(self, session: Session, *, driver: RoundDriver, link: RoundLink,
                      membership: RoundsMembership, checkpoints: CheckpointWriter,
                      history: list[dict[str, float]], progress: Progress,
                      say: Callable[[dict[str, float]], None] | None) -> None:
        ledger, every = self.ledger, self.options.checkpoint_every
        assert ledger is not None
        first = driver.t
        while not driver.done:
            t = driver.t
            gone, joined = await membership.before_round(t, driver)  # what round t changes
            ledger.last = max(ledger.last, driver.iterations)  # a re-base may extend the cap
            for neighbour in gone:
                await link.drop(neighbour)
            for neighbour in joined:
                link.join(neighbour)
            await checkpoints.before_round(t)
            try:
                inbox = await link.exchange(t, driver.outbox)
            except AgentFailure as failure:
                inbox = await membership.on_silence(t, failure, driver, link)
                if inbox is None:  # the run had ended for the others (agent/departure/
                    # ending.py): at the window's check round, or where this agent waits
                    mark = membership.ended or "ended"
                    history.append({**evaluate(session.problem, session.index, driver.state,
                                               self.status), mark: 1.0})
                    break
            applied = membership.applied(t)  # a departure: a restart resumes here
            if (t % every == 0 or applied) and t != first:
                # A checkpoint at round t promises that every neighbour holds my round t-1
                # message (a process restarted from it resends rounds from t on only): their
                # round-t messages, just collected, prove it (none can compute round t
                # without mine). Written by a thread, on disk before my round t + 1 message
                # (agent/checkpoint_writer.py); a departure's round at once.
                await checkpoints.save(round_=t, tensors=driver.checkpoint_tensors(),
                                       history=history, durable=applied)
            await membership.round_saved(t)
            due = driver.step(inbox)
            progress(Stage.OPTIMIZING, t + 1)
            self._reported = t + 1
            ledger.advance(t + 1)
            self.mailbox.discard_before("round", t + 1)
            if due:
                record = evaluate(session.problem, session.index, driver.state, self.status)
                history.append({**record, **driver.measures})
                if say is not None:
                    say(history[-1])

    def _progress_line(self, iterations: int) -> Callable[[dict[str, float]], None]:
        """A progress line per evaluation, for this agent's own operator (its log)."""
        name = self.options.name

        def say(record: dict[str, float]) -> None:
            # its own loss and accuracy, and how far it still moves and disagrees with its
            # neighbours (efpsn.optimize.driver.progress; relative to max(1, ||x||))
            figures = ", ".join(f"{k.replace('relative_', '')} {record[k]:.4g}"
                                for k in ("loss", "accuracy", "relative_step", "relative_gap")
                                if k in record)
            log.info("%s: round %d/%d: %s", name, int(record["round"]), iterations, figures)
        return say

    def _describe_loss(self, session: Session, resumed_from: int) -> Callable[..., str]:
        def describe(neighbour: str, t: int, detail: str) -> str:
            return (f"run {session.run_id} cannot resume at {self.options.name}: it must "
                    f"replay round {t} from its checkpoint {resumed_from}, and {neighbour} no "
                    f"longer holds that round ({detail}); start a new run")
        return describe


def evaluate(problem: Problem, index: int, state: AgentState, status: Status
             ) -> dict[str, float]:
    """Local, unmasked metrics of this agent's iterate (what one agent can know): loss on its
    training data, accuracy on the public test set (else its held-out part), held-out
    accuracy. They go into its own result.json; with agent-local data its status (on the wire)
    carries only the public-test accuracy."""
    x = state["x"]
    shard = problem.shard(index)
    loss, _ = problem.task.loss_and_grad(x, shard.images, shard.labels)
    record = {"round": state.t, "loss": float(loss)}
    holdout = problem.holdouts[index] if problem.holdouts else None
    if holdout is not None:
        record["holdout_accuracy"] = float(problem.task.accuracy(x, holdout))
    if problem.test is not None:
        record["accuracy"] = float(problem.task.accuracy(x, problem.test))
    else:  # agent-local data without a public test set: the local held-out part
        record["accuracy"] = record.get("holdout_accuracy", float("nan"))
    if problem.config.data == LOCAL_DATA:
        # GetStatus goes on the wire: only the accuracy on the public test set, nothing
        # measured on this agent's private data (that stays in its own result.json)
        status.loss = float("nan")
        status.accuracy = record["accuracy"] if problem.test is not None else float("nan")
    else:
        status.loss, status.accuracy = record["loss"], record["accuracy"]
    return record
