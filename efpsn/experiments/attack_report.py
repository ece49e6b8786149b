"""What the attack experiment makes of its records: attacker names, summaries, tables, figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from efpsn.experiments.common import Column, format_table, new_figure, save_figure
from efpsn.experiments.idlg import PERTURBATIONS
from efpsn.params.refresh_setting import Refresh

__all__ = [
    "ADAPTIVE",
    "AVERAGING",
    "PLAIN",
    "THREE_ROUNDS",
    "TWO_ROUNDS",
    "attack_table",
    "gamma_independent",
    "grid_row_name",
    "plot_grid",
    "plot_psnr",
    "plot_refreshed_psnr",
    "summarise",
]

PLAIN = "iDLG"
ADAPTIVE = "iDLG, perturbed coords dropped"
TWO_ROUNDS = "iDLG, 2 rounds differenced"
THREE_ROUNDS = "iDLG, 3 rounds combined"
AVERAGING = "iDLG on the mean of many rounds"
SHORT = {PLAIN: "", ADAPTIVE: "adaptive, ", TWO_ROUNDS: "2 rounds, ", THREE_ROUNDS: "3 rounds, ",
         AVERAGING: "mean, "}


def plot_grid(truth: torch.Tensor, grids: dict[str, dict[int, torch.Tensor]],
              psnr: dict[str, float], title: str, path: Path) -> Path:
    """One row per attack (its label and PSNR on the left), columns: truth, then snapshots."""
    names = list(grids)
    points = sorted(next(iter(grids.values())))
    fig, axes = new_figure(len(points) + 1, len(names), size=(1.05, 1.15))
    for r, name in enumerate(names):
        cells = [("truth", truth), *((f"it {p}", grids[name][p]) for p in points)]
        for c, (label, image) in enumerate(cells):
            ax = axes[r][c]
            ax.imshow(image.reshape(28, 28).clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(label, fontsize=7)
        axes[r][0].set_ylabel(f"{name}\n{psnr[name]:.1f} dB", fontsize=7)
    fig.suptitle(title, fontsize=8)
    return save_figure(fig, path, dpi=80)


def grid_row_name(attacker: str, gamma: float, refresh: str = "never") -> str:
    prefix = "" if refresh == "never" else f"{refresh}, "
    return prefix + SHORT[attacker] + ("no noise" if gamma == 0 else f"$\\gamma$={gamma:g}")


def gamma_independent(perturbation: str, attacker: str, refresh: str = "never") -> bool:
    """Whether the attacker removes this perturbation exactly (so it runs at one gamma only):
    the adaptive attacker always; against the fixed mask, 3 rounds always and 2 rounds unless
    K = 2; against a refreshed K = 1 mask, 2 or 3 rounds inside one period (R >= 3)."""
    if attacker == ADAPTIVE:
        return True
    if refresh != "never":
        every = Refresh.parse(refresh).every or 1  # a fading mask changes every round
        return attacker in (TWO_ROUNDS, THREE_ROUNDS) and every >= 3 and perturbation == "all-k1"
    if attacker == THREE_ROUNDS:
        return True
    return attacker == TWO_ROUNDS and perturbation != "all-k2"


_PERTURBATION_STYLE = {"last-bias": "tab:blue", "all-k1": "tab:green", "all-k2": "tab:red"}
_ATTACKER_STYLE = {PLAIN: ("-", "o"), TWO_ROUNDS: ("--", "s"), THREE_ROUNDS: ("-.", "^"),
                   AVERAGING: (":", "D")}


def _series(ax: Any, series: list[dict[str, Any]], *, color: str, attacker: str, label: str,
            flat: bool) -> None:
    """One attacker's PSNR vs gamma on `ax` (a horizontal line when it cannot depend on gamma)."""
    if flat:
        ax.axhline(series[0]["psnr_mean"], color=color, alpha=0.7, label=label + " (any gamma)",
                   linestyle=":" if attacker == ADAPTIVE else "-.")
        return
    linestyle, marker = _ATTACKER_STYLE.get(attacker, ("-", "^"))
    ax.errorbar([max(r["gamma"], 1e0) for r in series],  # gamma 0 drawn at 1
                [r["psnr_mean"] for r in series], yerr=[r["psnr_std"] for r in series],
                color=color, marker=marker, linestyle=linestyle, capsize=3, label=label)


def _finish_axes(ax: Any, title: str, top: float) -> None:
    ax.set_ylim(bottom=0.0, top=top)
    ax.set_xscale("log")
    ax.set_xlabel(r"noise level $\gamma$ (no noise drawn at $\gamma$=1)")
    ax.set_ylabel("PSNR of the reconstruction (dB)")
    ax.set_title(title, fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=5.5, loc="best")


def plot_psnr(summary: list[dict[str, Any]], path: Path) -> Path:
    """Fixed masks: PSNR vs gamma, one panel per (model, x_1 round); colour = perturbation,
    style = attacker; attackers that cannot depend on gamma are horizontal lines."""
    fixed = [r for r in summary if r["refresh"] == "never"]
    panels = sorted({(r["model"], r["attack_round"]) for r in fixed},
                    key=lambda mr: (mr[0] != "logreg", -mr[1]))
    fig, axes = new_figure(len(panels), 1, size=(4.6, 3.6))
    top = max(r["psnr_mean"] for r in fixed) * 1.08 + 2.0
    for ax, (model, rnd) in zip(axes[0], panels, strict=True):
        rows = [r for r in fixed if r["model"] == model and r["attack_round"] == rnd]
        clean = [r for r in rows if r["gamma"] == 0 and r["attacker"] == PLAIN]
        for name in PERTURBATIONS:
            mine = [r for r in rows if r["perturbation"] == name]
            for attacker in sorted({r["attacker"] for r in mine}):
                series = sorted((r for r in mine if r["attacker"] == attacker),
                                key=lambda r: r["gamma"])
                if attacker == PLAIN and name != "last-bias":
                    series = clean + series  # gamma 0 is the same run for every setting
                _series(ax, series, color=_PERTURBATION_STYLE[name], attacker=attacker,
                        label=f"{name}: {attacker}", flat=gamma_independent(name, attacker))
        _finish_axes(ax, f"{model}, x_1 at round {rnd}", top)
    fig.suptitle("iDLG on agent 1: plain, adaptive and multi-round attackers", fontsize=9)
    return save_figure(fig, path)


def plot_refreshed_psnr(summary: list[dict[str, Any]], path: Path) -> Path:
    """Refreshed masks: PSNR vs gamma, one panel per model; colour = refresh period, style =
    attacker (the fixed mask's rows of the same perturbation drawn in grey)."""
    refreshed = [r for r in summary if r["refresh"] != "never"]
    models = sorted({r["model"] for r in refreshed}, key=lambda m: m != "logreg")
    fig, axes = new_figure(len(models), 1, size=(4.6, 3.6))
    top = max(r["psnr_mean"] for r in summary) * 1.08 + 2.0
    refreshes = sorted({r["refresh"] for r in refreshed},
                       key=lambda t: (not Refresh.parse(t).fading, Refresh.parse(t).every or 1))
    colours = dict(zip(refreshes, ("tab:green", "tab:orange", "tab:purple", "tab:brown",
                                   "tab:pink"), strict=False))
    for ax, model in zip(axes[0], models, strict=True):
        perturbation = next(r["perturbation"] for r in refreshed if r["model"] == model)
        rows = [r for r in summary if r["model"] == model and r["perturbation"] == perturbation
                and r["attack_round"] in {q["attack_round"] for q in refreshed}]
        for refresh in ["never", *refreshes]:
            mine = [r for r in rows if r["refresh"] == refresh]
            for attacker in sorted({r["attacker"] for r in mine}):
                series = sorted((r for r in mine if r["attacker"] == attacker),
                                key=lambda r: r["gamma"])
                _series(ax, series, color=colours.get(refresh, "tab:gray"), attacker=attacker,
                        label=f"{refresh}: {attacker}",
                        flat=gamma_independent(perturbation, attacker, refresh))
        ax.axhline(15.0, color="black", linewidth=0.8, alpha=0.5)
        _finish_axes(ax, f"{model}, {PERTURBATIONS[perturbation]}; line: 15 dB", top)
    fig.suptitle("iDLG on agent 1 against masks refreshed every R rounds", fontsize=9)
    return save_figure(fig, path)


FIELDS = ("model", "attack_round", "perturbation", "refresh", "attacker", "rounds_seen", "gamma")


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread of PSNR, MSE, label accuracy and time per (FIELDS) setting."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[f] for f in FIELDS), []).append(r)
    out = []
    for key, chosen in groups.items():
        psnr = np.array([r["psnr"] for r in chosen])
        mse = np.array([r["mse"] for r in chosen])
        out.append({
            **dict(zip(FIELDS, key, strict=True)),
            "samples": len(chosen), "psnr_mean": float(psnr.mean()), "psnr_std": float(psnr.std()),
            "psnr_min": float(psnr.min()), "psnr_max": float(psnr.max()),
            "mse_mean": float(mse.mean()), "mse_std": float(mse.std()),
            "label_accuracy": float(np.mean([r["label_ok"] for r in chosen])),
            "seconds_mean": float(np.mean([r["seconds"] for r in chosen])),
        })
    return out


def attack_table(summary: list[dict[str, Any]]) -> str:
    return format_table(summary, [
        Column("model", "model"), Column("attack_round", "x_1 round"),
        Column("perturbation", "perturbation"), Column("refresh", "refresh"),
        Column("attacker", "attacker"), Column("rounds_seen", "rounds"),
        Column("gamma", "gamma", lambda g: f"{g:g}"), Column("samples", "n"),
        Column("psnr_mean", "PSNR mean (dB)", ".1f"), Column("psnr_std", "std", ".1f"),
        Column("psnr_max", "max", ".1f"), Column("mse_mean", "MSE mean", ".3g"),
        Column("label_accuracy", "label ok", ".2f"),
    ])
