"""A neighbour silent in phase II past the departure deadline, at one agent: report it, ask the
coordinator who left (it decides, the same for everyone: coordinator/departures.py), apply the
decision (agent/departure/local.py) and collect the round again without the departed agent;
or end where the rule says, when the run had ended for agents far from it
(agent/departure/ending.py). Only names and round numbers go to the coordinator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from agent.departure import records as saved
from agent.departure.ending import end_at_cap, end_in_window
from agent.departure.local import LocalDepartures
from agent.departure.new_edges import NewEdges
from agent.departure.phase_one import Decided, PhaseOneDecision
from agent.departure.reports import poll_membership, report_finished, report_silence
from agent.exchange import RoundLink
from agent.mailbox import Mailbox
from agent.options import AgentFailure, RefusedByNeighbour
from agent.state import EDGE_TERMS, StateStore
from efpsn.algorithms.base import Received
from efpsn.departure.joins import seed_epoch
from efpsn.masks.fading import FadingMask
from efpsn.masks.refresh import FixedMask, RefreshedMask
from efpsn.optimize.driver import RoundDriver

__all__ = ["Silence"]

log = logging.getLogger("efpsn.agent")


class Silence:
    """What an agent does when a neighbour stays silent past the departure deadline in phase
    II: report it, wait for the coordinator's decision, apply it and collect the round again
    without the departed agent. It never goes on without a decision: a refusal, no decision or
    no coordinator raise the failure as before (exit 2 naming the silent neighbour)."""

    def __init__(self, *, departures: LocalDepartures, coordinator: Any, mailbox: Mailbox,
                 store: StateStore, timeout: float, edges: NewEdges,
                 deciding: Callable[[bool], None]) -> None:
        self.edges = edges  # a new edge's seed exchange (agent/departure/new_edges.py)
        self.deciding = deciding  # a new neighbour may call before I hear the decision
        self.departures = departures
        self.coordinator = coordinator
        self.mailbox = mailbox
        self.store = store
        self.timeout = timeout  # how long a report waits for the others to report too
        self.applied: int | None = None  # the round at which a departure was last applied
        self.unfinished: dict[str, int] = {}  # new neighbours whose exchange is still to run
        # joins learned before their round: (round, number, partners), exchanged at the round
        self.due: list[tuple[int, int, dict[str, int]]] = []

    def resume(self, driver: RoundDriver) -> PhaseOneDecision | None:
        """A restarted agent: re-apply the departures it had applied (none saved: nothing);
        those decided in phase I and not adopted yet are returned, to adopt again."""
        session, terms, masks = self.departures.session, self.departures.terms, self.departures.masks
        try:
            record = saved.load(self.store, run_id=session.run_id)
            kept = self.store.has_record(EDGE_TERMS)  # since phase I
            if (kept or record and record["adopted"]) and terms is not None \
                    and isinstance(masks, FixedMask):
                terms.restore(self.store, run_id=session.run_id, mask=masks)
        except ValueError as exc:
            raise AgentFailure(f"{session.assignment.name} cannot resume: {exc}") from None
        if record is not None and not record["adopted"]:
            return PhaseOneDecision.reloaded(record, session)
        if record is not None:
            self.departures.restore(record, driver)  # a new edge's exchange not finished:
            held = record["seeds"] if terms is None else terms.held  # `restart` finishes it
            self.unfinished = {n: j for n, (j, _, _) in record["joining"].items() if j not in held}
        return None

    async def restart(self, driver: RoundDriver) -> None:
        """A restart: `resume`, then adopt what phase I decided or finish a new edge's exchange."""
        unadopted = self.resume(driver)
        if unadopted is not None:
            await self.adopt(unadopted, driver)
        else:
            await self.finish_edges()

    async def finish_edges(self) -> None:
        """The new edges' exchange of the last decision, run once the round it was applied at
        is checkpointed (agent/phases/phase_two.py): a restart resumes there and finishes it."""
        joiners, self.unfinished = self.unfinished, {}
        session = self.departures.session
        for notice in self.departures.joins:  # a join's new edges: its number's seeds
            mine = {n: j for n, j in joiners.items() if session.joining[n][2] == notice.round}
            if mine:
                await self._new_edges(mine, epoch=seed_epoch(notice.number))
                joiners = {n: j for n, j in joiners.items() if n not in mine}
        if joiners:
            await self._new_edges(joiners)

    def missing(self, t: int, failure: AgentFailure) -> list[str]:
        """The neighbours whose round-t message is missing, and the one the failure blames."""
        session = self.departures.session
        if isinstance(failure, RefusedByNeighbour):
            return []  # a neighbour that answers is not gone: its refusal is the error
        missing = {n for n in session.neighbour_names if not self.mailbox.has("round", t, n)}
        if failure.blame in session.neighbour_names:
            missing.add(failure.blame)
        return sorted(missing)

    async def recover(self, t: int, failure: AgentFailure, driver: RoundDriver,
                      link: RoundLink) -> dict[int, Received] | None:
        """Round t's inbox after the departures the coordinator decides; `failure` (or a later
        one) when there is none to decide; None when the run had stopped (the driver ends at
        the check round: LocalDepartures.stop)."""
        session = self.departures.session
        while True:
            await self.finish_edges()  # a pending one first: it is of the previous decision
            missing = self.missing(t, failure)
            if not missing:
                raise failure
            # only a neighbour that does not answer (GetStatus) is reported silent: one that
            # answers is alive and waits itself (it reports too), and must not be declared gone
            # because its own report comes a moment after mine
            silent = await link.peers.unresponsive(missing)
            name = session.assignment.name
            log.warning("%s: %s; %s", name, failure,
                        f"asking the coordinator whether {', '.join(silent)} left" if silent
                        else f"{', '.join(missing)} answer (waiting themselves): waiting for "
                        "the coordinator's decision")
            self.deciding(True)  # a new neighbour may call before I hear the decision
            try:
                found, names, joining = await report_silence(
                    self.coordinator, session=session, name=name, round_=t, silent=silent,
                    epoch=self.departures.epoch, timeout=self.timeout,
                    last=driver.iterations)
                ended = [d for d in found if (d.stopped or d.capped)
                         and d.agent not in self.departures.gone]
                if ended and ended[0].capped:  # too late to re-base: I end where I wait
                    there = end_at_cap(self.departures, ended, names, driver)
                elif ended:  # agents far from it finished the last window: so do I
                    end_in_window(self.departures, ended, names, driver)
                    return None
                joiners = {} if ended else self.departures.learn(found, names, driver, joining)
            except AgentFailure as undecided:  # the silence stops this agent, as without
                raise AgentFailure(f"{failure}; {undecided}",
                                   blame=undecided.blame and failure.blame) from None
            finally:
                self.deciding(False)
            if ended:  # at the cap: there, or the rounds up to there first
                return None if there else await link.recollect(t, driver.outbox)
            self.unfinished = joiners  # their exchange, after round t's checkpoint (<= R)
            gone, joined = self.departures.before_round(t, driver)
            for neighbour in gone:
                await link.drop(neighbour)
            for neighbour in joined:
                link.join(neighbour)
            self.departures.save(self.store)  # a restart re-applies it (and resumes)
            self.applied = t  # phase II checkpoints this round (agent/phases/phase_two.py)
            try:
                return await link.recollect(t, driver.outbox)
            except AgentFailure as again:
                failure = again

    async def learn_joins(self, t: int, driver: RoundDriver, *, finished: bool = False) -> None:
        """A run with seats that join later, before stepping check round t (or ended there):
        the joins decided since the last poll, each recorded, and this agent's new edges'
        seeds exchanged at the join's round R, before it is stepped (the newcomer waits for
        them; at once when this agent ends first). Not at the check round it learns of the
        join: another member may learn of it only at R (the coordinator decides between two
        members' polls of one check round), and it cannot reach R while this agent waits in
        the exchange for a newcomer that waits for every new neighbour's key."""
        local = self.departures
        notices = await poll_membership(
            self.coordinator, session=local.session, name=local.session.assignment.name,
            round_=t, known=local.known_joins, finished=finished,
            timeout=local.session.config.round_timeout_seconds)
        for notice in notices:
            self.due.append((notice.round, notice.number, local.learn_join(notice, driver)))
        now = [d for d in self.due if finished or d[0] <= t]
        self.due = [d for d in self.due if not finished and d[0] > t]
        for _, number, partners in now:  # a restart before R learns of the join again
            await self._new_edges(partners, epoch=seed_epoch(number))
            local.save(self.store)  # a restart knows the join (and its seeds)

    async def finished(self, driver: RoundDriver) -> None:
        """A stop on the certificate or at the cap: tell the coordinator (a departure it
        decides later, while this agent is gone home, is then the end it was:
        coordinator/departures.py)."""
        if self.departures.window is None and self.departures.capped is None:
            await report_finished(self.coordinator, session=self.departures.session,
                                  name=self.departures.session.assignment.name,
                                  round_=driver.t, epoch=self.departures.epoch, timeout=5.0,
                                  capped=not driver.stopped_early)

    async def adopt(self, decision: Decided, driver: RoundDriver) -> None:
        """Departures decided while this agent was still in phase I (agent/departure/phase_one.py,
        which finished it without them): learn them before round 0 and run the new edges'
        phase I; the loop drops the departed neighbours at round 0 (their edges hold no mask
        term already) and re-bases at R, as for a departure at round 0."""
        joiners = self.departures.learn(decision.decided, decision.names, driver,
                                        decision.joining)
        self.departures.epoch = decision.epoch  # the coordinator's count of decisions
        await self._new_edges(joiners)
        self.departures.save(self.store)

    async def _new_edges(self, joiners: dict[str, int], *, epoch: int | None = None) -> None:
        """The new edges' phase I after a decision (agent/departure/new_edges.py): their seeds,
        or with the paper's fixed mask their shares, added at the re-base round (`epoch`: the
        decision's, for the seeds; a departure's by default)."""
        session, terms = self.departures.session, self.departures.terms
        epoch = self.departures.epoch if epoch is None else epoch
        if joiners and isinstance(self.departures.masks, (FadingMask, RefreshedMask)):
            rebase_round = min(session.joining[n][2] for n in joiners)
            self.departures.add_seeds(await self.edges.exchange(
                session, joiners, rebase_round=rebase_round, epoch=epoch))
        elif joiners and terms is not None:  # the paper's protocol on the new edges
            rebase_round = min(session.joining[n][2] for n in joiners)
            terms.add(await self.edges.exchange_shares(
                session, joiners, rebase_round=rebase_round, epoch=epoch))
        if terms is not None:  # what a restart needs (fixed_terms.py), saved first
            await asyncio.to_thread(terms.save, self.store, run_id=session.run_id)
        if joiners:  # the seeds in departures.json, then the exchange's state goes
            self.departures.save(self.store)
            self.edges.done()
