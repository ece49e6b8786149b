"""The run parameters' checks and parsers (efpsn/params/checks.py, the values of
efpsn/params/values.py) at their boundaries: the smallest and largest value each accepts, the first
it refuses, and what the refusal says."""

from __future__ import annotations

import math

import pytest

from efpsn.params.checks import at_least, check_data, one_of, positive
from efpsn.params.config import RunConfig
from efpsn.params.refresh_setting import Refresh
from efpsn.params.values import BatchSize, Momentum, Rounds


def test_batch_sizes_are_positive_integers_full_or_auto() -> None:
    assert tuple(BatchSize.parse(t).size for t in ("full", "1", "64")) == (None, 1, 64)
    assert BatchSize.parse("auto").auto and not BatchSize.parse("full").auto
    for bad in ("0", "-3", "2.5", "lots", ""):
        with pytest.raises(ValueError, match=f"batch size must be a positive integer, 'full' "
                                             f"or 'auto', got '{bad}'"):
            BatchSize.parse(bad)


def test_rounds_are_positive_integers_or_auto() -> None:
    assert tuple(Rounds.parse(t).count for t in ("auto", "1", "300")) == (None, 1, 300)
    for bad in ("0", "-1", "many", "1e3"):
        with pytest.raises(ValueError, match=f"iterations must be a positive integer or "
                                             f"'auto', got '{bad}'"):
            Rounds.parse(bad)


def test_momentum_is_in_0_1_or_auto() -> None:
    assert tuple(Momentum.parse(t).beta for t in ("auto", "0", "0.99")) == (None, 0.0, 0.99)
    for bad in ("1", "1.0", "-0.1", "nan", "fast"):
        with pytest.raises(ValueError, match=rf"momentum must be a number in \[0, 1\) or "
                                             rf"'auto', got '{bad}'"):
            Momentum.parse(bad)


def test_the_boundaries_themselves_are_accepted() -> None:
    for changes in ({"precision": 0}, {"precision": 30}, {"test_fraction": 0.01},
                    {"test_fraction": 0.99}, {"agents": 2}, {"gamma": 0.5},
                    {"gamma": 1e-12}, {"refresh": "every:1", "algorithm": "dsgd"},
                    {"refresh": "fading:1e-9"}, {"refresh": "fading:0.999999"}, {"data": "idx:/srv/mnist"}):
        config = RunConfig(**changes)
        wanted = {k: Refresh.parse(v) if k == "refresh" else v for k, v in changes.items()}
        assert all(getattr(config, k) == v for k, v in wanted.items()), changes
    check_data("idx:folder")
    assert Refresh.parse("every:1").every == 1


def test_the_check_factories_refuse_exactly_outside_their_range() -> None:
    at_least("K", 0)(0)
    with pytest.raises(ValueError, match="K must be >= 0, got -1"):
        at_least("K", 0)(-1)
    positive("clip")(1e-300)
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match=f"clip must be a finite number > 0, got {bad}"):
            positive("clip")(bad)
    one_of("mode", ("a", "b"))("b")
    with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\), got 'c'"):
        one_of("mode", ("a", "b"))("c")


def test_a_seat_is_named_agentK_one_based() -> None:
    from efpsn.params.checks import seat_index

    assert [seat_index(n, agents=6) for n in ("agent1", " agent6 ")] == [0, 5]
    for bad in ("agent0", "agent7", "agentx", "5", "Agent2"):
        with pytest.raises(ValueError, match=rf"^{bad!r} is not a seat of this run "
                                             r"\(agent1\.\.agent6\)$"):
            seat_index(bad, agents=6)


def test_the_late_seats_are_named_once_each_and_two_agents_start() -> None:
    from efpsn.params.checks import parse_late

    assert parse_late("", agents=5) == ()
    assert parse_late(" agent5 , agent2,", agents=5) == (1, 4)
    with pytest.raises(ValueError, match=r"^late 'agent2,agent2': a seat is named twice$"):
        parse_late("agent2,agent2", agents=5)
    with pytest.raises(ValueError, match=r"^'agent6' is not a seat"):
        parse_late("agent6", agents=5)
    assert parse_late("agent1,agent2,agent3", agents=5) == (0, 1, 2)  # two start
    with pytest.raises(ValueError, match=r"^late 'agent1,agent2,agent3,agent4': 1 of 5 agents "
                                         r"would start; a run starts with at least 2$"):
        parse_late("agent1,agent2,agent3,agent4", agents=5)
