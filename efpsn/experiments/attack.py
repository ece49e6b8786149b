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

Refreshed masks (efpsn/masks/refresh.py): with `every:R` agent 1's mask is new every R rounds,
derived from its edge seeds exactly as the network derives it (efpsn/experiments/attack_noise.py).
The multi-round attackers then take their rounds inside one period when R leaves room
(attack_noise.attacker_rounds), where a K = 1 mask still cancels; across periods the noise is
fresh and does not. A fourth attacker, the strongest a neighbour has against fresh noise,
averages agent 1's perturbed gradients on the sample over `averaging_rounds` rounds and runs
iDLG on the mean, generously assumed to be at one and the same iterate x_1 (in a run x_1 moves
and the batch changes, which only hurts the attacker): the noise's variance falls by the number
of periods those rounds span.

Perturbations compared: the paper's (last-layer bias, (K, m, N) = (1, 10, 10), Lebesgue measure)
and every parameter with K = 1 (N = d + 1) or with the squares added (K = 2, N = 2d + 1), both in
the uniform-measure basis that `--selection all` uses; the refreshed rows perturb every
parameter with K = 1.

Attackers that use many or late rounds (efpsn/experiments/attack_rounds.py, `many_rounds`) run
on real simulated runs of the defaults and other modes where agent 0 holds one sample.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from efpsn.experiments.attack_noise import Agent1Noise, attacker_rounds
from efpsn.experiments.attack_report import (
    ADAPTIVE,
    AVERAGING,
    PLAIN,
    THREE_ROUNDS,
    TWO_ROUNDS,
    attack_table,
    grid_row_name,
    plot_grid,
    plot_psnr,
    plot_refreshed_psnr,
    summarise,
)
from efpsn.experiments.attack_rounds import ManyRoundSettings, many_round_table, run_many_rounds
from efpsn.experiments.common import finish, log, output_dir, stopwatch, write_csv
from efpsn.experiments.idlg import (
    MULTI_ROUND_INIT_SCALE,
    PERTURBATIONS,
    RESTART_ABOVE,
    attack_point,
    image_errors,
    infer_label,
    infer_label_multi,
    observed_gradient,
    perturbation_problem,
    reconstruct,
    reconstruct_multi,
)
from efpsn.experiments.sweep import load_problem
from efpsn.jsonfile import write_json
from efpsn.params.config import RunConfig
from efpsn.params.refresh_setting import Refresh
from efpsn.tasks.objective import Task

NAME = "attack"


@dataclass(frozen=True, kw_only=True)
class AttackSettings:
    """What to attack. gamma 0 means no perturbation (mask "none").

    `attack_rounds`: x_1 is agent 1's iterate after that many rounds of the noise-free run of
    `base` (the paper's DSGD by default; base_config("defaults"): the defaults, for LeNet agt on
    mini-batches), the same x_1 at every gamma so that only the perturbation differs; the
    run's schedule is compressed to those rounds (efpsn.experiments.idlg.attack_point), and a
    fading mask fades at the full run's rate.
    Round 0 is the initial point (zeros for logistic regression, DLG's U(-0.5, 0.5) for LeNet).
    `iterations` counts optimizer.step calls of L-BFGS with `inner_iterations` iterations each,
    like the DLG/iDLG code (whose figures show these steps, 0 to 240 in the paper).

    `perturbations` (PERTURBATIONS keys; fixed masks): "last-bias" runs at every attack round;
    the all-parameter settings and the multi-round attackers run at the `extended_rounds` only.
    The multi-round attacker sees x_1 after r, r + gap and r + 2 gap rounds (`multi_round_gap`).
    An attacker whose result cannot depend on gamma (adaptive; 2 rounds against K = 1; 3 rounds
    against K <= 2) runs once, at the largest gamma (the worst case for float rounding).

    `refreshes` ("every:R"; none by default, the full and quick profiles set them): rows with
    masks refreshed every R rounds on `refreshed_perturbation`, at the `extended_rounds`, for
    each of `refresh_gammas`: against R < 3 the plain, 2-round and 3-round attackers; against
    R >= 3 the 2-round attacker inside a period (once, at the largest gamma: it cancels the
    mask); against every R the averaging attacker over `averaging_rounds` rounds.
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
    refreshes: tuple[str, ...] = ()
    refresh_gammas: tuple[float, ...] = (1e0, 1e2, 1e4, 1e6)
    refreshed_perturbation: str = "all-k1"
    averaging_rounds: int = 10_000
    many_rounds: ManyRoundSettings | None = None
    base: RunConfig = field(default_factory=lambda: RunConfig.preset("paper"))

    def __post_init__(self) -> None:
        unknown = sorted({*self.perturbations, self.refreshed_perturbation} - set(PERTURBATIONS))
        if unknown:
            raise ValueError(
                f"unknown perturbations {unknown}: expected some of {sorted(PERTURBATIONS)}"
            )
        if self.multi_round_gap < 1:
            raise ValueError(f"multi_round_gap must be >= 1, got {self.multi_round_gap}")
        for text in self.refreshes:
            if not Refresh.parse(text).refreshed:
                raise ValueError(f"refreshes are 'every:R' or 'fading[:RHO]' (the fixed mask "
                                 f"always runs), got {text!r}")
        if self.refreshes and self.refreshed_perturbation != "all-k1":
            raise ValueError("refreshed rows need the K = 1 perturbation 'all-k1' (the averaging "
                             f"attacker's mean is exact for K = 1), got "
                             f"{self.refreshed_perturbation!r}")
        if self.averaging_rounds < 1:
            raise ValueError(f"averaging_rounds must be >= 1, got {self.averaging_rounds}")


QUICK_MANY_ROUNDS = ManyRoundSettings(
    modes=ManyRoundSettings().modes[:3], tables=("wine",), samples=2, gammas=(1e3,), images=1,
    image_shard=100, pairs=60, steps=30)
"""The many-round attackers in the quick profile: the defaults, the fixed mask and
every:1 on wine; one digit on the defaults and the fixed mask."""

PROFILES: dict[str, AttackSettings] = {
    "full": AttackSettings(profile="full",
                           refreshes=("fading", "every:1", "every:10", "every:100"),
                           many_rounds=ManyRoundSettings()),
    "quick": AttackSettings(profile="quick", gammas=(0.0, 1e2, 1e4), seeds=(0,),
                            images_per_seed=2, iterations=60, snapshots=4, attack_rounds=(50,),
                            refreshes=("fading", "every:1", "every:10"), refresh_gammas=(1e4,),
                            averaging_rounds=1000, many_rounds=QUICK_MANY_ROUNDS),
}


BASES = ("paper", "defaults")


def base_config(name: str) -> RunConfig:
    """The run the attacked iterates come from: the paper's preset, or the defaults (each model
    then resolves its own: agt full batch for logreg, agt on mini-batches for LeNet)."""
    if name not in BASES:
        raise ValueError(f"unknown base {name!r}: expected one of {BASES}")
    return RunConfig.preset("paper") if name == "paper" else RunConfig()


def settings_for(profile: str, **overrides: Any) -> AttackSettings:
    """A profile with optional overrides (None values are ignored)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: expected one of {sorted(PROFILES)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    if "attack_rounds" in changes and "extended_rounds" not in changes:
        # the rounds asked for get the all-parameter, multi-round and refreshed attackers too
        # (round 0, the initial point, only the last-bias ones, as in the profiles)
        changes["extended_rounds"] = tuple(r for r in changes["attack_rounds"] if r > 0)
    s = dataclasses.replace(PROFILES[profile], **changes)
    return dataclasses.replace(s, profile=profile if not changes else f"{profile} (modified)")


# ------------------------------------------------------------------------------ plan


def _snapshot_points(settings: AttackSettings) -> tuple[int, ...]:
    step = max(1, settings.iterations // settings.snapshots)
    points = list(range(0, settings.iterations + 1, step))
    if points[-1] != settings.iterations:
        points.append(settings.iterations)
    return tuple(points)


def _plan(settings: AttackSettings, name: str, rnd: int) -> list[tuple[float, str]]:
    """The (gamma, attacker) pairs run for one fixed-mask perturbation at one x_1 round."""
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


def _refreshed_plan(settings: AttackSettings, refresh: str) -> list[tuple[float, str]]:
    """The (gamma, attacker) pairs run against masks refreshed as `refresh` says."""
    every = Refresh.parse(refresh).every
    assert every is not None
    gammas = settings.refresh_gammas
    plan = [(g, AVERAGING) for g in gammas]
    if every < 3:  # no period holds 3 rounds: every attacker faces fresh noise
        plan += [(g, PLAIN) for g in gammas]
        if settings.multi_round:
            plan += [(g, a) for g in gammas for a in (TWO_ROUNDS, THREE_ROUNDS)]
    elif settings.multi_round:
        plan.append((max(gammas), TWO_ROUNDS))  # inside one period a K = 1 mask cancels
    return plan


def _jobs(settings: AttackSettings, rnd: int) -> list[tuple[str, str, list[tuple[float, str]]]]:
    """(perturbation, refresh, [(gamma, attacker), ...]) to run at x_1 round `rnd`."""
    jobs = [(name, "never", _plan(settings, name, rnd)) for name in settings.perturbations]
    if rnd in settings.extended_rounds:
        jobs += [(settings.refreshed_perturbation, refresh, _refreshed_plan(settings, refresh))
                 for refresh in settings.refreshes]
    return [job for job in jobs if job[2]]


# ------------------------------------------------------------------------------ attacks


@dataclass
class _Target:
    """One private sample of agent 1 under attack, and what the attacker knows around it."""

    task: Task
    image: torch.Tensor
    label: torch.Tensor
    rnd: int
    seed: int
    perturbed: torch.Tensor  # boolean, the coordinates Phi moves
    init_scale: float


def _attack(settings: AttackSettings, target: _Target, attacker: str, noise: Agent1Noise,
            iterate: Any, snap: tuple[int, ...]) -> tuple[dict[str, Any], dict[int, Any]]:
    """Run one attacker on one sample; (the record, the reconstruction's snapshots)."""
    started = time.perf_counter()
    task, image, label, rnd = target.task, target.image, target.label, target.rnd
    dummy_seed = target.seed
    steps = {"iterations": settings.iterations, "inner_iterations": settings.inner_iterations}
    if attacker in (PLAIN, ADAPTIVE, AVERAGING):
        rounds = ([rnd] if attacker != AVERAGING
                  else list(range(rnd, rnd + settings.averaging_rounds)))
        perturbation = (noise.perturbation(rnd) if attacker != AVERAGING
                        else noise.mean_perturbation(rnd, settings.averaging_rounds))
        observed = observed_gradient(task, iterate(rnd), image, label, perturbation)
        guess = infer_label(task, observed)
        keep = ~target.perturbed if attacker == ADAPTIVE else None
        rec, snaps, loss = reconstruct(task, iterate(rnd), observed, guess, seed=dummy_seed,
                                       snapshot_at=snap, keep=keep, **steps)
    else:
        rounds = attacker_rounds(rnd, refresh=noise.refresh, gap=settings.multi_round_gap,
                                 count=2 if attacker == TWO_ROUNDS else 3)
        xs = [iterate(r) for r in rounds]
        seen = [observed_gradient(task, x, image, label, noise.perturbation(r))
                for x, r in zip(xs, rounds, strict=True)]
        observed = seen[0]
        guess = infer_label_multi(task, xs, seen, seed=dummy_seed, init_scale=target.init_scale,
                                  inner_iterations=settings.inner_iterations)
        rec, snaps, loss = reconstruct_multi(task, xs, seen, guess, seed=dummy_seed,
                                             snapshot_at=snap, init_scale=target.init_scale,
                                             **steps)
        if loss > RESTART_ABOVE:
            # the attacker sees its own matching loss: one restart from another dummy, keep the
            # better fit
            again = reconstruct_multi(task, xs, seen, guess, seed=dummy_seed + 500,
                                      snapshot_at=snap, init_scale=target.init_scale, **steps)
            if again[2] < loss:
                rec, snaps, loss = again
    mse, psnr = image_errors(rec, image)
    record = {
        "refresh": str(noise.refresh), "attacker": attacker, "gamma": noise.gamma,
        "rounds_seen": len(rounds), "rounds": f"{rounds[0]}-{rounds[-1]}" if len(rounds) > 3
        else ",".join(map(str, rounds)), "label": int(label), "inferred_label": guess,
        "label_ok": guess == int(label), "mse": mse, "psnr": psnr, "final_loss": loss,
        "observed_norm": float(observed.norm()), "seconds": time.perf_counter() - started,
    }
    return record, snaps


def run(settings: AttackSettings, *, out: str | Path | None = None,
        figures_to: str | Path | None = None) -> dict[str, Any]:
    """Attack every (model, round, perturbation, refresh, attacker, gamma, seed, image)."""
    if settings.models and not any(_jobs(settings, rnd) for rnd in settings.attack_rounds):
        raise ValueError(
            f"nothing to attack at rounds {', '.join(map(str, settings.attack_rounds))} with "
            f"perturbations {', '.join(settings.perturbations) or 'none'} and refreshes "
            f"{', '.join(settings.refreshes) or 'none'}: give a perturbation, a refresh or a "
            "round > 0")
    folder = output_dir(out, NAME)
    points = _snapshot_points(settings)
    rows: list[dict[str, Any]] = []
    figures: list[Path] = []
    with stopwatch() as elapsed:
        for model in settings.models:
            problem = load_problem(settings.base.replace(task=model))
            task, shard = problem.task, problem.shards[0]
            cache: dict[int, torch.Tensor] = {}

            def iterate(r: int, problem: Any = problem, cache: Any = cache) -> torch.Tensor:
                if r not in cache:
                    cache[r] = attack_point(problem, r)
                return cache[r]

            for rnd in settings.attack_rounds:
                for name, refresh, plan in _jobs(settings, rnd):
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
                            noise = Agent1Noise(setting, gamma=gamma, noise_seed=seed,
                                                refresh=Refresh.parse(refresh))
                            attackers = [a for g, a in plan if g == gamma]
                            done = []
                            for j, index in enumerate(picks):
                                target = _Target(
                                    task=task, image=shard.images[int(index)].unsqueeze(0),
                                    label=shard.labels[int(index)].reshape(1), rnd=rnd,
                                    seed=1000 * seed + j, perturbed=perturbed,
                                    init_scale=MULTI_ROUND_INIT_SCALE.get(model, 1.0))
                                first = seed == settings.seeds[0] and j == 0
                                for attacker in attackers:
                                    record, snaps = _attack(settings, target, attacker, noise,
                                                            iterate, points if first else ())
                                    done.append({"model": model, "attack_round": rnd,
                                                 "perturbation": name, "seed": seed,
                                                 "image": int(index), **record})
                                    if first:
                                        row_name = grid_row_name(attacker, gamma, refresh)
                                        grids[row_name] = snaps
                                        grid_psnr[row_name] = record["psnr"]
                                        grid_truth = target.image
                            rows += done
                            text = "; ".join(f"{a}: " + ", ".join(
                                f"{r['psnr']:.1f}" for r in done if r["attacker"] == a)
                                for a in attackers)
                            log(f"{model}, x_1 at round {rnd}, {name}, refresh {refresh}, seed "
                                f"{seed}, gamma {gamma:g}: PSNR (dB) {text} "
                                f"({sum(r['seconds'] for r in done):.0f}s)")
                    assert grid_truth is not None
                    suffix = ("" if name == "last-bias" else f"_{name}") + (
                        "" if refresh == "never" else "_" + refresh.replace(":", ""))
                    figures.append(plot_grid(
                        grid_truth, grids, grid_psnr,
                        f"iDLG on agent 1, {model}, x_1 at round {rnd}, {PERTURBATIONS[name]}, "
                        f"refresh {refresh}: L-BFGS steps ({settings.inner_iterations} "
                        "iterations each)", folder / f"attack_{model}_round{rnd}{suffix}.png"))
        summary = summarise(rows)
        write_csv(folder / "summary.csv", summary)
        if any(r["refresh"] == "never" for r in summary):
            figures.append(plot_psnr(summary, folder / "attack_psnr.png"))
        if any(r["refresh"] != "never" for r in summary):
            figures.append(plot_refreshed_psnr(summary, folder / "attack_refresh_psnr.png"))
        table = attack_table(summary)
        many: dict[str, Any] = {}
        if settings.many_rounds is not None:
            many_rows, many_summary = run_many_rounds(settings.many_rounds)
            many = {"summary": many_summary, "rows": many_rows}
            write_json(folder / "many_rounds.json", many)
            (folder / "many_rounds.md").write_text(many_round_table(many_summary) + "\n")
            table += ("\n\nAttackers that use many or late rounds (agent 0 holds one sample; "
                      "many_rounds.json):\n" + many_round_table(many_summary))
        payload = {
            "profile": settings.profile,
            "many_rounds": many.get("summary", []),
            "settings": {k: v for k, v in dataclasses.asdict(settings).items() if k != "base"},
            "base_config": settings.base.to_dict(),
            "snapshot_iterations": list(points),
            "summary": summary,
        }
        wall = elapsed()
    return finish(folder, NAME, payload=payload, rows=rows, table=table,
                  figures=figures, wall_seconds=wall, figures_to=figures_to)
