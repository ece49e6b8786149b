"""Phase II at one agent: the shared round driver (efpsn/optimize/driver.py) fed by the round exchange
(agent/exchange.py), with checkpoints and the agent's own evaluations.

The same RoundDriver runs in the in-process simulator; only the message moving differs, which is
why a networked run equals the simulator bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.checkpoint_writer import CheckpointWriter
from agent.departing import Silence
from agent.exchange import RoundLink
from agent.mailbox import Mailbox
from agent.options import AgentFailure
from agent.session import Session
from agent.state import Checkpoint, StateStore
from agent.status import Status
from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import AgentState, Message, StepContext
from efpsn.ledger import RoundLedger
from efpsn.masks.refresh import MaskProvider
from efpsn.optimize.driver import RoundDriver
from efpsn.optimize.stopping import StopRule
from efpsn.params.checks import LOCAL_DATA
from efpsn.params.schedules import make_schedule
from efpsn.problem import Problem

__all__ = ["PhaseTwoResult", "evaluate", "run_phase_two"]

log = logging.getLogger("efpsn.agent")


@dataclass
class PhaseTwoResult:
    """The final state, the evaluations, and the message of the run's last round (still to be
    pushed by RoundLink.finish)."""

    state: AgentState
    final_outbox: Message
    history: list[dict[str, float]] = field(default_factory=list)


def make_driver(session: Session, masks: MaskProvider,
                checkpoint: Checkpoint | None) -> RoundDriver:
    """The round driver of this agent's run, fresh or from a checkpoint."""
    cfg, problem = session.config, session.problem
    algorithm = make_algorithm(cfg.algorithm, momentum=cfg.momentum.value)
    schedule = make_schedule(cfg.schedule, iterations=cfg.iterations.total)
    ctx = StepContext(agent=session.index, weights=session.weights(), lr=schedule(0),
                      oracle=problem.objective(session.index, masks))
    common = {"algorithm": algorithm, "context": ctx, "schedule": schedule,
              "iterations": cfg.iterations.total, "eval_every": cfg.eval_every,
              "stop": StopRule.for_run(cfg, problem.weights)}
    if checkpoint is None:
        return RoundDriver(x0=problem.initial_params(), **common)
    return RoundDriver(resume_from=AgentState(t=checkpoint.round, tensors=checkpoint.tensors),
                       **common)


async def run_phase_two(*, session: Session, driver: RoundDriver, link: RoundLink,
                        ledger: RoundLedger, mailbox: Mailbox, store: StateStore,
                        status: Status, checkpoint_every: int, name: str,
                        history: list[dict[str, float]],
                        on_evaluation: Callable[[dict[str, float]], None] | None = None,
                        silence: Silence | None = None) -> PhaseTwoResult:
    """Every round from the driver's (0, or the checkpoint's) to the last; on_evaluation hears
    each evaluation record (e.g. a progress line for this agent's operator). `silence`: a
    neighbour silent past the deadline is reported to the coordinator, and the departure it
    decides is applied (agent/departing.py); None: the silence stops this agent."""
    if not history:
        history.append(evaluate(session.problem, session.index, driver.state, status))
    else:
        evaluate(session.problem, session.index, driver.state, status)
    life = status.life
    life.optimizing(driver.t)
    checkpoints = CheckpointWriter(store, run_id=session.run_id)
    try:
        await _rounds(session=session, driver=driver, link=link, ledger=ledger,
                      mailbox=mailbox, status=status, checkpoints=checkpoints,
                      checkpoint_every=checkpoint_every, history=history,
                      on_evaluation=on_evaluation, silence=silence)
    except BaseException:
        await checkpoints.close(failing=True)
        raise
    await checkpoints.close()
    if driver.t >= life.round:  # the stop rule's round (efpsn/optimize/stopping.py), at most the
        life.advance(driver.t)  # rounds (the check round's, below it, after a last window)
    return PhaseTwoResult(state=driver.state, final_outbox=driver.outbox, history=history)


async def _rounds(*, session: Session, driver: RoundDriver, link: RoundLink, ledger: RoundLedger,
                  mailbox: Mailbox, status: Status, checkpoints: CheckpointWriter,
                  checkpoint_every: int, history: list[dict[str, float]],
                  on_evaluation: Callable[[dict[str, float]], None] | None,
                  silence: Silence | None) -> None:
    """run_phase_two's rounds, to the driver's last or to the run's end decided for the
    others."""
    life = status.life
    first = driver.t
    while not driver.done:
        t = driver.t
        if silence is not None:  # what the departures decided change at round t
            gone, joined = silence.departures.before_round(t, driver)
            ledger.last = max(ledger.last, driver.iterations)  # a re-base may extend the cap
            for neighbour in gone:
                await link.drop(neighbour)
            for neighbour in joined:
                link.join(neighbour)
        await checkpoints.before_round(t)
        try:
            inbox = await link.exchange(t, driver.outbox)
        except AgentFailure as exc:
            if silence is None:
                raise
            inbox = await silence.recover(t, exc, driver, link)
            if inbox is None:  # the run had ended for the others (agent/ending.py): at
                # the window's check round s, or where this agent waits before the cap
                mark = "stopped_at_check" if silence.departures.capped is None else "at_cap"
                history.append({**evaluate(session.problem, session.index, driver.state,
                                           status), mark: 1.0})
                break
        applied = silence is not None and silence.applied == t  # a departure: resume here
        if (t % checkpoint_every == 0 or applied) and t != first:
            # A checkpoint at round t promises that every neighbour holds my round t-1 message
            # (a process restarted from it resends rounds from t on only): their round-t
            # messages, just collected, prove it (none can compute round t without mine).
            # Written by a thread, on disk before my round t + 1 message (agent/
            # checkpoint_writer.py); a departure's round at once: a restart resumes there.
            await checkpoints.save(round_=t, tensors=driver.checkpoint_tensors(),
                                   history=history, durable=applied)
        if silence is not None:  # a new edge's exchange, once the round is saved (departing)
            await silence.finish_edges()
        due = driver.step(inbox)
        life.advance(t + 1)
        ledger.advance(t + 1)
        mailbox.discard_before("round", t + 1)
        if due:
            record = evaluate(session.problem, session.index, driver.state, status)
            history.append({**record, **driver.measures})
            if on_evaluation is not None:
                on_evaluation(history[-1])


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
