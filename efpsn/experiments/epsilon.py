"""Theorem 4.1 in numbers: epsilon vs gamma on several topologies, and gamma for a target."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from efpsn.experiments.common import (
    Column,
    finish,
    format_table,
    new_figure,
    output_dir,
    save_figure,
    stopwatch,
    write_csv,
)
from efpsn.privacy.theorem import account, calibrate
from efpsn.topology import build_graph, describe, laplacian_spectrum

NAME = "privacy"
TOPOLOGIES = ("ring", "complete", "grid", "erdos-renyi", "star", "path")


@dataclass(frozen=True, kw_only=True)
class PrivacySettings:
    """Accountant inputs. sensitivity = ||f_I - f_I'||_{V_q}, the adjacency bound (1 here)."""

    profile: str = "full"
    agents: tuple[int, ...] = (5, 9)
    topologies: tuple[str, ...] = TOPOLOGIES
    delta: float = 1e-5
    p: float = 1.0
    q: float = 2.0
    sensitivity: float = 1.0
    seed: int = 0  # erdos-renyi draw
    gammas: tuple[float, ...] = tuple(float(g) for g in np.logspace(-2, 8, 41))
    table_gammas: tuple[float, ...] = (1e-2, 1e0, 1e2, 1e3, 1e4, 1e6)
    target_epsilons: tuple[float, ...] = (0.1, 1.0)


PROFILES: dict[str, PrivacySettings] = {
    "full": PrivacySettings(),
    "quick": PrivacySettings(profile="quick"),  # pure arithmetic: already instant
}


def _plot(curves: dict[tuple[int, str], list[float]], labels: dict[tuple[int, str], str],
          settings: PrivacySettings, path: Path) -> Path:
    fig, axes = new_figure(len(settings.agents), 1, size=(4.6, 3.6))
    for ax, n in zip(axes[0], settings.agents, strict=True):
        for topology in settings.topologies:
            eps = curves.get((n, topology))
            if eps is not None:
                ax.loglog(settings.gammas, eps, label=labels[(n, topology)],
                          linewidth=2.2 if topology == "ring" else 1.2)
        for target in settings.target_epsilons:
            ax.axhline(target, color="0.5", linestyle=":", linewidth=0.8)
        ax.set_xlabel(r"noise level $\gamma$")
        ax.set_ylabel(r"$\epsilon$ (Theorem 4.1)")
        ax.set_title(f"n = {n} agents, $\\delta$ = {settings.delta:g}, p = {settings.p:g}, "
                     f"q = {settings.q:g}", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def run(settings: PrivacySettings, *, out: str | Path | None = None,
        figures_to: str | Path | None = None) -> dict[str, Any]:
    """Evaluate the accountant on every (n, topology, gamma); write tables and the plot."""
    folder = output_dir(out, NAME)
    common = {"p": settings.p, "q": settings.q, "sensitivity": settings.sensitivity}
    with stopwatch() as elapsed:
        rows: list[dict[str, Any]] = []
        curve_rows: list[dict[str, Any]] = []
        curves: dict[tuple[int, str], list[float]] = {}
        labels: dict[tuple[int, str], str] = {}
        for n in settings.agents:
            for topology in settings.topologies:
                graph = build_graph(topology, n, seed=settings.seed)
                mu2, mu_max = laplacian_spectrum(graph)
                eps = [account(graph, gamma=g, delta=settings.delta, **common).epsilon
                       for g in settings.gammas]
                curves[(n, topology)] = eps
                labels[(n, topology)] = graph.name or topology
                curve_rows += [{"agents": n, "topology": topology, "gamma": g, "epsilon": e}
                               for g, e in zip(settings.gammas, eps, strict=True)]
                row: dict[str, Any] = {
                    "agents": n, "topology": topology, "graph": describe(graph),
                    "mu2": mu2, "mu_max": mu_max,
                }
                for g in settings.table_gammas:
                    row[f"eps@{g:g}"] = account(graph, gamma=g, delta=settings.delta,
                                                **common).epsilon
                for target in settings.target_epsilons:
                    row[f"gamma_for_eps={target:g}"] = calibrate(
                        graph, target_epsilon=target, delta=settings.delta, **common)
                rows.append(row)
        figures = [_plot(curves, labels, settings, folder / "privacy.png")]
        write_csv(folder / "curves.csv", curve_rows)
        columns = [Column("agents", "n"), Column("topology", "topology"),
                   Column("mu2", "mu_2", ".3f"), Column("mu_max", "mu_max", ".3f")]
        columns += [Column(f"eps@{g:g}", f"eps @ gamma={g:g}", ".3g")
                    for g in settings.table_gammas]
        columns += [Column(f"gamma_for_eps={t:g}", f"gamma for eps={t:g}", ".4g")
                    for t in settings.target_epsilons]
        table = format_table(rows, columns)
        payload = {"settings": dataclasses.asdict(settings)}
        wall = elapsed()
    return finish(folder, NAME, payload=payload, rows=rows, table=table, figures=figures,
                  wall_seconds=wall, figures_to=figures_to)
