"""The agent's life as one state machine, sans-I/O (in the style of h11): no asyncio, no gRPC.

    REGISTERING -> ASSIGNED -> KEYS -> SHARES -> (STATS) -> OPTIMIZING(t) -> DONE
    any stage but FAILED -> FAILED

The pipeline (agent/pipeline.py) is the only module that advances it, with events (assign,
keys, shares, stats, standardised, optimizing, advance, done, fail), each legal from given
stages only (IllegalTransition otherwise); the router and GetStatus ask it (its session, its
wire phase and round). Its data is the stage's: no session before ASSIGNED. Each phase keeps
its own receive rules (agent/phases/). A restart is assigned again (its saved assignment) and
goes on to OPTIMIZING at its checkpoint's round.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from efpsn.wire.records import Phase

if TYPE_CHECKING:
    from agent.session import Session

__all__ = ["IllegalTransition", "Life", "Stage"]


class Stage(enum.Enum):
    REGISTERING = "registering"  # waiting for the coordinator (or reloading a saved run)
    ASSIGNED = "assigned"  # the run is known: its neighbours' messages are served
    KEYS = "keys"  # phase I: public keys
    SHARES = "shares"  # phase I: encrypted shares (or seeds)
    STATS = "stats"  # scale standard: the secure sum of column statistics
    OPTIMIZING = "optimizing"  # phase II, at round `round`
    DONE = "done"
    FAILED = "failed"


# the phase GetStatus reports for each stage (FAILED: the phase it failed in)
WIRE_PHASE = {Stage.REGISTERING: Phase.PHASE_UNSPECIFIED, Stage.ASSIGNED: Phase.PHASE_UNSPECIFIED,
              Stage.KEYS: Phase.KEYS, Stage.SHARES: Phase.SHARES, Stage.STATS: Phase.STATS,
              Stage.OPTIMIZING: Phase.OPTIMIZE, Stage.DONE: Phase.DONE}

PHASE_ONE = (Stage.ASSIGNED, Stage.KEYS, Stage.SHARES)


class IllegalTransition(RuntimeError):
    """An event the agent's current stage does not allow (a bug in the sequencing)."""


class Life:
    """One agent's stage and the data it holds (see the module's docstring)."""

    def __init__(self) -> None:
        self._stage = Stage.REGISTERING
        self._session: Session | None = None
        self._round = 0
        self._awaiting_totals = False  # scale standard: phase II waits for the secure sum
        self._failed_in = Stage.REGISTERING
        self.error = ""

    def __repr__(self) -> str:
        return f"Life({self._stage.value}, round {self._round})"

    # ------------------------------------------------------------------ questions

    @property
    def stage(self) -> Stage:
        return self._stage

    @property
    def session(self) -> Session | None:
        """The assigned run (None while registering)."""
        return self._session

    @property
    def round(self) -> int:
        """Phase II's current round (0 before it)."""
        return self._round

    @property
    def phase(self) -> Phase:
        """The phase GetStatus reports."""
        stage = self._failed_in if self._stage is Stage.FAILED else self._stage
        return WIRE_PHASE[stage]

    # ------------------------------------------------------------------ events

    def _require(self, event: str, *allowed: Stage) -> None:
        if self._stage not in allowed:
            raise IllegalTransition(
                f"{event} in stage {self._stage.value} (allowed in "
                f"{', '.join(s.value for s in allowed)})")

    def assign(self, session: Session) -> None:
        """The run is assigned (or a saved one reloaded)."""
        self._require("assign", Stage.REGISTERING)
        self._stage, self._session = Stage.ASSIGNED, session

    def keys(self) -> None:
        self._require("keys", Stage.ASSIGNED)
        self._stage = Stage.KEYS

    def shares(self) -> None:
        self._require("shares", Stage.KEYS)
        self._stage = Stage.SHARES

    def stats(self) -> None:
        """scale standard: the secure sum begins (after phase I, whichever masks it drew)."""
        self._require("stats", *PHASE_ONE)
        self._stage, self._awaiting_totals = Stage.STATS, True

    def standardised(self, session: Session) -> None:
        """The totals are known: the session phase II runs."""
        self._require("standardised", Stage.STATS)
        self._session, self._awaiting_totals = session, False

    def optimizing(self, t: int) -> None:
        """Phase II begins at round t (0, or a restart's checkpoint)."""
        self._require("optimizing", *PHASE_ONE, Stage.STATS)
        if self._awaiting_totals:
            raise IllegalTransition("optimizing in stage stats before the secure sum's totals "
                                    "are known")
        if t < 0:
            raise IllegalTransition(f"optimizing from round {t}")
        self._stage, self._round = Stage.OPTIMIZING, t

    def advance(self, t: int) -> None:
        """Phase II is at round t (never backwards)."""
        self._require("advance", Stage.OPTIMIZING)
        if t < self._round:
            raise IllegalTransition(f"advance to round {t} from round {self._round}")
        self._round = t

    def done(self) -> None:
        self._require("done", Stage.OPTIMIZING)
        self._stage = Stage.DONE

    def fail(self, error: str) -> None:
        """The agent failed with `error` (from any stage; GetStatus keeps its phase)."""
        self._require("fail", *(s for s in Stage if s is not Stage.FAILED))
        self._failed_in, self._stage, self.error = self._stage, Stage.FAILED, error
