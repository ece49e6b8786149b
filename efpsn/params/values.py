"""The run parameters that have a grammar, each a small frozen value parsed once.

Each value has `parse(text)` (the command line's and the wire's text), `str()` (its show, which
`parse` reads back), `of(x)` (a value, its text, or the wire's scalar: how RunConfig's
constructor takes a field) and `wire()` (the scalar RunParameters carries, proto/efpsn/wire/v1/
coordinator.proto). The wire keeps its scalars (0 rounds, -1.0 momentum, -1.0 l2 for "auto" and
"the task's default"; -1 and 0 batch and stop-every for "auto" and "full" or "never"); those
numbers live here and nowhere else: every other room asks the value (`rounds.auto`, `batch.full`,
`momentum.auto`).

Pure and free of numpy, torch and phe: the coordinator parses with it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["L2", "BatchSize", "Momentum", "Rounds", "Schedule", "StopEvery"]


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _count_text(text: str, *, word: str, name: str) -> int | None:
    """A positive integer, or `word` (None)."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    body = text.strip()
    if body == word:
        return None
    try:
        value = int(body)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a positive integer or {word!r}, got {text!r}")
    return value


def _real(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Rounds:
    """Phase II rounds: `count`, or None for the step rule's (`auto`). Wire: uint64, 0 = auto."""

    count: int | None

    def __post_init__(self) -> None:
        if self.count is not None:
            object.__setattr__(self, "count", _positive_int(self.count, "iterations"))

    @classmethod
    def parse(cls, text: str) -> Rounds:
        """"auto" or a positive integer."""
        return cls(_count_text(text, word="auto", name="iterations"))

    @classmethod
    def of(cls, value: Any) -> Rounds:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"iterations must be Rounds, a str or an int, got {value!r}")
        if value < 0:
            raise ValueError(f"iterations must be >= 0 (0: auto), got {value}")
        return cls(int(value) or None)

    def wire(self) -> int:
        return self.count or 0

    def __str__(self) -> str:
        return "auto" if self.count is None else str(self.count)

    @property
    def auto(self) -> bool:
        return self.count is None

    @property
    def total(self) -> int:
        """The number of rounds; ValueError while it is the step rule's (resolve first)."""
        if self.count is None:
            raise ValueError("iterations auto are the step rule's: resolve the run first "
                             "(RunConfig.resolved)")
        return self.count


@dataclass(frozen=True)
class BatchSize:
    """Samples per agent and round: `size`, None for the whole local data set (`full`), or
    `auto` (RunConfig.resolved picks by the task: full for logistic regression, whose step
    rule and certificate are full-batch; AUTO_MINI_BATCH for a neural network).
    Wire: sint32, 0 = full, -1 = auto."""

    size: int | None
    auto: bool = False

    def __post_init__(self) -> None:
        if self.size is not None:
            object.__setattr__(self, "size", _positive_int(self.size, "batch size"))
            if self.auto:
                raise ValueError("batch size is a number, full or auto, not both")

    @classmethod
    def parse(cls, text: str) -> BatchSize:
        """"auto", "full" or a positive integer."""
        if isinstance(text, str) and text.strip() == "auto":
            return cls(None, auto=True)
        try:
            return cls(_count_text(text, word="full", name="batch size"))
        except ValueError:
            raise ValueError(f"batch size must be a positive integer, 'full' or 'auto', got "
                             f"{text!r}") from None

    @classmethod
    def of(cls, value: Any) -> BatchSize:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if value is None:
            return cls(None)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"batch_size must be BatchSize, a str or an int, got {value!r}")
        if value < -1:
            raise ValueError(f"batch_size must be >= -1 (-1: auto, 0: full), got {value}")
        return cls(None, auto=True) if value == -1 else cls(int(value) or None)

    def wire(self) -> int:
        return -1 if self.auto else (self.size or 0)

    def __str__(self) -> str:
        return "auto" if self.auto else "full" if self.size is None else str(self.size)

    @property
    def full(self) -> bool:
        """The whole local data set every round (False while auto: resolve first)."""
        return self.size is None and not self.auto


@dataclass(frozen=True)
class Momentum:
    """agt's Nesterov momentum beta in [0, 1), or None for the step rule's (`auto`).
    Wire: double, negative = auto (a resolved run never sends it)."""

    beta: float | None

    def __post_init__(self) -> None:
        if self.beta is not None:
            beta = _real(self.beta, "momentum")
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"momentum must be in [0, 1) (or auto), got {self.beta!r}")
            object.__setattr__(self, "beta", beta)

    @classmethod
    def parse(cls, text: str) -> Momentum:
        """"auto" or a number in [0, 1)."""
        if not isinstance(text, str):
            raise TypeError(f"momentum must be a str, got {type(text).__name__}")
        body = text.strip()
        if body == "auto":
            return cls(None)
        try:
            value = float(body)
        except ValueError:
            value = math.nan
        if not 0.0 <= value < 1.0:
            raise ValueError(f"momentum must be a number in [0, 1) or 'auto', got {text!r}")
        return cls(value)

    @classmethod
    def of(cls, value: Any) -> Momentum:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        number = _real(value, "momentum")
        return cls(None if number < 0 else number)

    def wire(self) -> float:
        return -1.0 if self.beta is None else self.beta

    def __str__(self) -> str:
        return "auto" if self.beta is None else repr(self.beta)

    @property
    def auto(self) -> bool:
        return self.beta is None

    @property
    def value(self) -> float:
        """beta; ValueError while it is the step rule's (resolve first)."""
        if self.beta is None:
            raise ValueError("momentum auto is the step rule's: resolve the run first "
                             "(RunConfig.resolved)")
        return self.beta


@dataclass(frozen=True)
class L2:
    """The L2 weight: `weight` >= 0, or None for the task family's default (`default`).
    Wire: double, negative = the task's default."""

    weight: float | None

    def __post_init__(self) -> None:
        if self.weight is not None:
            weight = _real(self.weight, "l2")
            if not (math.isfinite(weight) and weight >= 0):
                raise ValueError(f"l2 must be a finite number >= 0 (or default), got "
                                 f"{self.weight!r}")
            object.__setattr__(self, "weight", weight)

    @classmethod
    def parse(cls, text: str) -> L2:
        """"default", a number >= 0, or a negative number (the default, as the wire says)."""
        if not isinstance(text, str):
            raise TypeError(f"l2 must be a str, got {type(text).__name__}")
        body = text.strip()
        if body == "default":
            return cls(None)
        try:
            value = float(body)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ValueError(f"l2 must be a finite number or 'default', got {text!r}")
        return cls(None if value < 0 else value)

    @classmethod
    def of(cls, value: Any) -> L2:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        number = _real(value, "l2")
        if not math.isfinite(number):
            raise ValueError(f"l2 must be finite, got {value!r}")
        return cls(None if number < 0 else number)

    def wire(self) -> float:
        return -1.0 if self.weight is None else self.weight

    def __str__(self) -> str:
        return "default" if self.weight is None else repr(self.weight)

    @property
    def default(self) -> bool:
        return self.weight is None

    def or_none(self) -> float | None:
        """The weight, or None for the task's default (what make_task takes)."""
        return self.weight


ScheduleKind = Literal["auto", "paper", "constant", "onecycle"]
SCHEDULE_KINDS = ("auto", "paper", "constant", "onecycle")


@dataclass(frozen=True)
class Schedule:
    """The step size: `auto` (the step rule's; `auto:LR` once resolved), `paper[:LR0]` (the
    paper's decay, LR0 0.2 by default), `constant:LR` or `onecycle:LR` (a warm-up to LR, then
    a linear decay: efpsn/params/schedules.py). Wire: its text."""

    kind: ScheduleKind
    lr: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"schedule kind must be auto, paper, constant or onecycle, got "
                             f"{self.kind!r}")
        if self.lr is not None:  # its range is the step size's (efpsn/params/schedules.py)
            object.__setattr__(self, "lr", _real(self.lr, "learning rate"))
        elif self.kind in ("constant", "onecycle"):
            raise ValueError(f"{self.kind} schedule needs a learning rate, e.g. "
                             f"'{self.kind}:0.05'")

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """"auto", "auto:LR", "paper", "paper:LR0", "constant:LR" or "onecycle:LR"."""
        if not isinstance(text, str):
            raise TypeError(f"schedule must be a str, got {type(text).__name__}")
        name, sep, arg = text.strip().partition(":")
        if name not in SCHEDULE_KINDS:
            raise ValueError(f"unknown schedule {text!r}: expected 'auto', 'paper', "
                             "'paper:LR0', 'constant:LR' or 'onecycle:LR'")
        if not sep:
            return cls(name)  # type: ignore[arg-type]
        try:
            lr = float(arg)
        except ValueError:
            raise ValueError(f"schedule {text!r}: {arg!r} is not a number") from None
        return cls(name, lr)  # type: ignore[arg-type]

    @classmethod
    def of(cls, value: Any) -> Schedule:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        raise TypeError(f"schedule must be a Schedule or a str, got {value!r}")

    def wire(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return self.kind if self.lr is None else f"{self.kind}:{self.lr!r}"

    @property
    def auto(self) -> bool:
        """The step rule's (resolved or not)."""
        return self.kind == "auto"

    @property
    def unresolved(self) -> bool:
        """`auto` without the step rule's number yet."""
        return self.kind == "auto" and self.lr is None

    @property
    def constant_step(self) -> float | None:
        """The constant step of `auto:LR` or `constant:LR`; None for a decaying schedule (the
        paper's, onecycle)."""
        return self.lr if self.kind in ("auto", "constant") else None


@dataclass(frozen=True)
class StopEvery:
    """How often the stop rule checks the convergence certificate (efpsn/optimize/stopping.py):
    every `rounds` rounds, never (None), or `auto` (RunConfig.resolved picks: 25 when the rounds are
    the step rule's and the model has a certificate, never otherwise).
    Wire: sint32, -1 = auto, 0 = never."""

    rounds: int | None
    auto: bool = False

    def __post_init__(self) -> None:
        if self.rounds is not None:
            object.__setattr__(self, "rounds", _positive_int(self.rounds, "stop every"))
            if self.auto:
                raise ValueError("stop every is a number of rounds or auto, not both")

    @classmethod
    def parse(cls, text: str) -> StopEvery:
        """"auto", "never" or a positive integer."""
        if not isinstance(text, str):
            raise TypeError(f"stop every must be a str, got {type(text).__name__}")
        body = text.strip()
        if body == "auto":
            return cls(None, auto=True)
        try:
            rounds = _count_text(body, word="never", name="stop every")
        except ValueError:
            raise ValueError(f"stop every must be a positive integer, 'auto' or 'never', got "
                             f"{text!r}") from None
        return cls(rounds)

    @classmethod
    def of(cls, value: Any) -> StopEvery:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"stop_every must be StopEvery, a str or an int, got {value!r}")
        if value < -1:
            raise ValueError(f"stop_every must be >= -1 (-1: auto, 0: never), got {value}")
        return cls(None, auto=True) if value == -1 else cls(int(value) or None)

    def wire(self) -> int:
        return -1 if self.auto else (self.rounds or 0)

    def __str__(self) -> str:
        return "auto" if self.auto else "never" if self.rounds is None else str(self.rounds)

    @property
    def never(self) -> bool:
        return self.rounds is None and not self.auto
