"""Between phase I and phase II of a `scale standard` run: the secure sum of column statistics
over the network (efpsn/stats/flood.py's flood, efpsn/stats/column_sums.py's masked vectors).
SecureSum owns the phase: the neighbours' flood messages (judged by its ledger, efpsn/ledger.py's
FirstCopyLedger, and filed in the mailbox), its run, the totals saved for a restart (through
the state store), and the session standardised with them.

Order at an agent: phase I's edge seeds saved -> the flood (every round's message delivered to
every neighbour, acknowledged, before the next) -> totals.json saved -> the session resolved and
standardised -> phase II. Every neighbour acknowledged all of this agent's flood messages before
its totals were saved, so a process restarted from them owes nobody a flood message; a process
stopped before they were saved cannot rejoin (the flood is not replayed), like one stopped in
phase I. One gone for good in phase I or during the flood (departures on) is decided as a
departure in phase I and the flood starts again without it (SecureSum.run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable

from agent.life import Stage
from agent.mailbox import Mailbox
from agent.membership import PhaseOneMembership
from agent.options import AgentFailure, RefusedByNeighbour
from agent.peers import Peers
from agent.prepare import Prepared
from agent.session import Session
from agent.state import TOTALS, StateError, StateStore
from efpsn.departure.membership import reconfigure
from efpsn.departure.remask import drop_seeds
from efpsn.ledger import FirstCopyLedger, Judgement, Verdict
from efpsn.masks.seeds import EdgeSeeds
from efpsn.problem import build_problem, build_task
from efpsn.stats.column_sums import Totals, masked_vector
from efpsn.stats.flood import StatsFlood, flood_round_base
from efpsn.stats.standardise import standardise_local, with_count_l2
from efpsn.topology import Graph
from efpsn.wire.records import Phase
from efpsn.wire.stats import StatsRecord, stats_message

__all__ = ["SecureSum", "standardised_session", "stats_length"]

FORMAT = 1  # of STATE/totals.json
log = logging.getLogger("efpsn.agent")


def stats_length(session: Session) -> int:
    """Entries of a masked statistics vector in this run: 1 + 3d (efpsn/stats/column_sums.py)."""
    return 1 + 3 * math.prod(session.problem.task.shape)


class SecureSum:
    """The secure sum of column statistics at one agent (see the module's docstring)."""

    def __init__(self, *, peers: Peers, mailbox: Mailbox, store: StateStore) -> None:
        self.peers = peers
        self.mailbox = mailbox
        self.store = store
        self.ledger = FirstCopyLedger("the statistics flood")

    def take(self, record: StatsRecord) -> Judgement:
        """A neighbour's flood message (checked at the edge): one per neighbour and round,
        identical copies acknowledged; once the flood is over here only copies."""
        judgement = self.ledger.judge(str(record.round), record.sender, record.digest,
                                      what=f"round-{record.round} statistics")
        if judgement.verdict == Verdict.ACCEPT:
            self.mailbox.put("stats", record.round, record.sender, record.vectors)
        return judgement

    async def run(self, session: Session, *, prepared: Prepared, seeds: EdgeSeeds | None,
                  link: PhaseOneMembership, entered: Callable[[Stage], None],
                  ) -> tuple[Totals, EdgeSeeds | None]:
        """This agent's flood: its masked vector out, every agent's in, the totals, and the
        seeds phase II masks with. A neighbour's message that names the wrong agents or
        contradicts another is an AgentFailure blaming it.

        A neighbour silent past the deadline is `link`'s to handle (agent/membership.py): with
        departures on it is reported as in phase I (a departure there or during this flood is
        one in phase I: round 0, re-base round n), and once the coordinator decides, the flood
        starts again on the remaining graph (efpsn.departure.membership's reconfigure: the new
        edges carry messages, no pad) with rounds and fresh pads of its own (the decisions'
        epoch), every departed neighbour's seeds dropped from this agent's pad and from phase
        II's masks (as if it had left in phase I), so the remaining pads cancel and the totals
        are the remaining agents'."""
        assert prepared.local is not None, "scale standard needs agent-local data"
        entered(Stage.STATS)
        try:
            return await self._run(session, prepared=prepared, seeds=seeds, link=link)
        finally:
            self.ledger.close()  # the flood is over here: only copies are acknowledged

    async def _run(self, session: Session, *, prepared: Prepared, seeds: EdgeSeeds | None,
                   link: PhaseOneMembership) -> tuple[Totals, EdgeSeeds | None]:
        assert prepared.local is not None
        link.masker = None  # phase I is over: a decision drops seeds here, not in it
        features = prepared.local.train.images.numpy()
        while True:
            gone = frozenset(d.agent for d in link.decided)
            mine = seeds if seeds is None or not gone else drop_seeds(seeds, gone)
            if mine is not None and gone and not mine.neighbours:
                raise AgentFailure(f"{session.assignment.name}: every neighbour it shares "
                                   "phase I seeds with left; it will not publish its column "
                                   "statistics without a pad")
            graph = (reconfigure(session.problem.graph, gone).graph if gone
                     else session.problem.graph)
            epoch = link.epoch  # fresh pads for a flood started again
            flood = StatsFlood(graph=graph, agent=session.index, gone=gone,
                               own=masked_vector(features, mine, epoch))
            base = flood_round_base(epoch, session.config.agents)
            senders = _flood_neighbours(session, graph, link)
            try:
                await _flood(flood, base, senders, peers=self.peers, timeout=link.deadline)
            except _Silent as silent:
                await link.recover(silent.missing, silent.failure)
                continue
            try:
                return flood.totals(), mine
            except ValueError as exc:
                raise AgentFailure(f"the secure sum of column statistics failed: {exc}"
                                   ) from None

    def save(self, totals: Totals, *, run_id: str) -> None:
        """STATE/totals.json (0600, through the state store): the run's totals, written once,
        before phase II."""
        self.store.save_record(TOTALS, {
            "format": FORMAT, "run_id": run_id, "count": totals.count,
            "sums": [str(v) for v in totals.sums], "squares": [str(v) for v in totals.squares],
            "present": list(totals.present)})

    def reload(self, *, run_id: str, name: str) -> Totals:
        """A restart: the totals saved before phase II (the sum is never summed again); an
        AgentFailure when they are missing (stopped during the sum) or damaged."""
        self.ledger.close()
        try:
            totals = self.load(run_id=run_id)
        except StateError as exc:
            raise AgentFailure(f"{name} cannot resume: {exc}") from None
        if totals is None:
            raise AgentFailure(
                f"{name} was stopped during the secure sum of column statistics of run "
                f"{run_id} (no totals in {self.store.folder}); the sum is not replayed: start "
                "a new run")
        return totals

    def load(self, *, run_id: str) -> Totals | None:
        """The totals `save` wrote for `run_id`, or None; StateError when damaged."""
        path = self.store.record_path(TOTALS)
        try:
            payload = self.store.load_record(TOTALS, fmt=FORMAT, run_id=run_id)
            if payload is None:
                return None
            return Totals(count=int(payload["count"]),
                          sums=tuple(int(v) for v in payload["sums"]),
                          squares=tuple(int(v) for v in payload["squares"]),
                          present=tuple(int(v) for v in payload.get("present", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"{path} is damaged: {exc}") from None


class _Silent(Exception):
    def __init__(self, missing: list[str], failure: AgentFailure) -> None:
        self.missing, self.failure = missing, failure


def _flood_neighbours(session: Session, graph: Graph,
                      link: PhaseOneMembership) -> dict[str, int]:
    """The flood's neighbours in `graph`, name -> index: the session's, and the new ones a
    decision named (session.joining)."""
    names = {**session.names, **{i: n for n, (i, _, _) in session.joining.items()}}
    names = {**link.names, **names}
    return {names[j]: j for j in sorted(graph.neighbours(session.index))}


async def _flood(flood: StatsFlood, base: int, senders: dict[str, int], *, peers: Peers,
                 timeout: float) -> None:
    """The flood's rounds, numbered from `base` on the wire; _Silent for neighbours that sent
    or took nothing in time (a refusal or a wrong message is an AgentFailure as it is)."""
    for r in range(flood.rounds):
        message = stats_message(header=peers.header(Phase.STATS, base + r),
                                vectors=flood.outgoing(r))
        outcomes = await asyncio.gather(
            *(peers.send(name, "PutStats", message, timeout=timeout) for name in senders),
            return_exceptions=True)
        failed = {}
        for name, outcome in zip(senders, outcomes, strict=True):
            if isinstance(outcome, RefusedByNeighbour) or (
                    isinstance(outcome, BaseException) and not isinstance(outcome, AgentFailure)):
                raise outcome
            if isinstance(outcome, AgentFailure):
                failed[name] = outcome
        if failed:
            raise _Silent(sorted(failed), failed[min(failed)])
        try:
            got = await peers.collect("stats", base + r, timeout=timeout, senders=senders)
        except AgentFailure as failure:
            missing = sorted(n for n in senders if not peers.mailbox.has("stats", base + r, n))
            if not missing:
                raise
            raise _Silent(missing, failure) from None
        names = {j: n for n, j in senders.items()}
        for j in sorted(got):
            try:
                flood.merge(j, r, got[j])
            except ValueError as exc:
                raise AgentFailure(f"{names[j]} sent a wrong statistics message: {exc}",
                                   blame=names[j]) from None


def standardised_session(session: Session, prepared: Prepared, totals: Totals, *,
                         who: str) -> Session:
    """The session phase II runs: l2 from the total count (when left to its default) and the
    step rule resolved with it, exactly as the simulator does (efpsn/stats/standardise.py), and this
    agent's data standardised with the totals (its training part checked against the step
    rule's curvature bound)."""
    if len(totals.sums) != stats_length(session) // 3:
        raise AgentFailure(f"{who}: the totals have {len(totals.sums)} columns, the run's data "
                           f"{stats_length(session) // 3}")
    config = with_count_l2(session.config, totals).resolved()
    assert prepared.local is not None
    local = standardise_local(prepared.local, totals, who=who, moment_bound=config.moment_bound)
    if local.missing:  # this agent's own log only: the count is a statistic of its data
        log.info("%s: filled %d empty cells of its own table with the network's column means",
                 who, local.missing)
    task = build_task(config)
    resolved = Prepared(config=config, task=task, local=local,
                        problem=build_problem(config, local={}, task=task))
    return dataclasses.replace(session, config=config,
                               problem=resolved.problem_for(session.index),
                               standardisation=(totals.mean(), totals.std()))

