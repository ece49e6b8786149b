"""Parameter counts of the built-in models by arithmetic alone (no torch), for validating a run.

The coordinator, which never builds a model, checks a run's basis counts with these; the tests
check them against the real models (efpsn/tasks/models.py).
"""

from __future__ import annotations

import itertools
import math

from efpsn.params.schema import TaskSpec
from efpsn.params.values import L2

__all__ = ["DEFAULT_L2", "l2_weight", "last_bias_count", "parameter_count"]

# The tasks' default L2 weights, f(x) = mean loss + (l2 / 2) ||x||^2 (why these values: see
# efpsn/tasks/objective.py): logistic regression 1e-2, so that x* exists, is unique and the
# problem is l2-strongly convex (ridge alike); the others the plain loss.
DEFAULT_L2: dict[str, float] = {"logreg": 1e-2, "ridge": 1e-2, "lenet": 0.0, "mlp": 0.0,
                                "python": 0.0}

LENET_CHANNELS = 12
LENET_KERNEL = 5
LENET_FEATURES = 588  # 12 channels x 7 x 7 after the strides 2, 2, 1 on 28 x 28


def parameter_count(task: TaskSpec | str, *, shape: tuple[int, ...], classes: int) -> int | None:
    """How many scalar parameters the built-in `task` has for this schema (None: a user's
    python:MODULE:FACTORY model, known only once built)."""
    spec = TaskSpec.of(task)
    features = math.prod(shape)
    if spec.kind == "logreg":
        return (features + 1) * classes
    if spec.kind == "ridge":
        return features + 1
    if spec.kind == "lenet":
        conv = [LENET_CHANNELS * c_in * LENET_KERNEL**2 + LENET_CHANNELS
                for c_in in (1, LENET_CHANNELS, LENET_CHANNELS)]
        return sum(conv) + (LENET_FEATURES + 1) * classes
    if spec.kind == "mlp":
        widths = (features, *spec.hidden, classes)
        return sum((fan_in + 1) * fan_out for fan_in, fan_out in itertools.pairwise(widths))
    return None


def last_bias_count(task: TaskSpec | str, *, classes: int) -> int | None:
    """The size of the built-in model's last bias (its output layer's: one per class, one for
    ridge); None for a user's model."""
    kind = TaskSpec.of(task).kind
    return None if kind == "python" else 1 if kind == "ridge" else classes


def l2_weight(task: TaskSpec | str, l2: L2 | float) -> float:
    """The run's L2 weight: `l2`, or the task family's default (L2 default; a bare number:
    negative)."""
    weight = l2.weight if isinstance(l2, L2) else (None if l2 < 0 else float(l2))
    return DEFAULT_L2[TaskSpec.of(task).kind] if weight is None else weight
