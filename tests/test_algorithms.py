"""Step functions: DSGD and gradient tracking on hand-made quadratics; schedules; mixing order."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from efpsn.algorithms import ALGORITHMS, make_algorithm
from efpsn.algorithms.agt import AcceleratedTracking
from efpsn.algorithms.base import StepContext, mix
from efpsn.algorithms.dsgd import DSGD
from efpsn.algorithms.gt import GradientTracking
from efpsn.params.schedules import Constant, PaperSchedule, make_schedule

RING5 = {i: ((i - 1) % 5, (i + 1) % 5) for i in range(5)}
# Metropolis weights on a 5-ring: every degree is 2, so w_ij = 1/3 and w_ii = 1/3.
WEIGHTS = {i: {i: 1 / 3, **{j: 1 / 3 for j in RING5[i]}} for i in range(5)}


def quadratic_oracles(offsets: list[torch.Tensor]) -> tuple[list, torch.Tensor]:
    """f_i(x) = 0.5 ||x - c_i||^2 + <offset_i, x>; returns oracles and the minimiser of sum_i f_i."""
    gen = torch.Generator().manual_seed(0)
    centers = [torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(5)]
    oracles = [
        (lambda x, t, c=c, o=o: (x - c) + o) for c, o in zip(centers, offsets, strict=True)
    ]
    x_star = sum(centers) / 5 - sum(offsets) / 5
    return oracles, x_star


def run(algorithm, oracles, lr, rounds):
    ctxs = [StepContext(agent=i, weights=WEIGHTS[i], lr=lr, oracle=oracles[i]) for i in range(5)]
    x0 = torch.zeros(3, dtype=torch.float64)
    pairs = [algorithm.init(x0, c) for c in ctxs]
    states = [s for s, _ in pairs]
    outs = [o for _, o in pairs]
    for _ in range(rounds):
        stepped = [algorithm.step(states[i], {j: outs[j] for j in RING5[i]}, ctxs[i])
                   for i in range(5)]
        states = [s for s, _ in stepped]
        outs = [o for _, o in stepped]
    return states


def zero_sum_offsets(scale: float) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    raw = [scale * torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(5)]
    mean = sum(raw) / 5
    return [r - mean for r in raw]


@pytest.mark.parametrize("scale", [0.0, 1.0, 1e3, 1e6])
def test_gradient_tracking_is_exact_under_zero_sum_offsets(scale: float) -> None:
    # prepare: zero-sum linear perturbations of any size leave the minimiser unchanged
    oracles, x_star = quadratic_oracles(zero_sum_offsets(scale))
    # execute
    states = run(GradientTracking(), oracles, lr=0.3, rounds=1500)
    # assert: every agent reaches x* (up to float rounding relative to the offsets)
    for s in states:
        assert torch.allclose(s["x"], x_star, atol=1e-9 * max(1.0, scale), rtol=0)


def test_dsgd_constant_step_consensus_error_grows_with_offsets() -> None:
    # With a constant step, DSGD's local iterates disagree by O(lr * heterogeneity of the local
    # gradients); zero-sum offsets add heterogeneity, so the disagreement (the source of the
    # paper's residual error at large gamma) grows in proportion to them. GT above is exact.
    def consensus(scale: float) -> float:
        oracles, _ = quadratic_oracles(zero_sum_offsets(scale))
        states = run(DSGD(), oracles, lr=0.1, rounds=500)
        x_bar = sum(s["x"] for s in states) / 5
        return float(sum(torch.sum((s["x"] - x_bar) ** 2) for s in states))

    assert consensus(1e2) > 1e3 * consensus(1.0) > 0


def test_dsgd_step_matches_hand_computation() -> None:
    ctx = StepContext(agent=0, weights={0: 0.5, 1: 0.25, 4: 0.25}, lr=0.1,
                      oracle=lambda x, t: 2 * x)
    state, _ = DSGD().init(torch.tensor([1.0], dtype=torch.float64), ctx)
    inbox = {1: {"x": torch.tensor([3.0], dtype=torch.float64)},
             4: {"x": torch.tensor([5.0], dtype=torch.float64)}}
    nxt, msg = DSGD().step(state, inbox, ctx)
    # 0.5*1 + 0.25*3 + 0.25*5 - 0.1*2*1 = 2.5 - 0.2
    assert nxt["x"].item() == pytest.approx(2.3, abs=1e-15)
    assert nxt.t == 1 and msg["x"] is nxt["x"]


def test_inbox_must_match_neighbours() -> None:
    ctx = StepContext(agent=0, weights=WEIGHTS[0], lr=0.1, oracle=lambda x, t: x)
    state, _ = DSGD().init(torch.zeros(2, dtype=torch.float64), ctx)
    with pytest.raises(ValueError, match=r"missing \[4\]"):
        DSGD().step(state, {1: {"x": torch.zeros(2, dtype=torch.float64)}}, ctx)
    gt_state, _ = GradientTracking().init(torch.zeros(2, dtype=torch.float64), ctx)
    with pytest.raises(ValueError, match="lacks tensors"):
        GradientTracking().step(
            gt_state, {j: {"x": torch.zeros(2, dtype=torch.float64)} for j in (1, 4)}, ctx
        )


def test_mix_sums_in_ascending_agent_order() -> None:
    # Values chosen so that float addition order matters: (1e16 + 1) - 1e16 != 1e16 - 1e16 + 1.
    ctx = StepContext(agent=1, weights={0: 1.0, 1: 1.0, 2: 1.0}, lr=0.0, oracle=lambda x, t: x)
    own = {"v": torch.tensor([1.0], dtype=torch.float64)}
    inbox = {2: {"v": torch.tensor([-1e16], dtype=torch.float64)},
             0: {"v": torch.tensor([1e16], dtype=torch.float64)}}
    expected = (torch.tensor([1e16]) + 1.0) + -1e16  # order 0, 1, 2
    assert mix("v", own, inbox, ctx).item() == expected.item()


def test_make_algorithm_rejects_unknown_names() -> None:
    assert isinstance(make_algorithm("gt"), GradientTracking)
    with pytest.raises(ValueError, match="unknown algorithm 'adam'"):
        make_algorithm("adam")


def test_paper_schedule_holds_then_reaches_final() -> None:
    s = PaperSchedule()
    assert s(0) == s(1999) == 0.2
    assert s(9999) == pytest.approx(4e-5, rel=1e-12)
    lrs = np.array([s(t) for t in range(2000, 10_000)])
    assert np.all(np.diff(lrs) < 0)
    # geometric: the log step is constant
    assert np.allclose(np.diff(np.log(lrs)), np.log(4e-5 / 0.2) / 7999)


def test_make_schedule_specs() -> None:
    assert make_schedule("constant:0.05", iterations=10)(7) == 0.05
    short = make_schedule("paper", iterations=100)
    assert short(0) == 0.2 and short(99) == pytest.approx(4e-5)
    with pytest.raises(ValueError, match="unknown schedule"):
        make_schedule("cosine", iterations=10)
    with pytest.raises(ValueError, match="finite positive"):
        Constant(-1.0)


def test_step_context_is_immutable_and_replaceable() -> None:
    ctx = StepContext(agent=0, weights=WEIGHTS[0], lr=0.1, oracle=lambda x, t: x)
    for name, value in (("lr", 0.5), ("agent", 1), ("weights", {}), ("oracle", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(ctx, name, value)
    replaced = dataclasses.replace(ctx, lr=0.5)
    assert replaced.lr == 0.5 and ctx.lr == 0.1  # a new context; the old one is unchanged
    assert (replaced.agent, replaced.weights, replaced.oracle) == (0, WEIGHTS[0], ctx.oracle)
    assert ctx.neighbours == (1, 4)


@pytest.mark.parametrize("scale", [0.0, 1.0, 1e3, 1e6])
def test_accelerated_tracking_is_exact_under_zero_sum_offsets(scale: float) -> None:
    # prepare: the same zero-sum perturbations; Nesterov momentum on the lazy matrix
    oracles, x_star = quadratic_oracles(zero_sum_offsets(scale))
    # execute
    states = run(make_algorithm("agt", momentum=0.5), oracles, lr=0.3, rounds=1500)
    # assert: every agent's x (and its extrapolated z) reaches x*
    for s in states:
        assert torch.allclose(s["x"], x_star, atol=1e-9 * max(1.0, scale), rtol=0)
        assert torch.allclose(s["z"], x_star, atol=1e-9 * max(1.0, scale), rtol=0)


def test_accelerated_tracking_step_matches_hand_computation() -> None:
    # prepare: agent 0 with weights 1/2 (itself), 1/4, 1/4: lazy weights 3/4, 1/8, 1/8
    ctx = StepContext(agent=0, weights={0: 0.5, 1: 0.25, 4: 0.25}, lr=0.1,
                      oracle=lambda x, t: 2 * x)
    algo = make_algorithm("agt", momentum=0.5)
    state, msg = algo.init(torch.tensor([1.0], dtype=torch.float64), ctx)
    assert msg["z"].item() == 1.0 and msg["y"].item() == 2.0
    inbox = {1: {"z": torch.tensor([3.0], dtype=torch.float64),
                 "y": torch.tensor([4.0], dtype=torch.float64)},
             4: {"z": torch.tensor([5.0], dtype=torch.float64),
                 "y": torch.tensor([-8.0], dtype=torch.float64)}}
    # execute
    nxt, out = algo.step(state, inbox, ctx)
    # assert: x+ = 3/4*1 + 1/8*3 + 1/8*5 - 0.1*2 = 1.55; z+ = x+ + 0.5 (x+ - 1) = 1.825;
    # y+ = 3/4*2 + 1/8*4 + 1/8*(-8) + g(z+) - g(z) = 1.0 + 3.65 - 2 = 2.65
    assert nxt["x"].item() == pytest.approx(1.55, abs=1e-15)
    assert nxt["z"].item() == pytest.approx(1.825, abs=1e-15)
    assert nxt["y"].item() == pytest.approx(2.65, abs=1e-14)
    assert nxt["g"].item() == pytest.approx(3.65, abs=1e-15)
    assert out["z"] is nxt["z"] and out["y"] is nxt["y"] and nxt.t == 1


def test_accelerated_tracking_beats_plain_tracking_on_an_ill_conditioned_problem() -> None:
    # prepare: f_i(x) = 0.5 h ||x - c_i||^2 + offsets with curvature 1e-2 (kappa 100 at step 1)
    def slow(offsets: list[torch.Tensor]) -> tuple[list, torch.Tensor]:
        oracles, x_star = quadratic_oracles(offsets)
        return [lambda x, t, o=o: 1e-2 * o(x, t) for o in oracles], x_star

    oracles, x_star = slow(zero_sum_offsets(1.0))
    # execute: 300 rounds each, momentum from the strong convexity (q = sqrt(alpha mu) = 0.1)
    plain = run(make_algorithm("agt", momentum=0.0), oracles, lr=1.0, rounds=300)
    fast = run(make_algorithm("agt", momentum=(1 - 0.1) / (1 + 0.1)), oracles, lr=1.0,
               rounds=300)
    # assert: momentum is orders of magnitude closer after the same rounds
    def error(states):
        return max(float(torch.linalg.vector_norm(s["x"] - x_star)) for s in states)

    assert error(fast) < 1e-3 * error(plain)


@pytest.mark.parametrize("momentum", [-0.1, 1.0, float("nan")])
def test_accelerated_tracking_refuses_a_momentum_outside_0_1(momentum: float) -> None:
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        make_algorithm("agt", momentum=momentum)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_an_algorithm_declares_the_tensors_it_holds_and_sends(name: str) -> None:
    # a checkpoint stores state_keys and an agent sizes its neighbours' messages by
    # message_keys: both must be exactly what the state and the messages carry, every round
    algo = make_algorithm(name)
    assert algo.name == name  # the name a run's parameters select it by
    ctx = StepContext(agent=0, weights=WEIGHTS[0], lr=0.1, oracle=lambda x, t: 2 * x)
    state, msg = algo.init(torch.ones(3, dtype=torch.float64), ctx)
    inbox = {j: {k: torch.full((3,), float(j), dtype=torch.float64) for k in algo.message_keys}
             for j in RING5[0]}
    nxt, out = algo.step(state, inbox, ctx)
    for held, sent in ((state, msg), (nxt, out)):
        assert set(held.tensors) == set(algo.state_keys)
        assert set(sent) == set(algo.message_keys) <= set(algo.state_keys)


@pytest.mark.parametrize("name", ["gt", "agt"])
def test_tracking_asks_the_oracle_for_each_round_in_order(name: str) -> None:
    # round t's gradient is evaluated for round t (the minibatch of round t), as in every
    # algorithm, so a network and the simulator draw the same batches
    asked: list[int] = []

    def oracle(x: torch.Tensor, t: int) -> torch.Tensor:
        asked.append(t)
        return 2 * x

    ctx = StepContext(agent=0, weights=WEIGHTS[0], lr=0.1, oracle=oracle)
    algo = make_algorithm(name)
    state, _ = algo.init(torch.ones(3, dtype=torch.float64), ctx)
    inbox = {j: {k: torch.zeros(3, dtype=torch.float64) for k in algo.message_keys}
             for j in RING5[0]}
    for _ in range(3):
        state, _ = algo.step(state, inbox, ctx)
    assert asked == [0, 1, 2, 3] and state.t == 3


def test_accelerated_tracking_by_default_is_gradient_tracking_on_the_lazy_matrix() -> None:
    # beta = 0 (the default momentum): z = x, and the iterates are plain gradient tracking's on
    # W' = (I + W) / 2, to the bit
    oracles, _ = quadratic_oracles(zero_sum_offsets(1.0))
    lazy = {i: {j: (w + 1.0) / 2 if j == i else w / 2 for j, w in WEIGHTS[i].items()}
            for i in range(5)}
    ctxs = [StepContext(agent=i, weights=lazy[i], lr=0.3, oracle=oracles[i]) for i in range(5)]
    accelerated = run(AcceleratedTracking(), oracles, lr=0.3, rounds=40)
    x0 = torch.zeros(3, dtype=torch.float64)
    pairs = [GradientTracking().init(x0, c) for c in ctxs]
    states, outs = [s for s, _ in pairs], [o for _, o in pairs]
    for _ in range(40):
        stepped = [GradientTracking().step(states[i], {j: outs[j] for j in RING5[i]}, ctxs[i])
                   for i in range(5)]
        states, outs = [s for s, _ in stepped], [o for _, o in stepped]
    for fast, plain in zip(accelerated, states, strict=True):
        assert torch.equal(fast["x"], plain["x"]) and torch.equal(fast["z"], plain["x"])
        assert torch.equal(fast["y"], plain["y"])


def test_numpy_mixing_and_agt_step_equal_torchs_operations_bit_for_bit() -> None:
    """mix and agt's step run float64 vectors through numpy (base.float64_arrays): the same
    products, sums and differences as torch's, so the same bits as the torch expressions."""
    from efpsn.algorithms.agt import lazy
    from efpsn.algorithms.base import AgentState

    rng = np.random.default_rng(21)
    weights = {0: 0.35, 2: 0.4, 5: 0.25}
    grads = {1: torch.from_numpy(rng.normal(size=300))}
    ctx = StepContext(agent=2, weights=weights, lr=0.037,
                      oracle=lambda x, t: grads[t] * x.sum())
    def vec() -> torch.Tensor:
        return torch.from_numpy(rng.normal(size=300) * 10.0 ** rng.integers(-8, 8, 300))

    own = {"z": vec(), "y": vec()}
    inbox = {j: {"z": vec(), "y": vec()} for j in (0, 5)}
    expected = inbox[0]["y"] * 0.35 + own["y"] * 0.4 + inbox[5]["y"] * 0.25
    got = mix("y", own, inbox, ctx)
    assert got.numpy().tobytes() == expected.numpy().tobytes()
    as_float32 = {j: {k: v.float() for k, v in m.items()} for j, m in inbox.items()}
    assert mix("y", {k: v.float() for k, v in own.items()}, as_float32, ctx).dtype == torch.float32
    algo, w = AcceleratedTracking(momentum=0.6), lazy(ctx)
    state = AgentState(t=0, tensors={"x": vec(), "z": own["z"], "y": own["y"], "g": vec()})
    nxt, out = algo.step(state, inbox, ctx)
    x_next = (inbox[0]["z"] * w.weights[0] + own["z"] * w.weights[2]
              + inbox[5]["z"] * w.weights[5]) - 0.037 * own["y"]
    z_next = x_next + 0.6 * (x_next - state["x"])
    y_next = (inbox[0]["y"] * w.weights[0] + own["y"] * w.weights[2]
              + inbox[5]["y"] * w.weights[5]) + (ctx.oracle(z_next, 1) - state["g"])
    for key, value in (("x", x_next), ("z", z_next), ("y", y_next)):
        assert nxt[key].numpy().tobytes() == value.numpy().tobytes()
    assert out["z"] is nxt["z"] and out["y"] is nxt["y"]


def test_agt_step_takes_torchs_operations_for_an_oracle_that_gives_no_float64_vector() -> None:
    from efpsn.algorithms.agt import lazy
    from efpsn.algorithms.base import AgentState

    def oracle(x: torch.Tensor, t: int) -> torch.Tensor:
        return (x * 2.0).float()  # float32: torch's promotion, as before

    ctx = StepContext(agent=0, weights={0: 0.5, 1: 0.5}, lr=0.1, oracle=oracle)
    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    state = AgentState(t=0, tensors={"x": x, "z": x, "y": x * 0.5, "g": x * 0.25})
    inbox = {1: {"z": x + 1.0, "y": x - 1.0}}
    nxt, _ = AcceleratedTracking(momentum=0.5).step(state, inbox, ctx)
    w = lazy(ctx).weights
    x_next = (x * w[0] + (x + 1.0) * w[1]) - 0.1 * (x * 0.5)
    z_next = x_next + 0.5 * (x_next - x)
    y_next = (x * 0.5 * w[0] + (x - 1.0) * w[1]) + (oracle(z_next, 1) - x * 0.25)
    assert nxt["y"].dtype == torch.float64 and torch.equal(nxt["y"], y_next)
    assert torch.equal(nxt["z"], z_next)
