"""Step-size schedules: the one place where learning rates are defined."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from efpsn.params.values import Schedule


class StepSize(Protocol):
    """A step size as a function of the 0-based round index t."""

    def __call__(self, t: int) -> float: ...


@dataclass(frozen=True)
class Constant:
    """alpha_t = lr for every round (gradient tracking converges exactly with it)."""

    lr: float

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"constant step size must be a finite positive number, got {self.lr!r}")

    def __call__(self, t: int) -> float:
        return self.lr


@dataclass(frozen=True)
class PaperSchedule:
    """The paper's DSGD schedule: lr0 for `hold` rounds, then geometric decay to `final` at `total`.

    The paper only says the rate "remains fixed in the first 2000 steps, and drops to 4e-5 at the
    last step". We choose the geometric (log-linear) shape
    alpha_t = lr0 * (final / lr0) ** ((t - hold) / (total - 1 - hold)) for hold <= t < total,
    so round `total - 1` (the last of `total` updates) uses exactly `final`; rounds past the end
    keep `final`.
    """

    lr0: float = 0.2
    hold: int = 2000
    final: float = 4e-5
    total: int = 10_000

    def __post_init__(self) -> None:
        if not (self.lr0 > 0 and self.final > 0):
            raise ValueError(f"learning rates must be positive, got lr0={self.lr0}, final={self.final}")
        if not (0 <= self.hold < self.total - 1):
            raise ValueError(
                f"need 0 <= hold < total - 1, got hold={self.hold}, total={self.total}"
            )

    def __call__(self, t: int) -> float:
        if t < self.hold:
            return self.lr0
        frac = min(1.0, (t - self.hold) / (self.total - 1 - self.hold))
        return self.lr0 * (self.final / self.lr0) ** frac


@dataclass(frozen=True)
class OneCycle:
    """A warm-up, then a linear decay (Smith's one-cycle policy, for mini-batch training of
    neural networks): alpha_t rises linearly from peak / 10 at t = 0 to `peak` at t = `warmup`,
    then falls linearly to peak / (total - warmup) at the last round t = total - 1 (never 0);
    rounds past the end keep that last value.

    The warm-up keeps the first rounds' steps small while gradient tracking's trackers still
    carry the zero-sum masks' start (efpsn/masks/fading.py: the fixed part mixes away within a
    few dozen rounds, the fresh part fades): a neural network's iterates then stay where its
    gradients mean something. The decay averages the mini-batches' noise away at the end.
    Every value is a few exact float operations on public numbers (the same bits anywhere)."""

    peak: float
    warmup: int
    total: int

    def __post_init__(self) -> None:
        if not (self.peak > 0 and math.isfinite(self.peak)):
            raise ValueError(f"onecycle's peak step must be a finite positive number, got "
                             f"{self.peak!r}")
        if not 0 <= self.warmup < self.total:
            raise ValueError(f"need 0 <= warmup < total, got warmup={self.warmup}, "
                             f"total={self.total}")

    def __call__(self, t: int) -> float:
        if t < self.warmup:
            return self.peak * (0.1 + 0.9 * t / self.warmup)
        left = self.total - min(t, self.total - 1)  # total - warmup at the peak, 1 at the end
        return self.peak * left / (self.total - self.warmup)


ONECYCLE_WARMUP = 0.15  # of the rounds: onecycle's warm-up


def make_schedule(spec: Schedule | str, *, iterations: int) -> StepSize:
    """The step size of a schedule (efpsn.params.values.Schedule, or its text): "paper",
    "paper:LR0", "constant:LR", "onecycle:LR" (a warm-up over the first 15% of rounds, then a
    linear decay: OneCycle) or "auto:LR" (the constant step the public step rule gave,
    efpsn/params/step_rule.py).

    "paper" keeps the paper's proportions (hold for the first 20% of rounds, reach 4e-5 at the last)
    so that a shortened run (e.g. a quick profile) decays over its own length.
    """
    schedule = Schedule.of(spec)
    if schedule.unresolved:
        raise ValueError("schedule auto is the step rule's: resolve the run first "
                         "(RunConfig.resolved), which gives auto:LR")
    if schedule.kind in ("auto", "constant"):
        assert schedule.lr is not None
        return Constant(schedule.lr)
    if schedule.kind == "onecycle":
        assert schedule.lr is not None
        return OneCycle(peak=schedule.lr, warmup=math.floor(iterations * ONECYCLE_WARMUP),
                        total=max(1, iterations))
    lr0 = 0.2 if schedule.lr is None else schedule.lr
    if iterations < 3:
        return Constant(lr0)
    hold = min(iterations - 2, max(0, round(iterations * 0.2)))
    return PaperSchedule(lr0=lr0, hold=hold, final=4e-5, total=iterations)
