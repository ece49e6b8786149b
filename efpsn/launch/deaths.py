"""A local agent that dies is named on the screen at once: `efpsn up` is every agent's parent,
so a thread asks the kernel, ten times a second, whether one has ended (without reaping it:
the launcher's own wait still gets its exit code), and says who, how, at which round, and what
the others do about it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Self

from efpsn.launch.processes import Child
from efpsn.wire.records import Phase
from efpsn.wire.status_client import AgentStatus

__all__ = ["DeathWatch", "Ending", "death_line", "how_it_ended"]

PERIOD = 0.1  # seconds between two looks: a death is said within about this long


@dataclass(frozen=True)
class Ending:
    """How a process ended: killed by a signal (its name), or exited with a code."""

    signal: str | None
    code: int | None

    def words(self) -> str:
        return f"was killed by {self.signal}" if self.signal else f"exited with code {self.code}"


def how_it_ended(pid: int) -> Ending | None:
    """The ending of child `pid` if it has ended (left waitable for its owner), else None;
    None too when it is not (or no longer) this process's child."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None or info.si_pid == 0:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        try:
            return Ending(signal=signal.Signals(info.si_status).name, code=None)
        except ValueError:
            return Ending(signal=f"signal {info.si_status}", code=None)
    return Ending(signal=None, code=info.si_status)


def _when(status: AgentStatus | None) -> str:
    """When it died, as far as the last poll (at most half a second old) tells."""
    if status is None or status.phase == Phase.PHASE_UNSPECIFIED:
        return "before it reported phase I or II"
    if status.phase == Phase.OPTIMIZE:
        return f"at round {status.round}"
    if status.phase in (Phase.KEYS, Phase.SHARES):
        return "last seen in phase I"
    if status.phase == Phase.STATS:
        return "last seen in the secure sum of column statistics"
    return "after its run"


def death_line(name: str, pid: int, ending: Ending, status: AgentStatus | None, *,
               deadline: float | None) -> str:
    """`agent2 (pid N) was killed by SIGKILL at round R; ...` and what happens next: with
    departures (deadline > 0) its neighbours wait for it that long, then the coordinator decides
    whether it left for good and the others go on without it; without, the run stops."""
    when = _when(status)
    head = f"{name} (pid {pid}) {ending.words()}{',' if when.startswith('last') else ''} {when}"
    if deadline is None or deadline <= 0:
        return (f"{head}; departures are off (--departure-deadline 0): the run stops, every "
                "other process is stopped")
    return (f"{head}; the others wait for it until the departure deadline ({deadline:g} s), "
            "then go on without it once the coordinator declares it gone")


def _never() -> bool:
    return False


class DeathWatch:
    """`with DeathWatch(agents, say=..., last_seen=..., deadline=...)`: while the block runs,
    every agent that ends with an error is said at once (`say(line)`, from a thread)."""

    def __init__(self, agents: Sequence[Child], *, say: Callable[[str], None],
                 last_seen: Mapping[str, AgentStatus], deadline: float | None) -> None:
        self._agents = list(agents)
        self._say = say
        self._seen = last_seen
        self._deadline = deadline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="efpsn-up-deaths", daemon=True)
        self.said: dict[str, Ending] = {}
        self._joining: dict[str, Callable[[], bool]] = {}

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def watch(self, child: Child, *, joining: Callable[[], bool]) -> None:
        """An agent started later (efpsn up --late) is watched too, once it has joined
        (`joining()` False: the launcher says itself why one could not, efpsn/launch/late.py)."""
        self._joining[child.name] = joining
        self._agents = [*self._agents, child]

    def unwatch(self, name: str) -> None:
        """Agent `name` ended without joining the run: nothing to say about it here."""
        self._agents = [a for a in self._agents if a.name != name]

    def close(self) -> None:
        """No more lines (before the launcher stops the others itself)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            for child in self._agents:
                if child.name in self.said or self._joining.get(child.name, _never)():
                    continue
                ending = how_it_ended(child.process.pid)
                if ending is None and child.process.returncode not in (None, 0):
                    code = child.process.returncode  # reaped by the launcher meanwhile
                    ending = (Ending(signal=signal.Signals(-code).name, code=None) if code < 0
                              else Ending(signal=None, code=code))
                if ending is None or ending.code == 0:
                    continue
                self.said[child.name] = ending
                if not self._stop.is_set():
                    self._say(death_line(child.name, child.process.pid, ending,
                                         self._seen.get(child.name), deadline=self._deadline))
            self._stop.wait(PERIOD)
