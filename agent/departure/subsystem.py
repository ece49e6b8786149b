"""Departures on, behind the membership interface (agent/membership.py): the one object the
pipeline asks at its named points, holding what the departure subsystem knows for the agent's
whole life.

    phase I and the secure sum    PhaseOneDepartures (agent/departure/phase_one.py)
    phase I ended                 its decisions saved; the fixed mask's per-edge terms
                                  (agent/departure/fixed_terms.py)
    phase II                      Silence (agent/departure/silence.py) over LocalDepartures
                                  (agent/departure/local.py); the new edges' phase I
                                  (agent/departure/new_edges.py)
    on restart                    the saved decisions (agent/departure/records.py)

A neighbour silent past the departure deadline (--departure-deadline, default the run's round
timeout) is reported to the coordinator, which decides the same for every agent; nobody goes on
without that decision.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent.departure import records
from agent.departure.fixed_terms import EdgeTerms, save_phase_one
from agent.departure.local import LocalDepartures
from agent.departure.new_edges import NewEdges
from agent.departure.phase_one import PhaseOneDepartures
from agent.departure.silence import Silence
from agent.exchange import RoundLink
from agent.mailbox import Mailbox
from agent.options import AgentFailure, AgentOptions
from agent.peers import Peers
from agent.session import Session
from agent.state import StateStore
from efpsn.algorithms.base import Received
from efpsn.departure.joins import check_round
from efpsn.masks.refresh import MaskProvider
from efpsn.masks.zero_sum import Masker
from efpsn.optimize.driver import RoundDriver

__all__ = ["Departures"]


class Departures:
    """The membership of one agent's run when departures are on (see the module's
    docstring)."""

    def __init__(self, *, options: AgentOptions, peers: Peers, mailbox: Mailbox,
                 store: StateStore) -> None:
        self.options = options
        self.peers = peers
        self.mailbox = mailbox
        self.store = store
        self.new_edges = NewEdges(peers=peers, mailbox=mailbox, store=store,
                                  noise_seed=options.insecure_noise_seed,
                                  allow_insecure_keys=options.allow_insecure_keys)
        self._deciding = False
        self._left: PhaseOneDepartures | None = None  # decisions taken in phase I
        self._terms: EdgeTerms | None = None  # the fixed mask's per-edge terms

    @property
    def deciding(self) -> bool:
        """A departure decision is awaited: a caller unknown a moment ago may be new."""
        return self._deciding

    def awaiting_decision(self, awaited: bool) -> None:
        """A report waits for the coordinator's decision (True), or has its answer (False)."""
        self._deciding = awaited

    def _deadline(self, session: Session) -> float:
        return self.options.departure_deadline or session.config.round_timeout_seconds

    # ------------------------------------------------------------------ phase I

    def phase_one(self, session: Session) -> PhaseOneDepartures:
        if self._left is None:
            deadline = self._deadline(session)
            # the others report up to a few rounds later: wait for their deadline too
            self._left = PhaseOneDepartures(
                session=session, peers=self.peers, mailbox=self.mailbox,
                coordinator=self.peers.coordinator(), deadline=deadline,
                wait=deadline + session.config.round_timeout_seconds,
                deciding=self.awaiting_decision)
        return self._left

    async def phase_one_ended(self, session: Session, masker: Masker | None
                              ) -> dict[str, float]:
        """Before phase I's result is saved: who left (a restart must know), and with the
        fixed mask every edge's terms, decrypted alone (what it cost)."""
        self.phase_one(session).save(self.store)
        if masker is None:
            return {}
        self._terms, cost = await asyncio.to_thread(save_phase_one, masker, self.store,
                                                    run_id=session.run_id)
        return cost

    def secure_sum_ended(self, session: Session) -> None:
        """Those who left during the sum, saved before the totals are."""
        self.phase_one(session).save(self.store)

    def left_in_phase_one(self, session: Session) -> set[int]:
        record = records.load(self.store, run_id=session.run_id)
        return records.left_in_phase_one(record, session.index)

    # ------------------------------------------------------------------ phase II

    def rounds(self, session: Session, masks: MaskProvider) -> RoundsDepartures:
        deadline = self._deadline(session)
        silence = Silence(departures=LocalDepartures(session, masks, self._terms),
                          coordinator=self.peers.coordinator(), mailbox=self.mailbox,
                          store=self.store, timeout=deadline + session.config.round_timeout_seconds,
                          edges=self.new_edges, deciding=self.awaiting_decision)
        return RoundsDepartures(silence, left=self._left, timeout=deadline)


class RoundsDepartures:
    """Phase II's side of the membership with departures on (agent/membership.py's
    RoundsMembership), over one Silence."""

    def __init__(self, silence: Silence, *, left: PhaseOneDepartures | None,
                 timeout: float) -> None:
        self.silence = silence
        self.local = silence.departures
        self.left = left
        self.timeout = timeout
        # a run with seats that join later: every member polls before each check round
        self.polls = bool(self.local.session.config.late)

    @property
    def ended(self) -> str | None:
        """Why the rounds ended early: in a departure's last window, or at the cap."""
        if self.local.window is None and self.local.capped is None:
            return None
        return "stopped_at_check" if self.local.capped is None else "at_cap"

    async def start(self, driver: RoundDriver, *, restarted: bool) -> bool:
        """Phase I's decisions adopted before round 0; otherwise (a restart, or a fresh start
        with nothing decided) what was applied before, re-applied: True then, since the
        neighbours to replay from may have changed."""
        if self.left is not None and self.left.decided:
            await self.silence.adopt(self.left, driver)
            return False
        await self.silence.restart(driver)
        return restarted

    async def before_round(self, t: int, driver: RoundDriver) -> tuple[list[str], list[str]]:
        if self.polls and check_round(t, last=driver.iterations):  # joins (coordinator/joins.py)
            await self.silence.learn_joins(t, driver)
        return self.local.before_round(t, driver)

    async def on_silence(self, t: int, failure: AgentFailure, driver: RoundDriver,
                         link: RoundLink) -> dict[int, Received] | None:
        return await self.silence.recover(t, failure, driver, link)

    def applied(self, t: int) -> bool:
        return self.silence.applied == t

    async def round_saved(self, t: int) -> None:
        await self.silence.finish_edges()  # a new edge's exchange, once the round is saved

    async def finish(self, driver: RoundDriver, link: RoundLink) -> None:
        if self.polls:  # the run takes no more joins once a member ended
            await self.silence.learn_joins(driver.t, driver, finished=True)
        if self.ended is not None:
            await link.abandon()  # the run had ended: no neighbour needs a message of mine
            return
        await self.silence.finished(driver)  # the certificate's stop or the cap
        await link.finish(driver.state.t, driver.outbox)

    def records(self) -> dict[str, Any] | None:
        return self.local.to_json()
