"""The picture of a run (RESULTS/training.png): objective, test accuracy, consensus and the
certificate against the rounds, every agent a thin line and their mean a thick one, each
departure marked. Drawn with matplotlib's Agg canvas (no display, no pyplot state)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from efpsn.optimize.certificate import TARGET
from efpsn.report.curves import Curves, certificate_curve, read_curves

__all__ = ["PICTURE", "draw", "write_picture"]

PICTURE = "training.png"


def _mean(curves: Curves, key: str) -> tuple[list[int], list[float]]:
    """The agents' mean of `key` at every round all of them that still run measured it."""
    by_round: dict[int, list[float]] = {}
    for agent in curves.agents:
        for t, v in zip(*agent.series(key), strict=True):
            by_round.setdefault(t, []).append(v)
    rounds = sorted(by_round)
    return rounds, [statistics.fmean(by_round[t]) for t in rounds]


def _each(ax: Any, curves: Curves, key: str, *, label: str, reduce: str = "mean") -> bool:
    drawn = False
    for agent in curves.agents:
        rounds, values = agent.series(key)
        if rounds:
            ax.plot(rounds, values, linewidth=0.8, alpha=0.5)
            drawn = True
    if not drawn:
        return False
    if reduce == "mean":
        rounds, values = _mean(curves, key)
    else:  # the largest: the network's worst disagreement
        by_round: dict[int, float] = {}
        for agent in curves.agents:
            for t, v in zip(*agent.series(key), strict=True):
                by_round[t] = max(by_round.get(t, -math.inf), v)
        rounds = sorted(by_round)
        values = [by_round[t] for t in rounds]
    ax.plot(rounds, values, color="black", linewidth=2.0, label=label)
    return True


def _mark_departures(axes: list[Any], curves: Curves) -> None:
    for k, d in enumerate(curves.departures):
        for ax in axes:
            ax.axvline(d.round, color="tab:red", linestyle="--", linewidth=1.2,
                       label=f"{d.agent} left (round {d.round})" if ax is axes[0] else None)
            if d.rebase_round is not None:
                ax.axvline(d.rebase_round, color="tab:red", linestyle=":", linewidth=1.0,
                           label=(f"re-based (round {d.rebase_round})"
                                  if ax is axes[0] and k == 0 else None))


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=9,
            transform=ax.transAxes)
    ax.set_axis_off()  # not its ticks: the axes share the rounds


def _title(curves: Curves) -> str:
    s = curves.settings
    what = ", ".join(str(s[k]) for k in ("task", "algorithm", "topology") if s.get(k))
    unfinished = [a.name for a in curves.agents if not a.finished]
    head = f"{len(curves.agents)} agents" + (f" ({what})" if what else "")
    if unfinished:
        head += (f"; {', '.join(unfinished)} (not finished): to "
                 f"{'its last checkpoint' if len(unfinished) == 1 else 'their last checkpoints'}")
    if curves.run_id:
        head = f"run {curves.run_id}: {head}"
    line = curves.convergence or ""
    return head + (f"\n{line[:140]}{'...' if len(line) > 140 else ''}" if line else "")


def draw(curves: Curves) -> Any:
    """The figure (matplotlib.figure.Figure) of `curves`."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.0, 7.6), layout="constrained")
    (objective, accuracy), (consensus, certificate) = fig.subplots(2, 2, sharex=True)
    if _each(objective, curves, "loss", label="mean of the agents"):
        objective.set_yscale("log")
        objective.set_title("objective: each agent's loss on its own data")
    else:
        _empty(objective, "no loss in the histories")
    if _each(accuracy, curves, "accuracy", label="mean of the agents"):
        accuracy.set_title("test accuracy")
    else:
        _empty(accuracy, "no accuracy in the histories")
    if _each(consensus, curves, "gap", label="largest (the network's)", reduce="max"):
        consensus.set_yscale("log")
        consensus.set_title("consensus: distance to a neighbour's iterate")
    else:
        _empty(consensus, "no consensus measure in the histories")
    rounds, bounds, why = certificate_curve(curves)
    if rounds:
        certificate.plot(rounds, bounds, color="black", linewidth=2.0,
                         label="bound B on ||x_bar - x*||, over ||x_bar||")
        certificate.axhline(TARGET, color="tab:green", linestyle="--", linewidth=1.2,
                            label=f"target {TARGET:g}")
        certificate.set_yscale("log")
        certificate.set_title("certificate (from the agents' own measures)")
        certificate.legend(loc="upper right", fontsize=8)
    else:
        _empty(certificate, why or "the certificate bounds nothing yet at the evaluated rounds")
    drawn = [ax for ax in (objective, accuracy, consensus, certificate) if ax.has_data()]
    _mark_departures(drawn, curves)
    for ax in drawn:
        ax.grid(True, alpha=0.3)
    for ax in (consensus, certificate):
        ax.set_xlabel("round")
    if objective.has_data():
        objective.legend(loc="upper right", fontsize=8)
    fig.suptitle(_title(curves), fontsize=10)
    return fig


def write_picture(folder: Path, *, out: Path | None = None) -> Path:
    """Draw the run in `folder` into `out` (default FOLDER/training.png); returns the path.
    ValueError when the folder holds no history; ImportError without matplotlib."""
    curves = read_curves(folder)
    path = out or folder / PICTURE
    fig = draw(curves)
    fig.savefig(path, dpi=110)
    return path
