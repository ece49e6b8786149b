"""The stop rule (efpsn/stopping.py): rounding that only loosens, one max-consensus over the
graph's diameter, the same stop round at every agent and in the simulator, --iterations wins."""

from __future__ import annotations

import math

import pytest
import torch

from efpsn.certificate import TARGET, certify
from efpsn.config import STOP_EVERY, RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.stopping import CEILING, FLOOR, StopRule, exponents, merge
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
    assert RunConfig().resolved().stop_every == STOP_EVERY
    assert RunConfig(iterations=300).resolved().stop_every == 0  # --iterations N runs N
    assert RunConfig(iterations=300, stop_every=10).resolved().stop_every == 10
    assert RunConfig(task="lenet", selection="last-bias").resolved().stop_every == 0
    assert RunConfig(algorithm="dsgd").resolved().stop_every == 0


def test_stop_integers_on_the_wire() -> None:
    message = {"y": torch.ones(3, dtype=torch.float64), "z": torch.zeros(3, dtype=torch.float64),
               "stop:": torch.tensor([FLOOR, -3, 5, CEILING])}
    data = encode_round(message, run_id="r", sender="a", round_=4)
    pb = agent_pb2.RoundMessage.FromString(data)
    assert list(pb.stop) == [FLOOR, -3, 5, CEILING]
    record = parse_round(pb, run_id="r", senders={"a"}, shapes={"y": (3,), "z": (3,)})
    assert record.tensors["stop:"].tolist() == [FLOOR, -3, 5, CEILING]
    plain = parse_round(agent_pb2.RoundMessage.FromString(encode_round(
        {k: v for k, v in message.items() if k != "stop:"}, run_id="r", sender="a",
        round_=4)), run_id="r", senders={"a"}, shapes={"y": (3,), "z": (3,)})
    assert "stop:" not in plain.tensors and plain.digest != record.digest
    for bad in ([1, 2, 3], [0, 0, 0, CEILING + 1]):
        pb.ClearField("stop")
        pb.stop.extend(bad)
        with pytest.raises(WireError, match="stop must be empty or 4 integers"):
            parse_round(pb, run_id="r", senders={"a"}, shapes={"y": (3,), "z": (3,)})


@pytest.fixture(scope="module")
def fast_problem():  # type: ignore[no-untyped-def]
    return build_problem(FAST.resolved())


def test_the_simulator_stops_at_the_target_before_the_cap(fast_problem) -> None:
    run = run_simulation(FAST, problem=fast_problem)
    cap, rounds = run.config.iterations.total, run.timings["rounds"]
    assert run.config.stop_every == STOP_EVERY and rounds < cap
    # a check round plus the diameter (2 on the 5-ring)
    assert rounds % STOP_EVERY == 2 and run.final["round"] == rounds
    assert run.convergence is not None and run.convergence.converged
    assert TARGET / 100 <= run.convergence.bound <= TARGET


def test_an_explicit_iterations_wins(fast_problem) -> None:
    config = FAST.replace(iterations=120)
    run = run_simulation(config, problem=build_problem(config.resolved()))
    assert run.config.stop_every == 0 and run.timings["rounds"] == 120
