"""How often the zero-sum masks change: the `refresh` run parameter as one value, one grammar.

Pure and free of numpy, torch and phe, so the coordinator and the parameter checks use the same
parse as the agents:

- `never`: phase I's mask every round (the paper). Differencing two rounds cancels it (K = 1).
- `every:R`: fresh zero-sum noise every R rounds from the seeds phase I shares under Paillier.
  Gradient tracking accumulates the fresh increments and does not converge, so only DSGD takes it.
- `fading` / `fading:RHO` / `fading:RHO:FLOOR`: the default. A fixed zero-sum part plus a fresh
  zero-sum part every round scaled by max(RHO^t, FLOOR), RHO in (0, 1) public and no faster than
  the algorithm's own contraction, FLOOR in [0, 1) (0 unless given; `fading` alone: the step
  rule's rate, efpsn.params.step_rule.fading_rate, and its floor, which only mini-batch training
  has). The fresh part keeps every two rounds' difference noisy while it lasts, and dies out at
  the rate the algorithm forgets, so the run still ends where the unmasked run ends; a floor
  keeps it from dying out where the steps' own noise never does (efpsn/masks/fading.py).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["Refresh"]


@dataclass(frozen=True)
class Refresh:
    """`every` rounds per period (None: never), or a fading rate (`fade`, with `every` 1) and
    the fresh part's floor (`floor`, 0: none).

    `fade_auto`: `fading` without a rate, which RunConfig.resolved() turns into `fading:RHO`
    (or `fading:RHO:FLOOR`)."""

    every: int | None
    fade: float | None = None
    fade_auto: bool = False
    floor: float = 0.0

    def __post_init__(self) -> None:
        if self.every is not None:
            if isinstance(self.every, bool) or not isinstance(self.every, numbers.Integral):
                raise TypeError(f"refresh period must be an int or None, got {type(self.every)}")
            if self.every < 1:
                raise ValueError(f"refresh period must be >= 1 round, got {self.every}")
            object.__setattr__(self, "every", int(self.every))
        if self.fade is not None:
            object.__setattr__(self, "fade", _fraction(self.fade, "fading rate", zero=False))
        if (self.fade is not None or self.fade_auto) and self.every != 1:
            raise ValueError("a fading refresh changes every round (every = 1)")
        if self.fade is not None and self.fade_auto:
            raise ValueError("a fading refresh has a rate or is auto, not both")
        object.__setattr__(self, "floor", _fraction(self.floor, "fading floor", zero=True))
        if self.floor and self.fade is None:
            raise ValueError("a fading floor comes with its rate ('fading:RHO:FLOOR')")

    @classmethod
    def parse(cls, text: str) -> Refresh:
        """"never", "every:R" (R >= 1), "fading", "fading:RHO" (0 < RHO < 1) or
        "fading:RHO:FLOOR" (0 <= FLOOR < 1)."""
        if not isinstance(text, str):
            raise TypeError(f"refresh must be a str, got {type(text).__name__}")
        body = text.strip()
        if body == "never":
            return cls(None)
        if body == "fading":
            return cls(1, fade_auto=True)
        kind, _, arg = body.partition(":")
        arg = arg.strip()
        if kind == "every" and arg.isdigit() and int(arg) >= 1:
            return cls(int(arg))
        if kind == "fading":
            rate_text, colon, floor_text = arg.partition(":")
            rate, floor = _number(rate_text), _number(floor_text) if colon else 0.0
            if 0.0 < rate < 1.0 and 0.0 <= floor < 1.0:
                return cls(1, fade=rate, floor=floor)
        raise ValueError(f"refresh must be 'never', 'every:R' with R >= 1, 'fading', "
                         f"'fading:RHO' with 0 < RHO < 1 or 'fading:RHO:FLOOR' with "
                         f"0 <= FLOOR < 1, got {text!r}")

    @classmethod
    def of(cls, value: Refresh | str) -> Refresh:
        """A Refresh as it is, or its text parsed."""
        return value if isinstance(value, Refresh) else cls.parse(value)

    def wire(self) -> str:
        return str(self)

    def __str__(self) -> str:
        if self.fade_auto:
            return "fading"
        if self.fade is not None:
            return f"fading:{self.fade!r}" + (f":{self.floor!r}" if self.floor else "")
        return "never" if self.every is None else f"every:{self.every}"

    @property
    def refreshed(self) -> bool:
        """Whether the mask changes during the run (phase I then shares seeds, not noise)."""
        return self.every is not None

    @property
    def fading(self) -> bool:
        return self.fade is not None or self.fade_auto

    @property
    def accumulates(self) -> bool:
        """Whether fresh noise that never dies out enters every round (`every:R`): a tracker
        adds it up, so gradient tracking cannot converge under it."""
        return self.every is not None and not self.fading

    def period(self, t: int) -> int:
        """floor(t / R) for round t >= 0 (0 for every round when never)."""
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
            raise ValueError(f"round must be an int >= 0, got {t!r}")
        return 0 if self.every is None else int(t) // self.every


def _fraction(value: object, what: str, *, zero: bool) -> float:
    """`value` as a float in (0, 1), or [0, 1) with `zero`; TypeError / ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {type(value)}")
    number = float(value)
    if not (math.isfinite(number) and (0.0 <= number if zero else 0.0 < number) and number < 1.0):
        raise ValueError(f"{what} must lie in {'[0' if zero else '(0'}, 1), got {value!r}")
    return number


def _number(text: str) -> float:
    """A finite float, or NaN (which every range check refuses)."""
    try:
        value = float(text.strip())
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan
