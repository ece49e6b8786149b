"""The public data schema's words: the task (TaskSpec), per-sample input shapes, and the public
scale features are divided by (Scale); the two run parameters are values parsed once, like
efpsn/params/values.py's. Torch-free (the coordinator validates with it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from efpsn.params.refresh_setting import Refresh

__all__ = ["STANDARD", "STANDARD_DISCLOSURE", "TASKS", "Scale", "TaskSpec", "check_standard_masks",
           "parse_shape"]

STANDARD = "standard"
"""The scale word of features standardised with the network's column statistics (mean and
standard deviation by secure summation: efpsn/stats/column_sums.py): read raw, divided by
nothing."""

STANDARD_DISCLOSURE = ("disclosed by design to every agent (scale standard): every column's global "
                       "mean and variance and the total sample count (with a table's empty "
                       "cells: how many cells of each column hold a value); opt out with a "
                       "public scale (schema.json or --scale none|div:...)")
"""The named disclosure of a scale standard run (README: features in any units)."""

TASKS = ("logreg", "ridge", "lenet", "mlp:H1,H2,...", "python:MODULE:FACTORY")

TaskKind = Literal["logreg", "ridge", "lenet", "mlp", "python"]


@dataclass(frozen=True)
class TaskSpec:
    """The `task` run parameter: logreg, ridge (a numeric target: squared loss + l2), lenet,
    mlp:H1,H2,... (`hidden` widths) or python:MODULE:FACTORY (`factory`, "MODULE:FACTORY": a
    user's model). Wire: its text."""

    kind: TaskKind
    hidden: tuple[int, ...] = ()
    factory: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("logreg", "ridge", "lenet", "mlp", "python"):
            raise ValueError(f"task must be one of {TASKS}, got {self.kind!r}")
        if (self.kind == "mlp") != bool(self.hidden) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in self.hidden):
            raise ValueError(f"task {self.kind!r}: hidden widths {self.hidden!r} are for mlp, "
                             "positive")
        module, sep, factory = self.factory.rpartition(":")
        if (self.kind == "python") != bool(self.factory) or (
                self.factory and not (sep and module and factory.isidentifier())):
            raise ValueError(f"task {self.kind!r}: factory {self.factory!r} is python's, "
                             "MODULE:FACTORY")

    @classmethod
    def parse(cls, task: str) -> TaskSpec:
        """logreg, lenet, mlp:H1,H2,... or python:MODULE:FACTORY; else ValueError saying which."""
        if not isinstance(task, str):
            raise TypeError(f"task must be a str, got {type(task).__name__}")
        if task in ("logreg", "ridge", "lenet"):
            return cls(task)  # type: ignore[arg-type]
        if task.startswith("mlp:"):
            widths = task[4:].split(",")
            if all(w.isdigit() and int(w) >= 1 for w in widths):
                return cls("mlp", hidden=tuple(int(w) for w in widths))
            raise ValueError(f"task {task!r}: expected mlp:H1,H2,... with positive hidden widths")
        if task.startswith("python:"):
            module, sep, factory = task[7:].rpartition(":")
            if sep and module and factory.isidentifier():
                return cls("python", factory=task[7:])
            raise ValueError(f"task {task!r}: expected python:MODULE:FACTORY, e.g. "
                             "python:mymodel:make")
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")

    @classmethod
    def of(cls, value: TaskSpec | str) -> TaskSpec:
        """A TaskSpec as it is, or its text parsed."""
        return value if isinstance(value, TaskSpec) else cls.parse(value)

    def wire(self) -> str:
        return str(self)

    def __str__(self) -> str:
        if self.kind == "mlp":
            return "mlp:" + ",".join(map(str, self.hidden))
        return "python:" + self.factory if self.kind == "python" else self.kind

    @property
    def logreg(self) -> bool:
        """Logistic regression (softmax cross-entropy on a linear model)."""
        return self.kind == "logreg"

    @property
    def regression(self) -> bool:
        """A numeric target (ridge): one output per sample, labels are numbers, the score is
        R^2; every other task classifies."""
        return self.kind == "ridge"

    @property
    def linear(self) -> bool:
        """A linear model with a convex loss (logreg, ridge): the tasks with a public curvature
        bound (efpsn/params/step_rule.py), an x* and a convergence certificate."""
        return self.kind in ("logreg", "ridge")


def parse_shape(text: str) -> tuple[int, ...]:
    """'1x28x28' -> (1, 28, 28); every dimension a positive integer."""
    dims = text.split("x")
    if not text or not all(d.isdigit() and int(d) >= 1 for d in dims):
        raise ValueError(f"input shape must look like 784 or 1x28x28, got {text!r}")
    return tuple(int(d) for d in dims)


ScaleKind = Literal["none", "unit", "div", "standard"]


@dataclass(frozen=True)
class Scale:
    """The `scale` run parameter: what features are divided by, public constants never fitted on
    anyone's data: none, unit (/255: 8-bit intensities to [0, 1]), div:C or div:C1,...,Cd (one
    per feature), or standard (read raw; standardised with the network's column statistics
    after phase I, efpsn/stats/standardise.py). Wire: its text."""

    kind: ScaleKind
    divisors: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("none", "unit", "div", "standard"):
            raise ValueError(f"scale kind must be none, unit, div or standard, got {self.kind!r}")
        if (self.kind == "div") != bool(self.divisors) or not all(
                isinstance(v, float) and math.isfinite(v) and v > 0 for v in self.divisors):
            raise ValueError(f"scale {self.kind!r}: divisors {self.divisors!r} are div's, "
                             "finite floats > 0")

    @classmethod
    def parse(cls, scale: str) -> Scale:
        """none, standard, unit, div:C or div:C1,...,Cd with every C > 0."""
        if not isinstance(scale, str):
            raise TypeError(f"scale must be a str, got {type(scale).__name__}")
        if scale in ("none", STANDARD, "unit"):
            return cls(scale)  # type: ignore[arg-type]
        if scale.startswith("div:"):
            try:
                values = [float(v) for v in scale[4:].split(",")]
            except ValueError:
                values = [math.nan]
            if values and all(math.isfinite(v) and v > 0 for v in values):
                return cls("div", tuple(values))
        raise ValueError(f"scale must be none, standard, unit, div:C or div:C1,...,Cd with every "
                         f"C > 0, got {_short(scale)}")

    @classmethod
    def of(cls, value: Scale | str) -> Scale:
        """A Scale as it is, or its text parsed."""
        return value if isinstance(value, Scale) else cls.parse(value)

    def wire(self) -> str:
        return str(self)

    def __str__(self) -> str:
        if self.kind != "div":
            return self.kind
        return "div:" + ",".join(str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)
                                 for v in self.divisors)

    @property
    def standard(self) -> bool:
        return self.kind == STANDARD

    def divisor(self, *, features: int | None = None) -> float | np.ndarray:
        """The public constants features are divided by: none and standard -> 1, unit -> 255,
        div:C -> C, div:C1,...,Cd -> one per feature (an array; with `features`, it must have
        that many)."""
        if self.kind in ("none", STANDARD):
            return 1.0
        if self.kind == "unit":
            return 255.0
        if len(self.divisors) == 1:
            return self.divisors[0]
        if features is not None and len(self.divisors) != features:
            raise ValueError(f"scale {_short(str(self))} gives {len(self.divisors)} divisors, "
                             f"but a sample has {features} features: one each")
        return np.asarray(self.divisors, dtype=np.float64)


def check_standard_masks(scale: Scale, *, mask: str, refresh: Refresh) -> None:
    """ValueError, one line, unless a scale standard run has what its secure sum needs: phase
    I's edge seeds (zero-sum masks, refreshed or fading), or no masks at all (then nothing is
    private anyway). Other scales: nothing to check."""
    if not scale.standard or mask == "none":
        return
    if mask != "zero-sum" or not refresh.refreshed:
        raise ValueError(
            f"scale standard sums the column statistics under masks from phase I's edge seeds, "
            f"which mask {mask!r} with refresh {str(refresh)!r} does not share: use --refresh fading "
            f"(the default) or every:R, or give public scales (schema.json's scale or --scale: "
            f"none, unit or div:...)")


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
