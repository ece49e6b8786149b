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


def make_schedule(spec: Schedule | str, *, iterations: int) -> StepSize:
    """The step size of a schedule (efpsn.params.values.Schedule, or its text): "paper",
    "paper:LR0", "constant:LR", or "auto:LR" (the constant step the public step rule gave,
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
    lr0 = 0.2 if schedule.lr is None else schedule.lr
    if iterations < 3:
        return Constant(lr0)
    hold = min(iterations - 2, max(0, round(iterations * 0.2)))
    return PaperSchedule(lr0=lr0, hold=hold, final=4e-5, total=iterations)
