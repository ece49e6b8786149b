"""The gamma sweep behind both accuracy figures: one Problem, many (mode, gamma) simulations."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from efpsn.data.images import Dataset, load_data
from efpsn.experiments.common import PAPER_GAMMAS, Column, log, new_figure, save_figure
from efpsn.params.config import RunConfig, structural_fields
from efpsn.params.model_sizes import parameter_count
from efpsn.params.schema import parse_shape
from efpsn.problem import Problem, build_problem
from efpsn.simulator import run_simulation

__all__ = [
    "STRUCTURAL_FIELDS",
    "Problems",
    "Series",
    "every_parameter",
    "load_problem",
    "plot_sweep",
    "run_series",
    "sweep_columns",
    "with_config",
]

# The RunConfig fields build_problem derives the graph, task, basis, selection and data shards
# from (declared structural in efpsn/params/config.py). A sweep may vary every other field (gamma,
# mask, algorithm, batch, schedule, iterations) on one Problem; changing one of these needs a new
# one.
STRUCTURAL_FIELDS = structural_fields()


@dataclass(frozen=True, kw_only=True)
class Series:
    """One algorithm setting of an accuracy figure, swept over gamma for some mask modes.

    `reference` adds one noise-free run (mask "none"), drawn as a horizontal line: without
    noise, gamma does not enter the run at all (nor the selection, nor the refresh).
    `selection` "all" perturbs every parameter (K = 1, N = d + 1, uniform-measure basis;
    `every_parameter`) instead of the base's selection; `refreshes` are the mask's refresh
    settings ("never": phase I's fixed mask; "every:R"); `clip` clips every sample's gradient
    (the reference too).
    """

    name: str
    label: str
    algorithm: str = "dsgd"
    batch_size: int = 64  # 0 = full batch
    schedule: str = "paper"
    iterations: int = 10_000
    gammas: tuple[float, ...] = PAPER_GAMMAS
    modes: tuple[str, ...] = ("zero-sum", "independent")
    reference: bool = True
    eval_every: int = 250
    selection: str = ""  # "": the base's
    refreshes: tuple[str, ...] = ("never",)
    clip: float = 0.0

    def configs(self, base: RunConfig) -> list[RunConfig]:
        """The runs of this series: the reference first, then modes x refreshes x gammas."""
        if self.selection not in ("", "all"):
            raise ValueError(f"series {self.name}: selection must be '' (the base's) or 'all', "
                             f"got {self.selection!r}")
        common = (every_parameter(base) if self.selection == "all" else base).replace(
            algorithm=self.algorithm, batch_size=self.batch_size, schedule=self.schedule,
            iterations=self.iterations, eval_every=min(self.eval_every, self.iterations),
            clip=self.clip, refresh="never",
        )
        runs = [common.replace(mask="none", gamma=1.0)] if self.reference else []
        runs += [common.replace(mask=mode, gamma=g, refresh=r)
                 for mode in self.modes for r in self.refreshes for g in self.gammas]
        return runs

    def rounds(self) -> int:
        runs = len(self.modes) * len(self.refreshes) * len(self.gammas) + int(self.reference)
        return self.iterations * runs


def every_parameter(base: RunConfig) -> RunConfig:
    """`base` with every parameter perturbed: selection "all", K = 1, m = d, N = d + 1 (every
    affine function, in the uniform-measure basis), as `efpsn simulate --selection all`."""
    d = parameter_count(base.task, shape=parse_shape(base.input_shape), classes=base.classes)
    if d is None:
        raise ValueError(f"task {base.task!r}: its parameter count is known only once built; "
                         "give --m and --N")
    return base.replace(selection="all", K=1, m=d, N=d + 1)


def load_problem(base: RunConfig) -> Problem:
    """build_problem once (the data set is read and split once for the whole sweep)."""
    data: tuple[Dataset, Dataset] = load_data(base.data, test_fraction=base.test_fraction,
                                              seed=base.seed)
    return build_problem(base, data=data)


def with_config(problem: Problem, config: RunConfig) -> Problem:
    """The same graph, task, basis and shards under another run's parameters (no data reload).

    Raises ValueError if `config` differs in a field the shared parts were built from.
    """
    changed = [f for f in STRUCTURAL_FIELDS if getattr(config, f) != getattr(problem.config, f)]
    if changed:
        raise ValueError(f"cannot reuse the problem: {changed} differ; build a new one")
    derived = dataclasses.replace(problem, config=config)
    _ = derived.layout  # refuse what build_problem would refuse (e.g. an overflowing packing)
    return derived


def _gamma_text(gamma: float | None) -> str:
    return "-" if gamma is None else f"{gamma:g}"


class Problems:
    """One Problem per structure (selection, basis, ...) a sweep's runs need, built once each
    on the same data; `for_config` gives it under the run's parameters (with_config)."""

    def __init__(self, problem: Problem) -> None:
        self._built = {self._structure(problem.config): problem}

    @staticmethod
    def _structure(config: RunConfig) -> tuple[Any, ...]:
        return tuple(getattr(config, f) for f in STRUCTURAL_FIELDS)

    def for_config(self, config: RunConfig) -> Problem:
        key = self._structure(config)
        if key not in self._built:
            self._built[key] = load_problem(config)
        return with_config(self._built[key], config)


def run_series(
    problem: Problem,
    series: Sequence[Series],
    *,
    noise_seed: int,
    x_star: torch.Tensor | None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run every configuration of every series with the "fast" phase I.

    "fast" computes exactly the integers the Paillier protocol produces from the same noise seed
    (tests/test_network.py checks it bitwise against real gRPC agents). A series with another
    selection than `problem`'s gets its own problem (same data and split; x* does not depend on
    the perturbation). Returns (rows, runs): one row of final metrics per run, and the runs'
    histories for the JSON file.
    """
    plan = [(s, c) for s in series for c in s.configs(problem.config)]
    problems = Problems(problem)
    spent: dict[str, tuple[int, float]] = {}  # series -> (rounds done, seconds)
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for index, (s, config) in enumerate(plan, start=1):
        derived = problems.for_config(config)
        result = run_simulation(config, protocol="fast", noise_seed=noise_seed, problem=derived,
                                x_star=x_star)
        gamma = None if config.mask == "none" else config.gamma
        eta = np.array([m.values() for m in result.masks])
        row: dict[str, Any] = {
            "series": s.name,
            "algorithm": config.algorithm,
            "batch_size": config.batch.size or "full",
            "schedule": str(config.schedule),
            "iterations": config.iterations.total,
            "selection": str(config.selection),
            "N": derived.N,
            "mode": config.mask,
            "refresh": str(config.refresh),
            "clip": config.clip,
            "gamma": gamma,
            **{k: v for k, v in result.final.items() if k != "round"},
            "max_abs_eta": float(np.abs(eta).max()),
            "masks_sum_to_zero": result.masks_sum_to_zero(),
            "periods_checked": result.periods_zero_sum,
            "seconds": result.timings["phase1_seconds"] + result.timings["phase2_seconds"],
            "seconds_per_round": result.timings["seconds_per_round"],
        }
        rows.append(row)
        runs.append({"row": row, "settings": config.to_dict(), "history": result.history})
        done, seconds = spent.get(s.name, (0, 0.0))
        spent[s.name] = (done + config.iterations.total, seconds + row["seconds"])
        left = sum(c.iterations.total for t, c in plan[index:] if t.name == s.name)
        eta = spent[s.name][1] / spent[s.name][0] * left
        extra = f", dev {row['deviation']:.3g}" if "deviation" in row else ""
        refresh = "" if not config.refresh.refreshed else f" {config.refresh}"
        log(f"[{index}/{len(plan)}] {s.name} {config.mask}{refresh} gamma {_gamma_text(gamma)}: "
            f"acc {row['accuracy']:.4f}, ||avg grad||^2 {row['grad_norm2']:.3g}{extra} "
            f"({row['seconds']:.0f}s; about {eta / 60:.1f} min left in {s.name})")
        if on_row is not None:
            on_row(row)
    return rows, runs


def sweep_columns(metric: str, header: str) -> list[Column]:
    """Columns of the printed sweep table."""
    return [
        Column("series", "series"),
        Column("mode", "mask"),
        Column("refresh", "refresh"),
        Column("gamma", "gamma", lambda g: f"{g:g}"),
        Column(metric, header, ".3g"),
        Column("accuracy", "test acc", ".4f"),
        Column("consensus", "consensus", ".2g"),
        Column("seconds_per_round", "s/round", ".4f"),
    ]


_STYLE = {
    "zero-sum": {"color": "tab:blue", "marker": "o", "label": "EFPSN (zero-sum)"},
    "independent": {"color": "tab:orange", "marker": "s", "label": "non-zero-sum baseline"},
}


def plot_sweep(
    rows: Sequence[dict[str, Any]],
    *,
    series: str,
    metric: str,
    metric_label: str,
    title: str,
    path: Any,
) -> Any:
    """Two panels vs gamma (log x): `metric` (log y) and test accuracy; one line per mask mode."""
    fig, axes = new_figure(2, 1, size=(4.6, 3.5))
    chosen = [r for r in rows if r["series"] == series]
    reference = [r for r in chosen if r["mode"] == "none"]
    for ax, key, label, logy in ((axes[0][0], metric, metric_label, True),
                                 (axes[0][1], "accuracy", "test accuracy", False)):
        for mode, style in _STYLE.items():
            points = sorted((r["gamma"], r[key]) for r in chosen if r["mode"] == mode)
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, **style)
        if reference:
            ax.axhline(reference[0][key], color="0.4", linestyle="--", label="noise-free")
        ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(r"noise level $\gamma$")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][1].set_ylim(0.0, 1.0)
    axes[0][1].legend(fontsize=8, loc="lower left")
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)

