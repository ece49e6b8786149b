"""Phase II at one agent: rounds of the shared algorithm step, exchanged with the neighbours,
checkpointed, and replayed from the neighbours' history after a restart."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import signal
from typing import TYPE_CHECKING

import numpy as np
import torch

from agent.concurrency import all_or_first_error, settle
from agent.mailbox import Interrupted
from agent.options import AgentFailure, RefusedByNeighbour
from agent.outbox_log import OutboxLog
from agent.session import Session
from agent.state import Checkpoint, StateError
from efpsn.algorithms import AgentState, Message, StepContext, make_algorithm
from efpsn.config import LOCAL_DATA
from efpsn.masking import MaskCoefficients
from efpsn.schedules import make_schedule
from efpsn.wire import serde
from efpsn.wire.serde import Phase, WireError
from efpsn.wire.v1 import agent_pb2

if TYPE_CHECKING:
    from agent.node import AgentNode

log = logging.getLogger("efpsn.agent")


class Outboxes:
    """My round messages of the newest `keep` rounds, served to restarting neighbours; with a
    log, also kept on disk and reloaded after a crash (restore)."""

    def __init__(self, keep: int, log: OutboxLog | None = None) -> None:
        self.keep = keep
        self.log = log
        self.sent: collections.OrderedDict[int, agent_pb2.RoundMessage] = (
            collections.OrderedDict())
        self.produced = -1  # newest round whose outbox exists

    def remember(self, t: int, request: agent_pb2.RoundMessage, data: bytes) -> None:
        """Keep my round-t message (`data`: its serialized bytes, as sent)."""
        if self.log is not None and t > self.produced:
            self.log.append(t, data)
        self._keep(t, request)

    def _keep(self, t: int, request: agent_pb2.RoundMessage) -> None:
        self.sent[t] = request
        self.produced = max(self.produced, t)
        while len(self.sent) > self.keep:
            self.sent.popitem(last=False)

    def restore(self) -> int:
        """Reload what the previous process sent (from the log); returns how many rounds."""
        if self.log is None:
            return 0
        count = 0
        for t, data in self.log.load().items():
            try:
                self._keep(t, agent_pb2.RoundMessage.FromString(data))
                count += 1
            except Exception:  # noqa: BLE001 - a damaged record is one round we cannot serve
                log.warning("outbox record of round %d is damaged; skipped", t)
        return count

    def held(self) -> str:
        return f"{min(self.sent)}..{max(self.sent)}" if self.sent else "none"


def decode_round(
    session: Session, pb: agent_pb2.RoundMessage, *, sender: str, round_: int
) -> tuple[dict[str, torch.Tensor], bytes]:
    """Validate a neighbour's round message (pushed or pulled): header, names, shapes,
    float64, finite. Returns its tensors and its digest (serde.round_digest); raises WireError
    saying what is wrong."""
    serde.validate_header(pb.header, run_id=session.run_id, phase=Phase.OPTIMIZE,
                          senders={sender}, round=round_)
    tensors, digest = serde.decode_round_message(pb, expected_shapes=session.message_shapes)
    for name, tensor in tensors.items():
        if tensor.dtype != torch.float64:
            raise WireError(f"tensor {name!r} must be float64, got {tensor.dtype}")
        if not _all_finite(tensor.numpy()):
            raise WireError(f"tensor {name!r} has non-finite entries")
    return tensors, digest


def _all_finite(values: np.ndarray) -> bool:
    """No NaN or infinity: a finite sum proves it in one cheap pass (NaN and infinities
    propagate into the sum); an overflowing sum of finite values gets the full check."""
    return bool(np.isfinite(values.sum())) or bool(np.isfinite(values).all())


async def run_phase_two(node: AgentNode, mask: MaskCoefficients, *, resume: bool) -> AgentState:
    """All rounds from the start (or from the newest checkpoint when resuming) to the last."""
    s = node.session
    assert s is not None
    cfg, problem = s.config, s.problem
    algorithm = make_algorithm(cfg.algorithm)
    schedule = make_schedule(cfg.schedule, iterations=cfg.iterations)
    ctx = StepContext(
        agent=s.index, weights=s.weights(), lr=schedule(0),
        oracle=problem.objective(s.index, mask),
    )
    state, outbox = algorithm.init(problem.initial_params(), ctx)
    checkpoint = _load_checkpoint(node, state) if resume else None
    if resume:
        node.resumed_from = checkpoint.round if checkpoint else 0
        log.warning("%s resumes run %s at round %d (saved mask reloaded; %s)",
                    node.options.name, s.run_id, node.resumed_from,
                    "from its checkpoint" if checkpoint else "no checkpoint yet")
    if checkpoint is None:
        node.history = [evaluate(node, state, 0)]
    else:
        state = AgentState(t=checkpoint.round, tensors=checkpoint.tensors)
        # an outbox is the state's message tensors (true of every algorithm's step)
        outbox = {k: state[k] for k in algorithm.message_keys}
        node.history = list(checkpoint.history)
        evaluate(node, state, checkpoint.round)
    node.status.round = state.t
    node.status.phase = Phase.OPTIMIZE
    every = node.options.checkpoint_every
    crash_at = _test_crash_round(node.options.name)
    first = state.t
    for t in range(first, cfg.iterations):
        if t == crash_at:  # hidden test hook: die here like a power cut (no cleanup)
            os.kill(os.getpid(), signal.SIGKILL)
        node.status.round = t
        inbox = await exchange(node, outbox, t, timeout=cfg.round_timeout_seconds)
        if t % every == 0 and t != first:
            # A checkpoint at round t promises that every neighbour holds my round t-1 message
            # (a process restarted from it resends rounds from t on only): their round-t
            # messages, just collected, prove it (none can compute round t without mine).
            node.store.save_checkpoint(run_id=s.run_id, round_=t, tensors=state.tensors,
                                       history=node.history)
        state, outbox = algorithm.step(state, inbox, dataclasses.replace(ctx, lr=schedule(t)))
        node.status.round = t + 1
        node.mailbox.discard_before("round", t + 1)
        node.mailbox.forget_before("round", t + 1 - node.options.keep_rounds)
        if (t + 1) % cfg.eval_every == 0 or t + 1 == cfg.iterations:
            node.history.append(evaluate(node, state, t + 1))
    node.status.round = cfg.iterations
    node.final_outbox = outbox
    return state


def _test_crash_round(name: str) -> int | None:
    """Hidden test hook: EFPSN_TEST_CRASH_AT_ROUND=T (or NAME:T, for agent NAME only) makes the
    agent SIGKILL itself when it reaches round T, before sending anything for it (tests kill at
    a known round instead of racing the checkpoint writes). Unset: None."""
    who, _, at = os.environ.get("EFPSN_TEST_CRASH_AT_ROUND", "").rpartition(":")
    return int(at) if at and who in ("", name) else None


def _load_checkpoint(node: AgentNode, initial: AgentState) -> Checkpoint | None:
    """The newest intact checkpoint with the same tensors as the algorithm's state."""
    s = node.session
    assert s is not None
    expected = {k: tuple(v.shape) for k, v in initial.tensors.items()}
    try:
        return node.store.load_checkpoint(run_id=s.run_id, expected=expected)
    except StateError as exc:
        raise AgentFailure(f"{node.options.name} cannot resume: {exc}") from None


async def exchange(node: AgentNode, outbox: Message, t: int, *, timeout: float,
                   final: bool = False) -> dict[int, Message]:
    """Send my round-t message to every neighbour while collecting theirs (pulling rounds a
    neighbour sent to this agent's previous process, after a restart).

    Round messages go on the round streams, with no answer per message: a neighbour's next
    round message is the acknowledgement, so only the neighbours' messages are on the critical
    path. A stream that ended (a refusal, a neighbour restarting) is mended first: the rounds
    it carried that were not confirmed go again by PutRound (Peers.repair), also when it ends
    while we wait. final: the run's last round, sent by PutRound and acknowledged, since no
    later round will confirm it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    await delivered(node)
    peers, s = node.peers, node.session
    assert s is not None
    await peers.repair(node.outboxes.sent, deadline=deadline)
    request = serde.message_to_proto(outbox, header=peers.header(Phase.OPTIMIZE, t))
    data = request.SerializeToString()
    node.outboxes.remember(t, request, data)
    if final:
        sends = (peers.send(name, "PutRound", request, timeout=timeout)
                 for name in sorted(s.addresses))
    else:
        sends = (peers.send_round(name, request, data, timeout=timeout)
                 for name in sorted(s.addresses))
    node.sending = asyncio.ensure_future(all_or_first_error(sends))
    try:
        await _pull_missing(node, t, deadline=deadline)
        while True:
            try:
                return await peers.collect("round", t, timeout=max(0.0, deadline - loop.time()))
            except Interrupted:
                await peers.repair(node.outboxes.sent, deadline=deadline)
    except BaseException:
        await abandon_sending(node)
        raise


async def delivered(node: AgentNode) -> None:
    """Wait until my last round message is written to every neighbour's stream (or, by
    PutRound, acknowledged); AgentFailure if a neighbour refused it or stayed unreachable until
    the deadline."""
    sending, node.sending = node.sending, None
    if sending is not None:
        await sending


async def abandon_sending(node: AgentNode) -> None:
    """Cancel a delivery still under way and collect its outcome, so that no task is left
    with an exception nobody retrieved."""
    sending, node.sending = node.sending, None
    if sending is not None:
        await settle(sending)


async def _pull_missing(node: AgentNode, t: int, *, deadline: float) -> None:
    """After a restart, ask neighbours for round-t messages that were pushed to this agent's
    previous process. A neighbour that has not reached round t yet will push it (to this
    process), so it is not asked again."""
    wanted = [n for n in sorted(node.pull_from) if not node.mailbox.has("round", t, n)]
    if wanted:
        await all_or_first_error(_pull(node, name, t, deadline=deadline) for name in wanted)


async def _pull(node: AgentNode, name: str, t: int, *, deadline: float) -> None:
    assert node.session is not None
    request = serde.round_request(header=node.peers.header(Phase.OPTIMIZE, t))
    try:
        reply = await node.peers.call(name, "GetRound", request, deadline=deadline,
                                      what=f"pulling OPTIMIZE round {t} from")
    except RefusedByNeighbour as exc:
        if exc.code != "NOT_FOUND":
            raise
        reason = (f"run {node.session.run_id} cannot resume at {node.options.name}: it must "
                  f"replay round {t} from its checkpoint {node.resumed_from}, and {name} no "
                  f"longer holds that round ({exc.detail}); start a new run")
        node.store.mark_unresumable(reason)
        raise AgentFailure(reason) from None
    if not reply.available:
        node.pull_from.discard(name)
        return
    try:
        tensors, digest = decode_round(node.session, reply.message, sender=name, round_=t)
        node.mailbox.put("round", t, name, tensors, digest)
    except ValueError as exc:
        raise AgentFailure(f"neighbour {name} served a bad round {t}: {exc}") from None


async def final_barrier(node: AgentNode) -> None:
    """Push my final outbox (round T) and wait, still serving GetRound, until every
    neighbour has finished too (or the round deadline passes): a neighbour that restarts
    near the end can then still replay the rounds it needs from us."""
    s = node.session
    assert s is not None and node.final_outbox is not None
    try:
        await exchange(node, node.final_outbox, s.config.iterations,
                       timeout=s.config.round_timeout_seconds, final=True)
        await delivered(node)
    except AgentFailure as exc:
        log.warning("%s finished, but not every neighbour confirmed it did: %s",
                    node.options.name, exc)


def evaluate(node: AgentNode, state: AgentState, t: int) -> dict[str, float]:
    """Local, unmasked metrics of this agent's iterate (what one agent can know): loss on its
    training data, accuracy on the public test set (else its held-out part), held-out
    accuracy. They go into its own result.json; with agent-local data its status (on the wire)
    carries only the public-test accuracy."""
    s = node.session
    assert s is not None
    x, problem = state["x"], s.problem
    shard = problem.shard(s.index)
    loss, _ = problem.task.loss_and_grad(x, shard.images, shard.labels)
    record = {"round": t, "loss": float(loss)}
    holdout = problem.holdouts[s.index] if problem.holdouts else None
    if holdout is not None:
        record["holdout_accuracy"] = float(problem.task.accuracy(x, holdout))
    if problem.test is not None:
        record["accuracy"] = float(problem.task.accuracy(x, problem.test))
    else:  # agent-local data without a public test set: the local held-out part
        record["accuracy"] = record.get("holdout_accuracy", float("nan"))
    if problem.config.data == LOCAL_DATA:
        # GetStatus goes on the wire: only the accuracy on the public test set, nothing
        # measured on this agent's private data (that stays in its own result.json)
        node.status.loss = float("nan")
        node.status.accuracy = record["accuracy"] if problem.test is not None else float("nan")
    else:
        node.status.loss, node.status.accuracy = record["loss"], record["accuracy"]
    return record
