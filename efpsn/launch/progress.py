"""How `efpsn up` shows a running network's progress: a terminal bar (tqdm), plain lines (a
notebook cell, a log: efpsn.notebook.train), or nothing (--quiet)."""

from __future__ import annotations

import sys
import time
from typing import Literal, Protocol

__all__ = ["PROGRESS_MODES", "Progress", "ProgressMode", "make_progress", "say_beside"]

ProgressMode = Literal["bar", "lines", "none"]
PROGRESS_MODES: tuple[str, ...] = ("bar", "lines", "none")
LINE_SECONDS = 5.0  # a line at most this often (and once at the end)


class Progress(Protocol):
    """What the launcher's watch calls: the rounds every agent has done, the figures shown."""

    n: int

    def update(self, rounds: int) -> None: ...

    def set_postfix(self, **figures: str) -> None: ...

    def close(self) -> None: ...


class _Lines:
    """A line "efpsn up: round 150 of 617 (loss 0.41, acc 0.93)" at most every LINE_SECONDS,
    on stdout (what a notebook cell shows), and the last one when the run ends."""

    def __init__(self, total: int | None, *, every: float = LINE_SECONDS) -> None:
        self.total, self.n, self._every = total, 0, every
        self._figures: dict[str, str] = {}
        self._said = -1
        self._at = time.monotonic()

    def update(self, rounds: int) -> None:
        self.n += rounds
        if time.monotonic() - self._at >= self._every:
            self._say()

    def set_postfix(self, **figures: str) -> None:
        self._figures = figures

    def _say(self) -> None:
        if self.n == self._said:
            return
        of = f" of {self.total}" if self.total else ""
        shown = ", ".join(f"{k} {v}" for k, v in self._figures.items())
        print(f"efpsn up: round {self.n}{of}" + (f" ({shown})" if shown else ""),
              file=sys.stdout, flush=True)
        self._said, self._at = self.n, time.monotonic()

    def close(self) -> None:
        self._say()


def make_progress(mode: ProgressMode, *, total: int | None) -> Progress:
    """The display of `mode` for a run of `total` rounds (None: known once the agents have
    the network's totals)."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress must be one of {', '.join(PROGRESS_MODES)}, got {mode!r}")
    if mode == "lines":
        return _Lines(total)
    from tqdm import tqdm

    bar: Progress = tqdm(total=total, disable=mode == "none", unit="round", desc="network")
    return bar


def say_beside(progress: Progress, line: str) -> None:
    """A line for the person watching that a terminal bar does not overwrite (stderr)."""
    if hasattr(progress, "write"):  # tqdm's: printed above the bar
        progress.write(line, file=sys.stderr)  # type: ignore[attr-defined]
    else:
        print(line, file=sys.stderr, flush=True)
