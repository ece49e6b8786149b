"""The stop rule (efpsn/optimize/stopping.py): rounding that only loosens, one max-consensus over
the graph's diameter, the same stop round at every agent and in the simulator, --iterations wins."""

from __future__ import annotations

import math

import pytest
import torch

from efpsn.optimize.certificate import TARGET, certify
from efpsn.optimize.stopping import CEILING, FLOOR, StopRule, exponents, merge
from efpsn.params.config import STOP_EVERY, RunConfig
from efpsn.params.values import StopEvery
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.wire.records import WireError
from efpsn.wire.rounds import encode_round, parse_round
from efpsn.wire.v1 import agent_pb2

# l2 = 10 on the main job's data: the step rule's cap is 289 rounds, the target is met before
FAST = RunConfig(l2=10.0, eval_every=50, refresh="never", key_bits=512)


def _rule(**kw: object) -> StopRule:
    args = {"every": 10, "hops": 2, "cap": 100, "curvature": 4.0, "l2": 0.5, "momentum": 0.5,
            "target": 1e-6, **kw}
    return StopRule(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1e-300, 3e-9, 0.25, 0.3, 1.0, 7.0, 1024.0, 1e300])
def test_the_disclosed_integers_only_loosen_the_measures(value: float) -> None:
    tracker, gap, step, norm = exponents({"tracker": value, "gap": value, "step": value},
                                         x_norm=value, momentum=0.9)
    assert tracker == gap == step
    assert 2.0 ** tracker >= value > 2.0 ** (tracker - 1)  # the least power of 2 above
    assert 2.0 ** -norm <= value < 2.0 ** (-norm + 1)  # the greatest power of 2 below


def test_zero_missing_and_infinite_measures() -> None:
    assert exponents({"tracker": 0.0, "gap": 0.0, "step": 0.0}, x_norm=0.0, momentum=0.9) == (
        FLOOR, FLOOR, FLOOR, -FLOOR)
    assert exponents({"gap": math.inf, "step": math.nan}, x_norm=1.0, momentum=0.9)[:3] == (
        CEILING, CEILING, CEILING)
    # without momentum the step is no term of the certificate: nothing about it is disclosed
    assert exponents({"tracker": 1.0, "gap": 1.0, "step": 5.0}, x_norm=1.0,
                     momentum=0.0)[2] == FLOOR
    rule = _rule()
    assert rule.bound((CEILING, FLOOR, FLOOR, 0)) == math.inf
    assert not rule.stops((CEILING, FLOOR, FLOOR, 0))


def test_the_rule_bounds_the_certificate_from_above() -> None:
    rule = _rule()
    measures = [{"tracker": 3e-9, "gap": 1.1e-10, "step": 7e-9},
                {"tracker": 1e-9, "gap": 2.9e-10, "step": 2e-9}]
    norms = [5.3, 5.1]
    own, other = (exponents(m, x_norm=x, momentum=0.5)
                  for m, x in zip(measures, norms, strict=True))
    network = merge(own, [other])
    worst = {k: max(m[k] for m in measures) for k in measures[0]}
    # ||x_bar|| is at least min ||x_i|| - D gap - 2 beta step
    x_bar = min(norms) - 2 * worst["gap"] - 2 * 0.5 * worst["step"]
    exact = certify(worst, x_bar_norm=x_bar, curvature=4.0, l2=0.5, hops=2, momentum=0.5,
                    rounds=10)
    assert exact.bound is not None and exact.bound < rule.bound(network) < 16 * exact.bound
    assert rule.stops(network) == (rule.bound(network) <= 1e-6)


def test_checks_and_windows_are_public_functions_of_the_round() -> None:
    rule = _rule(every=10, hops=3, cap=45)
    assert [t for t in range(50) if rule.is_check(t)] == [10, 20, 30, 40]
    assert [t for t in range(50) if rule.window(t) is not None] == [10, 11, 12, 20, 21, 22,
                                                                    30, 31, 32, 40, 41, 42]
    assert not _rule(every=10, hops=3, cap=43).is_check(40)  # its stop round is the cap
    # checks never overlap: a long diameter spaces them out
    assert _rule(every=2, hops=5).period == 6
    assert not _rule(every=0).active and _rule(every=0).window(10) is None
    assert _rule().stops((FLOOR, FLOOR, FLOOR, -3))


def test_auto_stops_only_when_the_rounds_are_the_rules() -> None:
    assert RunConfig().resolved().stop_every.rounds == STOP_EVERY
    assert RunConfig(iterations=300).resolved().stop_every.never  # --iterations N runs N
    assert RunConfig(iterations=300, stop_every=10).resolved().stop_every == StopEvery(10)
    assert RunConfig(task="lenet", selection="last-bias").resolved().stop_every.never
    assert RunConfig(algorithm="dsgd").resolved().stop_every.never


def test_stop_integers_on_the_wire() -> None:
    message = {"y": torch.ones(3, dtype=torch.float64), "z": torch.zeros(3, dtype=torch.float64),
               "stop:": torch.tensor([FLOOR, -3, 5, CEILING])}
    data = encode_round(message, run_id="r", sender="a", round_=4)
    pb = agent_pb2.RoundMessage.FromString(data)
    assert list(pb.stop) == [FLOOR, -3, 5, CEILING]
    record = parse_round(pb, run_id="r", senders={"a"}, shapes={"y": (3,), "z": (3,)},
                         seed=7)
    assert record.tensors["stop:"].tolist() == [FLOOR, -3, 5, CEILING]
    plain = parse_round(agent_pb2.RoundMessage.FromString(encode_round(
        {k: v for k, v in message.items() if k != "stop:"}, run_id="r", sender="a",
        round_=4)), run_id="r", senders={"a"}, shapes={"y": (3,), "z": (3,)}, seed=7)
    assert "stop:" not in plain.tensors and plain.digest != record.digest
    for bad in ([1, 2, 3], [0, 0, 0, CEILING + 1]):
        pb.ClearField("stop")
        pb.stop.extend(bad)
        with pytest.raises(WireError, match="stop must be empty or 4 integers"):
            parse_round(pb, run_id="r", senders={"a"}, shapes={"y": (3,), "z": (3,)}, seed=7)


@pytest.fixture(scope="module")
def fast_problem():  # type: ignore[no-untyped-def]
    return build_problem(FAST.resolved())


@pytest.fixture(scope="module")
def whole_run(fast_problem):  # type: ignore[no-untyped-def]
    return run_simulation(FAST, problem=fast_problem)


def test_the_simulator_stops_at_the_target_before_the_cap(whole_run) -> None:
    run = whole_run
    cap, rounds = run.config.iterations.total, run.timings["rounds"]
    assert run.config.stop_every.rounds == STOP_EVERY and rounds < cap
    # a check round plus the diameter (2 on the 5-ring)
    assert rounds % STOP_EVERY == 2 and run.final["round"] == rounds
    assert run.convergence is not None and run.convergence.converged
    assert TARGET / 100 <= run.convergence.bound <= TARGET


def test_an_explicit_iterations_wins(fast_problem) -> None:
    config = FAST.replace(iterations=120)
    run = run_simulation(config, problem=build_problem(config.resolved()))
    assert run.config.stop_every.never and run.timings["rounds"] == 120


def test_a_departure_voids_the_windows_it_cuts_and_the_rule_restarts_at_the_rebase() -> None:
    rule = _rule(every=10, hops=3, cap=100)
    # agent left at round 32: window 30 would be decided at round 32 (its last merge), void;
    # window 20 was decided at round 22, before
    cut = rule.voided_from(32)
    assert [t for t in range(100) if cut.is_check(t)] == [10, 20]
    assert cut.window(30) is None and cut.window(31) is None and cut.window(21) == 20
    assert cut.voided_from(40).until == 32 and rule.voided_from(33).window(30) == 30
    # the re-based rule (the remaining graph's diameter 2) counts its checks from R = 37
    later = _rule(every=10, hops=2, cap=100, origin=37)
    assert [t for t in range(100) if later.is_check(t)] == [47, 57, 67, 77, 87, 97]
    assert later.window(48) == 47 and later.window(49) is None and later.window(37) is None
    assert later.window(5) is None and not later.is_check(30)


def test_a_driver_under_a_voided_window_sends_no_integers(fast_problem) -> None:
    from efpsn.algorithms import make_algorithm
    from efpsn.algorithms.base import StepContext
    from efpsn.optimize.driver import RoundDriver
    from efpsn.optimize.stopping import STOP_KEY
    from efpsn.params.schedules import make_schedule
    from efpsn.simulator import make_mask_providers

    rule = StopRule.for_run(FAST, fast_problem.weights)
    config = FAST.resolved()
    schedule = make_schedule(config.schedule, iterations=config.iterations.total)
    driver = RoundDriver(
        algorithm=make_algorithm(config.algorithm, momentum=config.momentum.value),
        context=StepContext(agent=0, weights={0: 0.5, 1: 0.5}, lr=schedule(0),
                            oracle=fast_problem.objective(0, make_mask_providers(fast_problem)[0])),
        schedule=schedule, iterations=config.iterations.total, eval_every=50,
        x0=fast_problem.initial_params(), stop=rule)
    while driver.t < rule.period:  # with a mirror image of itself, up to the first check
        driver.step({1: dict(driver.outbox)})
    assert driver.sharing is not None and STOP_KEY in driver.outbox
    driver.revise_stop(rule.voided_from(driver.t))
    assert driver.sharing is None and STOP_KEY not in driver.outbox
    # a neighbour's integers of the void window are not read
    driver.step({1: {**driver.outbox, STOP_KEY: torch.tensor([0, 0, 0, 0])}})
    assert driver.sharing is None and not driver.stopped_early


def test_a_departure_at_the_last_windows_check_moves_the_stop_to_the_remaining_graphs_rule(
        fast_problem, whole_run) -> None:
    from efpsn.departure.membership import parse_leave

    stop = whole_run.timings["rounds"]  # a check round + 2 (the 5-ring's diameter)
    # agent3 sends nothing from the check round s on: its neighbours wait at s, the agents two
    # hops away at s + 1, nobody reaches the stop round s + 2 (efpsn/departure/last_window.py)
    leave = parse_leave(f"agent3@{stop - 2}", agents=5)
    run = run_simulation(FAST, problem=fast_problem, departures=[leave])
    rounds = run.timings["rounds"]
    # the 4-path's diameter is 3; its checks are counted from the re-base round R = T + 5
    assert rounds > leave.rebase_round and (rounds - 3 - leave.rebase_round) % STOP_EVERY == 0
    assert rounds < run.config.iterations.total
    assert run.convergence is not None and run.convergence.converged


def test_a_departure_inside_the_last_window_ends_the_run_where_the_far_agents_stopped(
        fast_problem, whole_run) -> None:
    from efpsn.departure.membership import parse_leave

    stop = whole_run.timings["rounds"]
    # agent3 sends nothing from s + 1 on: agents 1 and 5, two hops away, complete s + 2 on
    # the whole ring's certificate before anyone can know; agents 2 and 4 end at s
    leave = parse_leave(f"agent3@{stop - 1}", agents=5)
    run = run_simulation(FAST, problem=fast_problem, departures=[leave])
    assert run.timings["rounds"] == stop
    assert run.departures is not None
    event = run.departures["departures"][0]
    assert (event["stopped"], event["check_round"]) == (stop, stop - 2)
    assert event["finished"] == ["agent1", "agent5"]
    assert event["at_check"] == ["agent2", "agent4"]
    assert run.departures["optimum_of"] == "the optimum of agents 1,2,3,4,5's objective"
    # the finished agents hold the whole run's models bit for bit, the others their round-s
    # iterates (one step short of the stop round's: not the same)
    survivors = [0, 1, 3, 4]
    same = [bool(torch.equal(x, whole_run.xs[i])) for x, i in zip(run.xs, survivors,
                                                                 strict=True)]
    assert same == [True, False, False, True]
    assert run.convergence is not None and run.convergence.converged
    assert "at round" in run.convergence.line and run.convergence.bound <= TARGET
