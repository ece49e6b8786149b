"""`efpsn status`'s output: one line per agent (phase, round, rounds left, neighbours with the
time since each was last heard, departures, and for the agent's own operator its figures),
or the same as JSON for scripts."""

from __future__ import annotations

import math
from typing import Any

from efpsn.monitor.gather import AgentRow, RunProgress
from efpsn.wire.records import Phase
from efpsn.wire.status_client import AgentStatus

__all__ = ["agent_line", "progress_json", "progress_lines"]

PHASES = {Phase.PHASE_UNSPECIFIED: "starting", Phase.KEYS: "phase I (keys)",
          Phase.SHARES: "phase I (shares)", Phase.STATS: "secure sum of statistics",
          Phase.OPTIMIZE: "phase II", Phase.DONE: "done"}


def _seconds(value: float | None) -> str:
    if value is None:
        return "never heard"
    return f"{value:.1f} s ago" if value < 120 else f"{value / 60:.0f} min ago"


def _rounds(s: AgentStatus) -> str:
    if s.phase not in (Phase.OPTIMIZE, Phase.DONE):
        return ""
    last = s.last_round or s.total_rounds
    left = s.rounds_left
    words = f"round {s.round} of {last}"
    if left is not None and not s.finished:
        words += f", about {left} left"
    return words


def _neighbours(s: AgentStatus) -> str:
    if s.neighbours:
        heard = ", ".join(f"{v.name} {_seconds(v.heard_ago)}" for v in s.neighbours)
        return f"neighbours {heard}"
    if s.neighbour_count:
        return f"{s.neighbour_count} neighbours (names for the run's parties only)"
    return "no neighbours yet" if s.phase == Phase.PHASE_UNSPECIFIED else "no neighbours"


def _figures(s: AgentStatus) -> str:
    shown = []
    if not math.isnan(s.loss):
        shown.append(f"loss {s.loss:.4f}")
    if not math.isnan(s.accuracy):
        shown.append(f"accuracy {s.accuracy:.3f}")
    return ", ".join(shown)


def agent_line(row: AgentRow) -> str:
    """`agent2: phase II, round 120 of 6919, about 6799 left; neighbours agent1 0.1 s ago,
    agent3 0.2 s ago; departed none` (and the operator's figures), or why it gave nothing."""
    s = row.status
    if s is None:
        where = f"not answering at {row.address}"
        if row.alive is False:
            where += f" (its process {row.pid} is gone)"
        elif row.alive:
            where += f" (its process {row.pid} runs: busy, stopped or cut off)"
        return f"{row.name}: {where}"
    parts = [PHASES.get(s.phase, s.phase.name)]
    if s.error:
        parts[0] = f"FAILED in {parts[0]}: {s.error}"
    rounds = _rounds(s)
    if rounds:
        parts.append(rounds)
    head = ", ".join(parts)
    tail = [_neighbours(s)]
    if s.departed:
        tail.append(f"departed {', '.join(s.departed)}")
    elif s.departed_count:
        tail.append(f"{s.departed_count} departed")
    if s.waiting_for:
        tail.append(f"waiting for {', '.join(s.waiting_for)}")
    if s.resumed_from_round is not None:
        tail.append(f"resumed from round {s.resumed_from_round}")
    figures = _figures(s)
    if figures:
        tail.append(figures)
    return f"{row.name}: {head}; " + "; ".join(tail)


def progress_lines(progress: RunProgress) -> list[str]:
    """A header (where the view comes from, the coordinator's counts), one line per agent,
    then any problem."""
    head = progress.source
    run = progress.run
    if run is not None:
        head += f": run {run.run_id or '(id for the parties only)'}, {run.registered} of " \
                f"{run.expected} agents registered"
        if run.departed:
            head += f", departed {', '.join(run.departed)}"
    answering = sum(r.status is not None for r in progress.rows)
    head += f"; {answering} of {len(progress.rows)} agents answer"
    return [head, *(agent_line(r) for r in progress.rows), *progress.problems]


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _agent_json(row: AgentRow) -> dict[str, Any]:
    out: dict[str, Any] = {"name": row.name, "address": row.address,
                           "answering": row.status is not None}
    if row.pid is not None:
        out.update(pid=row.pid, process_alive=row.alive)
    s = row.status
    if s is None:
        return out
    out.update(
        phase=s.phase.name, round=s.round, last_round=s.last_round or s.total_rounds,
        rounds_left=s.rounds_left, finished=s.finished, error=s.error or None,
        neighbour_count=s.neighbour_count,
        neighbours=[{"name": v.name, "address": v.address, "heard_seconds_ago": v.heard_ago}
                    for v in s.neighbours],
        departed_count=s.departed_count, departed=list(s.departed),
        waiting_for=list(s.waiting_for), resumed_from_round=s.resumed_from_round,
        loss=_finite(s.loss), accuracy=_finite(s.accuracy))
    return out


def progress_json(progress: RunProgress) -> dict[str, Any]:
    """The same view for scripts (`efpsn status --json`)."""
    run = progress.run
    return {"source": progress.source,
            "run": None if run is None else {
                "run_id": run.run_id or None, "registered": run.registered,
                "expected": run.expected, "assigned": run.assigned,
                "departed": list(run.departed)},
            "agents": [_agent_json(r) for r in progress.rows], "problems": progress.problems}
