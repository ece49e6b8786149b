"""The degree-2 zero-sum mask experiment (efpsn/experiments/quadratic_mask.py): the
matrices cancel over the agents, the masked run still ends at x*, and the step rule with the
masked curvature is the default's when the mask is off."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from efpsn.data.folders import load_sklearn_set
from efpsn.data.local import LocalData
from efpsn.experiments.quadratic_mask import (
    masked_config,
    quadratic_masks,
    relative_gap,
)
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.topology import build_graph


def test_the_matrices_sum_to_zero_and_keep_the_public_bound() -> None:
    # prepare: the 4-ring and a complete graph of 5
    for graph in (build_graph("ring", 4, seed=0), build_graph("complete", 5, seed=0)):
        # execute
        masks = quadratic_masks(graph, 12, bound=3.0, seed=7)
        # assert: zero-sum, symmetric, ||A_i|| <= bound, and not zero
        assert np.abs(sum(masks)).max() < 1e-12
        for a in masks:
            assert np.allclose(a, a.T, rtol=0, atol=0)
            norm = float(np.abs(np.linalg.eigvalsh(a)).max())
            assert 0.5 < norm <= 3.0 + 1e-12
        assert not np.allclose(masks[0], quadratic_masks(graph, 12, bound=3.0, seed=8)[0])


def test_scale_zero_is_the_step_rule_and_a_scale_costs_rounds() -> None:
    config = RunConfig(data="local", input_shape="13", classes=3, agents=4)
    plain = config.resolved()
    same = masked_config(config, scale=0.0)
    assert (same.schedule, same.iterations, same.momentum, same.refresh) == (
        plain.schedule, plain.iterations, plain.momentum, plain.refresh)
    masked = masked_config(config, scale=0.25)
    assert 1.3 * plain.iterations.total < masked.iterations.total < 1.6 * plain.iterations.total
    assert masked.schedule.constant_step < plain.schedule.constant_step


@pytest.mark.slow
def test_a_degree_2_mask_keeps_the_run_exact_on_wine() -> None:
    # prepare: wine in 4 shards, the defaults with the masked step rule (scale 0.25)
    whole, scale = load_sklearn_set("wine")
    base = RunConfig(data="local", input_shape="13", classes=3, scale=scale, agents=4,
                     gamma=1e3)
    data = dataclasses.replace(
        whole, images=whole.images / torch.as_tensor(base.divisor, dtype=torch.float64))
    parts = np.array_split(np.random.default_rng(0).permutation(len(data)), 4)
    local = {i: LocalData(train=data.subset(p), holdout=None, test=None)
             for i, p in enumerate(parts)}
    config = masked_config(base, scale=0.25)
    problem = build_problem(config, local=local)
    masks = quadratic_masks(problem.graph, len(problem.initial_params()),
                            bound=0.25 * 7.01, seed=0)
    # execute
    unmasked = relative_gap(config.replace(mask="none"),
                            build_problem(config.replace(mask="none"), local=local), noise_seed=0)
    masked = relative_gap(config, problem, noise_seed=0, quadratic=masks)
    # assert: within the goal (measured 1.3e-7 against 2.2e-10), and the mask was on: a bigger
    # one (scale 1 at the same step) does not converge (it diverges: the local objectives are
    # not convex, and gradient tracking's disagreement modes go unstable)
    assert masked <= 1.1 * unmasked + 1e-6
    big = quadratic_masks(problem.graph, len(problem.initial_params()), bound=7.01, seed=0)
    with np.errstate(all="ignore"):
        gap = relative_gap(config, problem, noise_seed=0, quadratic=big)
    assert not gap < 1e-3  # nan or large


def test_profiling_the_linear_part_recovers_a_sample_behind_a_degree_2_mask() -> None:
    # prepare: one sample's gradients at random points plus A z + c, A symmetric and large
    from efpsn.experiments.attack_fit import Levels, LinearModel, profiled_svd_estimate
    from efpsn.experiments.attack_output import sample_gradients
    rng = np.random.default_rng(4)
    model = LinearModel(classes=3, features=5, l2=0.0)
    x = rng.uniform(-1, 1, size=5)
    points = rng.normal(size=(60, 18))
    true = np.stack([sample_gradients(model, p, x[None, :], np.array([1]))[0] for p in points])
    a = rng.normal(size=(18, 18)) * 5
    masked = true + points @ (a + a.T) + rng.normal(size=18)
    # execute
    got = profiled_svd_estimate(model, Levels(points=points, grads=masked))
    # assert: exact (the mask is linear in the point, the softmax is not)
    assert np.allclose(got, x, rtol=0, atol=1e-8)


def test_simulate_mask_degree_2_ends_at_x_star(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    # prepare: iris in 4 private folders, the defaults at gamma 1e6
    import json

    from efpsn.cli.main import main
    folders = tmp_path / "iris"
    assert main(["data", "split", "--data", "sklearn:iris", "--agents", "4",
                 "--out", str(folders)]) == 0
    out = tmp_path / "run.json"
    # execute
    code = main(["simulate", "--data-dir", str(folders), "--agents", "4", "--holdout", "0",
                 "--quiet", "--gamma", "1e6", "--mask-degree", "2", "--json", str(out)])
    # assert: the degree-2 mask was on, the rounds are the masked rule's, and the run is exact
    assert code == 0
    printed = capsys.readouterr().out
    assert "degree-2 mask: sum_i A_i = 0" in printed
    result = json.loads(out.read_text())
    assert result["final"]["relative_deviation"] < 1e-6
    assert result["settings"]["iterations"] > 585  # the default rule's rounds on iris
    # and refused where it is not built
    assert main(["simulate", "--data-dir", str(folders), "--agents", "4", "--holdout", "0",
                 "--quiet", "--algorithm", "gt", "--mask-degree", "2"]) != 0
