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
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

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
from efpsn.experiments.sweep import load_problem, with_config
from efpsn.perturbation import FunctionalPerturbation
from efpsn.problem import Problem
from efpsn.simulator import make_masks, run_simulation
from efpsn.tasks import Task

NAME = "attack"
MSE_FLOOR = 1e-20  # PSNR is capped at 200 dB (float64 reconstructions can be exact)
ADAPTIVE = "iDLG, perturbed coords dropped"


@dataclass(frozen=True, kw_only=True)
class AttackSettings:
    """What to attack. gamma 0 means no perturbation (mask "none").

    `attack_rounds`: x_1 is agent 1's iterate after that many rounds of the noise-free DSGD run
    (the paper's settings), the same x_1 at every gamma so that only the perturbation differs.
    Round 0 is the initial point (zeros for logistic regression, DLG's U(-0.5, 0.5) for LeNet).
    `iterations` counts optimizer.step calls of L-BFGS with `inner_iterations` iterations each,
    like the DLG/iDLG code (whose figures show these steps, 0 to 240 in the paper).
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
    base: RunConfig = field(default_factory=RunConfig)


PROFILES: dict[str, AttackSettings] = {
    "full": AttackSettings(profile="full"),
    "quick": AttackSettings(profile="quick", seeds=(0,), images_per_seed=2, iterations=60,
                            snapshots=4, attack_rounds=(50,)),
}


def settings_for(profile: str, **overrides: Any) -> AttackSettings:
    """A profile with optional overrides (None values are ignored)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: expected one of {sorted(PROFILES)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    s = dataclasses.replace(PROFILES[profile], **changes)
    return dataclasses.replace(s, profile=profile if not changes else f"{profile} (modified)")


# ------------------------------------------------------------------------------ the attack


def sample_gradient(task: Task, x: torch.Tensor, image: torch.Tensor, label: torch.Tensor,
                    *, create_graph: bool = False) -> torch.Tensor:
    """grad_x of the task's objective on one sample (image (1,1,28,28), label (1,)), by autograd.

    With create_graph the result stays differentiable with respect to `image` (the attack needs
    the gradient of a gradient).
    """
    with torch.enable_grad():
        xr = x if x.requires_grad else x.detach().requires_grad_(True)
        value = F.cross_entropy(task.logits(xr, image), label) + 0.5 * task.l2 * (xr * xr).sum()
        (grad,) = torch.autograd.grad(value, xr, create_graph=create_graph)
    return grad


def observed_gradient(task: Task, x: torch.Tensor, image: torch.Tensor, label: torch.Tensor,
                      perturbation: FunctionalPerturbation | None) -> torch.Tensor:
    """What the attacker sees: the true single-sample gradient plus grad Phi(eta_bar_1)(x)."""
    grad = sample_gradient(task, x, image, label).detach()
    if perturbation is not None:
        grad = grad + perturbation.gradient(x)
    return grad


def infer_label(task: Task, grad: torch.Tensor) -> int:
    """iDLG: the class whose row of the last layer's weight gradient has a negative sum."""
    slices = list(task.parameter_slices().values())
    weight = grad[slices[-2]].reshape(10, -1)  # the last layer: weight, then bias
    return int(weight.sum(dim=1).argmin())


def reconstruct(
    task: Task,
    x: torch.Tensor,
    observed: torch.Tensor,
    label: int,
    *,
    seed: int,
    iterations: int,
    inner_iterations: int,
    snapshot_at: tuple[int, ...] = (),
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[int, torch.Tensor], float]:
    """L-BFGS on a dummy image ~ N(0, 1) to match `observed`; returns (image, snapshots, loss).

    `keep`: boolean mask of the gradient coordinates the attacker matches (None: all).
    """
    generator = torch.Generator().manual_seed(seed)
    dummy = torch.randn((1, 1, 28, 28), generator=generator, dtype=torch.float64)
    dummy.requires_grad_(True)
    target = observed if keep is None else observed[keep]
    labels = torch.tensor([label])
    xr = x.detach().clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([dummy], lr=1.0, max_iter=inner_iterations, history_size=100,
                                  line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        grad = sample_gradient(task, xr, dummy, labels, create_graph=True)
        diff = (grad if keep is None else grad[keep]) - target
        loss = (diff * diff).sum()
        (d_dummy,) = torch.autograd.grad(loss, dummy)
        dummy.grad = d_dummy
        return loss.detach()

    snapshots: dict[int, torch.Tensor] = {}
    for it in range(iterations + 1):
        if it in snapshot_at:
            snapshots[it] = dummy.detach().clone()
        if it < iterations:
            optimizer.step(closure)
    final_loss = float(closure())
    return dummy.detach().clone(), snapshots, final_loss


def image_errors(reconstruction: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """(MSE, PSNR in dB) of the reconstruction clipped to the pixel range [0, 1]."""
    mse = float(((reconstruction.clamp(0.0, 1.0) - truth) ** 2).mean())
    return mse, 10.0 * math.log10(1.0 / max(mse, MSE_FLOOR))


def attack_point(problem: Problem, rounds: int) -> torch.Tensor:
    """Agent 1's iterate after `rounds` rounds of the noise-free run (the initial point for 0)."""
    if rounds == 0:
        return problem.initial_params()
    config = problem.config.replace(mask="none", gamma=1.0, iterations=rounds, eval_every=rounds)
    return run_simulation(config, problem=with_config(problem, config)).xs[0]


def agent1_perturbation(problem: Problem, gamma: float, noise_seed: int
                        ) -> FunctionalPerturbation | None:
    """Agent 1's functional perturbation from the zero-sum phase I at `gamma` (None for 0)."""
    if gamma == 0:
        return None
    config = problem.config.replace(mask="zero-sum", gamma=gamma)
    derived = with_config(problem, config)
    masks = make_masks(derived, protocol="fast", noise_seed=noise_seed)
    return derived.perturbation(masks[0])


# ------------------------------------------------------------------------------ experiment


def _snapshot_points(settings: AttackSettings) -> tuple[int, ...]:
    step = max(1, settings.iterations // settings.snapshots)
    points = list(range(0, settings.iterations + 1, step))
    if points[-1] != settings.iterations:
        points.append(settings.iterations)
    return tuple(points)


def _plot_grid(truth: torch.Tensor, grids: dict[float, dict[int, torch.Tensor]],
               psnr: dict[float, float], title: str, path: Path) -> Path:
    gammas = list(grids)
    points = sorted(next(iter(grids.values())))
    fig, axes = new_figure(len(points) + 1, len(gammas), size=(1.05, 1.15))
    for r, gamma in enumerate(gammas):
        cells = [("truth", truth), *((f"it {p}", grids[gamma][p]) for p in points)]
        for c, (label, image) in enumerate(cells):
            ax = axes[r][c]
            ax.imshow(image.reshape(28, 28).clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(label, fontsize=7)
        name = "no noise" if gamma == 0 else f"$\\gamma$={gamma:g}"
        axes[r][0].set_ylabel(f"{name}\n{psnr[gamma]:.1f} dB", fontsize=7)
    fig.suptitle(title, fontsize=8)
    return save_figure(fig, path, dpi=80)


def _plot_psnr(summary: list[dict[str, Any]], path: Path) -> Path:
    fig, axes = new_figure(1, 1, size=(5.0, 3.6))
    ax = axes[0][0]
    styles = {"logreg": ("tab:blue", "o"), "lenet": ("tab:red", "s")}
    for (model, rnd) in sorted({(r["model"], r["attack_round"]) for r in summary}):
        colour, marker = styles.get(model, ("k", "^"))
        linestyle = "-" if rnd == max(r["attack_round"] for r in summary) else ":"
        rows = [r for r in summary if r["model"] == model and r["attack_round"] == rnd
                and r["attacker"] == "iDLG"]
        g = [max(r["gamma"], 1e0) for r in rows]  # gamma 0 drawn at 1 on the log axis
        ax.errorbar(g, [r["psnr_mean"] for r in rows], yerr=[r["psnr_std"] for r in rows],
                    color=colour, marker=marker, linestyle=linestyle, capsize=3,
                    label=f"{model}, x_1 at round {rnd}")
        adaptive = [r for r in summary if r["model"] == model and r["attack_round"] == rnd
                    and r["attacker"] != "iDLG"]
        if adaptive:
            ax.axhline(adaptive[0]["psnr_mean"], color=colour, linestyle=linestyle, alpha=0.35)
    ax.set_ylim(bottom=0.0, top=max(r["psnr_mean"] for r in summary) * 1.08 + 2.0)
    ax.set_xscale("log")
    ax.set_xlabel(r"noise level $\gamma$ (no noise drawn at $\gamma$=1)")
    ax.set_ylabel("PSNR of the reconstruction (dB)")
    ax.set_title("iDLG on agent 1 (faint lines: attacker ignoring the 10 perturbed coordinates)",
                 fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys: list[tuple[str, int, str, float]] = []
    for r in rows:
        key = (r["model"], r["attack_round"], r["attacker"], r["gamma"])
        if key not in keys:
            keys.append(key)
    out = []
    for model, rnd, attacker, gamma in keys:
        chosen = [r for r in rows if (r["model"], r["attack_round"], r["attacker"], r["gamma"])
                  == (model, rnd, attacker, gamma)]
        psnr = np.array([r["psnr"] for r in chosen])
        mse = np.array([r["mse"] for r in chosen])
        out.append({
            "model": model, "attack_round": rnd, "attacker": attacker, "gamma": gamma,
            "samples": len(chosen), "psnr_mean": float(psnr.mean()), "psnr_std": float(psnr.std()),
            "mse_mean": float(mse.mean()), "mse_std": float(mse.std()),
            "label_accuracy": float(np.mean([r["label_ok"] for r in chosen])),
            "seconds_mean": float(np.mean([r["seconds"] for r in chosen])),
        })
    return out


def run(settings: AttackSettings, *, out: str | Path | None = None,
        figures_to: str | Path | None = None) -> dict[str, Any]:
    """Attack every (model, attack round, seed, image, gamma); write tables and figures."""
    folder = output_dir(out, NAME)
    points = _snapshot_points(settings)
    rows: list[dict[str, Any]] = []
    figures: list[Path] = []
    with stopwatch() as elapsed:
        for model in settings.models:
            problem = load_problem(settings.base.replace(task=model))
            task, shard = problem.task, problem.shards[0]
            perturbed = torch.zeros(task.num_params, dtype=torch.bool)
            perturbed[torch.from_numpy(problem.indices)] = True
            for rnd in settings.attack_rounds:
                x1 = attack_point(problem, rnd)
                grids: dict[float, dict[int, torch.Tensor]] = {}
                grid_psnr: dict[float, float] = {}
                grid_truth = None
                for seed in settings.seeds:
                    picks = np.random.default_rng(seed).choice(
                        len(shard), size=settings.images_per_seed, replace=False)
                    for gamma in settings.gammas:
                        perturbation = agent1_perturbation(problem, gamma, seed)
                        attackers = [("iDLG", None)]
                        if settings.adaptive and gamma == max(settings.gammas):
                            # gamma-independent: run once, at the largest gamma
                            attackers.append((ADAPTIVE, ~perturbed))
                        for j, index in enumerate(picks):
                            image = shard.images[int(index)].unsqueeze(0)
                            label = shard.labels[int(index)].reshape(1)
                            observed = observed_gradient(task, x1, image, label, perturbation)
                            guess = infer_label(task, observed)
                            for attacker, keep in attackers:
                                started = time.perf_counter()
                                first = seed == settings.seeds[0] and j == 0 and keep is None
                                rec, snaps, loss = reconstruct(
                                    task, x1, observed, guess, seed=1000 * seed + j,
                                    iterations=settings.iterations,
                                    inner_iterations=settings.inner_iterations,
                                    snapshot_at=points if first else (), keep=keep,
                                )
                                mse, psnr = image_errors(rec, image)
                                rows.append({
                                    "model": model, "attack_round": rnd, "attacker": attacker,
                                    "gamma": gamma,
                                    "seed": seed, "image": int(index), "label": int(label),
                                    "inferred_label": guess, "label_ok": guess == int(label),
                                    "mse": mse, "psnr": psnr, "final_loss": loss,
                                    "observed_norm": float(observed.norm()),
                                    "seconds": time.perf_counter() - started,
                                })
                                if first:
                                    grids[gamma], grid_psnr[gamma], grid_truth = snaps, psnr, image
                        done = [r for r in rows if r["model"] == model and r["seed"] == seed
                                and r["attack_round"] == rnd and r["gamma"] == gamma]
                        text = "; ".join(
                            f"{name}: " + ", ".join(f"{r['psnr']:.1f}" for r in done
                                                    if r["attacker"] == name)
                            for name, _ in attackers)
                        log(f"{model}, x_1 at round {rnd}, seed {seed}, gamma {gamma:g}: PSNR "
                            f"(dB) {text} ({sum(r['seconds'] for r in done):.0f}s)")
                assert grid_truth is not None
                figures.append(_plot_grid(
                    grid_truth, grids, grid_psnr,
                    f"iDLG on agent 1, {model}, x_1 at round {rnd}: L-BFGS steps "
                    f"({settings.inner_iterations} iterations each)",
                    folder / f"attack_{model}_round{rnd}.png"))
        summary = _summarise(rows)
        write_csv(folder / "summary.csv", summary)
        figures.append(_plot_psnr(summary, folder / "attack_psnr.png"))
        table = format_table(summary, [
            Column("model", "model"), Column("attack_round", "x_1 round"),
            Column("attacker", "attacker"),
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
