"""Refreshed masks in the accuracy experiments: their rows, and the frontier (gamma, refresh)
-> (accuracy, distance to x*, the strongest attacker's PSNR, the accountant's epsilon)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from efpsn.experiments.attack_report import gamma_independent
from efpsn.experiments.common import Column, format_table, new_figure, save_figure
from efpsn.experiments.sweep import Series
from efpsn.jsonfile import read_json
from efpsn.params.config import RunConfig
from efpsn.params.refresh_setting import Refresh

__all__ = [
    "DELTA",
    "REFRESHES",
    "REFRESH_GAMMAS",
    "attack_psnr",
    "frontier_report",
    "frontier_rows",
    "frontier_table",
    "load_results",
    "plot_frontier",
    "refreshed_series",
    "run_epsilon",
    "strongest",
]

REFRESHES: tuple[str, ...] = ("never", "every:1", "every:10", "every:100")
"""The refreshed rows' mask settings: "never" is phase I's fixed mask on the same perturbation
(every parameter, K = 1), the comparison every refreshed row is read against."""
REFRESH_GAMMAS: tuple[float, ...] = (1e0, 1e2, 1e4, 1e5, 1e6)
DELTA = 1e-5
PSNR_LIMIT = 15.0  # dB: "nothing recognisable"
ATTACKED = "all-k1"  # the attack experiment's name of the refreshed rows' perturbation


def tracking_refreshes(refreshes: tuple[str, ...]) -> tuple[str, ...]:
    """The refreshes gradient tracking takes: the given ones without `every:R`, and fading."""
    kept = tuple(r for r in refreshes if not Refresh.parse(r).accumulates)
    return kept if any(Refresh.parse(r).fading for r in kept) else (*kept, "fading")


def refreshed_series(main: Series, *, refreshes: tuple[str, ...], gammas: tuple[float, ...],
                     gt_iterations: int | None = None, gt_lr: float = 0.1,
                     clips: tuple[float, ...] = (), clip_gammas: tuple[float, ...] = ()
                     ) -> tuple[Series, ...]:
    """The refreshed rows next to `main` (the paper's DSGD series), every parameter perturbed
    (K = 1, uniform measure, as the attack experiment's "all-k1"):

    - "<main>-all": main's algorithm, batch and schedule, zero-sum masks with each refresh;
      its noise-free run is main's (without noise the selection does not enter);
    - "gt-full-all" (gt_iterations given): gradient tracking, full batch, constant step gt_lr,
      with its own noise-free run, for the refreshes tracking takes (never and fading; `every:R`
      never lets it converge and is refused);
    - "<main>-all-clipC" per clip C: every:1 (or the first refresh) at `clip_gammas` (default
      `gammas`) with per-sample gradients clipped to C, and its own noise-free run with the
      same clipping.
    """
    if not refreshes:
        return ()
    common = {"selection": "all", "modes": ("zero-sum",), "gammas": gammas}
    out = [dataclasses.replace(main, name=f"{main.name}-all", refreshes=refreshes,
                               label=f"{main.label}, every parameter", reference=False,
                               **common)]
    if gt_iterations is not None:
        out.append(Series(name="gt-full-all", label=f"GT, constant step {gt_lr:g}, full batch, "
                          "every parameter", algorithm="gt", batch_size=0,
                          schedule=f"constant:{gt_lr:g}",
                          iterations=gt_iterations, eval_every=max(1, gt_iterations // 10),
                          refreshes=tracking_refreshes(refreshes), **common))
    refreshed = [r for r in refreshes if r != "never"]
    for clip in clips:
        out.append(dataclasses.replace(
            main, name=f"{main.name}-all-clip{clip:g}", refreshes=tuple(refreshed or ["never"])[:1],
            label=f"{main.label}, every parameter, per-sample clip {clip:g}", clip=clip,
            reference=True, **{**common, "gammas": clip_gammas or gammas}))
    return tuple(out)


def run_epsilon(settings: dict[str, Any], *, delta: float = DELTA) -> float:
    """The accountant's epsilon (one curious neighbour, every round composed) for a run's
    settings, as `efpsn privacy --refresh ... --json` prints it; inf where it gives no bound."""
    from efpsn.privacy.accounting import account_refreshed
    from efpsn.privacy.modes import refreshed_arguments

    config = RunConfig.from_dict(settings)
    if config.mask != "zero-sum" or (config.batch.full and config.clip == 0):
        return math.inf  # full batch needs the agent's private sample count; unclipped: no bound
    return account_refreshed(gamma=config.gamma,
                             **refreshed_arguments(config, delta=delta)).epsilon


def attack_psnr(paths: Sequence[str | Path]) -> dict[tuple[str, str, float | None], float]:
    """{(model, refresh, gamma): the highest PSNR of any attacker on any image} from attack
    experiment results (results.json files or their folders), for the refreshed rows'
    perturbation. An attacker that removes the mask exactly runs at one gamma and counts at
    every gamma: its best is kept under gamma None (`strongest` combines both)."""
    best: dict[tuple[str, str, float | None], float] = {}
    for path in paths:
        file = Path(path) / "results.json" if Path(path).is_dir() else Path(path)
        doc = json.loads(file.read_text())
        if doc.get("experiment") != "attack":
            raise ValueError(f"{file}: expected results of the attack experiment, got "
                             f"{doc.get('experiment')!r}")
        for r in doc["rows"]:
            if r["perturbation"] != ATTACKED or r["gamma"] <= 0:
                continue
            exact = gamma_independent(ATTACKED, r["attacker"], r["refresh"])
            key = (r["model"], r["refresh"], None if exact else float(r["gamma"]))
            best[key] = max(best.get(key, -math.inf), float(r["psnr"]))
    return best


def strongest(psnr: dict[tuple[str, str, float | None], float], model: str, refresh: str,
              gamma: float) -> float | None:
    """The strongest attacker's PSNR at (model, refresh, gamma); None where none was run."""
    found = [psnr[k] for k in ((model, refresh, gamma), (model, refresh, None)) if k in psnr]
    return max(found) if found else None


def frontier_rows(rows: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], *,
                  reference: dict[str, Any] | None, series: Sequence[str],
                  psnr: dict[tuple[str, str, float | None], float]) -> list[dict[str, Any]]:
    """One record per refreshed run of `series`: accuracy and its loss against the noise-free
    run (the series' own, else `reference`), distance to x*, consensus, the strongest
    attacker's PSNR per model (None where not measured) and the accountant's epsilon."""
    out = []
    for run in runs:
        row = run["row"]
        if row["series"] not in series or row["mode"] != "zero-sum":
            continue
        gamma = float(row["gamma"])
        base = next((r for r in rows if r["series"] == row["series"] and r["mode"] == "none"),
                    reference)
        out.append({
            "series": row["series"], "algorithm": row["algorithm"], "refresh": row["refresh"],
            "clip": row["clip"], "gamma": gamma, "accuracy": row["accuracy"],
            "accuracy_loss": None if base is None else base["accuracy"] - row["accuracy"],
            "deviation": row.get("deviation"), "relative_deviation":
                row.get("relative_deviation"), "consensus": row["consensus"],
            "psnr_logreg": strongest(psnr, "logreg", row["refresh"], gamma),
            "psnr_lenet": strongest(psnr, "lenet", row["refresh"], gamma),
            "epsilon": run_epsilon(run["settings"]),
        })
    return out


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"


def frontier_table(frontier: Sequence[dict[str, Any]]) -> str:
    """The frontier as a Markdown table."""
    return format_table(frontier, [
        Column("series", "series"), Column("refresh", "refresh"), Column("clip", "clip", "g"),
        Column("gamma", "gamma", lambda g: f"{g:g}"), Column("accuracy", "test acc", ".4f"),
        Column("accuracy_loss", "acc. lost", lambda v: f"{100 * v:.1f} pt"),
        Column("deviation", "‖x_bar − x*‖", ".3g"),
        Column("relative_deviation", "relative", ".3g"),
        Column("consensus", "consensus", ".2g"),
        Column("psnr_logreg", "PSNR logreg (max)", ".1f"),
        Column("psnr_lenet", "PSNR LeNet (max)", ".1f"),
        Column("epsilon", f"ε (δ={DELTA:g})", _number),
    ])


_COLOURS = {"never": "tab:red", "every:1": "tab:blue", "every:10": "tab:green",
            "every:100": "tab:purple"}


def plot_frontier(frontier: Sequence[dict[str, Any]], *, reference: dict[str, Any] | None,
                  series: Sequence[str], title: str, path: Path) -> Path:
    """Three panels vs gamma, one line per (series, refresh) of `series` (clipped series
    dashed): test accuracy (the noise-free run and 1 point below it in grey), ||x_bar - x*||,
    and the strongest attacker's PSNR on the logistic regression (solid) and LeNet (dotted),
    15 dB dashed."""
    fig, axes = new_figure(3, 1, size=(4.2, 3.4))
    chosen = [r for r in frontier if r["series"] in series]
    for name, refresh, clip in dict.fromkeys((r["series"], r["refresh"], r["clip"])
                                             for r in chosen):
        points = sorted((r for r in chosen if (r["series"], r["refresh"]) == (name, refresh)),
                        key=lambda r: r["gamma"])
        colour = _COLOURS.get(refresh, "0.3")
        style = "--" if clip else "-"
        g = [r["gamma"] for r in points]
        label = f"refresh {refresh}" + (f", clip {clip:g}" if clip else "")
        axes[0][0].plot(g, [r["accuracy"] for r in points], marker="o", color=colour,
                        linestyle=style, label=label)
        axes[0][1].plot(g, [r["deviation"] for r in points], marker="o", color=colour,
                        linestyle=style)
        if clip:
            continue  # the attack runs did not clip
        for key, line in (("psnr_logreg", "-"), ("psnr_lenet", ":")):
            measured = [(r["gamma"], r[key]) for r in points if r[key] is not None]
            if measured:
                xs, ys = zip(*measured, strict=True)
                axes[0][2].plot(xs, ys, marker="o", linestyle=line, color=colour)
    if reference is not None:
        axes[0][0].axhline(reference["accuracy"], color="0.3", linestyle="--",
                           label="noise-free")
        axes[0][0].axhline(reference["accuracy"] - 0.01, color="0.6", linestyle=":",
                           label="noise-free - 1 pt")
        if reference.get("deviation") is not None:
            axes[0][1].axhline(reference["deviation"], color="0.3", linestyle="--")
    axes[0][2].axhline(PSNR_LIMIT, color="0.3", linestyle="--", label="15 dB")
    axes[0][2].set_title("logreg solid, LeNet dotted", fontsize=8)
    labels = ("test accuracy", r"$\|\bar{x} - x^*\|$", "strongest attacker's PSNR (dB)")
    for ax, label in zip(axes[0], labels, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel(r"noise level $\gamma$")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0][1].set_yscale("log")
    axes[0][0].legend(fontsize=7, loc="lower left")
    axes[0][2].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def frontier_report(rows: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]],
                    series: Sequence[dict[str, Any]], *, attack_results: Sequence[str | Path],
                    title: str, path: Path) -> tuple[list[dict[str, Any]], str, Path | None]:
    """(records, table text, figure) of the frontier of a sweep whose `series` (as
    dataclasses.asdict(Series), main first) include refreshed ones; ([], "", None) if none."""
    refreshed = [s for s in series if s["selection"] == "all"]
    if not refreshed:
        return [], "", None
    reference = next((r for r in rows if r["series"] == series[0]["name"]
                      and r["mode"] == "none"), None)
    frontier = frontier_rows(rows, runs, reference=reference,
                             series=[s["name"] for s in refreshed],
                             psnr=attack_psnr(attack_results))
    table = "Refreshed masks, every parameter perturbed:\n\n" + frontier_table(frontier)
    figure = plot_frontier(frontier, reference=reference, title=title, path=path,
                           series=[s["name"] for s in refreshed if s["algorithm"] == "dsgd"])
    return frontier, table, figure


def load_results(folder: str | Path) -> dict[str, Any]:
    """An experiment's results.json (non-finite numbers restored)."""
    file = Path(folder) / "results.json"
    if not file.is_file():
        raise ValueError(f"expected an experiment's results in {folder}, found no results.json")
    return read_json(file)
