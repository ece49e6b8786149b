"""The consensus tail (efpsn/params/tail.py): a public schedule of mix / gradient / track steps, the
invariant sum y = sum g after every kind, a sound certificate at the tail's check, agt exact
after a tail that certified nothing, and no tail with gt, dsgd or --tail off."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import StepContext
from efpsn.optimize.certificate import diameter, mean_distance
from efpsn.optimize.driver import RoundDriver
from efpsn.optimize.stopping import StopRule
from efpsn.params.config import RunConfig
from efpsn.params.schedules import make_schedule
from efpsn.params.tail import KINDS, TailSchedule, mixing_rate, record, wanted
from efpsn.topology import build_graph, metropolis_weights


def ring(n: int) -> np.ndarray:
    return metropolis_weights(build_graph("ring", n, seed=0))


def test_the_mixes_come_from_the_graph_s_public_mixing_rate() -> None:
    # the 5-ring's W: 1/3 + 2/3 cos(2 pi / 5) = 0.5393; W' = (1 + 0.5393) / 2 is slower
    w = ring(5)
    assert mixing_rate(w, lazy=False) == pytest.approx(1 / 3 + 2 / 3 * math.cos(2 * math.pi / 5))
    tail = TailSchedule.for_graph(w, origin=0, rounds=6502, hops=2, cap=6502)
    assert not tail.lazy and tail.mixes == 23  # 0.5393^23 < 1e-6 < 0.5393^22
    assert 0.5393 ** 23 < 1e-6 < 0.5393 ** 22
    # under secure aggregation the senders weight by W': the tail mixes with it
    lazy = TailSchedule.for_graph(w, origin=0, rounds=6502, hops=2, cap=6502, aggregate=True)
    assert lazy.lazy and lazy.mixes == math.ceil(math.log(1e-6) / math.log(
        mixing_rate(w, lazy=True)))


def test_the_schedule_s_kinds_are_a_pure_function_of_the_round() -> None:
    tail = TailSchedule(origin=100, rounds=1000, hops=2, mixes=5, lazy=False, cap=1100)
    assert tail.length == 13
    assert tail.starts == (540, 580, 630, 700, 800, 920)  # origin + FRACTIONS of K
    kinds = [tail.kind(t) for t in range(530, 560)]
    assert kinds == ["agt"] * 10 + ["mix"] * 5 + ["gradient"] + ["track"] * 7 + ["agt"] * 7
    assert tail.check_round(540) == 551 and tail.is_check(551) and not tail.is_check(550)
    assert {tail.kind(t) for t in range(1200)} == set(KINDS)
    # an attempt that would not end before the cap is none
    assert TailSchedule(origin=0, rounds=1000, hops=2, mixes=5, lazy=False,
                        cap=710).starts == (440, 480, 530, 600)


def test_a_graph_whose_tail_is_long_against_its_rounds_gets_none() -> None:
    path = metropolis_weights(build_graph("path", 30, seed=0))
    tail = TailSchedule.for_graph(path, origin=0, rounds=2000, hops=diameter(path), cap=2000)
    assert tail.mixes == 0 and tail.starts == () and tail.kind(700) == "agt"
    assert tail.reason is not None and "no consensus tails" in tail.reason


def _rule(**kw: object) -> StopRule:
    tail = TailSchedule(origin=0, rounds=200, hops=2, mixes=4, lazy=False, cap=200)
    args = {"every": 10, "hops": 2, "cap": 200, "curvature": 4.0, "l2": 0.5, "momentum": 0.5,
            "target": 1e-6, "tail": tail, **kw}
    return StopRule(**args)  # type: ignore[arg-type]


def test_regular_checks_that_meet_a_tail_are_none_and_the_tail_s_check_is_one() -> None:
    rule = _rule()
    # tails after rounds 88, 106, 120, 140, 164 (96 would meet the first: length 11, steps
    # a .. a + 10), checks at a + 9; a regular check s uses steps s - 1 .. s + 1
    assert rule.tail is not None and rule.tail.starts == (88, 106, 120, 140, 164)
    checks = [t for t in range(200) if rule.is_check(t)]
    assert checks == [10, 20, 30, 40, 50, 60, 70, 80, 97, 100, 115, 129, 149, 160, 173, 180,
                      190]
    windows = [t for t in range(200) if rule.window(t) is not None]
    assert windows == [u for s in checks for u in (s, s + 1)]
    # a departure voids windows but never changes a step's kind
    cut = rule.voided_from(100)
    assert [t for t in range(200) if cut.is_check(t)] == [10, 20, 30, 40, 50, 60, 70, 80, 97]
    assert [cut.kind(t) for t in range(200)] == [rule.kind(t) for t in range(200)]


def test_tails_only_for_agt_under_an_active_stop_rule_and_not_when_off() -> None:
    w = ring(5)
    assert StopRule.for_run(RunConfig(), w).tail is not None  # the defaults: agt, auto
    assert StopRule.for_run(RunConfig(tail="off"), w).tail is None
    assert StopRule.for_run(RunConfig(algorithm="gt", tail="on"), w).tail is None
    assert StopRule.for_run(RunConfig(iterations=300), w).tail is None  # no stop rule
    assert not wanted("on", algorithm="dsgd", gamma=1e3)
    assert wanted("on", algorithm="agt", gamma=1e3)
    with pytest.raises(ValueError, match="tail must be one of"):
        wanted("sometimes", algorithm="agt", gamma=1e3)
    # auto stops at the gamma where the tails were measured to help the regressions (1e6)
    assert StopRule.for_run(RunConfig(gamma=1e3), w).tail is not None
    assert StopRule.for_run(RunConfig(gamma=1e6), w).tail is None
    assert StopRule.for_run(RunConfig(gamma=1e6, tail="on"), w).tail is not None
    # and the run's record says why it took none (nothing to say when off or without a rule)
    def said(**kw: object) -> object:
        c = RunConfig(**kw).resolved()  # type: ignore[arg-type]
        rule = StopRule.for_run(c, w)
        return record(rule.tail, mode=c.tail, algorithm=c.algorithm, gamma=c.gamma,
                      active=rule.active)
    assert "above gamma 1000" in str(said(gamma=1e6)["none"])  # type: ignore[index]
    assert said(gamma=1e3)["starts"]  # type: ignore[index]
    assert said(gamma=1e6, tail="off") is None and said(gamma=1e6, iterations=300) is None
    with pytest.raises(ValueError, match="tail"):
        RunConfig(tail="sometimes")


# ------------------------------------------------------------------ a masked network of quadratics

N, D, MU, BIG_L, RHO = 5, 4, 0.05, 2.0, 0.99
CURV = [MU, BIG_L, 0.5, 1.0, 0.2]


def _network(rule: StopRule, *, lr: float = 0.2, momentum: float = 0.8):  # type: ignore[no-untyped-def]
    """RoundDrivers of f_i = 0.5 h_i ||x - c_i||^2 on the 5-ring, each gradient plus a fading
    zero-sum mask 100 RHO^t m_i (sum_i m_i = 0): the disagreement a tail removes."""
    gen = torch.Generator().manual_seed(3)
    centers = [torch.randn(D, generator=gen, dtype=torch.float64) + 3 for _ in range(N)]
    masks = [torch.randn(D, generator=gen, dtype=torch.float64) for _ in range(N)]
    mean = sum(masks) / N
    masks = [m - mean for m in masks]
    x_star = sum(h * c for h, c in zip(CURV, centers, strict=True)) / sum(CURV)
    weights = ring(N)
    algo = make_algorithm("agt", momentum=momentum)
    schedule = make_schedule(f"constant:{lr}", iterations=rule.cap)
    drivers = [RoundDriver(
        algorithm=algo, schedule=schedule, iterations=rule.cap, eval_every=rule.cap,
        x0=torch.zeros(D, dtype=torch.float64), stop=rule,
        context=StepContext(agent=i, weights={j: float(weights[i, j]) for j in range(N)
                                              if weights[i, j] > 0}, lr=lr,
                            oracle=lambda x, t, h=CURV[i], c=centers[i], m=masks[i]:
                            h * (x - c) + 100 * RHO ** t * m))
        for i in range(N)]
    return drivers, x_star


def _round(drivers) -> None:  # type: ignore[no-untyped-def]
    outs = [d.outbox for d in drivers]
    for i, d in enumerate(drivers):
        d.step({j: outs[j] for j in d.context.weights if j != i})


def _quadratic_rule(target: float, cap: int = 1500) -> StopRule:
    w = ring(N)
    return StopRule(every=25, hops=diameter(w), cap=cap, curvature=BIG_L, l2=MU,
                    momentum=0.8, target=target, factor=mean_distance(w),
                    tail=TailSchedule.for_graph(w, origin=0, rounds=cap, hops=diameter(w),
                                                cap=cap))


def test_every_kind_of_step_keeps_the_trackers_sum_and_the_tail_mixes_the_points() -> None:
    rule = _quadratic_rule(target=1e-30)  # never met: every tail and the whole run
    drivers, _ = _network(rule)
    tail = rule.tail
    assert tail is not None and tail.starts
    a = tail.starts[0]
    seen = set()
    while not drivers[0].done:
        t = drivers[0].t
        kind = rule.kind(t)
        z_bar = sum(d.state["z"] for d in drivers) / N
        velocity = [d.state["z"] - d.state["x"] for d in drivers]
        g_before = [d.state["g"] for d in drivers]
        _round(drivers)
        seen.add(kind)
        y_sum = sum(d.state["y"] for d in drivers)
        g_sum = sum(d.state["g"] for d in drivers)
        assert torch.allclose(y_sum, g_sum, atol=1e-9), (t, kind)
        if kind == "mix":  # the average point stays, x keeps its offset from z
            assert torch.allclose(sum(d.state["z"] for d in drivers) / N, z_bar, atol=1e-12)
            assert all(torch.allclose(d.state["z"] - d.state["x"], v, atol=1e-12)
                       for d, v in zip(drivers, velocity, strict=True))
        if kind == "track":  # only the trackers move
            assert all(torch.equal(d.state["g"], g) for d, g in zip(drivers, g_before,
                                                                   strict=True))
        if t + 1 == tail.check_round(a):  # the points agree to SHRINK of where they started
            spread = max(float(torch.linalg.vector_norm(d.state["z"] - z_bar))
                         for d in drivers)
            assert spread < 1e-5 * max(1.0, float(torch.linalg.vector_norm(z_bar)))
    assert seen == set(KINDS)


@pytest.mark.slow
def test_agt_stays_exact_after_tails_that_certify_nothing() -> None:
    distances = []
    for tail in (True, False):  # (the mask, 100 RHO^t, fades for 3,000 rounds)
        rule = _quadratic_rule(target=1e-30, cap=3000)
        assert rule.tail is not None and len(rule.tail.starts) == 6
        drivers, x_star = _network(rule if tail else dataclasses.replace(rule, tail=None))
        while not drivers[0].done:
            _round(drivers)
        x_bar = sum(d.state["x"] for d in drivers) / N
        distances.append(float(torch.linalg.vector_norm(x_bar - x_star)))
    assert distances[0] < 1e-12 and distances[1] < 1e-12, distances


def test_a_tail_s_certificate_is_never_below_the_true_distance_and_ends_on_its_points() -> None:
    rule = _quadratic_rule(target=1e-3, cap=1500)
    drivers, x_star = _network(rule)
    tail = rule.tail
    assert tail is not None
    bounds = []
    while not drivers[0].done:
        t = drivers[0].t
        _round(drivers)
        if tail.is_check(t + 1) and rule.is_check(t + 1):
            # the network's integers (every agent's own, max-merged: what the window agrees)
            network = tuple(max(v) for v in zip(*[d.sharing for d in drivers], strict=True))
            p_bar = sum(d.state["z"] for d in drivers) / N
            true = float(torch.linalg.vector_norm(p_bar - x_star) / torch.linalg.vector_norm(
                x_star))
            bounds.append((t + 1, rule.bound(network), true))
            assert rule.bound(network) >= true, bounds[-1]
    stop = drivers[0].iterations
    assert all(d.iterations == stop and d.stopped_early for d in drivers)
    assert tail.is_check(stop - rule.hops), (stop, bounds)  # the run ended on a tail
    final = [d.state for d in drivers]
    assert all(torch.equal(s["x"], s["z"]) for s in final)  # the model is the mixed points
    x_bar = sum(s["x"] for s in final) / N
    true = float(torch.linalg.vector_norm(x_bar - x_star) / torch.linalg.vector_norm(x_star))
    assert true <= drivers[0].measures["stop_certificate"] <= 1e-3


# ------------------------------------------------------------------ the simulator on wine


@pytest.fixture(scope="module")
def wine_problem(wine_no_test):  # type: ignore[no-untyped-def]
    """wine in 4 private folders (no test set: the `wine_no_test` fixture), its problem with the
    defaults and x*."""
    from efpsn.data.folders import inspect_data_dir, load_data_dir
    from efpsn.problem import build_problem
    from efpsn.tasks.optimum import centralized_optimum

    out = wine_no_test
    config = RunConfig(**inspect_data_dir(out).run_values())  # type: ignore[arg-type]
    problem = build_problem(config, local=load_data_dir(config, out, holdout=0.0))
    return config, problem, centralized_optimum(problem.task, problem.shards).x


def _simulate(wine_problem, **changes: object):  # type: ignore[no-untyped-def]
    from efpsn.simulator import run_simulation

    config, problem, x_star = wine_problem
    return run_simulation(config.replace(**changes), problem=problem, x_star=x_star)


def test_the_defaults_end_on_a_tail_earlier_certified_and_within_the_bound(wine_problem) -> None:
    on, off = _simulate(wine_problem), _simulate(wine_problem, tail="off")
    # off: the stop rule as before the tails (docs/RESULTS.md's table: 752 rounds)
    assert off.timings["rounds"] == 752
    rule = StopRule.for_run(on.config, wine_problem[1].weights)
    assert rule.tail is not None and rule.tail.is_check(on.timings["rounds"] - rule.hops)
    assert on.timings["rounds"] < 0.7 * off.timings["rounds"]
    assert on.convergence is not None and on.convergence.converged
    assert on.final["relative_deviation"] <= on.final["stop_certificate"] <= 1e-3


def test_gt_takes_no_tail_bit_for_bit(wine_problem) -> None:
    # 600 rounds checked every 25: agt would take tails there (one is 29 rounds, <= 5% of K)
    config, problem, _ = wine_problem
    short = {"iterations": 600, "stop_every": 25}
    assert StopRule.for_run(config.replace(**short), problem.weights).tail is not None
    runs = [_simulate(wine_problem, algorithm="gt", tail=tail, **short) for tail in ("on", "off")]
    assert runs[0].timings["rounds"] == runs[1].timings["rounds"]
    assert all(torch.equal(a, b) for a, b in zip(runs[0].xs, runs[1].xs, strict=True))


def test_the_privacy_line_names_the_tails_when_the_run_takes_them() -> None:
    from efpsn.privacy.modes import TAIL_WARNING, privacy_statement

    ring5 = build_graph("ring", 5, seed=0)
    assert TAIL_WARNING in privacy_statement(RunConfig().resolved(), ring5).line()
    for quiet in (RunConfig(tail="off"), RunConfig(mask="none"), RunConfig(iterations=300)):
        assert "consensus tails" not in privacy_statement(quiet.resolved(), ring5).line()


def test_a_rebase_restarts_the_schedule_and_abandons_a_tail_it_cuts() -> None:
    # prepare: the defaults' rule on the 5-ring, and the 4 agents left after agent 4 went
    w = ring(5)
    config = RunConfig()
    rule = StopRule.for_run(config, w)
    assert rule.tail is not None
    a = rule.tail.starts[0]
    rebase_round = a + 5  # inside the first tail's mixes
    remaining = np.delete(np.delete(w, 4, axis=0), 4, axis=1)
    remaining[np.arange(4), np.arange(4)] += 1 - remaining.sum(axis=1)
    # execute
    rebased = StopRule.rebased(config, remaining, origin=rebase_round, until=None, cap=rule.cap)
    # assert: the cut tail's remaining steps are plain agt; the new tails count from R
    assert rule.kind(rebase_round) == "mix" and rebased.kind(rebase_round) == "agt"
    assert rebased.tail is not None and rebased.tail.origin == rebase_round
    assert rebased.tail.starts[0] == rebase_round + round(0.44 * rebased.tail.rounds)
    assert not rebased.is_check(rule.tail.check_round(a))
    # the remaining graph's schedule is public: every agent derives the same one
    again = StopRule.rebased(config, remaining.copy(), origin=rebase_round, until=a + 9,
                             cap=rule.cap)
    assert again.tail == rebased.tail
