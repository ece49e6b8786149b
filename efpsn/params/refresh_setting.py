"""How often the zero-sum masks change: the `refresh` run parameter as one value, one grammar.

Pure and free of numpy, torch and phe, so the coordinator and the parameter checks use the same
parse as the agents:

- `never`: phase I's mask every round (the paper). Differencing two rounds cancels it (K = 1).
- `every:R`: fresh zero-sum noise every R rounds from the seeds phase I shares under Paillier.
  Gradient tracking accumulates the fresh increments and does not converge, so only DSGD takes it.
- `fading` / `fading:RHO`: the default. A fixed zero-sum part plus a fresh zero-sum part every
  round scaled by RHO^t, RHO in (0, 1) public and no faster than the algorithm's own contraction
  (`fading` alone: the step rule's rate, efpsn.params.step_rule.fading_rate). The fresh part keeps
  every two rounds' difference noisy while it lasts, and dies out at the rate the algorithm forgets,
  so the run still ends where the unmasked run ends (efpsn/masks/fading.py).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["Refresh"]


@dataclass(frozen=True)
class Refresh:
    """`every` rounds per period (None: never), or a fading rate (`fade`, with `every` 1).

    `fade_auto`: `fading` without a rate, which RunConfig.resolved() turns into `fading:RHO`."""

    every: int | None
    fade: float | None = None
    fade_auto: bool = False

    def __post_init__(self) -> None:
        if self.every is not None:
            if isinstance(self.every, bool) or not isinstance(self.every, numbers.Integral):
                raise TypeError(f"refresh period must be an int or None, got {type(self.every)}")
            if self.every < 1:
                raise ValueError(f"refresh period must be >= 1 round, got {self.every}")
            object.__setattr__(self, "every", int(self.every))
        if self.fade is not None:
            if isinstance(self.fade, bool) or not isinstance(self.fade, numbers.Real):
                raise TypeError(f"fading rate must be a number, got {type(self.fade)}")
            if not (math.isfinite(self.fade) and 0.0 < self.fade < 1.0):
                raise ValueError(f"fading rate must lie in (0, 1), got {self.fade!r}")
            object.__setattr__(self, "fade", float(self.fade))
        if (self.fade is not None or self.fade_auto) and self.every != 1:
            raise ValueError("a fading refresh changes every round (every = 1)")
        if self.fade is not None and self.fade_auto:
            raise ValueError("a fading refresh has a rate or is auto, not both")

    @classmethod
    def parse(cls, text: str) -> Refresh:
        """"never", "every:R" (R >= 1), "fading" or "fading:RHO" (0 < RHO < 1)."""
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
            try:
                rate = float(arg)
            except ValueError:
                rate = math.nan
            if math.isfinite(rate) and 0.0 < rate < 1.0:
                return cls(1, fade=rate)
        raise ValueError(f"refresh must be 'never', 'every:R' with R >= 1, 'fading' or "
                         f"'fading:RHO' with 0 < RHO < 1, got {text!r}")

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
            return f"fading:{self.fade!r}"
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
