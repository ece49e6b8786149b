"""`efpsn up`'s stop signals: SIGTERM (kill, timeout, service managers), SIGHUP (a closed
terminal) and SIGINT (Ctrl-C) raise Stopped in the launcher, so that it stops every process it
started on the way out, then exits 128 + the signal's number saying which signal stopped it.

Only the first signal raises: later ones (a second Ctrl-C while the children are being stopped)
must not cut that stop short. Inside `held()` (the stop itself) a first signal waits until the
block is over. What a launcher killed -9 cannot stop stops itself: efpsn/process/lifeline.py.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Self

__all__ = ["STOP_SIGNALS", "StopSignals", "Stopped", "signals_held"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_ACTIVE: list[StopSignals] = []


class Stopped(KeyboardInterrupt):
    """A command stopped by a signal it handles (SIGTERM, SIGHUP, SIGINT): its exit code is
    128 + the signal's number, its last line `message` (efpsn.flags.parser.run_command)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    """`with StopSignals("efpsn up"):` (main thread): a stop signal raises Stopped once."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.signum: int | None = None
        self._held = 0
        self._pending = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def stopped(self) -> Stopped:
        assert self.signum is not None
        name = signal.Signals(self.signum).name
        return Stopped(self.signum, f"{self.what}: stopped by {name}; every process it "
                                    f"started is stopped (exit {128 + self.signum})")

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            return  # the first signal counts; the stop it started is under way
        self.signum = signum
        if self._held:
            self._pending = True
            return
        raise self.stopped()

    @contextmanager
    def held(self) -> Iterator[None]:
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if self._pending and not self._held:
                self._pending = False
                raise self.stopped()  # the signal came during the stop


@contextmanager
def signals_held() -> Iterator[None]:
    """A stop signal arriving in this block (the stop of the children) is acted on at its end,
    if StopSignals is active; nothing otherwise."""
    if not _ACTIVE:
        yield
        return
    with _ACTIVE[-1].held():
        yield
