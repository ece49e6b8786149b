"""What this agent reports about itself through GetStatus (agent/router.py serves it): its
phase, round, error and whether it finished are its life's (agent/life.py), the figures its
last evaluation's."""

from __future__ import annotations

import math
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
