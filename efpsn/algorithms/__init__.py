"""Decentralized optimization algorithms as sans-I/O step functions: the algorithms by name.

The step's types live in base.py, each algorithm in its own module (dsgd.py, gt.py, agt.py)."""

from __future__ import annotations

from efpsn.algorithms.agt import AcceleratedTracking
from efpsn.algorithms.base import Algorithm
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


__all__ = ["ALGORITHMS", "make_algorithm"]
