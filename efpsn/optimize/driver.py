"""One agent's phase II, round by round and without I/O: the loop around the algorithm's step
that the in-process simulator and the networked agent share.

The driver owns what happens in a round besides moving messages: the step size of round t,
the step itself, when to evaluate, and the convergence measures an agent can compute from
what it holds (its own iterates and its neighbours' messages), so that a run can tell whether
it has converged without knowing x*. The caller moves the messages: the simulator hands each
agent its neighbours' outboxes, the agent exchanges them over gRPC (agent/phases/phase_two.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch

from efpsn.algorithms.base import (
    AgentState,
    Aggregate,
    Algorithm,
    Message,
    Received,
    StepContext,
    difference,
)
from efpsn.optimize.stopping import STOP_KEY, TERMS, StopRule, exponents, merge
from efpsn.params.schedules import StepSize

__all__ = ["CHECK_STATE", "STOP_STATE", "RoundDriver", "checkpoint_shapes", "progress", "worst"]

STOP_STATE = "stop_state"  # checkpoint tensor: [1, the 4 integers to send] or [0, 0, 0, 0, 0]
# checkpoint tensors of the last check round's state (a departure in its window ends the run
# there: efpsn/departure/last_window.py): [1, its round] or [0, 0], and CHECK_PREFIX + each state
# key
CHECK_STATE, CHECK_PREFIX = "check_state", "check_"


def checkpoint_shapes(state_keys: Sequence[str], shape: tuple[int, ...], *,
                      stop: bool) -> dict[str, tuple[int, ...]]:
    """The tensors of a checkpoint (RoundDriver.checkpoint_tensors), name -> shape: the state's,
    and with a stop rule its window's integers and the last check round's state."""
    shapes = {k: shape for k in state_keys}
    if stop:
        shapes[STOP_STATE] = (TERMS + 1,)
        shapes[CHECK_STATE] = (2,)
        shapes.update({CHECK_PREFIX + k: shape for k in state_keys})
    return shapes


def progress(before: AgentState, state: AgentState, inbox: Mapping[int, Received],
             ctx: StepContext | None = None) -> dict[str, float]:
    """Convergence measures of one agent after a round, from what it holds:

    step: ||x^{t+1} - x^t|| (how much its iterate still moves); gap: max over neighbours j of
    the distance between j's round-t iterate as sent (x, or accelerated tracking's z) and this
    agent's own; tracker: ||y^{t+1}|| for gradient tracking (y tracks the network's average
    gradient, which is 0 at x*). Each is also given relative to max(1, ||x^{t+1}||), the scale
    a user can read.

    With an Aggregate inbox (secure aggregation) no single neighbour's iterate is known: gap is
    then the distance to the neighbours' weighted mean, ||z_bar_N(i) - z_i|| with
    z_bar_N(i) = sum_j w_ij z_j / sum_j w_ij (ctx: the weights of the step's mixing), and the
    certificate uses the graph's factor for it (efpsn.optimize.certificate.spread)."""
    x = state["x"]
    scale = max(1.0, float(torch.linalg.vector_norm(x)))
    out = {"step": float(torch.linalg.vector_norm(x - before["x"]))}
    key = "x" if "z" not in before.tensors else "z"
    if isinstance(inbox, Aggregate):
        if ctx is None:
            raise ValueError("an aggregated inbox's gap needs the mixing weights")
        gaps = [float(torch.linalg.vector_norm(inbox.mean(key, ctx) - before[key]))]
    else:
        gaps = [float(torch.linalg.vector_norm(difference(m[key], before[key])))
                for m in inbox.values()]
    out["gap"] = max(gaps) if gaps else 0.0
    if "y" in state.tensors:
        out["tracker"] = float(torch.linalg.vector_norm(state["y"]))
    for k in list(out):
        out[f"relative_{k}"] = out[k] / scale
    return out


class RoundDriver:
    """The state of one agent's algorithm and what to do in each round.

    `outbox` is the message to send for round `t`; `step(inbox)` consumes the neighbours'
    round-t messages and moves to t + 1, returning True when the caller should evaluate (every
    `eval_every` rounds and at the last); `measures` then holds `progress` of that round.

    With a stop rule (efpsn/optimize/stopping.py) the outbox of a check window also carries the stop
    integers (under STOP_KEY), the neighbours' are merged, and `iterations` drops to the stop
    round when the network's integers certify the target; `stopped_early` then says so.
    `checkpoint_tensors()` adds what a window needs to resume (STOP_STATE).

    The stop rule's kind of round t (StopRule.kind: efpsn/params/tail.py) picks the step: agt's own,
    or a consensus tail's mix, gradient or track step (the algorithm's tail_step); a run that
    stops on a tail's check ends with the tail's points (x = z).
    """

    def __init__(self, *, algorithm: Algorithm, context: StepContext, schedule: StepSize,
                 iterations: int, eval_every: int, x0: torch.Tensor | None = None,
                 resume_from: AgentState | None = None, stop: StopRule | None = None,
                 start: int = 0) -> None:
        if (x0 is None) == (resume_from is None):
            raise ValueError("give x0 (a fresh start) or resume_from (a saved state), not both")
        if iterations < 1 or eval_every < 1:
            raise ValueError(f"need iterations >= 1 and eval_every >= 1, got {iterations}, "
                             f"{eval_every}")
        self.algorithm = algorithm
        self.context = context
        self.schedule = schedule
        self.iterations = iterations
        self.eval_every = eval_every
        self.measures: dict[str, float] = {}
        self.stop = stop if stop is not None and stop.active else None
        self.stopped_early = False
        self.sharing: tuple[int, ...] | None = None  # the stop integers to send with round t
        # the state of the last check round (a departure in its window may end the run there:
        # efpsn/departure/last_window.py; a checkpoint keeps it: checkpoint_tensors)
        self.check: AgentState | None = None
        self._context: tuple[StepContext, StepContext] | None = None  # (base, round's)
        if resume_from is not None:
            tensors = dict(resume_from.tensors)
            saved = tensors.pop(STOP_STATE, None)
            if saved is not None and self.stop is not None and int(saved[0]) == 1:
                self.sharing = tuple(int(v) for v in saved[1:])
            check = tensors.pop(CHECK_STATE, None)
            held = {k[len(CHECK_PREFIX):]: tensors.pop(k) for k in list(tensors)
                    if k.startswith(CHECK_PREFIX)}
            if check is not None and int(check[0]) == 1:  # restarted inside a window
                self.check = AgentState(t=int(check[1]), tensors=held)
            resume_from = AgentState(t=resume_from.t, tensors=tensors)
            self.state = resume_from
            # an outbox is the state's message tensors (true of every algorithm's step)
            self.outbox: Message = {k: resume_from[k] for k in algorithm.message_keys}
        else:
            assert x0 is not None  # at round `start`: 0, or the round a party joins at
            ctx = dataclasses.replace(context, lr=schedule(start))
            self.state, self.outbox = algorithm.init(x0, ctx, t=start)
        self._attach_stop()  # a checkpoint inside a check window resumes its integers

    @property
    def t(self) -> int:
        """The round whose messages are exchanged next (rounds < t are done)."""
        return self.state.t

    @property
    def done(self) -> bool:
        return self.state.t >= self.iterations

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The state's tensors, and with a stop rule the window's integers and the last check
        round's state (float64, exact: checkpoint_shapes)."""
        if self.stop is None:
            return self.state.tensors
        saved = [1, *self.sharing] if self.sharing is not None else [0] * (TERMS + 1)
        check = self.check  # zeros when there is none yet
        return {**self.state.tensors, STOP_STATE: torch.tensor(saved, dtype=torch.float64),
                CHECK_STATE: torch.tensor([1, check.t] if check is not None else [0, 0],
                                          dtype=torch.float64),
                **{CHECK_PREFIX + k: check[k] if check is not None else torch.zeros_like(v)
                   for k, v in self.state.tensors.items()}}

    def step(self, inbox: Mapping[int, Received]) -> bool:
        """Consume the neighbours' round-t messages; True when round t + 1 is to be evaluated."""
        t = self.state.t
        before = self.state
        network, certified = None, math.nan
        if self.sharing is not None and isinstance(inbox, Aggregate):
            network = merge(self.sharing, [_stop_of(j, {STOP_KEY: inbox.stops[j]}
                                                    if j in inbox.stops else {})
                                           for j in sorted(inbox)])
        elif self.sharing is not None:
            network = merge(self.sharing, [_stop_of(j, m) for j, m in sorted(inbox.items())])
        if not isinstance(inbox, Aggregate) and any(STOP_KEY in m for m in inbox.values()):
            # the stop integers are no algorithm's input (of a window a departure voided too)
            inbox = {j: {k: v for k, v in m.items() if k != STOP_KEY} for j, m in inbox.items()}
        ctx = self._round_context(t)
        kind = "agt" if self.stop is None else self.stop.kind(t)
        if kind == "agt":
            self.state, self.outbox = self.algorithm.step(self.state, inbox, ctx)
        else:  # a consensus tail's step (efpsn/params/tail.py; the stop rule has tails for agt only)
            assert self.stop is not None and self.stop.tail is not None
            self.state, self.outbox = self.algorithm.tail_step(  # type: ignore[attr-defined]
                kind, self.state, inbox, ctx, lazy_mixing=self.stop.tail.lazy)
        self.sharing = None
        if self.stop is not None:
            s = self.stop.window(t)
            if network is not None and s is not None and t + 1 < s + self.stop.hops:
                self.sharing = network
            elif network is not None and s is not None and self.stop.stops(network):
                self.iterations = t + 1
                self.stopped_early = True
                certified = self.stop.bound(network)
                if self.stop.tail is not None and self.stop.tail.is_check(s):
                    # what the tail certified: x = z (its points, unmoved in the window)
                    self.state, before = _tail_model(self.state), _tail_model(before)
        due = (t + 1) % self.eval_every == 0 or t + 1 == self.iterations
        check = self.stop is not None and self.stop.is_check(t + 1) and not self.done
        if due or check:
            self.measures = progress(before, self.state, inbox,
                                     self.algorithm.mixing(ctx))
        if self.stopped_early and t + 1 == self.iterations:  # the window's bound, of round s
            self.measures["stop_certificate"] = certified
        if check:
            assert self.stop is not None
            self.check = self.state  # a step makes new tensors: a reference is a copy
            if self.stop.tail is not None and self.stop.tail.is_check(t + 1):
                self.check = _tail_model(self.state)  # a tail certifies its points z
            self.sharing = exponents(self.measures, momentum=self.stop.momentum,
                                     x_norm=float(torch.linalg.vector_norm(self.check["x"])))
        self._attach_stop()
        return due

    def _round_context(self, t: int) -> StepContext:
        """The context with round t's step size: the last round's object again while the
        context and the step size (its bits) are unchanged, so that a step's derived
        contexts (agt's lazy weights) are built once, not every round."""
        lr = self.schedule(t)
        held = self._context
        if (held is None or held[0] is not self.context or held[1].lr != lr
                or math.copysign(1.0, held[1].lr) != math.copysign(1.0, lr)):
            held = (self.context, dataclasses.replace(self.context, lr=lr))
            self._context = held
        return held[1]

    def end_at_check(self, check_round: int) -> None:
        """End with the state of check round `check_round`: the run stopped on its window's
        certificate while a departure kept this agent from reaching the stop round
        (efpsn/departure/last_window.py). ValueError when it does not hold that round's state
        (restarted
        inside the window, or a round that was no check)."""
        if self.check is None or self.check.t != check_round or self.state.t < check_round:
            held = None if self.check is None else self.check.t
            raise ValueError(f"the run stopped on the certificate of round {check_round}, but "
                             f"this agent holds the state of check round {held} only")
        self.state = self.check
        self.outbox = {k: self.state[k] for k in self.algorithm.message_keys}
        self.sharing = None
        self.iterations = check_round
        self.stopped_early = True

    def restart(self) -> None:
        """Round 0 afresh under the current context: the state and message the algorithm's
        init gives (a neighbour that left in phase I: this agent's mask never held the terms
        of their edge, efpsn/departure/replay.py)."""
        if self.state.t != 0:
            raise ValueError(f"restart() is for round 0, the driver is at round {self.t}")
        ctx = dataclasses.replace(self.context, lr=self.schedule(0))
        self.state, self.outbox = self.algorithm.init(self.state["x"], ctx)
        self._attach_stop()

    def revise_stop(self, stop: StopRule | None) -> None:
        """Go on under another stop rule (a departure's: StopRule.voided_from, or the re-based
        graph's); integers of a window it voids are no longer sent."""
        self.stop = stop if stop is not None and stop.active else None
        if self.sharing is not None and (self.stop is None or self.stop.window(self.t) is None):
            self.sharing = None
            self.outbox = {k: v for k, v in self.outbox.items() if k != STOP_KEY}

    def _attach_stop(self) -> None:
        """Put the integers to send with round t into the outbox (RoundMessage.stop)."""
        if self.sharing is not None:
            self.outbox = {**self.outbox, STOP_KEY: stop_tensor(self.sharing)}


def _tail_model(state: AgentState) -> AgentState:
    """A consensus tail's model: its mixed points z as x (efpsn/params/tail.py; during a tail x
    differs from z by the momentum of the round before it)."""
    return AgentState(t=state.t, tensors={**state.tensors, "x": state["z"]})


def _stop_of(sender: int, message: Received) -> tuple[int, ...]:
    """A neighbour's stop integers of a check window (ValueError when it sent none): a tensor
    in the simulator, a received read-only int64 array in the networked agent."""
    values = message.get(STOP_KEY)
    listed = [] if values is None else values.reshape(-1).tolist()
    if len(listed) != TERMS:
        raise ValueError(f"neighbour {sender}'s message of a check window carries no stop "
                         "integers: the agents disagree on the run's stop rule")
    return tuple(int(v) for v in listed)


def worst(measures: list[dict[str, float]]) -> dict[str, float]:
    """The network's convergence measures: the largest of every agent's (NaN-free)."""
    keys = sorted({k for m in measures for k in m})
    return {k: max((m[k] for m in measures if k in m and not math.isnan(m[k])), default=math.nan)
            for k in keys}


def stop_tensor(values: Sequence[int]) -> torch.Tensor:
    """The stop rule's integers as the in-process message entry (int64; efpsn/optimize/stopping.py
    itself imports no torch, so the coordinator can compute a re-base's cap)."""
    return torch.tensor(list(values), dtype=torch.int64)
