"""The tie between `efpsn up` and every process it starts: they stop when it is gone, even when
it was killed -9 and could stop nothing itself.

The launcher makes a pipe and keeps its write end to itself (never inherited: Python's
descriptors are not, and no child is handed it). Every process it starts inherits the read end
and its number in EFPSN_LIFELINE. The kernel closes the write end when the launcher ends, however
it ends, so a read returns end-of-file: a thread of each child waits for that, then sends its own
process SIGTERM (the same orderly stop as `efpsn up`'s own), and SIGKILL `grace` seconds later.

The launcher's direct children (the coordinator, the fork server, `--no-fork` agents) also ask
Linux for a parent-death signal (prctl PR_SET_PDEATHSIG), which lands at once, even in a process
busy in C code. Agents forked by the fork server do not: their parent is the fork server, which
exits once it has forked them all (that exit must not stop them; the launcher then adopts
them), so they rely on the pipe alone, which ties them to the launcher whoever their parent is.

Standard library only: the coordinator and the fork server import it before anything heavy.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import stat
import sys
import threading
import time

__all__ = ["ENV", "Lifeline", "hold_to_launcher", "launcher_gone", "set_parent_death_signal"]

ENV = "EFPSN_LIFELINE"  # "FD PID": the pipe's read end, and the launcher's pid for its children
PR_SET_PDEATHSIG = 1
_HELD: list[tuple[int, int]] = []  # (pipe, launcher pid or 0) once hold_to_launcher found them


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send `sig` to this process when its parent (thread) ends; False where that
    cannot be (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Lifeline:
    """The launcher's end: `env()` and `pass_fds` go to every process it starts; `close()` at
    the end (its death closes the pipe too)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # both non-inheritable; the read end is passed on

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read,)

    def env(self) -> dict[str, str]:
        return {ENV: f"{self._read} {os.getpid()}"}

    def close(self) -> None:
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass


def _lifeline_fd(text: str) -> tuple[int, int] | None:
    """(fd, launcher pid or 0) from EFPSN_LIFELINE, if fd is an open pipe here."""
    fields = text.split()
    try:
        fd, pid = int(fields[0]), int(fields[1]) if len(fields) > 1 else 0
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except (ValueError, IndexError, OSError):
        return None
    return fd, pid


def hold_to_launcher(*, watch: bool = True, grace: float = 5.0) -> bool:
    """In a process `efpsn up` started (EFPSN_LIFELINE set): stop when the launcher is gone.

    A direct child of the launcher gets the parent-death signal SIGTERM (and stops at once if
    the launcher is already gone). `watch`: also a thread that waits for the pipe's end, then
    sends SIGTERM to this process and SIGKILL after `grace` seconds. The fork server passes
    watch=False (it forks only while it runs one thread; its input ends with the launcher
    anyway); it keeps the variable for the agents it forks, with no pid (their parent is not
    the launcher). Anyone else takes the variable out of the environment: what they start is
    not tied to the launcher. Returns whether a lifeline was found."""
    text = os.environ.get(ENV) if not watch else os.environ.pop(ENV, None)
    found = _lifeline_fd(text) if text else None
    if found is None:
        return False
    fd, launcher = found
    _HELD[:] = [(fd, launcher)]
    if launcher:  # a direct child: the launcher's death signals it
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != launcher:  # it died before the signal was asked for
            os.kill(os.getpid(), signal.SIGTERM)
    if not watch:
        os.environ[ENV] = str(fd)  # for the agents it forks: the pipe, no parent-death signal
        return True
    threading.Thread(target=_watch, args=(fd, grace), name="efpsn-lifeline",
                     daemon=True).start()
    return True


def launcher_gone() -> bool:
    """Whether this process holds a lifeline (hold_to_launcher) and its launcher has ended: the
    pipe's write end is closed (poll reports a hang-up), or a direct child has a new parent."""
    if not _HELD:
        return False
    fd, launcher = _HELD[0]
    if launcher and os.getppid() != launcher:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return any(events & select.POLLHUP for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _watch(fd: int, grace: float) -> None:
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:  # closed under us: nothing to watch
            return
    try:
        print(f"the launcher (efpsn up) is gone: stopping (SIGTERM, SIGKILL after {grace:g}s)",
              file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)
    os.kill(os.getpid(), signal.SIGKILL)
