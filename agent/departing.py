"""A neighbour that left for good, at one agent: ask the coordinator who left (it decides, the
same for everyone: coordinator/departures.py), then apply the decision with the pure core's
functions (efpsn/departure/membership.py, efpsn/departure/remask.py), round by round as the simulator's
replay does (efpsn/departure/replay.py), so that the network equals `efpsn simulate --leave`.

At round T each neighbour of the departed agent d (at T + 1 a neighbour that used d's round-T
message, Departure.late) mixes with the drop-node weights and drops the mask terms it shares
with d; at the re-base round R every remaining agent takes the Metropolis weights of the graph
without d (joined where it fell apart: the ends of a new edge exchange seeds right after the
decision, agent/rejoin.py, and add them at R), restarts its tracker from its local gradient
and, with the stop rule, the remaining graph's rule (efpsn/optimize/stopping.py; no window decided at T
or later counts). Only names and round numbers go to the coordinator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

from agent import departure_state, fixed_terms
from agent.bootstrap import report_finished, report_silence
from agent.ending import end_at_cap, end_in_window, records
from agent.exchange import RoundLink
from agent.fixed_terms import EdgeTerms
from agent.mailbox import Mailbox
from agent.options import AgentFailure, RefusedByNeighbour
from agent.phase_one_leave import Decided, PhaseOneDecision
from agent.rejoin import Rejoin
from agent.session import Session
from agent.state import StateStore
from efpsn.algorithms.base import Received
from efpsn.departure.last_window import CapEnd
from efpsn.departure.membership import Departure, drop_node_weights, optimum_of, rebase, reconfigure
from efpsn.departure.remask import add_seeds, drop_seeds, reseeded
from efpsn.masks.fading import FadingMask
from efpsn.masks.refresh import FixedMask, MaskProvider, RefreshedMask
from efpsn.optimize.driver import RoundDriver
from efpsn.optimize.stopping import StopRule

__all__ = ["LocalDepartures", "Silence"]

log = logging.getLogger("efpsn.agent")


class LocalDepartures:
    """The departures this agent knows and what they change for it, round by round."""

    def __init__(self, session: Session, masks: MaskProvider,
                 terms: EdgeTerms | None = None) -> None:
        self.session = session
        self.masks = masks
        # the paper's fixed mask: phase I's per-edge shares a departure subtracts (fixed_terms;
        # a restarted agent's: reloaded by Silence.resume)
        self.terms = (terms or EdgeTerms(None)) if isinstance(masks, FixedMask) else None
        self.decided: list[Departure] = []
        self.epoch = 0
        self.graph = session.problem.graph
        self.weights = session.weights()
        self.events: list[dict[str, Any]] = []
        self.names = {**session.names, session.index: session.assignment.name}
        self._rebased: set[int] = set()
        self.new_seeds: dict[int, tuple[bytes, bytes]] = {}  # new neighbour -> (s_ij, s_ji)
        # what a restart needs again (agent/departure_state.py): every new neighbour and seed
        self.joined_info: dict[str, tuple[int, str, int]] = {}
        self.seed_record: dict[int, tuple[bytes, bytes]] = {}
        self.window: int | None = None  # who left in the stop's last window (agent/ending.py)
        self.capped: CapEnd | None = None  # a departure too late to re-base: the run's end

    @property
    def me(self) -> int:
        return self.session.index

    @property
    def gone(self) -> set[int]:
        return {d.agent for d in self.decided}

    def learn(self, departures: list[Departure], names: dict[int, str], driver: RoundDriver,
              joining: dict[str, tuple[int, str]] | None = None) -> dict[str, int]:
        """The coordinator's decision (all departures so far): check this agent can apply it;
        the new neighbours it shares a new edge with from the re-base round on (name ->
        index: their seeds are exchanged before it, agent/rejoin.py)."""
        self.names = {**names, **self.names}
        new = [d for d in departures if d.agent not in self.gone]
        if not new:
            raise AgentFailure(f"{self.session.assignment.name}: the coordinator's answer "
                               "holds no new departure")
        zero_sum = self.session.config.mask == "zero-sum"
        if zero_sum and self.terms is not None and not self.terms.available:
            raise AgentFailure("a departure with the paper's fixed mask (--refresh never) needs "
                               "phase I's per-edge shares, which this agent does not hold (its "
                               "phase I ran with departures off?): agent/fixed_terms.py")
        after = reconfigure(self.graph, self.gone | {d.agent for d in new})
        mine = sorted({b if a == self.me else a for a, b in after.new_edges if self.me in (a, b)})
        given = {index: (name, address) for name, (index, address) in (joining or {}).items()}
        if sorted(given) != mine:
            raise AgentFailure(f"the departure of {', '.join(self._name(d.agent) for d in new)} gives "
                               f"{self.session.assignment.name} the new neighbours "
                               f"{[f'agent{j + 1}' for j in mine]}, the coordinator named "
                               f"{sorted(n for n, _ in given.values())}")
        rebase_round = min(d.rebase_round for d in new)
        for j, (name, address) in given.items():
            self.session.joining[name] = (j, address, rebase_round)
            self.joined_info[name] = (j, address, rebase_round)
            self.names[j] = name
        self.decided.extend(new)
        self.epoch += 1
        if driver.stop is not None:  # no stop from a window decided at the round T or later
            driver.revise_stop(driver.stop.voided_from(min(d.round for d in new)))
        for d in new:
            self.events.append({**d.to_json(), "neighbours": [
                self._name(j) for j in self.graph.neighbours(d.agent)
                if j not in self.gone]})
        log.warning("%s: the coordinator decided: %s", self.session.assignment.name,
                    "; ".join(d.label() for d in new))
        return {name: j for j, (name, _) in given.items()}

    def add_seeds(self, seeds: dict[int, tuple[bytes, bytes]]) -> None:
        """The new edges' seeds, from their phase I (agent/rejoin.py), until the re-base."""
        self.new_seeds.update(seeds)
        self.seed_record.update(seeds)

    def save(self, folder: str | Path) -> None:
        """What a restart needs to re-apply the departures (agent/departure_state.py)."""
        departure_state.save(folder, run_id=self.session.run_id, decided=self.decided,
                             epoch=self.epoch, events=self.events, names=self.names,
                             joining=self.joined_info, seeds=self.seed_record)

    def restore(self, record: dict[str, Any], driver: RoundDriver) -> None:
        """A restart after departures were applied: re-apply what they changed up to the
        checkpoint's round c (the drops of rounds <= c, the re-bases before c without touching
        the checkpoint's trackers); round c's re-base is the loop's, as before the restart."""
        c = driver.t
        self.decided = list(record["decided"])
        self.epoch, self.events = record["epoch"], record["events"]
        self.names = {**record["names"], **self.names}
        self.joined_info = dict(record["joining"])
        self.seed_record = dict(record["seeds"])
        self.new_seeds = dict(record["seeds"])
        for name, entry in self.joined_info.items():
            self.session.joining[name] = entry
        sharing, outbox = driver.sharing, driver.outbox  # the checkpoint's stop window
        if driver.stop is not None:
            driver.revise_stop(driver.stop.voided_from(min(d.round for d in self.decided)))
        rounds = sorted({r for d in self.decided for r in (d.round, d.round + 1)
                         if r <= c} | {d.rebase_round for d in self.decided
                                       if d.rebase_round < c})
        for r in rounds:
            self._drop_at(r)
            if any(d.rebase_round == r for d in self.decided):
                self._rebased.add(r)
                self._rebase(r, driver, replaying=True)
        self._refresh(driver)
        if sharing is not None and driver.stop is not None and driver.stop.window(c) is not None:
            driver.sharing, driver.outbox = sharing, outbox
        log.warning("%s resumed with the departures %s applied up to round %d",
                    self.session.assignment.name, ", ".join(d.label() for d in self.decided), c)

    def _drop_at(self, t: int) -> list[int]:
        dropped: list[int] = []
        for d in self.decided:
            first = d.round + int(self.me in d.late and not d.phase_one)  # used round T
            if t == first and d.agent in self.weights:
                dropped.append(d.agent)
        if dropped:
            self.weights = drop_node_weights(self.weights, agent=self.me, gone=dropped)
            self._remask(dropped)
        for j in dropped:
            name = self._name(j)
            self.session.drop(name, reason=self._reason(name))
        return dropped

    def before_round(self, t: int, driver: RoundDriver) -> tuple[list[str], list[str]]:
        """Apply what round t changes (before its messages are taken); the neighbours this
        agent stops exchanging with from round t on, and the new ones it starts with."""
        dropped = self._drop_at(t)
        if dropped:
            self._refresh(driver)
        names = [self._name(j) for j in dropped]
        joined: list[str] = []
        if any(d.rebase_round == t for d in self.decided) and t not in self._rebased:
            self._rebased.add(t)
            joined = self._rebase(t, driver)
        return names, joined

    def _rebase(self, t: int, driver: RoundDriver, *, replaying: bool = False) -> list[str]:
        # those gone by round t, as the replay has them (a restart knows later ones too)
        recon = reconfigure(self.graph, {d.agent for d in self.decided if d.round <= t})
        self.graph = recon.graph
        self.weights = recon.agent_weights(self.me)
        new = sorted({b if a == self.me else a for a, b in recon.new_edges if self.me in (a, b)})
        joined = [self._name(j) for j in new]
        for name in joined:
            self.session.join(name)
        if new and isinstance(self.masks, (FadingMask, RefreshedMask)):  # phase I's terms
            self.masks = reseeded(self.masks, add_seeds(
                self.masks.seeds, {j: self.new_seeds.pop(j) for j in new}))
        elif new and self.terms is not None and isinstance(self.masks, FixedMask):
            self.masks = self.terms.joined(self.masks, new)
        self._refresh(driver)
        if not replaying:  # a restart's checkpoint after R holds the re-based trackers
            driver.state = rebase(driver.state)
            driver.outbox = {k: driver.state[k] for k in driver.algorithm.message_keys}
        # the stop rule of the remaining graph, its checks counted from R (efpsn/optimize/stopping.py)
        pending = min((d.round for d in self.decided if d.round <= t < d.rebase_round), default=None)
        stop = StopRule.rebased(self.session.config, recon.remaining_weights(), origin=t,
                                until=pending, cap=driver.iterations)
        if stop.active:  # the cap extended by the remaining graph's step rule
            driver.iterations = stop.cap
        driver.revise_stop(stop)
        for event in self.events:  # a restart reloads them: those its last save preceded
            if event["rebase_round"] == t and not (replaying and "new_edges" in event):
                event.update(epoch=self.epoch, new_edges=[[self._name(a), self._name(b)]
                                                          for a, b in recon.new_edges],
                             cap=driver.iterations)
        log.warning("%s re-based at round %d: the model is now %s%s",
                    self.session.assignment.name, t, optimum_of(recon.remaining),
                    "".join(f"; new neighbour {n}" for n in joined))
        return joined

    def _remask(self, gone: list[int]) -> None:
        if isinstance(self.masks, (FadingMask, RefreshedMask)):
            self.masks = reseeded(self.masks, drop_seeds(self.masks.seeds, gone))
        elif self.terms is not None and isinstance(self.masks, FixedMask):
            self.masks = self.terms.dropped(self.masks, gone)

    def _refresh(self, driver: RoundDriver) -> None:
        driver.context = dataclasses.replace(
            driver.context, weights=dict(self.weights),
            oracle=self.session.problem.objective(self.me, self.masks))

    def _reason(self, name: str) -> str:
        d = next(d for d in self.decided if self.names.get(d.agent) == name)
        return (f"{name} was declared gone at round {d.round} by the coordinator (silent past "
                "the departure deadline); it cannot come back to this run")

    def _name(self, j: int) -> str:
        return self.names.get(j, f"agent{j + 1}")

    def to_json(self) -> dict[str, Any] | None:
        """What the records say (None when nobody left): agent/ending.py's `records`."""
        return records(self)


class Silence:
    """What an agent does when a neighbour stays silent past the departure deadline in phase
    II: report it, wait for the coordinator's decision, apply it and collect the round again
    without the departed agent. It never goes on without a decision: a refusal, no decision or
    no coordinator raise the failure as before (exit 2 naming the silent neighbour)."""

    def __init__(self, *, departures: LocalDepartures, coordinator: Any, mailbox: Mailbox,
                 store: StateStore, timeout: float, rejoin: Rejoin) -> None:
        self.rejoin = rejoin  # a new edge's seed exchange (agent/rejoin.py)
        self.departures = departures
        self.coordinator = coordinator
        self.mailbox = mailbox
        self.store = store
        self.timeout = timeout  # how long a report waits for the others to report too
        self.applied: int | None = None  # the round at which a departure was last applied
        self.unfinished: dict[str, int] = {}  # new neighbours whose exchange is still to run

    def resume(self, driver: RoundDriver) -> PhaseOneDecision | None:
        """A restarted agent: re-apply the departures it had applied (none saved: nothing);
        those decided in phase I and not adopted yet are returned, to adopt again."""
        session, terms, masks = self.departures.session, self.departures.terms, self.departures.masks
        try:
            record = departure_state.load(self.store.folder, run_id=session.run_id)
            saved = (Path(self.store.folder) / fixed_terms.FILE).exists()  # since phase I
            if (saved or record and record["adopted"]) and terms is not None \
                    and isinstance(masks, FixedMask):
                terms.restore(self.store.folder, run_id=session.run_id, mask=masks)
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
        is checkpointed (agent/phase_two.py): a restart resumes there and finishes it."""
        joiners, self.unfinished = self.unfinished, {}
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
            self.rejoin.deciding(True)  # a new neighbour may call before I hear the decision
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
                self.rejoin.deciding(False)
            if ended:  # at the cap: there, or the rounds up to there first
                return None if there else await link.recollect(t, driver.outbox)
            self.unfinished = joiners  # their exchange, after round t's checkpoint (<= R)
            gone, joined = self.departures.before_round(t, driver)
            for neighbour in gone:
                await link.drop(neighbour)
            for neighbour in joined:
                link.join(neighbour)
            self.departures.save(self.store.folder)  # a restart re-applies it (and resumes)
            self.applied = t  # phase II checkpoints this round (agent/phase_two.py)
            try:
                return await link.recollect(t, driver.outbox)
            except AgentFailure as again:
                failure = again

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
        """Departures decided while this agent was still in phase I (agent/phase_one_leave.py,
        which finished it without them): learn them before round 0 and run the new edges'
        phase I; the loop drops the departed neighbours at round 0 (their edges hold no mask
        term already) and re-bases at R, as for a departure at round 0."""
        joiners = self.departures.learn(decision.decided, decision.names, driver,
                                        decision.joining)
        self.departures.epoch = decision.epoch  # the coordinator's count of decisions
        await self._new_edges(joiners)
        self.departures.save(self.store.folder)

    async def _new_edges(self, joiners: dict[str, int]) -> None:
        """The new edges' phase I after a decision (agent/rejoin.py): their seeds, or
        with the paper's fixed mask their shares, added at the re-base round."""
        session, terms = self.departures.session, self.departures.terms
        if joiners and isinstance(self.departures.masks, (FadingMask, RefreshedMask)):
            rebase_round = min(session.joining[n][2] for n in joiners)
            self.departures.add_seeds(await self.rejoin.exchange(
                joiners, rebase_round=rebase_round, epoch=self.departures.epoch))
        elif joiners and terms is not None:  # the paper's protocol on the new edges
            rebase_round = min(session.joining[n][2] for n in joiners)
            terms.add(await self.rejoin.exchange_shares(
                joiners, rebase_round=rebase_round, epoch=self.departures.epoch))
        if terms is not None:  # what a restart needs (agent/fixed_terms.py), saved first
            await asyncio.to_thread(terms.save, self.store.folder, run_id=session.run_id)
        if joiners:  # the seeds in departures.json, then the exchange's state goes
            self.departures.save(self.store.folder)
            self.rejoin.done()
