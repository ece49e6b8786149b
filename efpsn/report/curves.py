"""A run's training curves, read from its results folder: each agent's evaluation history
(RESULTS/NAME/result.json, or, for an agent that did not finish, the history in its last
checkpoint and the run's parameters and departures in its state folder), the departures the
others recorded, and the certificate's bound at every
evaluated round (efpsn/optimize/certificate.py, from the agents' own measures). Pure: no
plotting here (efpsn/report/picture.py draws it)."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AgentCurve", "Curves", "Departure", "certificate_curve", "read_curves"]

_CHECKPOINT = re.compile(r"^round-(\d{8,})$")
_AGENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class AgentCurve:
    """One agent's evaluations, in round order; `finished`: from its result.json (else from
    its last checkpoint: it stopped before the end)."""

    name: str
    history: list[dict[str, float]]
    finished: bool

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(rounds, values) of `key` where it was measured and finite."""
        pairs = [(int(h["round"]), float(h[key])) for h in self.history
                 if key in h and isinstance(h[key], int | float) and math.isfinite(h[key])]
        return [r for r, _ in pairs], [v for _, v in pairs]


@dataclass(frozen=True)
class Departure:
    """A party that left: the first round it sent nothing for, and the re-base round (None:
    it left in phase I, or too late to re-base)."""

    agent: str
    round: int
    rebase_round: int | None


@dataclass(frozen=True)
class Curves:
    """Everything the picture shows of one run."""

    folder: Path
    settings: dict[str, Any]
    agents: list[AgentCurve]
    departures: list[Departure] = field(default_factory=list)
    convergence: str | None = None  # the run's last line (summary.json), if it has one
    run_id: str = ""


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _last_checkpoint(folder: Path) -> dict[str, Any] | None:
    rounds = sorted((int(m.group(1)), p) for p in (folder / "state" / "checkpoints").glob("*")
                    if (m := _CHECKPOINT.match(p.name)))
    for _, path in reversed(rounds):
        meta = _read(path / "state.json")
        if meta is not None and isinstance(meta.get("history"), list):
            return meta
    return None


def _departures(records: Sequence[dict[str, Any]]) -> list[Departure]:
    seen: dict[str, Departure] = {}
    for record in records:
        for e in record.get("departures") or []:
            name = str(e.get("agent", ""))
            if not name or name in seen:
                continue
            rebase = e.get("rebase_round")
            late = "stopped" in e or "capped" in e or e.get("phase_one")
            seen[name] = Departure(agent=name, round=int(e.get("round") or 0),
                                   rebase_round=None if late or rebase is None else int(rebase))
    return sorted(seen.values(), key=lambda d: (d.round, d.agent))


def read_curves(folder: Path) -> Curves:
    """The curves of the run in `folder` (`efpsn up --results FOLDER`, or one party's own
    results folder). ValueError when it holds no agent's history."""
    agents: list[AgentCurve] = []
    records: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}
    run_id = ""
    dirs = sorted((p for p in folder.iterdir() if p.is_dir() and _AGENT.match(p.name)),
                  key=lambda p: _natural(p.name)) if folder.is_dir() else []
    for path in dirs:
        result = _read(path / "result.json")
        if result is not None and isinstance(result.get("history"), list):
            agents.append(AgentCurve(str(result.get("name", path.name)), result["history"],
                                     finished=True))
            records.append(result)
            settings = settings or dict(result.get("settings") or {})
            run_id = run_id or str(result.get("run_id", ""))
            continue
        meta = _last_checkpoint(path)
        if meta is not None and meta["history"]:
            agents.append(AgentCurve(path.name, list(meta["history"]), finished=False))
            state = path / "state"
            saved = _read(state / "assignment.json") or {}
            settings = settings or dict(saved.get("parameters") or {})
            run_id = run_id or str(saved.get("run_id", ""))
            applied = _read(state / "departures.json") or {}
            records.append({"departures": applied.get("events") or []})
    if not agents:
        raise ValueError(f"{folder} holds no agent's history (no NAME/result.json and no "
                         "checkpoint): give the results folder of a run (efpsn up --results)")
    summary = _read(folder / "summary.json") or {}
    if summary.get("departures"):
        records.append(summary)
    settings = settings or dict(summary.get("settings") or {})
    convergence = (summary.get("convergence") or {}).get("line")
    return Curves(folder=folder, settings=settings, agents=agents,
                  departures=_departures(records), convergence=convergence,
                  run_id=run_id or str(summary.get("run_id", "")))


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    return head, int(name[len(head):]) if name != head else -1


def _scale(record: dict[str, float]) -> float | None:
    """max(1, ||x_i||) as the agent measured it (a measure over its relative form)."""
    for key in ("step", "gap", "tracker"):
        value, relative = record.get(key), record.get(f"relative_{key}")
        if value and relative and math.isfinite(value) and math.isfinite(relative):
            return value / relative
    return None


def certificate_curve(curves: Curves) -> tuple[list[int], list[float], str | None]:
    """(rounds, bounds, why not): at every evaluated round, the certificate's bound B on
    ||x_bar - x*|| (efpsn/optimize/certificate.py) from the agents' worst measures, relative
    to ||x_bar|| taken as the agents' mean max(1, ||x_i||). The run is certified where this
    is below about the target (B / (||x_bar|| - B) <= target). `why not` says why there is
    no certificate at all (a model without a public curvature bound, DSGD, no settings)."""
    if not curves.settings:
        return [], [], "no run settings in the results"
    from efpsn.departure.membership import reconfigure
    from efpsn.optimize.certificate import Certifier, distance_bound
    from efpsn.optimize.driver import worst
    from efpsn.params.config import RunConfig
    from efpsn.topology import build_graph, metropolis_weights

    try:
        config = RunConfig.from_dict(curves.settings)
        graph = build_graph(config.topology, config.agents, seed=config.seed)
        before = Certifier.for_run(config, metropolis_weights(graph))
    except (ValueError, KeyError, TypeError) as exc:
        return [], [], f"the run's settings give no certificate ({exc})"
    if before.curvature is None or before.l2 <= 0:
        return [], [], "no public curvature bound for this model: no certificate"
    if config.algorithm == "dsgd":
        return [], [], "no tracker (DSGD): no certificate"
    after, rebase = before, None
    # indices as the coordinator gives them: the names sorted as strings
    names = {n: i for i, n in enumerate(sorted({a.name for a in curves.agents}
                                               | {d.agent for d in curves.departures}))}
    gone = {names[d.agent] for d in curves.departures if d.agent in names}
    if gone and len(names) == config.agents:
        rebase = min((d.rebase_round for d in curves.departures if d.rebase_round is not None),
                     default=None)
        after = Certifier.for_run(config, reconfigure(graph, gone).remaining_weights())
    by_round: dict[int, list[dict[str, float]]] = {}
    for agent in curves.agents:
        for h in agent.history:
            if "round" in h and ("tracker" in h or "gap" in h):
                numbers = {k: float(v) for k, v in h.items()
                           if isinstance(v, int | float) and not isinstance(v, bool)}
                by_round.setdefault(int(h["round"]), []).append(numbers)
    rounds, bounds = [], []
    for t in sorted(by_round):
        records = by_round[t]
        scales = [s for s in map(_scale, records) if s is not None]
        if not scales:
            continue
        c = after if rebase is not None and t >= rebase else before
        m = worst(records)
        assert c.curvature is not None
        value = distance_bound(tracker=m.get("tracker", math.nan), gap=m.get("gap", math.nan),
                               step=m.get("step", math.nan) if c.momentum else 0.0,
                               curvature=c.curvature, l2=c.l2, hops=c.hops,
                               momentum=c.momentum) / statistics.fmean(scales)
        if math.isfinite(value) and value > 0:
            rounds.append(t)
            bounds.append(value)
    return rounds, bounds, None
