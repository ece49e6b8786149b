"""The round driver (efpsn/optimize/driver.py) alone: the step size of each round, the evaluation
cadence, resuming from a saved state, and the convergence measures computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import AgentState, StepContext
from efpsn.optimize.driver import RoundDriver, progress, worst
from efpsn.params.schedules import make_schedule


def _driver(name: str = "dsgd", *, iterations: int = 7, eval_every: int = 3,
            resume: AgentState | None = None, lrs: list[float] | None = None) -> RoundDriver:
    seen = lrs if lrs is not None else []

    def oracle(x: torch.Tensor, t: int) -> torch.Tensor:
        return x - 1.0  # the gradient of ||x - 1||^2 / 2

    schedule = make_schedule("paper:0.5", iterations=iterations)

    def recorded(t: int) -> float:
        seen.append(t)
        return schedule(t)

    ctx = StepContext(agent=0, weights={0: 0.5, 1: 0.5}, lr=0.0, oracle=oracle)
    x0 = None if resume is not None else torch.zeros(3, dtype=torch.float64)
    return RoundDriver(algorithm=make_algorithm(name), context=ctx, schedule=recorded,
                       iterations=iterations, eval_every=eval_every, x0=x0, resume_from=resume)


def test_each_round_uses_its_own_step_size_and_evaluations_come_on_cadence() -> None:
    used: list[int] = []
    driver = _driver(lrs=used)
    assert used == [0]  # init asks for round 0's step size
    due = []
    while not driver.done:
        inbox = {1: {"x": torch.full((3,), float(driver.t), dtype=torch.float64)}}
        due.append(driver.step(inbox))
    assert used[1:] == list(range(7)) and driver.t == 7
    assert due == [False, False, True, False, False, True, True]  # rounds 3, 6 and the last


def test_the_step_is_the_algorithm_s_step_bit_for_bit() -> None:
    driver = _driver()
    algorithm = make_algorithm("dsgd")
    schedule = make_schedule("paper:0.5", iterations=7)
    ctx = StepContext(agent=0, weights={0: 0.5, 1: 0.5}, lr=schedule(0),
                      oracle=lambda x, t: x - 1.0)
    state, _ = algorithm.init(torch.zeros(3, dtype=torch.float64), ctx)
    inbox = {1: {"x": torch.ones(3, dtype=torch.float64)}}
    driver.step(inbox)
    state, outbox = algorithm.step(state, inbox, ctx)
    assert torch.equal(driver.state["x"], state["x"]) and torch.equal(driver.outbox["x"],
                                                                      outbox["x"])


def test_a_resumed_driver_starts_at_the_saved_round_with_its_message() -> None:
    saved = AgentState(t=4, tensors={"x": torch.arange(3, dtype=torch.float64),
                                     "y": torch.ones(3, dtype=torch.float64),
                                     "g": torch.zeros(3, dtype=torch.float64)})
    driver = _driver("gt", resume=saved)
    assert driver.t == 4 and set(driver.outbox) == {"x", "y"}
    assert driver.outbox["x"] is saved["x"]
    with pytest.raises(ValueError, match="not both"):
        _driver(resume=saved).__class__(
            algorithm=make_algorithm("dsgd"), context=driver.context, schedule=lambda t: 0.1,
            iterations=5, eval_every=1, x0=torch.zeros(3), resume_from=saved)
    with pytest.raises(ValueError, match="iterations >= 1"):
        RoundDriver(algorithm=make_algorithm("dsgd"), context=driver.context,
                    schedule=lambda t: 0.1, iterations=0, eval_every=1, x0=torch.zeros(3))


def test_progress_measures_by_hand() -> None:
    before = AgentState(t=0, tensors={"x": torch.tensor([0.0, 0.0], dtype=torch.float64)})
    state = AgentState(t=1, tensors={"x": torch.tensor([3.0, 4.0], dtype=torch.float64),
                                     "y": torch.tensor([0.0, 2.0], dtype=torch.float64)})
    inbox = {1: {"x": torch.tensor([1.0, 0.0], dtype=torch.float64)},
             2: {"x": torch.tensor([0.0, -2.0], dtype=torch.float64)}}
    got = progress(before, state, inbox)
    assert got["step"] == 5.0 and got["gap"] == 2.0 and got["tracker"] == 2.0
    assert got["relative_step"] == 1.0 and got["relative_gap"] == 0.4  # ||x|| = 5
    assert "tracker" not in progress(before, before, {})
    assert progress(before, before, {})["gap"] == 0.0
    # accelerated tracking: the neighbours' extrapolated z against this agent's own z
    mine = AgentState(t=0, tensors={"x": torch.zeros(2, dtype=torch.float64),
                                    "z": torch.tensor([1.0, 1.0], dtype=torch.float64)})
    sent = {1: {"z": torch.tensor([1.0, 4.0], dtype=torch.float64)}}
    assert progress(mine, mine, sent)["gap"] == 3.0
    merged = worst([{"step": 1.0, "gap": math.nan}, {"step": 3.0, "gap": 2.0}, {"step": 2.0}])
    assert merged == {"gap": 2.0, "step": 3.0}


def test_a_one_round_run_evaluating_every_round_is_allowed() -> None:
    driver = _driver("gt", iterations=1, eval_every=1)
    assert driver.step({1: driver.outbox}) and driver.done
    assert set(driver.measures) >= {"step", "gap", "tracker"}


def test_relative_measures_divide_by_the_norm_only_above_one() -> None:
    # ||x|| = 0.5: the relative measures equal the absolute ones (max(1, ||x||) = 1); ||x|| = 4:
    # divided by 4
    before = AgentState(t=0, tensors={"x": torch.zeros(2, dtype=torch.float64)})
    for x, scale in (([0.3, 0.4], 1.0), ([0.0, 4.0], 4.0)):
        after = AgentState(t=1, tensors={"x": torch.tensor(x, dtype=torch.float64)})
        inbox = {1: {"x": torch.tensor([0.0, 1.0], dtype=torch.float64)}}
        out = progress(before, after, inbox)
        assert out["relative_step"] == out["step"] / scale and out["gap"] == 1.0
        assert out["relative_gap"] == 1.0 / scale


def test_the_worst_of_measures_nobody_could_compute_is_nan() -> None:
    # DSGD agents report no tracker; a NaN (no finite value) stays NaN, never None or an error
    merged = worst([{"step": 0.5, "tracker": math.nan}, {"step": 2.0, "tracker": math.nan},
                    {"step": 1.0}])
    assert merged["step"] == 2.0 and math.isnan(merged["tracker"])


def test_a_rounds_context_is_reused_while_context_and_step_size_hold() -> None:
    """RoundDriver builds round t's context once per (context, step size): the same object
    while they hold (so agt's lazy weights are built once), a new one for a new step size, a
    new context (a departure's) or a step size of the other sign of zero."""
    import dataclasses

    sizes = {0: 0.1, 1: 0.1, 2: 0.2, 3: 0.0, 4: -0.0, 5: -0.0}
    driver = _driver("agt", iterations=8)
    driver.schedule = lambda t: sizes.get(t, 0.3)
    seen = [driver._round_context(t) for t in range(6)]
    assert seen[0] is seen[1] and seen[1] is not seen[2] and seen[3] is not seen[4]
    assert seen[4] is seen[5] and [c.lr for c in seen] == [sizes[t] for t in range(6)]
    assert math.copysign(1.0, seen[4].lr) == -1.0
    driver.context = dataclasses.replace(driver.context, weights={0: 0.25, 1: 0.75})
    again = driver._round_context(5)
    assert again is not seen[5] and again.weights == {0: 0.25, 1: 0.75}
    algorithm = driver.algorithm
    assert algorithm.mixing(again) is algorithm.mixing(again)
    assert algorithm.mixing(again).weights == {0: 0.625, 1: 0.375}
    assert algorithm.mixing(seen[0]).weights == {0: 0.75, 1: 0.25}
