"""What this agent reports about itself through GetStatus (agent/servicer.py serves it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from efpsn.wire.records import Phase

__all__ = ["Status"]


@dataclass
class Status:
    """Phase, round, the last public figures, and whether the agent finished or failed."""

    phase: Phase = Phase.PHASE_UNSPECIFIED
    round: int = 0
    loss: float = math.nan
    accuracy: float = math.nan
    error: str = ""
    finished: bool = False
