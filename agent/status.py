"""What this agent reports about itself through GetStatus (agent/router.py serves it): its
phase, round, error and whether it finished are its life's (agent/life.py), the figures its
last evaluation's, and when each neighbour was last heard (the servicer records it)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from agent.life import Life
from efpsn.wire.records import Phase

__all__ = ["Status"]


@dataclass
class Status:
    """The agent's life, and the last public figures."""

    life: Life = field(default_factory=Life)
    loss: float = math.nan
    accuracy: float = math.nan
    heard: dict[str, float] = field(default_factory=dict)  # neighbour -> time.monotonic()

    def hear(self, name: str) -> None:
        """A message from neighbour `name` was let in (its sender authenticated): it is alive."""
        self.heard[name] = time.monotonic()

    def heard_ago(self, name: str) -> float:
        """Seconds since `name` was last heard; -1 when it never was."""
        at = self.heard.get(name)
        return -1.0 if at is None else time.monotonic() - at

    @property
    def phase(self) -> Phase:
        return self.life.phase

    @property
    def round(self) -> int:
        return self.life.round

    @property
    def error(self) -> str:
        return self.life.error

    @property
    def finished(self) -> bool:
        return self.life.phase == Phase.DONE  # done (and maybe failed after it)
