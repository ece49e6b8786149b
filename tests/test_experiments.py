"""The paper's experiments (efpsn.experiments): each runs end to end and points the right way.

The sweeps run here with "test" settings (fewer rounds, gammas and images than the --quick
profiles) through the same functions the CLI calls, so the whole file stays a few minutes on 2
cores. Each test checks the direction of the paper's claim, not absolute numbers.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from efpsn.cli.experiment import default_out, register, run_experiment
from efpsn.experiments import (
    EXPERIMENTS,
    accuracy_convex,
    accuracy_nonconvex,
    attack,
    attack_report,
    epsilon,
    idlg,
    network_check,
    perturbing_function,
)
from efpsn.experiments.common import Column, format_table, parse_floats
from efpsn.experiments.sweep import Series, load_problem, with_config

pytestmark = pytest.mark.timeout(900)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="efpsn")
    register(root.add_subparsers(dest="command", required=True))
    return root


def by_mode(rows: list[dict], series: str) -> dict[tuple[str, float | None], dict]:
    return {(r["mode"], r["gamma"]): r for r in rows if r["series"] == series}


def assert_figure(path: Path, *, min_width: int = 300, min_height: int = 200) -> None:
    """A real plot: a PNG of at least this size with something drawn on it (axes, curves,
    text), not an empty or blank canvas."""
    import numpy as np
    from matplotlib import image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = image.imread(path)
    height, width = pixels.shape[:2]
    assert width >= min_width and height >= min_height, (path, pixels.shape)
    rgb = (pixels[..., :3].reshape(-1, 3) * 255).astype(np.uint8)
    ink = float((rgb < 230).any(axis=1).mean())  # share of pixels that are not (near) white
    assert 0.01 < ink < 0.95, (path, ink)
    assert len(np.unique(rgb, axis=0)) >= 16, path  # lines, markers and anti-aliased text


# ------------------------------------------------------------------------------ plumbing


def test_cli_offers_every_experiment_with_quick_and_out() -> None:
    p = parser()
    for name in (*EXPERIMENTS, "all"):
        args = p.parse_args(["experiment", name, "--quick", "--out", "somewhere"])
        assert args.quick and args.out == "somewhere" and callable(args.handler)
    args = p.parse_args(["experiment", "accuracy-convex", "--gammas", "1e-2,1,1e3",
                         "--iterations", "50", "--no-extras"])
    assert args.gammas == (0.01, 1.0, 1000.0) and args.iterations.count == 50 and args.no_extras
    with pytest.raises(SystemExit):
        p.parse_args(["experiment", "no-such-experiment"])


def test_quick_runs_never_overwrite_full_ones_by_default() -> None:
    assert default_out("attack", quick=False) == Path("results/experiments/attack")
    assert default_out("attack", quick=True) == Path("results/experiments/attack-quick")
    assert default_out("attack", quick=True, root=Path("x")) == Path("x/attack-quick")


def test_all_rejects_unknown_skip(tmp_path: Path) -> None:
    args = parser().parse_args(["experiment", "all", "--skip", "attack,typo", "--out",
                                str(tmp_path)])
    with pytest.raises(ValueError, match="typo"):
        args.handler(args)


def test_parse_floats_and_table() -> None:
    assert parse_floats("1e-2, 1,1e4") == (0.01, 1.0, 1e4)
    with pytest.raises(ValueError, match="abc"):
        parse_floats("1,abc")
    table = format_table([{"a": "x", "b": 1.5}], [Column("a", "A"), Column("b", "B", ".2f")])
    assert table.splitlines() == ["| A | B    |", "|---|------|", "| x | 1.50 |"]


def test_with_config_refuses_a_structural_change() -> None:
    problem = load_problem(accuracy_convex.PROFILES["quick"].base)
    assert with_config(problem, problem.config.replace(gamma=1e6, mask="independent")).shards \
        is problem.shards
    with pytest.raises(ValueError, match="topology"):
        with_config(problem, problem.config.replace(topology="complete"))


# ------------------------------------------------------------------------------ Sec. 5.1


def test_perturbation_formula_is_the_corrected_paper_one(tmp_path: Path) -> None:
    # execute: through the CLI handler, as `efpsn experiment perturbation --quick`
    args = parser().parse_args(["experiment", "perturbation", "--quick", "--out", str(tmp_path)])
    assert args.handler(args) == 0
    # assert
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["rows"][0]["function"] == (
        "5.853*x1^2*x2 - 1.237*x2^3 + 0.708*x1 - 0.665*x2 + 0.090"
    ) == perturbing_function.CORRECT
    assert results["matches_pinned"] is True
    assert results["basis"] == (
        "{0.500, 0.866*x2, 3.307*x2^3 - 1.984*x2, 0.866*x1, 2.905*x1^2*x2 - 0.968*x2}"
    )
    assert_figure(tmp_path / "perturbation.png")


# ------------------------------------------------------------------------------ Theorem 4.1


def test_privacy_epsilon_decreases_in_gamma(tmp_path: Path) -> None:
    summary = epsilon.run(epsilon.PROFILES["quick"], out=tmp_path)
    with open(tmp_path / "curves.csv") as handle:
        curves = list(csv.DictReader(handle))
    for n in (5, 9):
        for topology in epsilon.TOPOLOGIES:
            eps = [float(r["epsilon"]) for r in curves
                   if r["agents"] == str(n) and r["topology"] == topology]
            assert len(eps) == len(epsilon.PROFILES["quick"].gammas)
            assert all(a > b for a, b in itertools.pairwise(eps)), (n, topology)
    ring = next(r for r in summary["rows"] if r["agents"] == 5 and r["topology"] == "ring")
    # a smaller epsilon needs more noise; the inverse really reaches the target
    assert ring["gamma_for_eps=0.1"] > ring["gamma_for_eps=1"]
    from efpsn.privacy.theorem import account
    from efpsn.topology import build_graph

    got = account(build_graph("ring", 5), gamma=ring["gamma_for_eps=1"], p=1.0, q=2.0,
                  sensitivity=1.0, delta=1e-5).epsilon
    assert got == pytest.approx(1.0, rel=1e-12) and got <= 1.0
    # the complete graph (largest mu_2) is the most private at every gamma
    complete = next(r for r in summary["rows"] if r["agents"] == 5
                    and r["topology"] == "complete")
    assert complete["eps@1000"] < ring["eps@1000"]
    assert_figure(tmp_path / "privacy.png")


# ------------------------------------------------------------------------------ Sec. 5.2


@pytest.mark.slow
def test_accuracy_convex_zero_sum_keeps_accuracy_where_the_baseline_collapses(
    tmp_path: Path,
) -> None:
    # prepare: DSGD batch 64 with the paper's schedule shape over 400 rounds, gamma = 1e3, and
    # one tiny extra row (full-batch GT at gamma = 1e6) to exercise that path too
    settings = accuracy_convex.ConvexSettings(
        profile="test",
        main=Series(name="dsgd-b64", label="test", iterations=400, gammas=(1e3,), eval_every=200),
        extras=(Series(name="gt-full", label="GT test", algorithm="gt", batch_size=0,
                       schedule=f"constant:{accuracy_convex.GT_LR}", iterations=40,
                       gammas=(1e6,), modes=("zero-sum",), eval_every=20),),
    )
    # execute
    summary = accuracy_convex.run(settings, out=tmp_path)
    # assert
    rows = by_mode(summary["rows"], "dsgd-b64")
    clean, zero_sum, independent = (rows[("none", None)], rows[("zero-sum", 1e3)],
                                    rows[("independent", 1e3)])
    assert zero_sum["masks_sum_to_zero"] and zero_sum["max_abs_eta"] > 1.0  # real, large noise
    assert abs(zero_sum["accuracy"] - clean["accuracy"]) <= 0.01
    assert independent["accuracy"] < clean["accuracy"] - 0.10
    assert zero_sum["deviation"] < 1.1 * clean["deviation"]
    assert independent["deviation"] > 10 * zero_sum["deviation"]
    gt = by_mode(summary["rows"], "gt-full")
    assert abs(gt[("zero-sum", 1e6)]["accuracy"] - gt[("none", None)]["accuracy"]) <= 0.02
    for name in ("rows.csv", "results.json", "table.md"):
        assert (tmp_path / name).stat().st_size > 0
    for name in ("accuracy_convex.png", "accuracy_convex_extras.png"):
        assert_figure(tmp_path / name)


@pytest.mark.slow
@pytest.mark.slow
def test_accuracy_nonconvex_zero_sum_tracks_noise_free(tmp_path: Path) -> None:
    settings = accuracy_nonconvex.NonconvexSettings(
        profile="test",
        main=Series(name="dsgd-b64", label="test", iterations=40, gammas=(1e3,), eval_every=40),
        refreshes=("every:1",), refresh_gammas=(1e3,),
    )
    summary = accuracy_nonconvex.run(settings, out=tmp_path)
    refreshed = by_mode(summary["rows"], "dsgd-b64-all")[("zero-sum", 1e3)]
    assert refreshed["masks_sum_to_zero"] and refreshed["periods_checked"] == 40
    assert (refreshed["refresh"], refreshed["N"]) == ("every:1", 13_427)
    assert math.isfinite(refreshed["grad_norm2"])
    rows = by_mode(summary["rows"], "dsgd-b64")
    clean, zero_sum, independent = (rows[("none", None)], rows[("zero-sum", 1e3)],
                                    rows[("independent", 1e3)])
    assert summary["estimate"]["seconds_per_round"] > 0
    # 40 rounds leave LeNet near chance accuracy (it needs a few hundred to leave the sigmoid
    # plateau), so the check is on the paper's other panel: stationarity of the true objective
    assert zero_sum["grad_norm2"] < 1.5 * clean["grad_norm2"]
    assert independent["grad_norm2"] > 5 * zero_sum["grad_norm2"]
    assert abs(zero_sum["accuracy"] - clean["accuracy"]) <= 0.05
    assert_figure(tmp_path / "accuracy_nonconvex.png")


# ------------------------------------------------------------------------------ Sec. 5.3


def test_idlg_label_inference_reads_the_negative_row() -> None:
    problem = load_problem(accuracy_convex.PROFILES["quick"].base)
    x = idlg.attack_point(problem, 5)
    shard = problem.shards[0]
    for index in range(5):
        image, label = shard.images[index].unsqueeze(0), shard.labels[index].reshape(1)
        # the perturbation only moves the bias: the label stays readable at any gamma
        pert = idlg.agent1_perturbation(problem, 1e4, 0)
        grad = idlg.observed_gradient(problem.task, x, image, label, pert)
        assert idlg.infer_label(problem.task, grad) == int(label)


@pytest.mark.slow
@pytest.mark.slow
def test_attack_psnr_falls_as_gamma_rises(tmp_path: Path) -> None:
    # prepare: logistic regression at a trained point, LeNet at DLG's initial point
    base = {"seeds": (0,), "images_per_seed": 2, "iterations": 25, "snapshots": 5,
            "adaptive": True, "perturbations": ("last-bias",), "multi_round": False}
    runs = [
        attack.AttackSettings(profile="test", models=("logreg",), gammas=(0.0, 1e2, 1e4),
                              attack_rounds=(50,), **base),
        attack.AttackSettings(profile="test", models=("lenet",), gammas=(0.0, 1e4),
                              attack_rounds=(0,), **{**base, "images_per_seed": 1}),
    ]
    for i, settings in enumerate(runs):
        # execute
        summary = attack.run(settings, out=tmp_path / str(i))
        # assert
        table = [r for r in summary["summary"] if r["attacker"] == "iDLG"]
        psnr = [r["psnr_mean"] for r in table]
        assert [r["gamma"] for r in table] == list(settings.gammas)
        assert all(a > b for a, b in itertools.pairwise(psnr)), psnr
        assert psnr[0] > 40  # without noise the attack really works
        assert all(r["label_accuracy"] == 1.0 for r in summary["summary"])
        adaptive = [r for r in summary["summary"] if r["attacker"] == attack_report.ADAPTIVE]
        assert adaptive and adaptive[0]["psnr_mean"] > psnr[-1]  # dropping the bias helps
        model = settings.models[0]
        grid = tmp_path / str(i) / f"attack_{model}_round{settings.attack_rounds[0]}.png"
        assert_figure(grid, min_width=100, min_height=100)


# ------------------------------------------------------------------------------ network


@pytest.mark.process
@pytest.mark.slow
def test_network_check_reproduces_the_simulator_bitwise(tmp_path: Path) -> None:
    settings = dataclasses.replace(network_check.PROFILES["quick"], iterations=30)
    summary = network_check.run(settings, out=tmp_path)
    assert summary["bitwise_equal"] and summary["max_abs_diff"] == 0.0
    assert summary["config"]["gamma"] == 1e3 and summary["config"]["key_bits"] == 2048
    assert all(math.isclose(c["network"], c["simulator"], abs_tol=0.0)
               for c in summary["comparison"])
    # ... and not only by its own account: the agents' model.npy files, read here, equal a
    # simulation run here with the configuration and noise seed the check reports
    from efpsn.launch.summary import load_agent_results
    from efpsn.params.config import RunConfig
    from efpsn.simulator import run_simulation

    config = RunConfig.from_dict(summary["config"])
    assert config.iterations.count == 30 and config.mask == "zero-sum"
    names = [f"agent{i + 1}" for i in range(config.agents)]
    results, xs = load_agent_results(tmp_path / "network", names)
    assert [r["final"]["round"] for r in results] == [30] * config.agents
    sim = run_simulation(config, noise_seed=summary["noise_seed"])
    assert [x.numpy().tobytes() for x in xs] == [x.numpy().tobytes() for x in sim.xs]


def test_combination_weights_cancel_what_they_claim() -> None:
    rng = torch.Generator().manual_seed(0)
    a, b, c = (torch.rand(6, generator=rng, dtype=torch.float64) for _ in range(3))
    const = torch.rand(6, generator=rng, dtype=torch.float64)
    slope = torch.rand(6, generator=rng, dtype=torch.float64)

    def combine(ws: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        return sum(w * v for w, v in zip(ws, values, strict=True))

    two = idlg.combination_weights([a, b])
    three = idlg.combination_weights([a, b, c])
    # two rounds cancel a constant offset, not one that is affine in each coordinate
    assert torch.count_nonzero(combine(two, [const, const])) == 0
    assert combine(two, [const + slope * a, const + slope * b]).abs().max() > 1e-3
    # three rounds cancel the affine one (the gradient of the K = 2 power family)
    torch.testing.assert_close(combine(three, [const + slope * x for x in (a, b, c)]),
                               torch.zeros(6, dtype=torch.float64), rtol=0, atol=1e-15)
    assert max(float(w.abs().max()) for w in three) == 1.0
    with pytest.raises(ValueError, match="2 or 3 rounds, got 1"):
        idlg.combination_weights([a])


def test_all_parameter_perturbation_offsets_cancel_across_rounds_only_for_k1() -> None:
    problem = load_problem(accuracy_convex.PROFILES["quick"].base)
    xa, xb = idlg.attack_point(problem, 5), idlg.attack_point(problem, 8)
    image, label = problem.shards[0].images[0].unsqueeze(0), problem.shards[0].labels[0].reshape(1)
    clean = [idlg.observed_gradient(problem.task, x, image, label, None) for x in (xa, xb)]
    for name, cancels in (("all-k1", True), ("all-k2", False)):
        setting = idlg.perturbation_problem(problem, name)
        assert setting.system.measure == "uniform" and setting.indices.size == 7850
        pert = idlg.agent1_perturbation(setting, 1e4, 0)
        seen = [idlg.observed_gradient(problem.task, x, image, label, pert) for x in (xa, xb)]
        offset = seen[0] - clean[0]
        assert torch.count_nonzero(offset) == 7850 and offset.abs().max() > 10  # every coordinate
        residual = (seen[0] - seen[1]) - (clean[0] - clean[1])
        assert (residual.abs().max() < 1e-9) == cancels, (name, float(residual.abs().max()))


@pytest.mark.slow
@pytest.mark.slow
def test_multi_round_attacker_defeats_k1_and_three_rounds_defeat_k2(tmp_path: Path) -> None:
    # prepare: logistic regression at round 50, one image, gamma 1e4 only (and no noise)
    settings = attack.AttackSettings(profile="test", models=("logreg",), gammas=(0.0, 1e4),
                                     seeds=(0,), images_per_seed=1, iterations=20, snapshots=2,
                                     attack_rounds=(50,))
    # execute
    summary = attack.run(settings, out=tmp_path)
    # assert
    got = {(r["perturbation"], r["attacker"], r["gamma"]): r["psnr_mean"]
           for r in summary["summary"]}
    assert got[("all-k1", attack_report.PLAIN, 1e4)] < 15  # the plain attacker is stopped...
    assert got[("all-k1", attack_report.TWO_ROUNDS, 1e4)] > 60  # ...two rounds are not
    assert got[("all-k2", attack_report.TWO_ROUNDS, 1e4)] < 15  # K = 2 stops two rounds...
    assert got[("all-k2", attack_report.THREE_ROUNDS, 1e4)] > 30  # ...three rounds are not
    assert (tmp_path / "attack_logreg_round50_all-k2.png").stat().st_size > 0


def test_accuracy_convex_can_perturb_every_parameter() -> None:
    settings = accuracy_convex.settings_for("quick", selection="all")
    assert (str(settings.base.selection), settings.base.m, settings.base.N) == ("all", 7850, 7851)
    assert settings.profile == "quick (modified)"
    args = parser().parse_args(["experiment", "accuracy-convex", "--selection", "all"])
    assert args.selection == "all"
    with pytest.raises(ValueError, match="expected 'all'"):
        accuracy_convex.settings_for("quick", selection="last-bias")


# ------------------------------------------------------------------------------ refreshed masks


def test_refreshed_noise_is_the_seeds_noise_and_attackers_pick_rounds_in_a_period() -> None:
    import numpy as np

    from efpsn.experiments.attack_noise import Agent1Noise, attacker_rounds
    from efpsn.masks.refresh import RefreshedMask
    from efpsn.masks.seeds import exchange_seeds_fast
    from efpsn.masks.zero_sum import NoiseSpec
    from efpsn.params.refresh_setting import Refresh

    problem = load_problem(accuracy_convex.PROFILES["quick"].base)
    setting = idlg.perturbation_problem(problem, "all-k1")
    noise = Agent1Noise(setting, gamma=1e4, noise_seed=3, refresh=Refresh(5))
    c = setting.config
    mask = RefreshedMask(seeds=exchange_seeds_fast(problem.graph, noise_seed=3)[0],
                         spec=NoiseSpec(gamma=1e4, p=c.p, precision=c.precision,
                                        num_coefficients=setting.N), refresh=Refresh(5))
    etas = {t: noise.perturbation(t).eta for t in (0, 3, 4, 5, 12)}  # type: ignore[union-attr]
    for t, eta in etas.items():
        assert np.array_equal(eta, mask.values(t))  # the network's integers, / 10^P
    assert np.array_equal(etas[0], etas[4]) and not np.array_equal(etas[4], etas[5])
    mean = noise.mean_perturbation(3, 7).eta  # type: ignore[union-attr]
    np.testing.assert_allclose(mean, (2 * mask.values(3) + 5 * mask.values(5)) / 7, rtol=1e-12)
    fixed = Agent1Noise(setting, gamma=1e4, noise_seed=3, refresh=Refresh(None))
    assert fixed.perturbation(0) is fixed.perturbation(99) is fixed.mean_perturbation(0, 50)
    assert Agent1Noise(setting, gamma=0.0, noise_seed=3, refresh=Refresh(1)).perturbation(7) \
        is None
    # the attacker knows R: its rounds share x_1's period when they fit in it
    assert attacker_rounds(50, refresh=Refresh(None), count=3, gap=10) == [50, 60, 70]
    assert attacker_rounds(50, refresh=Refresh(10), count=3, gap=10) == [50, 54, 58]
    assert attacker_rounds(50, refresh=Refresh(100), count=2, gap=10) == [50, 60]
    assert attacker_rounds(50, refresh=Refresh(1), count=2, gap=10) == [50, 60]
    assert attacker_rounds(58, refresh=Refresh(10), count=2, gap=10) == [58, 59]
    assert attacker_rounds(50, refresh=Refresh(2), count=3, gap=10) == [50, 60, 70]


def test_quick_attack_has_refreshed_and_fixed_multi_round_rows() -> None:
    quick = attack.PROFILES["quick"]
    plans = {(name, refresh): plan for name, refresh, plan in attack._jobs(quick, 50)}
    assert (attack_report.TWO_ROUNDS in {a for _, a in plans[("all-k1", "never")]})
    assert {a for _, a in plans[("all-k1", "every:1")]} == {
        attack_report.PLAIN, attack_report.TWO_ROUNDS, attack_report.THREE_ROUNDS, attack_report.AVERAGING}
    assert {a for _, a in plans[("all-k1", "every:10")]} == {attack_report.TWO_ROUNDS, attack_report.AVERAGING}
    args = parser().parse_args(["experiment", "attack", "--refreshes", "every:1,every:5",
                                "--refresh-gammas", "1,1e6", "--averaging-rounds", "300",
                                "--perturbations", "none"])
    assert (args.refreshes, args.refresh_gammas, args.averaging_rounds, args.perturbations) == (
        ("every:1", "every:5"), (1.0, 1e6), 300, ())
    with pytest.raises(ValueError, match="'every:R'"):
        attack.settings_for("quick", refreshes=("never",))


def test_attack_rounds_asked_for_get_every_attacker_or_a_refusal(tmp_path: Path) -> None:
    # a late round asked for runs the refreshed masks' attackers there, not an empty table
    late = attack.settings_for("quick", attack_rounds=(1900,), perturbations=(),
                               refreshes=("fading",))
    assert late.extended_rounds == (1900,)
    assert [(name, refresh) for name, refresh, _ in attack._jobs(late, 1900)] == [
        ("all-k1", "fading")]
    assert attack.settings_for("quick", attack_rounds=(0, 50)).extended_rounds == (50,)
    empty = attack.settings_for("quick", attack_rounds=(0,), perturbations=(), refreshes=())
    with pytest.raises(ValueError, match="nothing to attack at rounds 0 with perturbations "
                                         "none and refreshes none"):
        attack.run(empty, out=tmp_path)
    assert list(tmp_path.iterdir()) == []  # refused before it wrote anything


@pytest.mark.slow
@pytest.mark.slow
def test_refreshed_masks_stop_the_multi_round_attacker_that_fixed_ones_do_not(
    tmp_path: Path,
) -> None:
    # prepare: logistic regression, one image, every parameter perturbed (K = 1) at gamma 1e4:
    # the fixed mask, a mask refreshed every round, and one refreshed every 10 rounds
    settings = attack.AttackSettings(
        profile="test", models=("logreg",), gammas=(0.0, 1e4), seeds=(0,), images_per_seed=1,
        iterations=20, snapshots=2, attack_rounds=(50,), perturbations=("all-k1",),
        refreshes=("every:1", "every:10"), refresh_gammas=(1e4,), averaging_rounds=200)
    # execute
    attack.run(settings, out=tmp_path)
    # assert: every record in results.json names its perturbation, refresh, attacker and PSNR
    records = json.loads((tmp_path / "results.json").read_text())["rows"]
    got = {(r["refresh"], r["attacker"]): r["psnr"] for r in records
           if r["perturbation"] == "all-k1"}
    assert got[("never", attack_report.TWO_ROUNDS)] >= 30  # the fixed mask cancels in 2 rounds...
    assert got[("every:1", attack_report.TWO_ROUNDS)] <= 15  # ...fresh noise every round does not
    assert got[("every:1", attack_report.THREE_ROUNDS)] <= 15
    assert got[("every:1", attack_report.AVERAGING)] <= 15  # 200 rounds of gamma 1e4: still noise
    assert got[("every:10", attack_report.TWO_ROUNDS)] >= 30  # two rounds of one period cancel it
    assert {r["rounds_seen"] for r in records if r["attacker"] == attack_report.AVERAGING} == {200}
    assert_figure(tmp_path / "attack_refresh_psnr.png")


def _attack_results(path: Path) -> Path:
    """A hand-made attack results.json: refreshed rows of the "all-k1" perturbation."""
    def row(refresh: str, attacker: str, gamma: float, psnr: float, image: int = 0) -> dict:
        return {"model": "logreg", "perturbation": "all-k1", "refresh": refresh,
                "attacker": attacker, "gamma": gamma, "psnr": psnr, "image": image}

    rows = [row("every:1", attack_report.AVERAGING, 1e4, 12.0), row("every:1", attack_report.PLAIN, 1e4, 3.0),
            row("every:1", attack_report.AVERAGING, 1e4, 14.5, image=1),
            row("every:1", attack_report.AVERAGING, 1e6, 4.0),
            row("every:10", attack_report.AVERAGING, 1e4, 5.0),
            row("every:10", attack_report.TWO_ROUNDS, 1e6, 98.0),  # cancels the period's mask: any gamma
            row("every:10", attack_report.AVERAGING, 1e6, 4.0),
            {**row("every:1", attack_report.PLAIN, 1e4, 90.0), "perturbation": "last-bias"}]
    path.write_text(json.dumps({"experiment": "attack", "rows": rows}))
    return path


@pytest.mark.slow
def test_accuracy_convex_refreshed_rows_and_their_frontier(tmp_path: Path) -> None:
    # prepare: 40 DSGD rounds, the mask fixed, refreshed every round and every 10 rounds, every
    # parameter perturbed at gamma 1e4; 20 rounds of full-batch GT; every:1 clipped to 1
    from efpsn.cli.main import main as efpsn_main

    settings = accuracy_convex.ConvexSettings(
        profile="test",
        main=Series(name="dsgd-b64", label="test", iterations=40, gammas=(1e3,),
                    modes=("zero-sum",), eval_every=20),
        refreshes=("never", "every:1", "every:10"), refresh_gammas=(1e4,), gt_iterations=20,
        clips=(1.0,), clip_gammas=(1e4,),
        attack_results=(str(_attack_results(tmp_path / "attack.json")),))
    # execute
    summary = accuracy_convex.run(settings, out=tmp_path / "out")
    # assert: every refreshed run's masks summed to zero in every one of its periods
    rows = {(r["series"], r["mode"], r["refresh"]): r for r in summary["rows"]}
    periods = {"never": 0, "every:1": 40, "every:10": 4}
    for refresh, count in periods.items():
        row = rows[("dsgd-b64-all", "zero-sum", refresh)]
        assert row["masks_sum_to_zero"] and row["periods_checked"] == count
        assert (row["selection"], row["N"], row["gamma"]) == ("all", 7851, 1e4)
    assert rows[("dsgd-b64", "zero-sum", "never")]["N"] == 10  # the paper's rows are unchanged
    # gradient tracking takes the fixed and the fading mask only (every:R never converges)
    gt = {k[2]: r for k, r in rows.items() if k[:2] == ("gt-full-all", "zero-sum")}
    assert set(gt) == {"never", "fading"} and gt["fading"]["periods_checked"] == 20
    assert gt["fading"]["masks_sum_to_zero"]
    frontier = {(r["series"], r["refresh"]): r for r in summary["frontier"]}
    assert len(frontier) == 6  # dsgd: never, every:1, every:10; gt: never, fading; clipped
    # the strongest attacker on any image; one that cancels the mask counts at every gamma
    assert frontier[("dsgd-b64-all", "every:1")]["psnr_logreg"] == 14.5
    assert frontier[("dsgd-b64-all", "every:10")]["psnr_logreg"] == 98.0
    assert frontier[("dsgd-b64-all", "never")]["psnr_logreg"] is None  # not measured
    assert frontier[("dsgd-b64-all", "every:1")]["psnr_lenet"] is None
    # epsilon: only clipped, refreshed-every-round DSGD has one, and it is `efpsn privacy`'s
    clipped = frontier[("dsgd-b64-all-clip1", "every:1")]
    assert clipped["accuracy_loss"] == pytest.approx(
        rows[("dsgd-b64-all-clip1", "none", "never")]["accuracy"] - clipped["accuracy"])
    assert all(math.isinf(r["epsilon"]) for k, r in frontier.items() if k != (
        "dsgd-b64-all-clip1", "every:1"))
    assert efpsn_main(["privacy", "--algorithm", "dsgd", "--refresh", "every:1", "--selection",
                       "all", "--m", "7850", "--N", "7851", "--clip", "1", "--gamma", "1e4", "--iterations", "40",
                       "--batch-size", "64", "--json", str(tmp_path / "eps.json")]) == 0
    assert clipped["epsilon"] == json.loads((tmp_path / "eps.json").read_text())["epsilon"]
    assert "Refreshed masks" in (tmp_path / "out" / "table.md").read_text()
    assert_figure(tmp_path / "out" / "accuracy_convex_frontier.png")
    # later attack results redraw the frontier without running the sweep again
    later = json.loads((tmp_path / "attack.json").read_text())
    later["rows"].append({**later["rows"][0], "psnr": 40.0, "image": 7})
    (tmp_path / "later.json").write_text(json.dumps(later))
    args = parser().parse_args(["experiment", "accuracy-convex", "--frontier-only", "--out",
                                str(tmp_path / "out"), "--attack-results",
                                str(tmp_path / "later.json")])
    redrawn = run_experiment("accuracy-convex", args)
    again = {(r["series"], r["refresh"]): r for r in redrawn["frontier"]}
    assert again[("dsgd-b64-all", "every:1")]["psnr_logreg"] == 40.0
    assert again[("dsgd-b64-all", "every:1")]["accuracy"] == frontier[
        ("dsgd-b64-all", "every:1")]["accuracy"]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["attack_results"] == [
        str(tmp_path / "later.json")]
    assert " 40.0 |" in (tmp_path / "out" / "table.md").read_text()


def test_profiles_keep_the_paper_rows_and_add_refreshed_ones() -> None:
    for module in (accuracy_convex, accuracy_nonconvex):
        for name, settings in module.PROFILES.items():
            configs = [c for s in settings.series() for c in s.configs(settings.base)]
            paper = settings.main.configs(settings.base)
            assert all((str(c.refresh), c.clip, str(c.selection), c.N)
                       == ("never", 0.0, "last-bias", 10)
                       for c in paper), name
            refreshed = [c for c in configs if c.refresh.refreshed]
            assert refreshed and all(str(c.selection) == "all" and c.K == 1 for c in refreshed)
    full = accuracy_convex.PROFILES["full"]
    assert full.main.iterations == 10_000 and full.main.gammas == (
        1e-2, 1e-1, 1e0, 1e1, 1e2, 1e3, 1e4)
    dsgd = next(s for s in full.refreshed() if s.name == "dsgd-b64-all")
    assert (dsgd.iterations, dsgd.batch_size, dsgd.schedule, dsgd.refreshes) == (
        10_000, 64, "paper", ("never", "every:1", "every:10", "every:100"))
    args = parser().parse_args(["experiment", "accuracy-convex", "--refreshes", "none",
                                "--clips", "1,10", "--attack-results", "a,b"])
    settings = accuracy_convex.settings_for("quick", refreshes=args.refreshes, clips=args.clips,
                                            attack_results=args.attack_results)
    assert (settings.refreshed(), settings.clips, settings.attack_results) == (
        (), (1.0, 10.0), ("a", "b"))
    args = parser().parse_args(["experiment", "accuracy-nonconvex", "--refreshes", "every:1",
                                "--refresh-gammas", "1e6"])
    lenet = accuracy_nonconvex.settings_for("quick", refreshes=args.refreshes,
                                            refresh_gammas=args.refresh_gammas)
    assert [(str(c.refresh), c.gamma, c.N) for c in lenet.series()[1].configs(lenet.base)] == [
        ("every:1", 1e6, 13_427)]
