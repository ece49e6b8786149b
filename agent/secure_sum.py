"""Between phase I and phase II of a `scale standard` run: the secure sum of column statistics
over the network (efpsn/stats_flood.py's flood, efpsn/secure_stats.py's masked vectors), its
receive rules, the totals saved for a restart, and the session standardised with them.

Order at an agent: phase I's edge seeds saved -> the flood (every round's message delivered to
every neighbour, acknowledged, before the next) -> totals.json saved -> the session resolved and
standardised -> phase II. Every neighbour acknowledged all of this agent's flood messages before
its totals were saved, so a process restarted from them owes nobody a flood message; a process
stopped before they were saved cannot rejoin (the flood is not replayed), like one stopped in
phase I.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from agent.life import Life
from agent.options import AgentFailure
from agent.peers import Peers
from agent.prepare import Prepared
from agent.session import Session
from agent.state import StateError, write_private
from efpsn.ledger import Judgement, Verdict
from efpsn.problem import build_problem, build_task
from efpsn.secure_stats import Totals, masked_vector
from efpsn.seeds import EdgeSeeds
from efpsn.standardise import standardise_local, with_count_l2
from efpsn.stats_flood import StatsFlood
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


def stats_length(session: Session) -> int:
    """Entries of a masked statistics vector in this run: 1 + 2d."""
    return 1 + 2 * math.prod(session.problem.task.shape)


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
                         prepared: Prepared, seeds: EdgeSeeds | None) -> Totals:
    """This agent's flood: its masked vector out, every agent's in, the totals. A neighbour's
    message that names the wrong agents or contradicts another is an AgentFailure blaming it."""
    assert prepared.local is not None, "scale standard needs agent-local data"
    flood = StatsFlood(graph=session.problem.graph, agent=session.index,
                       own=masked_vector(prepared.local.train.images.numpy(), seeds))
    life.stats()
    timeout = session.config.round_timeout_seconds
    for r in range(flood.rounds):
        message = stats_message(header=peers.header(Phase.STATS, r), vectors=flood.outgoing(r))
        await peers.send_all("PutStats", lambda name, m=message: m, timeout=timeout)
        got = await peers.collect("stats", r, timeout=timeout)
        for j in sorted(got):
            try:
                flood.merge(j, r, got[j])
            except ValueError as exc:
                who = session.names[j]
                raise AgentFailure(f"{who} sent a wrong statistics message: {exc}",
                                   blame=who) from None
    try:
        return flood.totals()
    except ValueError as exc:
        raise AgentFailure(f"the secure sum of column statistics failed: {exc}") from None


def save_totals(folder: Path, totals: Totals, *, run_id: str) -> None:
    """STATE/totals.json (0600): the run's totals, written once, before phase II."""
    payload = {"run_id": run_id, "count": totals.count, "sums": [str(v) for v in totals.sums],
               "squares": [str(v) for v in totals.squares]}
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
                      squares=tuple(int(v) for v in payload["squares"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"{path} is damaged: {exc}") from None


def standardised_session(session: Session, prepared: Prepared, totals: Totals, *,
                         who: str) -> Session:
    """The session phase II runs: l2 from the total count (when left to its default) and the
    step rule resolved with it, exactly as the simulator does (efpsn/standardise.py), and this
    agent's data standardised with the totals (its training part checked against the step
    rule's curvature bound)."""
    if len(totals.sums) != stats_length(session) // 2:
        raise AgentFailure(f"{who}: the totals have {len(totals.sums)} columns, the run's data "
                           f"{stats_length(session) // 2}")
    config = with_count_l2(session.config, totals).resolved()
    assert prepared.local is not None
    local = standardise_local(prepared.local, totals, who=who, moment_bound=config.moment_bound)
    task = build_task(config)
    resolved = Prepared(config=config, task=task, local=local,
                        problem=build_problem(config, local={}, task=task))
    return dataclasses.replace(session, config=config,
                               problem=resolved.problem_for(session.index),
                               standardisation=(totals.mean(), totals.std()))

