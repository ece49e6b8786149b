"""The consensus tail (efpsn/experiments/consensus_tail.py): mixing away the fresh part's
disagreement certifies a masked run near the unmasked run's round, and the bound stays a bound."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from efpsn.data.folders import inspect_data_dir, load_data_dir
from efpsn.experiments.consensus_tail import tail_checks
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.optimum import centralized_optimum


def _problem(folder: Path, **changes: object):  # type: ignore[no-untyped-def]
    config = RunConfig(**{**inspect_data_dir(folder).run_values(), **changes})  # type: ignore[arg-type]
    problem = build_problem(config, local=load_data_dir(config, folder, holdout=0.0))
    return problem, centralized_optimum(problem.task, problem.shards).x


@pytest.mark.slow
def test_the_tail_certifies_a_masked_run_near_the_unmasked_round(wine_no_test: Path) -> None:
    # prepare: wine_no_test in 4 folders, the defaults (fading masks, gamma 1e3) and unmasked
    masked, x_star = _problem(wine_no_test)
    unmasked, _ = _problem(wine_no_test, mask="none")
    # execute: the run's own stop rule without the protocol's tails (efpsn/params/tail.py), and a
    # tail tried every 25 rounds
    stop_masked = run_simulation(masked.config.replace(tail="off"),
                                 problem=masked).timings["rounds"]
    stop_unmasked = run_simulation(unmasked.config.replace(tail="off"),
                                   problem=unmasked).timings["rounds"]
    checks = tail_checks(masked, x_star=x_star)
    # assert: measured 400 (+ 41 tail rounds) against the stop rule's 752 and the unmasked 377;
    # every certificate bounds the true distance
    assert checks[-1].certificate <= 1e-3
    assert checks[-1].round + 41 < 0.7 * stop_masked and checks[-1].round < 1.2 * stop_unmasked
    for check in checks:
        assert math.isinf(check.certificate) or check.certificate >= check.distance, check
