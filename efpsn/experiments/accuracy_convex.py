"""Sec. 5.2.1: MNIST logistic regression, deviation ||x_bar - x*|| and test accuracy vs gamma."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from efpsn.experiments.common import (
    PAPER_GAMMAS,
    finish,
    format_table,
    log,
    new_figure,
    output_dir,
    save_figure,
    stopwatch,
)
from efpsn.experiments.frontier import (
    REFRESH_GAMMAS,
    REFRESHES,
    frontier_report,
    load_results,
    refreshed_series,
)
from efpsn.experiments.sweep import Series, load_problem, plot_sweep, run_series, sweep_columns
from efpsn.params.config import RunConfig
from efpsn.tasks.catalog import make_task
from efpsn.tasks.optimum import centralized_optimum

NAME = "accuracy-convex"
EXTRA_GAMMAS: tuple[float, ...] = (1e0, 1e2, 1e3, 1e4, 1e5, 1e6)
# Full-batch GT on this problem: 0.5 oscillates, 0.2 still shows a slowly decaying disagreement
# (consensus 0.2 after 300 noise-free rounds), 0.1 is safely stable.
GT_LR = 0.1


@dataclass(frozen=True, kw_only=True)
class ConvexSettings:
    """What to run. `main` is the paper's figure; `extras` the two additional rows:

    - gradient tracking (constant step GT_LR, full batch): its fixed point is exactly x* for the
      zero-sum masks, so its error cannot grow with gamma;
    - full-batch DSGD with the paper's schedule, extended to gamma = 1e6: no sampling noise, so
      what remains is the perturbation's own effect through the agents' disagreement.

    `refreshes` (none: no such rows) add the refreshed rows (efpsn/experiments/frontier.py):
    every parameter perturbed, each refresh setting at `refresh_gammas`, for main's DSGD, for
    full-batch GT over `gt_iterations` (None: none) and, per clip C in `clips`, for DSGD with
    every:1 and per-sample gradients clipped to C, at `clip_gammas`. `attack_results` (the
    attack experiment's results.json files or folders) give the frontier's PSNR column.
    """

    profile: str
    main: Series
    extras: tuple[Series, ...] = ()
    refreshes: tuple[str, ...] = ()
    refresh_gammas: tuple[float, ...] = REFRESH_GAMMAS
    gt_iterations: int | None = None
    clips: tuple[float, ...] = ()
    clip_gammas: tuple[float, ...] = (1e4, 1e5, 1e6)
    attack_results: tuple[str, ...] = ()
    noise_seed: int = 0
    base: RunConfig = field(
        default_factory=lambda: RunConfig.preset("paper", task="logreg", topology="ring"))

    def refreshed(self) -> tuple[Series, ...]:
        return refreshed_series(self.main, refreshes=self.refreshes, gammas=self.refresh_gammas,
                                gt_iterations=self.gt_iterations, gt_lr=GT_LR, clips=self.clips,
                                clip_gammas=self.clip_gammas)

    def series(self) -> tuple[Series, ...]:
        return (self.main, *self.extras, *self.refreshed())


def _extras(iterations: int, gammas: tuple[float, ...], eval_every: int) -> tuple[Series, ...]:
    return (
        Series(name="gt-full", label=f"GT, constant step {GT_LR}, full batch",
               algorithm="gt", batch_size=0, schedule=f"constant:{GT_LR}",
               iterations=iterations, gammas=gammas, modes=("zero-sum",), eval_every=eval_every),
        Series(name="dsgd-full", label="DSGD, paper schedule, full batch",
               algorithm="dsgd", batch_size=0, schedule="paper", iterations=iterations,
               gammas=gammas, modes=("zero-sum",), eval_every=eval_every),
    )


PROFILES: dict[str, ConvexSettings] = {
    # The paper: batch 64, lr 0.2 for 2,000 steps then down to 4e-5 at step 10,000.
    "full": ConvexSettings(
        profile="full",
        main=Series(name="dsgd-b64", label="DSGD, batch 64, paper schedule",
                    iterations=10_000, gammas=PAPER_GAMMAS, eval_every=250),
        extras=_extras(1000, EXTRA_GAMMAS, 100),
        refreshes=REFRESHES, gt_iterations=1000, clips=(1.0, 10.0),
    ),
    "quick": ConvexSettings(
        profile="quick",
        main=Series(name="dsgd-b64", label="DSGD, batch 64, paper schedule (800 steps)",
                    iterations=800, gammas=(1e-2, 1e0, 1e2, 1e3, 1e4), eval_every=100),
        extras=_extras(200, (1e3, 1e6), 50),
        refreshes=("never", "every:1"), refresh_gammas=(1e4,), gt_iterations=200,
    ),
}


def settings_for(profile: str, *, iterations: int | None = None,
                 gammas: tuple[float, ...] | None = None, extras: bool = True,
                 noise_seed: int | None = None,
                 selection: str | None = None, **refreshed: Any) -> ConvexSettings:
    """A profile with optional overrides of the main series (an intermediate profile).

    `selection="all"` perturbs every parameter (m = 7,850, N = 7,851: every affine function, in
    the uniform-measure basis) instead of the paper's last-layer bias. `refreshed`: overrides
    of refreshes, refresh_gammas, clips, clip_gammas and attack_results (None values ignored).
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: expected one of {sorted(PROFILES)}")
    s = PROFILES[profile]
    main = s.main
    if iterations is not None:
        main = dataclasses.replace(main, iterations=iterations,
                                   label=f"DSGD, batch 64, paper schedule ({iterations} steps)")
    if gammas is not None:
        main = dataclasses.replace(main, gammas=gammas)
    base = s.base
    if selection is not None:
        if selection.split("@")[0].strip() != "all":
            raise ValueError(f"selection override: expected 'all' (or 'all@MEASURE'), got "
                             f"{selection!r}")
        d = make_task(base.task).num_params
        base = base.replace(selection=selection, K=1, m=d, N=d + 1)
    changes = {k: v for k, v in refreshed.items() if v is not None}
    unknown = sorted(set(changes) - {"refreshes", "refresh_gammas", "clips", "clip_gammas",
                                    "attack_results"})
    if unknown:
        raise ValueError(f"unknown overrides {unknown}")
    modified = (iterations is not None or gammas is not None or selection is not None
                or bool(set(changes) - {"attack_results"}))
    return dataclasses.replace(
        s, main=main, extras=s.extras if extras else (), base=base, **changes,
        noise_seed=s.noise_seed if noise_seed is None else noise_seed,
        profile=f"{profile} (modified)" if modified else profile,
    )


def network_config(settings: ConvexSettings, *, gamma: float = 1e3) -> RunConfig:
    """The main series' zero-sum run at `gamma`, as a RunConfig for a networked check."""
    m = settings.main
    return settings.base.replace(
        algorithm=m.algorithm, batch_size=m.batch_size, schedule=m.schedule,
        iterations=m.iterations, eval_every=min(m.eval_every, m.iterations), mask="zero-sum",
        gamma=gamma,
    )


def _plot_extras(rows: list[dict[str, Any]], extras: tuple[Series, ...], path: Path) -> Path:
    fig, axes = new_figure(2, 1, size=(4.6, 3.5))
    colours = ("tab:green", "tab:purple", "tab:red")
    for s, colour in zip(extras, colours, strict=False):
        chosen = [r for r in rows if r["series"] == s.name]
        points = sorted((r["gamma"], r["deviation"], r["accuracy"])
                        for r in chosen if r["mode"] == "zero-sum")
        ref = [r for r in chosen if r["mode"] == "none"]
        if not points:
            continue
        g, dev, acc = zip(*points, strict=True)
        axes[0][0].plot(g, dev, marker="o", color=colour, label=f"{s.label}: zero-sum")
        axes[0][1].plot(g, acc, marker="o", color=colour, label=f"{s.label}: zero-sum")
        if ref:
            axes[0][0].axhline(ref[0]["deviation"], color=colour, linestyle="--", alpha=0.6,
                               label=f"{s.name}: noise-free")
            axes[0][1].axhline(ref[0]["accuracy"], color=colour, linestyle="--", alpha=0.6)
    for ax, label in ((axes[0][0], r"$\|\bar{x} - x^*\|$"), (axes[0][1], "test accuracy")):
        ax.set_xscale("log")
        ax.set_xlabel(r"noise level $\gamma$")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_yscale("log")
    axes[0][1].set_ylim(0.0, 1.0)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Logistic regression, EFPSN without sampling noise (extra rows)", fontsize=10)
    return save_figure(fig, path)


def _frontier(rows: list[dict[str, Any]], runs: list[dict[str, Any]],
              series: list[dict[str, Any]], attack_results: Any, folder: Path
              ) -> tuple[list[dict[str, Any]], str, Path | None]:
    return frontier_report(rows, runs, series, attack_results=attack_results,
                           title=f"Logistic regression, {series[0]['label']}, every parameter "
                                 "perturbed: fixed vs refreshed masks",
                           path=folder / "accuracy_convex_frontier.png")


def _table(rows: list[dict[str, Any]], frontier_text: str) -> str:
    table = format_table(rows, sweep_columns("deviation", "‖x_bar − x*‖"))
    return table + ("\n\n" + frontier_text if frontier_text else "")


def redraw_frontier(out: str | Path, *, attack_results: tuple[str, ...],
                    figures_to: str | Path | None = None) -> dict[str, Any]:
    """Recompute the frontier (table, figure, results.json) of the sweep in `out` with these
    attack results, without running anything again."""
    folder = Path(out)
    doc = load_results(folder)
    if doc.get("experiment") != NAME:
        raise ValueError(f"{folder}: expected results of {NAME}, got {doc.get('experiment')!r}")
    frontier, text, figure = _frontier(doc["rows"], doc["runs"], doc["series"], attack_results,
                                       folder)
    if figure is None:
        raise ValueError(f"{folder}: the sweep has no refreshed rows (run it with --refreshes)")
    figures = [Path(f) for f in doc["files"] if f.endswith(".png") and Path(f) != figure]
    payload = {k: v for k, v in doc.items()
               if k not in ("experiment", "out", "wall_seconds", "files", "rows")}
    payload.update(frontier=frontier, attack_results=list(attack_results))
    return finish(folder, NAME, payload=payload, rows=doc["rows"],
                  table=_table(doc["rows"], text), figures=[*figures, figure],
                  wall_seconds=doc["wall_seconds"], figures_to=figures_to)


def run(settings: ConvexSettings, *, out: str | Path | None = None,
        figures_to: str | Path | None = None) -> dict[str, Any]:
    """Run the sweep, write rows.csv, results.json, table.md and the figures into `out`."""
    folder = output_dir(out, NAME)
    with stopwatch() as elapsed:
        base = settings.base
        rounds = sum(s.rounds() for s in settings.series())
        log(f"{NAME} ({settings.profile}): {base.agents} agents on a {base.topology}, "
            f"{base.task}, data {base.data}; {rounds} simulated rounds in total")
        problem = load_problem(base)
        with stopwatch() as t_opt:
            optimum = centralized_optimum(problem.task, problem.shards)
        log(f"x* by centralized L-BFGS + Newton: ||grad F(x*)|| = {optimum.grad_norm:.2g}, "
            f"||x*|| = {float(optimum.x.norm()):.4g} ({t_opt():.0f}s)")
        rows, runs = run_series(problem, settings.series(), noise_seed=settings.noise_seed,
                                x_star=optimum.x)
        figures = [plot_sweep(
            rows, series=settings.main.name, metric="deviation",
            metric_label=r"$\|\bar{x} - x^*\|$",
            title=f"Logistic regression, {base.agents}-agent {base.topology}: "
                  f"{settings.main.label}",
            path=folder / "accuracy_convex.png",
        )]
        if settings.extras:
            figures.append(
                _plot_extras(rows, settings.extras, folder / "accuracy_convex_extras.png"))
        series = [dataclasses.asdict(s) for s in settings.series()]
        frontier, text, figure = _frontier(rows, runs, series, settings.attack_results, folder)
        figures += [figure] if figure is not None else []
        payload = {
            "profile": settings.profile,
            "protocol": "fast (the integers of the Paillier phase I, computed without encryption)",
            "noise_seed": settings.noise_seed,
            "base_config": base.to_dict(),
            "series": series,
            "attack_results": list(settings.attack_results),
            "data": {"spec": base.data, "train": sum(len(s) for s in problem.shards),
                     "test": len(problem.test)},
            "x_star": {"grad_norm": optimum.grad_norm, "norm": float(optimum.x.norm()),
                       "loss": optimum.loss, "seconds": optimum.seconds},
            "frontier": frontier,
            "runs": runs,
        }
        wall = elapsed()
    return finish(folder, NAME, payload=payload, rows=rows, table=_table(rows, text),
                  figures=figures, wall_seconds=wall, figures_to=figures_to)
