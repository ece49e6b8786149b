"""Sec. 5.3: the iDLG gradient-inversion attack (Zhao et al. 2020) on agent 1, vs gamma.

Threat model (the paper's): the attacker knows agent 1's iterate x_1 and agent 1's perturbed
gradient grad f_1(x_1) + grad Phi(eta_bar_1)(x_1) on one private sample, not the perturbation.
eta_bar_1 is agent 1's real mask from the zero-sum phase I at that gamma. The attacker

1. infers the label from the last layer's weight gradient (iDLG): for cross-entropy the row of
   the true class is (p_y - 1) * features with non-negative features (pixels, or sigmoid outputs),
   so it is the only row with a negative sum;
2. fits a dummy image by L-BFGS (torch.optim.LBFGS, strong-Wolfe line search) to minimise
   ||grad(dummy) - observed||^2 over all parameters.

A second, adaptive attacker drops the m perturbed coordinates (the selection is public) from the
matching loss; since Phi only moves those, its result does not depend on gamma at all.

A third, multi-round attacker uses agent 1's gradients on the same sample at R = 2 or 3 of its
iterates x^(1..R). The mask is fixed for the whole run, so Phi's gradient at x is the same
polynomial every round: with K = 1 a constant, which cancels in g^(1) - g^(2); with the power
family (K = 2, one quadratic per coordinate) it is affine in each coordinate, which cancels in the
per-coordinate combination (x_b - x_c) g_a + (x_c - x_a) g_b + (x_a - x_b) g_c of three rounds.
The attacker matches that combination of the dummy's gradients to the observed one.

Perturbations compared: the paper's (last-layer bias, (K, m, N) = (1, 10, 10), Lebesgue measure)
and every parameter with K = 1 (N = d + 1) or with the squares added (K = 2, N = 2d + 1), both in
the uniform-measure basis that `--selection all` uses.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from efpsn.config import RunConfig
from efpsn.experiments.common import (
    Column,
    finish,
    format_table,
    log,
    new_figure,
    output_dir,
    save_figure,
    stopwatch,
    write_csv,
)
from efpsn.experiments.idlg import (  # noqa: F401  (the attack's API, re-exported)
    MSE_FLOOR,
    MULTI_ROUND_INIT_SCALE,
    PERTURBATIONS,
    RESTART_ABOVE,
    agent1_perturbation,
    attack_point,
    combination_weights,
    image_errors,
    infer_label,
    infer_label_multi,
    observed_gradient,
    perturbation_problem,
    reconstruct,
    reconstruct_multi,
    sample_gradient,
)
from efpsn.experiments.sweep import load_problem

NAME = "attack"
PLAIN = "iDLG"
ADAPTIVE = "iDLG, perturbed coords dropped"
TWO_ROUNDS = "iDLG, 2 rounds differenced"
THREE_ROUNDS = "iDLG, 3 rounds combined"
@dataclass(frozen=True, kw_only=True)
class AttackSettings:
    """What to attack. gamma 0 means no perturbation (mask "none").

    `attack_rounds`: x_1 is agent 1's iterate after that many rounds of the noise-free DSGD run
    (the paper's settings), the same x_1 at every gamma so that only the perturbation differs.
    Round 0 is the initial point (zeros for logistic regression, DLG's U(-0.5, 0.5) for LeNet).
    `iterations` counts optimizer.step calls of L-BFGS with `inner_iterations` iterations each,
    like the DLG/iDLG code (whose figures show these steps, 0 to 240 in the paper).

    `perturbations` (PERTURBATIONS keys): "last-bias" runs at every attack round; the
    all-parameter settings and the multi-round attackers run at the `extended_rounds` only. The
    multi-round attacker sees x_1 after r, r + gap and r + 2 gap rounds (`multi_round_gap`). An
    attacker whose result cannot depend on gamma (adaptive; 2 rounds against K = 1; 3 rounds
    against K <= 2) runs once, at the largest gamma (the worst case for float rounding).
    """

    profile: str
    models: tuple[str, ...] = ("logreg", "lenet")
    gammas: tuple[float, ...] = (0.0, 1e1, 1e2, 1e3, 1e4)
    seeds: tuple[int, ...] = (0, 1)
    images_per_seed: int = 3
    iterations: int = 240
    inner_iterations: int = 20
    snapshots: int = 8
    attack_rounds: tuple[int, ...] = (0, 50)
    adaptive: bool = True
    perturbations: tuple[str, ...] = ("last-bias", "all-k1", "all-k2")
    extended_rounds: tuple[int, ...] = (50,)
    multi_round: bool = True
    multi_round_gap: int = 10
    base: RunConfig = field(default_factory=lambda: RunConfig.preset("paper"))

    def __post_init__(self) -> None:
        unknown = sorted(set(self.perturbations) - set(PERTURBATIONS))
        if unknown:
            raise ValueError(
                f"unknown perturbations {unknown}: expected some of {sorted(PERTURBATIONS)}"
            )
        if self.multi_round_gap < 1:
            raise ValueError(f"multi_round_gap must be >= 1, got {self.multi_round_gap}")


PROFILES: dict[str, AttackSettings] = {
    "full": AttackSettings(profile="full"),
    "quick": AttackSettings(profile="quick", gammas=(0.0, 1e2, 1e4), seeds=(0,),
                            images_per_seed=2, iterations=60, snapshots=4, attack_rounds=(50,)),
}


def settings_for(profile: str, **overrides: Any) -> AttackSettings:
    """A profile with optional overrides (None values are ignored)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: expected one of {sorted(PROFILES)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    s = dataclasses.replace(PROFILES[profile], **changes)
    return dataclasses.replace(s, profile=profile if not changes else f"{profile} (modified)")


# ------------------------------------------------------------------------------ experiment


def _snapshot_points(settings: AttackSettings) -> tuple[int, ...]:
    step = max(1, settings.iterations // settings.snapshots)
    points = list(range(0, settings.iterations + 1, step))
    if points[-1] != settings.iterations:
        points.append(settings.iterations)
    return tuple(points)


def _plot_grid(truth: torch.Tensor, grids: dict[str, dict[int, torch.Tensor]],
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


def _grid_row_name(attacker: str, gamma: float) -> str:
    short = {PLAIN: "", ADAPTIVE: "adaptive, ", TWO_ROUNDS: "2 rounds, ",
             THREE_ROUNDS: "3 rounds, "}[attacker]
    return short + ("no noise" if gamma == 0 else f"$\\gamma$={gamma:g}")


def _gamma_independent(perturbation: str, attacker: str) -> bool:
    """Whether the attacker removes this perturbation exactly (so it runs at one gamma only)."""
    if attacker in (ADAPTIVE, THREE_ROUNDS):
        return True
    return attacker == TWO_ROUNDS and perturbation != "all-k2"


_PERTURBATION_STYLE = {"last-bias": "tab:blue", "all-k1": "tab:green", "all-k2": "tab:red"}
_ATTACKER_STYLE = {PLAIN: ("-", "o"), TWO_ROUNDS: ("--", "s")}


def _plot_psnr(summary: list[dict[str, Any]], path: Path) -> Path:
    """PSNR vs gamma, one panel per (model, x_1 round): colour = perturbation, style = attacker.

    Attackers run at one gamma only (their result cannot depend on it) are horizontal lines.
    """
    panels = sorted({(r["model"], r["attack_round"]) for r in summary},
                    key=lambda mr: (mr[0] != "logreg", -mr[1]))
    fig, axes = new_figure(len(panels), 1, size=(4.6, 3.6))
    top = max(r["psnr_mean"] for r in summary) * 1.08 + 2.0
    for ax, (model, rnd) in zip(axes[0], panels, strict=True):
        rows = [r for r in summary if r["model"] == model and r["attack_round"] == rnd]
        clean = [r for r in rows if r["gamma"] == 0 and r["attacker"] == PLAIN]
        for name in PERTURBATIONS:
            mine = [r for r in rows if r["perturbation"] == name]
            for attacker in sorted({r["attacker"] for r in mine}):
                series = sorted((r for r in mine if r["attacker"] == attacker),
                                key=lambda r: r["gamma"])
                label = f"{name}: {attacker}"
                if _gamma_independent(name, attacker):
                    ax.axhline(series[0]["psnr_mean"], color=_PERTURBATION_STYLE[name],
                               linestyle=":" if attacker == ADAPTIVE else "-.", alpha=0.7,
                               label=label + " (any gamma)")
                    continue
                if attacker == PLAIN and name != "last-bias":
                    series = clean + series  # gamma 0 is the same run for every setting
                linestyle, marker = _ATTACKER_STYLE.get(attacker, ("-", "^"))
                ax.errorbar([max(r["gamma"], 1e0) for r in series],  # gamma 0 drawn at 1
                            [r["psnr_mean"] for r in series],
                            yerr=[r["psnr_std"] for r in series], color=_PERTURBATION_STYLE[name],
                            marker=marker, linestyle=linestyle, capsize=3, label=label)
        ax.set_ylim(bottom=0.0, top=top)
        ax.set_xscale("log")
        ax.set_xlabel(r"noise level $\gamma$ (no noise drawn at $\gamma$=1)")
        ax.set_ylabel("PSNR of the reconstruction (dB)")
        ax.set_title(f"{model}, x_1 at round {rnd}", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=5.5, loc="best")
    fig.suptitle("iDLG on agent 1: plain, adaptive and multi-round attackers", fontsize=9)
    return save_figure(fig, path)


def _summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fields = ("model", "attack_round", "perturbation", "attacker", "gamma")
    keys: list[tuple[Any, ...]] = []
    for r in rows:
        key = tuple(r[f] for f in fields)
        if key not in keys:
            keys.append(key)
    out = []
    for key in keys:
        chosen = [r for r in rows if tuple(r[f] for f in fields) == key]
        psnr = np.array([r["psnr"] for r in chosen])
        mse = np.array([r["mse"] for r in chosen])
        out.append({
            **dict(zip(fields, key, strict=True)),
            "samples": len(chosen), "psnr_mean": float(psnr.mean()), "psnr_std": float(psnr.std()),
            "mse_mean": float(mse.mean()), "mse_std": float(mse.std()),
            "label_accuracy": float(np.mean([r["label_ok"] for r in chosen])),
            "seconds_mean": float(np.mean([r["seconds"] for r in chosen])),
        })
    return out


def _plan(settings: AttackSettings, name: str, rnd: int) -> list[tuple[float, str]]:
    """The (gamma, attacker) pairs run for one perturbation setting at one x_1 round."""
    top = max(settings.gammas)
    noisy = [g for g in settings.gammas if g > 0]
    extended = rnd in settings.extended_rounds
    if name == "last-bias":
        plan = [(g, PLAIN) for g in settings.gammas]
        if settings.adaptive:
            plan.append((top, ADAPTIVE))
        if settings.multi_round and extended:
            plan.append((top, TWO_ROUNDS))  # K = 1: the constant cancels exactly
        return plan
    if not extended:
        return []
    plan = [(g, PLAIN) for g in noisy]  # gamma 0 is the last-bias setting's run
    if settings.multi_round and name == "all-k1":
        plan.append((top, TWO_ROUNDS))
    if settings.multi_round and name == "all-k2":
        plan += [(g, TWO_ROUNDS) for g in noisy]  # does not cancel: depends on gamma
        plan.append((top, THREE_ROUNDS))  # affine per coordinate: cancels exactly
    return plan


def run(settings: AttackSettings, *, out: str | Path | None = None,
        figures_to: str | Path | None = None) -> dict[str, Any]:
    """Attack every (model, round, perturbation, attacker, gamma, seed, image); write results."""
    folder = output_dir(out, NAME)
    points = _snapshot_points(settings)
    rows: list[dict[str, Any]] = []
    figures: list[Path] = []
    gap = settings.multi_round_gap
    with stopwatch() as elapsed:
        for model in settings.models:
            problem = load_problem(settings.base.replace(task=model))
            task, shard = problem.task, problem.shards[0]
            init_scale = MULTI_ROUND_INIT_SCALE.get(model, 1.0)
            for rnd in settings.attack_rounds:
                x1 = attack_point(problem, rnd)
                later: list[torch.Tensor] = []
                if settings.multi_round and rnd in settings.extended_rounds:
                    later = [attack_point(problem, rnd + gap), attack_point(problem, rnd + 2 * gap)]
                for name in settings.perturbations:
                    plan = _plan(settings, name, rnd)
                    if not plan:
                        continue
                    setting = perturbation_problem(problem, name)
                    perturbed = torch.zeros(task.num_params, dtype=torch.bool)
                    perturbed[torch.from_numpy(setting.indices)] = True
                    grids: dict[str, dict[int, torch.Tensor]] = {}
                    grid_psnr: dict[str, float] = {}
                    grid_truth = None
                    for seed in settings.seeds:
                        picks = np.random.default_rng(seed).choice(
                            len(shard), size=settings.images_per_seed, replace=False)
                        for gamma in sorted({g for g, _ in plan}):
                            perturbation = agent1_perturbation(setting, gamma, seed)
                            attackers = [a for g, a in plan if g == gamma]
                            for j, index in enumerate(picks):
                                image = shard.images[int(index)].unsqueeze(0)
                                label = shard.labels[int(index)].reshape(1)
                                observed = observed_gradient(task, x1, image, label, perturbation)
                                for attacker in attackers:
                                    started = time.perf_counter()
                                    first = seed == settings.seeds[0] and j == 0
                                    snap = points if first else ()
                                    if attacker in (PLAIN, ADAPTIVE):
                                        guess = infer_label(task, observed)
                                        keep = ~perturbed if attacker == ADAPTIVE else None
                                        rec, snaps, loss = reconstruct(
                                            task, x1, observed, guess, seed=1000 * seed + j,
                                            iterations=settings.iterations,
                                            inner_iterations=settings.inner_iterations,
                                            snapshot_at=snap, keep=keep,
                                        )
                                    else:
                                        used = 2 if attacker == TWO_ROUNDS else 3
                                        xs = [x1, *later][:used]
                                        seen = [observed, *(observed_gradient(
                                            task, x, image, label, perturbation)
                                            for x in later)][:used]
                                        guess = infer_label_multi(
                                            task, xs, seen, seed=1000 * seed + j,
                                            inner_iterations=settings.inner_iterations,
                                            init_scale=init_scale)
                                        rec, snaps, loss = reconstruct_multi(
                                            task, xs, seen, guess, seed=1000 * seed + j,
                                            iterations=settings.iterations,
                                            inner_iterations=settings.inner_iterations,
                                            snapshot_at=snap, init_scale=init_scale,
                                        )
                                        if loss > RESTART_ABOVE:
                                            # the attacker sees its own matching loss: one
                                            # restart from another dummy, keep the better fit
                                            again = reconstruct_multi(
                                                task, xs, seen, guess,
                                                seed=1000 * seed + j + 500,
                                                iterations=settings.iterations,
                                                inner_iterations=settings.inner_iterations,
                                                snapshot_at=snap, init_scale=init_scale,
                                            )
                                            if again[2] < loss:
                                                rec, snaps, loss = again
                                    mse, psnr = image_errors(rec, image)
                                    rows.append({
                                        "model": model, "attack_round": rnd,
                                        "perturbation": name, "attacker": attacker,
                                        "gamma": gamma, "seed": seed, "image": int(index),
                                        "label": int(label), "inferred_label": guess,
                                        "label_ok": guess == int(label),
                                        "mse": mse, "psnr": psnr, "final_loss": loss,
                                        "observed_norm": float(observed.norm()),
                                        "seconds": time.perf_counter() - started,
                                    })
                                    if first:
                                        row_name = _grid_row_name(attacker, gamma)
                                        grids[row_name], grid_psnr[row_name] = snaps, psnr
                                        grid_truth = image
                            done = [r for r in rows if r["model"] == model and r["seed"] == seed
                                    and r["attack_round"] == rnd and r["perturbation"] == name
                                    and r["gamma"] == gamma]
                            text = "; ".join(
                                f"{a}: " + ", ".join(f"{r['psnr']:.1f}" for r in done
                                                     if r["attacker"] == a)
                                for a in attackers)
                            log(f"{model}, x_1 at round {rnd}, {name}, seed {seed}, gamma "
                                f"{gamma:g}: PSNR (dB) {text} "
                                f"({sum(r['seconds'] for r in done):.0f}s)")
                    assert grid_truth is not None
                    suffix = "" if name == "last-bias" else f"_{name}"
                    figures.append(_plot_grid(
                        grid_truth, grids, grid_psnr,
                        f"iDLG on agent 1, {model}, x_1 at round {rnd}, {PERTURBATIONS[name]}: "
                        f"L-BFGS steps ({settings.inner_iterations} iterations each)",
                        folder / f"attack_{model}_round{rnd}{suffix}.png"))
        summary = _summarise(rows)
        write_csv(folder / "summary.csv", summary)
        figures.append(_plot_psnr(summary, folder / "attack_psnr.png"))
        table = format_table(summary, [
            Column("model", "model"), Column("attack_round", "x_1 round"),
            Column("perturbation", "perturbation"), Column("attacker", "attacker"),
            Column("gamma", "gamma", lambda g: f"{g:g}"),
            Column("samples", "n"),
            Column("psnr_mean", "PSNR mean (dB)", ".1f"), Column("psnr_std", "std", ".1f"),
            Column("mse_mean", "MSE mean", ".3g"), Column("mse_std", "std", ".2g"),
            Column("label_accuracy", "label ok", ".2f"),
        ])
        payload = {
            "profile": settings.profile,
            "settings": {k: v for k, v in dataclasses.asdict(settings).items() if k != "base"},
            "base_config": settings.base.to_dict(),
            "snapshot_iterations": list(points),
            "summary": summary,
        }
        wall = elapsed()
    return finish(folder, NAME, payload=payload, rows=rows, table=table, figures=figures,
                  wall_seconds=wall, figures_to=figures_to)
