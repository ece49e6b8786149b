"""The default step rule (efpsn/params/step_rule.py) and the convergence certificate
(efpsn/optimize/certificate.py): public numbers only, stability checked against the companion
matrices, and a certificate that never claims less than the true distance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import StepContext
from efpsn.optimize.certificate import TARGET, Certifier, certify, diameter, mean_distance
from efpsn.params.config import RunConfig
from efpsn.params.schedules import make_schedule
from efpsn.params.step_rule import (
    MAX_ROUNDS,
    NO_BOUND_ROUNDS,
    NO_BOUND_STEP,
    companion,
    mini_batch_rounds,
    nesterov_margin,
    public_curvature,
    step_rule,
)
from efpsn.topology import build_graph, metropolis_weights


def ring(n: int) -> np.ndarray:
    return metropolis_weights(build_graph("ring", n, seed=0))


def test_public_curvature_is_half_the_features_plus_one_plus_l2() -> None:
    # logistic regression: Hessian <= 0.5 E[x~ x~^T] <= 0.5 (d + 1) for features in [-1, 1]
    assert public_curvature("logreg", features=784, l2=0.01) == 0.5 * 785 + 0.01
    assert public_curvature("logreg", features=13, l2=-1.0) == 7.0 + 0.01  # the default l2
    assert public_curvature("lenet", features=784, l2=0.0) is None
    assert public_curvature("mlp:32", features=13, l2=0.01) is None
    # ridge: the squared loss's Hessian is E[x~ x~^T] itself, <= d + 1
    assert public_curvature("ridge", features=10, l2=0.5) == 11.0 + 0.5


def test_the_rule_s_numbers_for_the_mnist_ring_are_pinned() -> None:
    # the README's and RESULTS' default run: 5-ring, 784 features, l2 1e-2
    rule = step_rule(algorithm="agt", task="logreg", features=784, l2=0.01, weights=ring(5))
    assert (rule.step, rule.momentum, rule.rounds) == (0.00104197, 0.993565, 6502)
    assert rule.curvature == 392.51
    q = math.sqrt(rule.step * 0.01)
    assert rule.momentum == pytest.approx((1 - q) / (1 + q), rel=1e-5)


def test_every_mode_and_curvature_is_stable_at_the_rule_s_step() -> None:
    # prepare: the rule for a 4-ring and a 7-path on 13 features (wine's size)
    for weights in (ring(4), metropolis_weights(build_graph("path", 7, seed=0))):
        rule = step_rule(algorithm="agt", task="logreg", features=13, l2=0.01,
                         weights=weights)
        lazy = (np.eye(len(weights)) + weights) / 2
        lams = np.linalg.eigvalsh(lazy)
        # assert: every disagreement mode at every curvature in [l2, L] contracts (the
        # consensus mode lam = 1 has the tracking's eigenvalue 1 by design)
        for lam in lams[lams < 1 - 1e-12]:
            for h in np.geomspace(0.01, rule.curvature, 25):
                radius = max(abs(np.linalg.eigvals(companion(lam, rule.step * h,
                                                             rule.momentum))))
                assert radius < 1, (lam, h, radius)


def test_the_margin_is_where_stability_ends() -> None:
    lams = np.linalg.eigvalsh((np.eye(5) + ring(5)) / 2)
    c_max, rho = nesterov_margin(lams, kappa=1000.0)
    assert 0 < rho < 1 and 0.1 < c_max <= 1.0
    unstable = c_max * 1.05
    q = math.sqrt(unstable / 1000.0)
    beta = (1 - q) / (1 + q)
    radii = [max(abs(np.linalg.eigvals(companion(lam, unstable * h, beta))))
             for lam in lams[lams < 1 - 1e-12] for h in np.geomspace(1e-3, 1, 80)]
    assert max(radii) > 1


def test_other_algorithms_and_models_get_their_documented_defaults() -> None:
    dsgd = step_rule(algorithm="dsgd", task="logreg", features=784, l2=0.01, weights=ring(5))
    assert (dsgd.step, dsgd.momentum, dsgd.rounds) == (None, 0.0, 10_000)
    lenet = step_rule(algorithm="agt", task="lenet", features=784, l2=0.0, weights=ring(5))
    assert (lenet.step, lenet.momentum, lenet.rounds) == (NO_BOUND_STEP, 0.0, NO_BOUND_ROUNDS)
    gt = step_rule(algorithm="gt", task="logreg", features=784, l2=0.01, weights=ring(5))
    lam_min = np.linalg.eigvalsh(ring(5))[0]
    assert gt.step == pytest.approx(0.9 * (1 + lam_min) ** 2 / (2 * 392.51), rel=1e-5)
    assert gt.momentum == 0.0 and gt.rounds == MAX_ROUNDS  # 1 - alpha l2 is slow: capped
    with pytest.raises(ValueError, match="no step rule for algorithm 'adam'"):
        step_rule(algorithm="adam", task="logreg", features=4, l2=0.01, weights=ring(3))


def test_the_rounds_are_capped_on_large_sparse_graphs() -> None:
    rule = step_rule(algorithm="agt", task="logreg", features=784, l2=0.01, weights=ring(30))
    assert rule.rounds == MAX_ROUNDS


def test_a_config_resolves_auto_into_concrete_public_numbers() -> None:
    config = RunConfig()
    assert (config.schedule.unresolved, config.iterations.auto, config.momentum.auto) == (True,) * 3
    resolved = config.resolved()
    assert str(resolved.schedule) == "auto:0.00104197" and resolved.iterations.count == 6502
    assert resolved.momentum.beta == 0.993565 and resolved.resolved_ok
    assert resolved.resolved() is resolved
    # what the user gave stays: only the missing numbers come from the rule
    mine = RunConfig(iterations=300, momentum=0.9).resolved()
    assert (mine.iterations.count, mine.momentum.beta) == (300, 0.9)
    assert str(RunConfig.preset("paper").resolved().schedule) == "paper"
    with pytest.raises(ValueError, match="iterations auto are the step rule's rounds"):
        RunConfig(schedule="constant:0.1")


# ----------------------------------------------------------------------------- certificate


def test_diameter_counts_hops() -> None:
    assert diameter(ring(5)) == 2 and diameter(ring(6)) == 3
    assert diameter(metropolis_weights(build_graph("path", 7, seed=0))) == 6
    with pytest.raises(ValueError, match="disconnected"):
        diameter(np.eye(3))


def test_the_mean_distance_is_the_largest_average_hop_count() -> None:
    # the 5-ring: every agent is 0, 1, 1, 2, 2 hops from the five agents, (0+1+1+2+2)/5 = 1.2
    assert mean_distance(ring(5)) == pytest.approx(1.2)
    # the 7-path: its ends are 0..6 hops from the others, 21/7 = 3 (the diameter is 6)
    assert mean_distance(metropolis_weights(build_graph("path", 7, seed=0))) == pytest.approx(3)
    # the complete 4-graph: 3 neighbours one hop away, 3/4; one agent alone: 0
    assert mean_distance(metropolis_weights(build_graph("complete", 4, seed=0))) == 0.75
    assert mean_distance(metropolis_weights(build_graph("complete", 1, seed=0))) == 0.0
    with pytest.raises(ValueError, match="disconnected"):
        mean_distance(np.eye(3))


def test_certify_computes_the_documented_bound() -> None:
    # B = (tracker + L D gap) / mu + beta step; certificate B / (||x_bar|| - B)
    measures = {"tracker": 1e-6, "gap": 1e-8, "step": 1e-4}
    out = certify(measures, x_bar_norm=10.0, curvature=100.0, l2=0.01, hops=2, momentum=0.5,
                  rounds=50)
    bound = (1e-6 + 100.0 * 2 * 1e-8) / 0.01 + 0.5 * 1e-4
    assert out.bound == pytest.approx(bound / (10.0 - bound), rel=1e-12)
    assert out.converged and out.line.startswith("converged:")


def test_an_uncertified_run_says_so_and_what_to_change() -> None:
    far = {"tracker": 1.0, "gap": 0.0, "step": 0.0}
    out = certify(far, x_bar_norm=1000.0, curvature=1.0, l2=0.01, hops=1, momentum=0.0,
                  rounds=300, rate=0.99)
    assert not out.converged and out.bound == pytest.approx(100 / 900)
    # 0.111 -> 1e-3 at 0.99 per round: ln(111.1) / -ln(0.99) = 469 more rounds
    assert out.line.startswith("NOT converged: after 300 rounds")
    assert out.line.endswith("raise --iterations to about 769")
    none_yet = certify(far, x_bar_norm=1.0, curvature=1.0, l2=0.01, hops=1, momentum=0.0,
                       rounds=300, fallback_rounds=6502)
    assert none_yet.bound == math.inf and "nothing yet" in none_yet.line
    assert none_yet.line.endswith("to about 6502")
    assert "to about 600" in certify(far, x_bar_norm=1.0, curvature=1.0, l2=0.01, hops=1,
                                     momentum=0.0, rounds=300).line


def test_no_certificate_without_a_curvature_bound_or_a_tracker() -> None:
    lenet = certify({"tracker": 0.0, "relative_step": 0.5, "relative_gap": 0.25},
                    x_bar_norm=1.0, curvature=None, l2=0.0, hops=1, momentum=0.0, rounds=5)
    assert lenet.bound is None and not lenet.converged
    assert "no public curvature bound" in lenet.line and "0.5" in lenet.line
    dsgd = certify({"step": 0.1}, x_bar_norm=1.0, curvature=3.0, l2=0.01, hops=1,
                   momentum=0.0, rounds=5)
    assert dsgd.bound is None and "no tracker (DSGD)" in dsgd.line


def test_the_certificate_is_never_below_the_true_distance() -> None:
    # prepare: heterogeneous quadratics f_i = 0.5 h_i ||x - c_i||^2 with curvatures in [mu, L]
    n, d, mu, big_l = 5, 4, 0.05, 2.0
    gen = torch.Generator().manual_seed(3)
    centers = [torch.randn(d, generator=gen, dtype=torch.float64) + 3 for _ in range(n)]
    curv = [mu, big_l, 0.5, 1.0, 0.2]
    x_star = sum(h * c for h, c in zip(curv, centers, strict=True)) / sum(curv)
    weights = ring(n)
    momentum = 0.8
    algo = make_algorithm("agt", momentum=momentum)
    ctxs = [StepContext(agent=i, weights={j: float(weights[i, j]) for j in range(n)
                                          if weights[i, j] > 0}, lr=0.2,
                        oracle=lambda x, t, h=curv[i], c=centers[i]: h * (x - c))
            for i in range(n)]
    pairs = [algo.init(torch.zeros(d, dtype=torch.float64), c) for c in ctxs]
    states, outs = [s for s, _ in pairs], [o for _, o in pairs]
    checked = 0
    for t in range(400):
        before = states
        stepped = [algo.step(states[i], {j: outs[j] for j in ctxs[i].weights if j != i},
                             ctxs[i]) for i in range(n)]
        states, outs = [s for s, _ in stepped], [o for _, o in stepped]
        if t % 20:
            continue
        norm = torch.linalg.vector_norm
        measures = {
            "tracker": max(float(norm(s["y"])) for s in states),
            "gap": max(float(norm(before[i]["z"] - before[j]["z"]))
                       for i in range(n) for j in ctxs[i].weights if j != i),
            "step": max(float(norm(s["x"] - b["x"])) for s, b in zip(states, before,
                                                                     strict=True))}
        # the gap is measured on round t's z (as agents do); the certificate uses round t+1's
        # z_bar, so allow for this round's move in the comparison (measures on one round)
        x_bar = sum(s["x"] for s in states) / n
        out = certify(measures, x_bar_norm=float(norm(x_bar)), curvature=big_l, l2=mu,
                      hops=mean_distance(weights), momentum=momentum, rounds=t + 1)
        true = float(norm(x_bar - x_star) / norm(x_star))
        assert out.bound >= true * 0.999, (t, out.bound, true)
        checked += 1
    assert checked == 20


def test_a_certifier_for_a_run_uses_its_public_numbers() -> None:
    config = RunConfig().resolved()
    certifier = Certifier.for_run(config, ring(5))
    assert certifier.curvature == 392.51 and certifier.l2 == 0.01
    assert certifier.hops == pytest.approx(1.2)  # the 5-ring's mean distance (diameter 2)
    assert certifier.momentum == 0.993565 and certifier.rounds == 6502
    assert certifier.rate == pytest.approx(1 - math.sqrt(0.00104197 * 0.01))
    gt_config = RunConfig(algorithm="gt", iterations=100).resolved()
    gt = Certifier.for_run(gt_config, ring(5))
    step = gt_config.schedule.lr
    assert gt.momentum == 0.0 and gt.rate == pytest.approx(1 - step * 0.01) and gt.rounds == 100
    out = certifier({"tracker": 0.0, "gap": 0.0, "step": 0.0}, x_bar_norm=1.0)
    assert out.converged and out.bound == 0.0 and out.bound <= TARGET



def test_without_strong_convexity_or_a_curvature_bound_full_batch_the_step_is_constant() -> None:
    # logistic regression with l2 = 0 (no strong convexity: no rate) and LeNet with an L2 weight
    # (no public curvature bound), on the full batch: the documented constant step and rounds,
    # without momentum, for both tracking algorithms; never a division by zero or a step from a
    # missing bound
    for task, l2 in (("logreg", 0.0), ("lenet", 0.01)):
        for algorithm in ("agt", "gt"):
            rule = step_rule(algorithm=algorithm, task=task, features=784, l2=l2,
                             weights=ring(5))
            assert (rule.step, rule.momentum, rule.rounds) == (0.05, 0.0, 2000), (task, l2)
    # a LeNet run on the full batch resolves to that constant step
    resolved = RunConfig(task="lenet", batch_size="full").resolved()
    schedule = make_schedule(resolved.schedule, iterations=resolved.iterations.total)
    assert resolved.schedule.kind != "paper" and schedule(0) == schedule(1999) == 0.05
    assert (resolved.iterations.count, resolved.momentum.beta) == (2000, 0.0)


def test_a_neural_network_trains_on_mini_batches_by_default() -> None:
    # prepare / execute: the defaults of LeNet, an MLP and logistic regression
    lenet, mlp = (RunConfig(task=t).resolved() for t in ("lenet", "mlp:32"))
    logreg = RunConfig().resolved()
    # assert: the networks on batches of 64, agt with momentum 0.9 and the one-cycle step for
    # a budget of 128,000 samples per agent (2,000 rounds), without a stop rule (no
    # certificate); logistic regression keeps the full batch, its constant step and the rule
    for c in (lenet, mlp):
        assert (c.batch_size.size, c.algorithm, c.momentum.beta) == (64, "agt", 0.9)
        assert str(c.schedule) == "onecycle:0.1" and c.iterations.count == 2000
        assert c.stop_every.never and c.refresh.fading and c.resolved_ok
    assert logreg.batch_size.full and logreg.schedule.kind == "auto"
    assert logreg.stop_every.rounds == 25
    # the budget is samples: a batch of 32 runs twice the rounds; full batch the old guess
    assert RunConfig(task="lenet", batch_size=32).resolved().iterations.count == 4000
    assert mini_batch_rounds(64) == 2000 and mini_batch_rounds(1) == MAX_ROUNDS
    # the warm-up then the linear decay, never zero
    step = make_schedule(lenet.schedule, iterations=2000)
    assert step(0) == pytest.approx(0.01) and step(300) == 0.1 and step(1999) == 0.1 / 1700
    assert all(step(t) > 0 for t in range(0, 2001, 50))
    # gt has no momentum; dsgd keeps the paper's schedule
    assert RunConfig(task="lenet", algorithm="gt").resolved().momentum.beta == 0.0
    assert RunConfig(task="lenet", algorithm="dsgd").resolved().schedule.kind == "paper"


def test_gradient_tracking_s_rounds_add_the_disagreement_term_below_the_cap() -> None:
    # a 5-ring, 13 features, l2 = 0.1: uncapped. The ring's Metropolis spectrum in closed form:
    # 1/3 + 2/3 cos(2 pi k / 5); the rounds are ln(1e9) / (alpha mu) + ln(1e3) / (1 - lam_2)
    rule = step_rule(algorithm="gt", task="logreg", features=13, l2=0.1, weights=ring(5))
    lams = sorted(1 / 3 + 2 / 3 * math.cos(2 * math.pi * k / 5) for k in range(5))
    assert rule.curvature == 7.0 + 0.1
    assert rule.step == pytest.approx(0.9 * (1 + lams[0]) ** 2 / (2 * 7.1), rel=1e-5)
    expected = math.log(1e9) / (rule.step * 0.1) + math.log(1e3) / (1 - lams[-2])
    assert rule.rounds == math.ceil(expected) < MAX_ROUNDS


def test_a_single_agent_is_zero_hops_from_everyone() -> None:
    # one agent, no edges: the certificate's consensus term L D gap must vanish (D = 0)
    alone = metropolis_weights(build_graph("complete", 1, seed=0))
    assert diameter(alone) == 0
    assert diameter(metropolis_weights(build_graph("complete", 4, seed=0))) == 1


def test_no_certificate_without_strong_convexity_or_with_a_missing_bound() -> None:
    # either half of "a curvature bound and l2 > 0" missing: no certificate (never a division by
    # zero, never arithmetic on a missing bound), and summary.json says converged: false
    measures = {"tracker": 1e-9, "gap": 0.0, "step": 0.0, "relative_step": 0.5,
                "relative_gap": 0.25}
    for curvature, l2 in ((None, 0.01), (3.0, 0.0), (None, 0.0)):
        out = certify(measures, x_bar_norm=1.0, curvature=curvature, l2=l2, hops=1,
                      momentum=0.0, rounds=5)
        assert out.bound is None and out.converged is False, (curvature, l2)
        assert out.to_json() == {"certificate": None, "converged": False, "line": out.line}
        # the user still sees both measures: the last move and the neighbours' disagreement
        assert "moved the iterates by 0.5" in out.line and "disagree by 0.25" in out.line


def test_summary_json_carries_a_finite_certificate_and_drops_an_infinite_one() -> None:
    far = {"tracker": 1.0, "gap": 0.0, "step": 0.0}
    finite = certify(far, x_bar_norm=1000.0, curvature=1.0, l2=0.01, hops=1, momentum=0.0,
                     rounds=300)
    assert finite.to_json() == {"certificate": finite.bound, "converged": False,
                                "line": finite.line}
    assert finite.to_json()["certificate"] == pytest.approx(100 / 900)
    none_yet = certify(far, x_bar_norm=1.0, curvature=1.0, l2=0.01, hops=1, momentum=0.0,
                       rounds=300)
    assert none_yet.to_json()["certificate"] is None  # JSON has no infinity
    close = certify({"tracker": 0.0, "gap": 0.0, "step": 0.0}, x_bar_norm=1.0, curvature=1.0,
                    l2=0.01, hops=1, momentum=0.0, rounds=3)
    assert close.to_json() == {"certificate": 0.0, "converged": True, "line": close.line}


def test_a_bound_equal_to_the_norm_certifies_nothing() -> None:
    # B = tracker / l2 = 2 = ||x_bar||: ||x*|| >= ||x_bar|| - B = 0 bounds nothing
    out = certify({"tracker": 1.0, "gap": 0.0, "step": 0.0}, x_bar_norm=2.0, curvature=1.0,
                  l2=0.5, hops=1, momentum=0.0, rounds=10, rate=0.9)
    assert out.bound == math.inf and not out.converged
    assert "nothing yet" in out.line and out.line.endswith("to about 20")


def test_an_uncertified_line_shows_the_bound_it_reached() -> None:
    far = {"tracker": 1.0, "gap": 0.0, "step": 0.0}
    out = certify(far, x_bar_norm=1000.0, curvature=1.0, l2=0.01, hops=1, momentum=0.0,
                  rounds=300, rate=0.99)
    assert f"by {100 / 900:.2g} ||x*||" in out.line and "nothing yet" not in out.line


def test_a_certifier_advises_from_its_run_s_rate() -> None:
    # agt at the rule's step: the advice is the rounds still needed at the rate 1 - q
    config = RunConfig().resolved()
    certifier = Certifier.for_run(config, ring(5))
    far = {"tracker": 1.0, "gap": 0.0, "step": 0.0}
    out = certifier(far, x_bar_norm=1000.0, rounds=300)
    value = 100 / 900
    rate = 1 - math.sqrt(0.00104197 * 0.01)
    more = math.ceil(math.log(value / TARGET) / -math.log(rate))
    assert out.line.endswith(f"to about {300 + more}") and 300 + more != 2 * 300
    # the paper's decaying schedule has no constant rate: the step rule's rounds instead
    paper = RunConfig(algorithm="gt", schedule="paper", iterations=100).resolved()
    out = Certifier.for_run(paper, ring(5))(far, x_bar_norm=1000.0)
    assert not out.converged and out.line.endswith(f"to about {MAX_ROUNDS}")


@pytest.mark.parametrize(("missing", "value"), [("gap", None), ("step", None),
                                                ("gap", math.inf), ("tracker", math.inf)])
def test_a_missing_measure_certifies_nothing(missing: str, value: float | None) -> None:
    # a measure that is absent must never count as zero (that would be optimistic), and a
    # diverged one (inf) gives no certificate rather than advice to run longer
    measures = {"tracker": 1e-12, "gap": 1e-12, "step": 1e-12}
    if value is None:
        del measures[missing]
    else:
        measures[missing] = value
    cert = certify(measures, x_bar_norm=5.0, curvature=4.0, l2=1e-2, hops=2, momentum=0.9,
                   rounds=100)
    assert cert.bound is None and not cert.converged
    assert "missing or not finite" in cert.line
    # with every measure present the same numbers certify convergence
    full = certify({"tracker": 1e-12, "gap": 1e-12, "step": 1e-12}, x_bar_norm=5.0,
                   curvature=4.0, l2=1e-2, hops=2, momentum=0.9, rounds=100)
    assert full.converged


def test_the_fading_rate_is_the_slower_of_the_average_and_the_mixing_to_six_digits() -> None:
    """RHO is public: every machine must read the same six significant digits of 1 - RHO."""
    from efpsn.params.step_rule import StepRule, fading_rate

    bare = StepRule(step=0.01, momentum=0.5, rounds=100, curvature=1.0, mixing=None)
    # agt: 1 - sqrt(0.01 * 0.5) = 0.92928932..., 1 - RHO cut to 0.0707106
    assert fading_rate(bare, algorithm="agt", step=0.01, mu=0.5, rounds=100) == 0.9292894
    # gt: 1 - 0.01 * 0.5
    assert fading_rate(bare, algorithm="gt", step=0.01, mu=0.5, rounds=100) == 0.995
    slow_mixing = StepRule(step=0.01, momentum=0.5, rounds=100, curvature=1.0, mixing=0.99)
    assert fading_rate(slow_mixing, algorithm="agt", step=0.01, mu=0.5, rounds=100) == 0.99
    # no contraction rate (DSGD): fades to 1e-9 over the rounds
    dsgd = fading_rate(bare, algorithm="dsgd", step=None, mu=0.0, rounds=1000)
    assert dsgd == 0.97949 and dsgd ** 1000 <= 1e-9 * 1.001


def test_gradient_tracking_on_a_path_uses_its_smallest_and_second_largest_eigenvalues() -> None:
    """A path's spectrum has no repeated pairs (a ring's has), so the right eigenvalue counts."""
    weights = metropolis_weights(build_graph("path", 5))
    eigenvalues = np.linalg.eigvalsh(weights)
    gt = step_rule(algorithm="gt", task="logreg", features=13, l2=0.01, weights=weights)
    assert gt.step == 0.0404691  # 0.9 (1 + lambda_min)^2 / (2 h), rounded
    assert gt.step < 0.9 * (1 + eigenvalues[1]) ** 2 / (2 * gt.curvature) * 0.99
    assert gt.mixing == pytest.approx(0.872677996249965, rel=1e-12)
    agt = step_rule(algorithm="agt", task="logreg", features=13, l2=0.01, weights=weights)
    assert (agt.step, agt.momentum, agt.rounds) == (0.0591858, 0.952499, 1672)
