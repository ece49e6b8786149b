"""Between phase I and phase II of a `scale standard` run: the secure sum of column statistics
over the network (efpsn/stats/flood.py's flood, efpsn/stats/column_sums.py's masked vectors), its
receive rules, the totals saved for a restart, and the session standardised with them.

Order at an agent: phase I's edge seeds saved -> the flood (every round's message delivered to
every neighbour, acknowledged, before the next) -> totals.json saved -> the session resolved and
standardised -> phase II. Every neighbour acknowledged all of this agent's flood messages before
its totals were saved, so a process restarted from them owes nobody a flood message; a process
stopped before they were saved cannot rejoin (the flood is not replayed), like one stopped in
phase I. One gone for good in phase I or during the flood (departures on) is decided as a
departure in phase I and the flood starts again without it (run_secure_sum).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any, Protocol

from agent.durable import write_private
from agent.life import Life
from agent.options import AgentFailure, RefusedByNeighbour
from agent.peers import Peers
from agent.prepare import Prepared
from agent.session import Session
from agent.state import StateError
from efpsn.departure.membership import Departure, reconfigure
from efpsn.departure.remask import drop_seeds
from efpsn.ledger import Judgement, Verdict
from efpsn.masks.seeds import EdgeSeeds
from efpsn.problem import build_problem, build_task
from efpsn.stats.column_sums import Totals, masked_vector
from efpsn.stats.flood import StatsFlood, flood_round_base
from efpsn.stats.standardise import standardise_local, with_count_l2
from efpsn.topology import Graph
from efpsn.wire.records import Phase
from efpsn.wire.stats import stats_message

__all__ = [
    "TOTALS_FILE",
    "StatsLedger",
    "load_totals",
    "run_secure_sum",
    "save_totals",
    "standardised_session",
    "stats_length",
]

TOTALS_FILE = "totals.json"
log = logging.getLogger("efpsn.agent")


class PhaseOneDepartures(Protocol):
    """What the flood needs of agent/phase_one_leave.py's PhaseOneDepartures (not imported:
    it reaches the servicer, which takes the flood's rules from here)."""

    decided: list[Departure]
    names: dict[int, str]
    epoch: int
    deadline: float
    masker: Any

    async def recover(self, missing: list[str], failure: AgentFailure) -> None: ...


def stats_length(session: Session) -> int:
    """Entries of a masked statistics vector in this run: 1 + 3d (efpsn/stats/column_sums.py)."""
    return 1 + 3 * math.prod(session.problem.task.shape)


class StatsLedger:
    """The flood's receive rules: one message per neighbour and round, identical copies
    acknowledged; once the flood is over here only copies are acknowledged."""

    def __init__(self) -> None:
        self._digests: dict[tuple[str, int], bytes] = {}
        self.closed = False

    def judge(self, sender: str, round_: int, digest: bytes) -> Judgement:
        known = self._digests.get((sender, round_))
        if known is not None and known == digest:
            return Judgement(Verdict.DUPLICATE, "duplicate ignored")
        if self.closed:
            return Judgement(Verdict.REFUSE, f"the statistics flood is over at this agent, and "
                             f"this round-{round_} message is not the one {sender} sent",
                             "FAILED_PRECONDITION")
        if known is not None:
            return Judgement(Verdict.REFUSE, f"a different round-{round_} statistics message "
                             f"from {sender} was already received", "INVALID_ARGUMENT")
        self._digests[(sender, round_)] = digest
        return Judgement(Verdict.ACCEPT)

    def close(self) -> None:
        self.closed = True


async def run_secure_sum(*, session: Session, peers: Peers, life: Life,
                         prepared: Prepared, seeds: EdgeSeeds | None,
                         leave: PhaseOneDepartures | None = None,
                         ) -> tuple[Totals, EdgeSeeds | None]:
    """This agent's flood: its masked vector out, every agent's in, the totals, and the seeds
    phase II masks with. A neighbour's message that names the wrong agents or contradicts
    another is an AgentFailure blaming it.

    With departures on (`leave`, agent/phase_one_leave.py): a neighbour silent past the
    departure deadline is reported as in phase I (a departure there or during this flood is
    one in phase I: round 0, re-base round n), and once the coordinator decides, the flood
    starts again on the remaining graph (efpsn.departure.membership's reconfigure: the new edges carry
    messages, no pad) with rounds and fresh pads of its own (the decisions' epoch), every
    departed neighbour's seeds dropped from this agent's pad and from phase II's masks (as if
    it had left in phase I), so the remaining pads cancel and the totals are the remaining
    agents'."""
    assert prepared.local is not None, "scale standard needs agent-local data"
    life.stats()
    if leave is not None:
        leave.masker = None  # phase I is over: a decision drops seeds here, not in it
    timeout = session.config.round_timeout_seconds if leave is None else leave.deadline
    features = prepared.local.train.images.numpy()
    while True:
        gone = frozenset(() if leave is None else (d.agent for d in leave.decided))
        mine = seeds if seeds is None or not gone else drop_seeds(seeds, gone)
        if mine is not None and gone and not mine.neighbours:
            raise AgentFailure(f"{session.assignment.name}: every neighbour it shares phase I "
                               "seeds with left; it will not publish its column statistics "
                               "without a pad")
        graph = reconfigure(session.problem.graph, gone).graph if gone else session.problem.graph
        epoch = 0 if leave is None else leave.epoch  # fresh pads for a flood started again
        flood = StatsFlood(graph=graph, agent=session.index, gone=gone,
                           own=masked_vector(features, mine, epoch))
        base = flood_round_base(epoch, session.config.agents)
        senders = _flood_neighbours(session, graph, leave)
        try:
            await _flood(flood, base, senders, peers=peers, timeout=timeout)
        except _Silent as silent:
            if leave is None:
                raise silent.failure from None
            await leave.recover(silent.missing, silent.failure)
            continue
        try:
            return flood.totals(), mine
        except ValueError as exc:
            raise AgentFailure(f"the secure sum of column statistics failed: {exc}") from None


class _Silent(Exception):
    def __init__(self, missing: list[str], failure: AgentFailure) -> None:
        self.missing, self.failure = missing, failure


def _flood_neighbours(session: Session, graph: Graph,
                      leave: PhaseOneDepartures | None) -> dict[str, int]:
    """The flood's neighbours in `graph`, name -> index: the session's, and the new ones a
    decision named (session.joining)."""
    names = {**session.names, **{i: n for n, (i, _, _) in session.joining.items()}}
    if leave is not None:
        names = {**leave.names, **names}
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


def save_totals(folder: Path, totals: Totals, *, run_id: str) -> None:
    """STATE/totals.json (0600): the run's totals, written once, before phase II."""
    payload = {"run_id": run_id, "count": totals.count, "sums": [str(v) for v in totals.sums],
               "squares": [str(v) for v in totals.squares], "present": list(totals.present)}
    write_private(Path(folder) / TOTALS_FILE, json.dumps(payload).encode())


def load_totals(folder: Path, *, run_id: str) -> Totals | None:
    """The totals save_totals wrote for `run_id`, or None; StateError when damaged."""
    path = Path(folder) / TOTALS_FILE
    if not path.exists():
        return None
    try:
        payload = json.loads(path.read_text())
        if payload["run_id"] != run_id:
            raise StateError(f"{path} belongs to run {payload['run_id']!r}, not {run_id!r}")
        return Totals(count=int(payload["count"]),
                      sums=tuple(int(v) for v in payload["sums"]),
                      squares=tuple(int(v) for v in payload["squares"]),
                      present=tuple(int(v) for v in payload.get("present", ())))
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"{path} is damaged: {exc}") from None


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

