"""A neural network's default run: mini-batches of 64 (a pure function of seed, agent and round),
agt with momentum on the one-cycle step, and the fading masks, exactly zero-sum every round."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from efpsn.departure.remask import part_totals
from efpsn.masks.fading import FadingMask
from efpsn.params.config import RunConfig
from efpsn.params.schedules import OneCycle, make_schedule
from efpsn.params.step_rule import MINI_BATCH_FADE_FLOOR
from efpsn.problem import build_problem
from efpsn.simulator import make_mask_providers, run_simulation
from efpsn.tasks.batches import BatchSampler

ROUNDS = 6
LENET = RunConfig(task="lenet", iterations=ROUNDS, eval_every=3)


def test_the_mini_batch_default_s_masks_sum_to_zero_every_round() -> None:
    # prepare: LeNet's defaults, and the masks every agent runs (fading, from seeds)
    config = LENET.resolved()
    problem = build_problem(config)
    providers = make_mask_providers(problem, noise_seed=3)
    assert config.batch_size.size == 64 and config.refresh.fading
    assert config.refresh.floor == MINI_BATCH_FADE_FLOOR  # the batch noise never dies out
    assert all(isinstance(p, FadingMask) for p in providers)
    # assert: both integer parts of round t's masks sum to zero over the agents, every round
    # (and in the budget's last rounds, where the fresh part sits at its floor); the fresh
    # part is new every round (what differencing two rounds sees)
    budget = RunConfig(task="lenet").resolved().iterations.total
    for t in (*range(ROUNDS), budget - 101, budget - 100, budget - 1):
        totals = part_totals(providers, t)
        assert totals and all(not np.any(total) for total in totals.values()), t
    assert not np.array_equal(providers[0].fresh(1)[0], providers[0].fresh(2)[0])
    assert providers[0].faded(budget - 100) == MINI_BATCH_FADE_FLOOR
    # execute: the run itself checks its masks in every round it steps
    result = run_simulation(LENET, noise_seed=3)
    assert result.periods_zero_sum == ROUNDS and result.every_period_zero_sum
    assert result.masks_sum_to_zero()
    assert result.timings["rounds"] == ROUNDS


def test_each_round_s_batch_is_a_function_of_seed_agent_and_round() -> None:
    # the batches an agent draws restart where they were (a restart, the network, the simulator)
    first = BatchSampler(640, 64, seed=0, agent=2)
    again = BatchSampler(640, 64, seed=0, agent=2)
    late = [again.indices(t) for t in (17, 3, 12)]
    assert all(np.array_equal(first.indices(t), b) for t, b in zip((17, 3, 12), late))
    epoch = np.concatenate([first.indices(t).numpy() for t in range(10)])
    assert sorted(epoch) == list(range(640))  # an epoch is a permutation of the shard


@pytest.mark.parametrize("total", [1, 2, 7, 2000])
def test_onecycle_warms_up_then_decays_linearly_and_never_reaches_zero(total: int) -> None:
    step = make_schedule("onecycle:0.1", iterations=total)
    assert isinstance(step, OneCycle) and step.warmup == int(total * 0.15)
    values = [step(t) for t in range(total + 3)]
    peak = values.index(max(values))
    assert max(values) == pytest.approx(0.1) and peak == step.warmup
    assert all(a <= b for a, b in itertools.pairwise(values[:peak + 1]))  # the warm-up
    assert all(a > b for a, b in itertools.pairwise(values[peak:total]))  # the decay
    assert values[total - 1] == values[total + 2] > 0  # past the end: the last value


def test_onecycle_refuses_what_cannot_cycle() -> None:
    with pytest.raises(ValueError, match="finite positive"):
        OneCycle(peak=0.0, warmup=0, total=10)
    with pytest.raises(ValueError, match="warmup < total"):
        OneCycle(peak=0.1, warmup=10, total=10)
