"""Who takes part in the run, as the pipeline asks it at a few named points: the departure
subsystem (agent/departure/) when departures are on, `NoChanges` when they are off
(--departure-deadline 0: a silent neighbour stops this agent, exit 2 naming it).

    a neighbour missing in phase I    phase_one(session).send_all / .collect / .recover
                                      (also the secure sum of column statistics after it)
    phase I ended                     phase_one_ended(...): what a restart needs, saved
    the secure sum ended              secure_sum_ended(...): likewise
    on restart                        left_in_phase_one(...): the neighbours whose seeds
                                      phase I's saved result lacks
    phase II begins                   rounds(session, masks).start(driver)
    before a round                    .before_round(t, driver): who stops, who starts (a run
                                      with seats that join later polls the coordinator at its
                                      check rounds there)
    on silence                        .on_silence(t, failure, driver, link): the round's inbox
                                      after the coordinator's decision (or the run's end)
    a round saved                     .round_saved(t): work that waits for its checkpoint
    the run's end                     .finish(driver, link)

The router asks `deciding` (a caller unknown a moment ago may be a new neighbour named by a
decision this agent has not heard yet) and hands a new edge's phase I messages to
`new_edges`. A party joining a running network (a seat the run leaves empty) changes the
membership at the same points: the members hear the decision at a check round (before_round),
the ends of its new edges exchange their seeds then (new_edges), and everyone re-bases at the
join's round (before_round); the newcomer's own pipeline starts at that round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agent.options import AgentFailure

if TYPE_CHECKING:
    from agent.exchange import RoundLink
    from agent.peers import Peers
    from agent.session import Session
    from efpsn.algorithms.base import Received
    from efpsn.departure.membership import Departure
    from efpsn.masks.refresh import MaskProvider
    from efpsn.masks.zero_sum import Masker
    from efpsn.optimize.driver import RoundDriver

__all__ = ["Membership", "NoChanges", "PhaseOneMembership", "RoundsMembership"]


class PhaseOneMembership(Protocol):
    """Phase I's sends and waits (and the secure sum's), and what a neighbour gone there
    changes: `decided`, `names` (index -> name of the departed) and `epoch` (the coordinator's
    count of decisions); `masker` is told to drop a departed neighbour."""

    deadline: float
    decided: list[Departure]
    names: dict[int, str]
    epoch: int
    masker: Any

    async def send_all(self, method: str, make: Callable[[str], Any], *,
                       timeout: float | None = None) -> None: ...

    async def collect(self, kind: str) -> dict[int, Any]: ...

    async def recover(self, missing: list[str], failure: AgentFailure) -> None: ...


class RoundsMembership(Protocol):
    """Phase II's side: see the module's docstring for when each is called."""

    timeout: float  # how long a round waits for a neighbour before `on_silence`
    ended: str | None  # why the rounds ended before the driver's last: a history mark

    async def start(self, driver: RoundDriver, *, restarted: bool) -> bool: ...

    async def before_round(self, t: int, driver: RoundDriver
                           ) -> tuple[list[str], list[str]]: ...

    async def on_silence(self, t: int, failure: AgentFailure, driver: RoundDriver,
                         link: RoundLink) -> dict[int, Received] | None: ...

    def applied(self, t: int) -> bool: ...

    async def round_saved(self, t: int) -> None: ...

    async def finish(self, driver: RoundDriver, link: RoundLink) -> None: ...

    def records(self) -> dict[str, Any] | None: ...


class Membership(Protocol):
    """The run's membership at one agent, for its whole life (see the module's docstring)."""

    @property
    def deciding(self) -> bool: ...

    @property
    def new_edges(self) -> Any: ...  # agent/departure/new_edges.py's NewEdges, or None

    def phase_one(self, session: Session) -> PhaseOneMembership: ...

    async def phase_one_ended(self, session: Session, masker: Masker | None
                              ) -> dict[str, float]: ...

    def secure_sum_ended(self, session: Session) -> None: ...

    def left_in_phase_one(self, session: Session) -> set[int]: ...

    def rounds(self, session: Session, masks: MaskProvider) -> RoundsMembership: ...


# ------------------------------------------------------------------ departures off


@dataclass
class _StaticPhaseOne:
    """Phase I with a fixed set of neighbours: a silent one is a failure."""

    peers: Peers
    deadline: float
    decided: list[Departure] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    epoch: int = 0
    masker: Any = None

    async def send_all(self, method: str, make: Callable[[str], Any], *,
                       timeout: float | None = None) -> None:
        await self.peers.send_all(method, make, timeout=self.deadline)

    async def collect(self, kind: str) -> dict[int, Any]:
        return await self.peers.collect(kind, 0, timeout=self.deadline)

    async def recover(self, missing: list[str], failure: AgentFailure) -> None:
        raise failure


@dataclass
class _StaticRounds:
    """Phase II with a fixed set of neighbours: a silent one is a failure."""

    timeout: float
    ended: str | None = None

    async def start(self, driver: RoundDriver, *, restarted: bool) -> bool:
        return False

    async def before_round(self, t: int, driver: RoundDriver
                           ) -> tuple[list[str], list[str]]:
        return [], []

    async def on_silence(self, t: int, failure: AgentFailure, driver: RoundDriver,
                         link: RoundLink) -> dict[int, Received] | None:
        raise failure

    def applied(self, t: int) -> bool:
        return False

    async def round_saved(self, t: int) -> None:
        return None

    async def finish(self, driver: RoundDriver, link: RoundLink) -> None:
        await link.finish(driver.state.t, driver.outbox)

    def records(self) -> dict[str, Any] | None:
        return None


class NoChanges:
    """Departures off: the assigned neighbours are the run's to its end."""

    deciding = False
    new_edges = None

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    def phase_one(self, session: Session) -> PhaseOneMembership:
        return _StaticPhaseOne(self.peers, deadline=session.config.round_timeout_seconds)

    async def phase_one_ended(self, session: Session, masker: Masker | None
                              ) -> dict[str, float]:
        return {}

    def secure_sum_ended(self, session: Session) -> None:
        return None

    def left_in_phase_one(self, session: Session) -> set[int]:
        return set()

    def rounds(self, session: Session, masks: MaskProvider) -> RoundsMembership:
        if session.config.late:
            raise AgentFailure(f"{session.assignment.name}: run {session.run_id} has seats that "
                               f"join later ({session.config.late}), and --departure-deadline 0 "
                               "turns membership changes off: start every agent with a "
                               "departure deadline (the default) to take part")
        return _StaticRounds(timeout=session.config.round_timeout_seconds)
