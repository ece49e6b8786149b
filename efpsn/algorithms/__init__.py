"""Decentralized optimization algorithms as sans-I/O step functions."""

from __future__ import annotations

from efpsn.algorithms.agt import AcceleratedTracking
from efpsn.algorithms.base import (
    AgentState,
    Aggregate,
    Algorithm,
    GradientOracle,
    Message,
    StepContext,
    mix,
)
from efpsn.algorithms.dsgd import DSGD
from efpsn.algorithms.gt import GradientTracking

ALGORITHMS: dict[str, type] = {"dsgd": DSGD, "gt": GradientTracking, "agt": AcceleratedTracking}


def make_algorithm(name: str, *, momentum: float = 0.0) -> Algorithm:
    """Return the algorithm called `name` ("dsgd", "gt" or "agt", the latter with its
    Nesterov momentum)."""
    if name == "agt":
        return AcceleratedTracking(momentum)
    try:
        return ALGORITHMS[name]()
    except KeyError:
        raise ValueError(
            f"unknown algorithm {name!r}: expected one of {sorted(ALGORITHMS)}"
        ) from None


__all__ = [
    "ALGORITHMS",
    "DSGD",
    "AcceleratedTracking",
    "AgentState",
    "Aggregate",
    "Algorithm",
    "GradientOracle",
    "GradientTracking",
    "Message",
    "StepContext",
    "make_algorithm",
    "mix",
]
