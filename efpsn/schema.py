"""The public data schema's words: task names, per-sample input shapes, and the public scale
features are divided by. Torch-free (the coordinator validates with it)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from efpsn.refresh_value import Refresh

__all__ = ["STANDARD", "STANDARD_DISCLOSURE", "TASKS", "check_standard_masks", "check_task_spec", "parse_shape",
           "scale_divisor"]

STANDARD = "standard"
"""The scale word of features standardised with the network's column statistics (mean and
standard deviation by secure summation: efpsn/secure_stats.py): read raw, divided by nothing."""

STANDARD_DISCLOSURE = ("disclosed by design to every agent (scale standard): every column's global "
                       "mean and variance and the total sample count; opt out with a public "
                       "scale (schema.json or --scale none|div:...)")
"""The named disclosure of a scale standard run (README: features in any units)."""

TASKS = ("logreg", "lenet", "mlp:H1,H2,...", "python:MODULE:FACTORY")


def check_task_spec(task: str) -> None:
    """Raise ValueError unless `task` is logreg, lenet, mlp:H1,H2,... or python:MODULE:FACTORY."""
    if task in ("logreg", "lenet"):
        return
    if task.startswith("mlp:"):
        widths = task[4:].split(",")
        if all(w.isdigit() and int(w) >= 1 for w in widths):
            return
        raise ValueError(f"task {task!r}: expected mlp:H1,H2,... with positive hidden widths")
    if task.startswith("python:"):
        module, sep, factory = task[7:].rpartition(":")
        if sep and module and factory.isidentifier():
            return
        raise ValueError(f"task {task!r}: expected python:MODULE:FACTORY, e.g. python:mymodel:make")
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def parse_shape(text: str) -> tuple[int, ...]:
    """'1x28x28' -> (1, 28, 28); every dimension a positive integer."""
    dims = text.split("x")
    if not text or not all(d.isdigit() and int(d) >= 1 for d in dims):
        raise ValueError(f"input shape must look like 784 or 1x28x28, got {text!r}")
    return tuple(int(d) for d in dims)


def scale_divisor(scale: str, *, features: int | None = None) -> float | np.ndarray:
    """The public constants features are divided by: none and standard -> 1 (standard: the
    network's statistics are applied after phase I, efpsn/standardise.py), unit -> 255 (8-bit
    intensities to [0, 1]), div:C -> C, div:C1,...,Cd -> one per feature (an array; with
    `features`, it must have that many). Never fitted on any agent's data."""
    if scale in ("none", STANDARD):
        return 1.0
    if scale == "unit":
        return 255.0
    if scale.startswith("div:"):
        try:
            values = [float(v) for v in scale[4:].split(",")]
        except ValueError:
            values = [math.nan]
        if values and all(math.isfinite(v) and v > 0 for v in values):
            if len(values) == 1:
                return values[0]
            if features is not None and len(values) != features:
                raise ValueError(f"scale {_short(scale)} gives {len(values)} divisors, but a "
                                 f"sample has {features} features: one each")
            return np.asarray(values, dtype=np.float64)
    raise ValueError(f"scale must be none, standard, unit, div:C or div:C1,...,Cd with every "
                     f"C > 0, got "
                     f"{_short(scale)}")


def check_standard_masks(scale: str, *, mask: str, refresh: Refresh | str) -> None:
    """ValueError, one line, unless a scale standard run has what its secure sum needs: phase
    I's edge seeds (zero-sum masks, refreshed or fading), or no masks at all (then nothing is
    private anyway). Other scales: nothing to check."""
    from efpsn.refresh_value import Refresh

    if scale != STANDARD or mask == "none":
        return
    if mask != "zero-sum" or not Refresh.of(refresh).refreshed:
        raise ValueError(
            f"scale standard sums the column statistics under masks from phase I's edge seeds, "
            f"which mask {mask!r} with refresh {str(refresh)!r} does not share: use --refresh fading "
            f"(the default) or every:R, or give public scales (schema.json's scale or --scale: "
            f"none, unit or div:...)")


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
