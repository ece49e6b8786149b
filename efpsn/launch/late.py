"""`efpsn up --late agentK@R`: agent K's seat starts empty (the run's --late-seats); its process
is started only once every member has passed round R, and it joins the running network the way
any party does (`efpsn agent --join`, coordinator/joins.py). One that ends before the
coordinator gave it its seat (a refused join: the run ends before a join could take effect,
say) is named with its reason, and the others go on without it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from efpsn.launch.deaths import DeathWatch
from efpsn.launch.failures import diagnose
from efpsn.launch.processes import Child, read_port
from efpsn.wire.status_client import AgentStatus

__all__ = ["LateStarts"]


@dataclass
class LateStarts:
    """The seats whose processes start late, each once every member has passed its round;
    `start(name)` starts one (and waits until it serves)."""

    rounds: dict[str, int]  # name -> the round the members must have passed
    started: set[str] = field(default_factory=set)
    start: Callable[[str], Child] | None = None
    host: str = "127.0.0.1"
    serving: Callable[[], None] = lambda: None  # one more agent serves: the network record
    # the launcher's watch: its death lines, its lines for the person watching, its folder
    deaths: DeathWatch | None = None
    say: Callable[[str], None] = print
    folder: Path = Path(".")

    def pending(self) -> list[tuple[str, int]]:
        """The seats not started yet, with their rounds."""
        return sorted((n, r) for n, r in self.rounds.items() if n not in self.started)

    def joining(self, seen: Mapping[str, AgentStatus]) -> set[str]:
        """The started ones the coordinator has not given a seat yet (no run id reported)."""
        return {n for n in self.started if not (n in seen and seen[n].run_id)}

    def due(self, seen: Mapping[str, AgentStatus], members: list[str]) -> list[str]:
        """The late seats to start now: every member (not late, or started) reports a round
        at least theirs."""
        present = [m for m in members if m not in self.rounds or m in self.started]
        if not present or any(m not in seen for m in present):
            return []
        low = min(seen[m].round for m in present)
        due = [n for n, r in self.pending() if low >= r]
        self.started.update(due)
        return due

    def step(self, seen: Mapping[str, AgentStatus], agents: list[Child],
             addresses: dict[str, str]) -> None:
        """One look of the launcher's watch: a started one that serves gets its address (it is
        polled from then on); the ones that ended before they joined leave the watch
        (`agents`, the death watch) with their reason; the due ones start and are watched."""
        deaths, say, folder = self.deaths, self.say, self.folder
        for child in agents:
            if child.name in self.started and child.name not in addresses:
                port = read_port(child)
                if port is not None:
                    addresses[child.name] = f"{self.host}:{port}"
                    self.serving()
        joining = self.joining(seen)
        for child in [a for a in agents if a.name in joining and not a.running]:
            agents.remove(child)
            if deaths is not None:
                deaths.unwatch(child.name)
            if child.process.returncode == 0:
                continue
            reasons = diagnose([child], folder).causes
            say(f"{child.name} did not join: "
                f"{reasons.get(child.name) or f'exit {child.process.returncode}'} (the others "
                f"go on without it; logs: {folder / 'logs'}/)")
        if self.start is None:
            return
        for name in self.due(seen, [a.name for a in agents]):
            say(f"{name} starts and asks to join (every other agent has passed round "
                f"{self.rounds[name]})")
            child = self.start(name)
            if deaths is not None:
                deaths.watch(child, joining=lambda n=name: n in self.joining(seen))
