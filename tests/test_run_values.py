"""The run parameters with a grammar as values (efpsn/params/values.py, Selection, Refresh): each
parses its text once, shows the text it reads back, carries the wire's scalar, and RunConfig
holds the values, never their text or a sentinel number."""

from __future__ import annotations

import math
import typing

import pytest

from efpsn.params.config import RunConfig, value_types
from efpsn.params.refresh_setting import Refresh
from efpsn.params.schema import Scale, TaskSpec
from efpsn.params.values import L2, BatchSize, Momentum, Rounds, Schedule, StopEvery
from efpsn.perturbation.selection import Selection

TEXTS = {
    Rounds: ["auto", "1", "6502"],
    BatchSize: ["auto", "full", "1", "64"],
    Momentum: ["auto", "0.0", "0.5", "0.993565"],
    L2: ["default", "0.0", "0.01"],
    Schedule: ["auto", "auto:0.00104197", "paper", "paper:0.1", "constant:0.05",
               "onecycle:0.1"],
    Selection: ["all", "last-bias", "random", "random:200", "indices:3,17,42",
                "all@lebesgue", "last-bias@uniform"],
    Refresh: ["never", "every:1", "every:10", "fading", "fading:0.5", "fading:0.5:0.001"],
    StopEvery: ["auto", "never", "25"],
    TaskSpec: ["logreg", "lenet", "mlp:32,16", "python:mymodel:make"],
    Scale: ["none", "unit", "standard", "div:255", "div:2,4,0.5"],
}


@pytest.mark.parametrize(("kind", "text"), [(k, t) for k, ts in TEXTS.items() for t in ts])
def test_every_value_shows_the_text_it_parses_and_crosses_the_wire_unchanged(
        kind: typing.Any, text: str) -> None:
    value = kind.parse(text)
    assert str(value) == text
    assert kind.parse(str(value)) == value
    assert kind.of(value) is value and kind.of(text) == value
    assert kind.of(value.wire()) == value  # the wire's scalar (text or number) reads back


def test_the_sentinels_live_only_in_the_wire_scalars() -> None:
    assert (Rounds(None).wire(), BatchSize(None).wire(), BatchSize(None, auto=True).wire(),
            Momentum(None).wire(), L2(None).wire(), StopEvery(None, auto=True).wire(),
            StopEvery(None).wire()) == (0, 0, -1, -1.0, -1.0, -1, 0)
    assert BatchSize.of(-1).auto and not BatchSize.of(-1).full and BatchSize.of(0).full
    assert StopEvery.of(-1).auto and StopEvery.of(0).never and StopEvery.of(7).rounds == 7
    assert not StopEvery(None, auto=True).never and not StopEvery(3).never
    assert Rounds.of(0).auto and BatchSize.of(0).full and Momentum.of(-1.0).auto
    assert L2.of(-1.0).default and L2.parse("-1").default
    assert (Rounds.of(300).count, BatchSize.of(64).size, Momentum.of(0.9).beta,
            L2.of(0.5).weight) == (300, 64, 0.9, 0.5)


def test_an_unresolved_value_refuses_to_give_a_number() -> None:
    with pytest.raises(ValueError, match="iterations auto are the step rule's"):
        _ = Rounds(None).total
    with pytest.raises(ValueError, match="momentum auto is the step rule's"):
        _ = Momentum(None).value
    assert Rounds(7).total == 7 and Momentum(0.25).value == 0.25


def test_the_values_refuse_what_is_out_of_range_naming_it() -> None:
    for bad, match in ((lambda: Rounds(0), "iterations must be a positive integer"),
                       (lambda: Rounds.of(-1), "iterations must be >= 0"),
                       (lambda: BatchSize.of(-5), "batch_size must be >= -1"),
                       (lambda: BatchSize(64, auto=True), "not both"),
                       (lambda: Momentum(1.0), r"momentum must be in \[0, 1\)"),
                       (lambda: L2(-0.5), "l2 must be a finite number >= 0"),
                       (lambda: L2.parse("nan"), "l2 must be a finite number or 'default'"),
                       (lambda: Schedule.parse("paper:fast"), "'fast' is not a number"),
                       (lambda: Schedule.parse("cosine"), "unknown schedule 'cosine'"),
                       (lambda: Schedule.parse("constant"), "constant schedule needs"),
                       (lambda: Schedule.parse("onecycle"), "onecycle schedule needs"),
                       (lambda: StopEvery.parse("0"), "stop every must be a positive integer"),
                       (lambda: StopEvery.of(-2), "stop_every must be >= -1"),
                       (lambda: StopEvery(5, auto=True), "not both")):
        with pytest.raises(ValueError, match=match):
            bad()
    for bad_type in (lambda: Rounds.of(True), lambda: Rounds.of(2.5), lambda: Schedule.of(3),
                     lambda: Momentum.of(None)):
        with pytest.raises(TypeError):
            bad_type()


def test_the_schedule_says_what_the_step_rule_left_and_its_constant_step() -> None:
    assert Schedule.parse("auto").unresolved and not Schedule.parse("auto:0.1").unresolved
    assert Schedule.parse("auto:0.1").auto and not Schedule.parse("paper").auto
    assert [Schedule.parse(t).constant_step for t in ("auto:0.1", "constant:0.2", "paper:0.3",
                                                      "onecycle:0.1")] == [0.1, 0.2, None, None]


def test_run_config_holds_values_never_text_or_sentinels() -> None:
    hints = typing.get_type_hints(RunConfig)
    for name in ("selection", "refresh", "schedule", "momentum", "iterations", "batch_size",
                 "l2", "scale", "task", "stop_every"):
        assert hints[name] not in (str, int, float), name
        assert name in value_types() and hasattr(hints[name], "parse"), name
    assert {hints[n] for n in ("scale", "task", "stop_every")} == {Scale, TaskSpec, StopEvery}
    config = RunConfig(selection="last-bias", refresh="never", schedule="paper",
                       iterations=200, batch_size=64, momentum=0.0, l2=0.001, algorithm="dsgd")
    assert config == RunConfig(selection=Selection.parse("last-bias"), refresh=Refresh(None),
                               schedule=Schedule("paper"), iterations=Rounds(200),
                               batch_size=BatchSize(64), momentum=Momentum(0.0), l2=L2(0.001),
                               algorithm="dsgd")
    assert all(isinstance(getattr(config, name), kind) for name, kind in value_types().items())
    plain = config.to_dict()
    assert (plain["selection"], plain["refresh"], plain["schedule"], plain["iterations"],
            plain["batch_size"], plain["momentum"], plain["l2"]) == (
        "last-bias", "never", "paper", 200, 64, 0.0, 0.001)
    assert RunConfig.from_dict(plain) == config
    resolved = RunConfig().resolved()
    assert RunConfig.from_dict(resolved.to_dict()) == resolved
    assert math.isclose(resolved.refresh.fade or 0.0, 0.99677205)


@pytest.mark.parametrize(("make", "error", "words"), [
    (lambda: BatchSize.parse("abc"), ValueError, r"^batch size must be a positive integer, 'full' or 'auto', got 'abc'$"),
    (lambda: BatchSize(0), ValueError, r"^batch size "),
    (lambda: Momentum.parse("1.0"), ValueError, r"^momentum must be a number in \[0, 1\) or 'auto'"),
    (lambda: Momentum(1.0), ValueError, r"^momentum must be in \[0, 1\)"),
    (lambda: Momentum("0.5"), TypeError, r"^momentum must be a number, got '0\.5'$"),
    (lambda: L2("x"), TypeError, r"^l2 must be a number, got 'x'$"),
    (lambda: L2.of(object()), TypeError, r"^l2 must be a number"),
    (lambda: L2.of(math.inf), ValueError, r"^l2 must be finite, got inf$"),
    (lambda: Schedule.parse(3), TypeError, r"^schedule must be a str, got int$"),
    (lambda: Schedule.parse("warm"), ValueError, r"'paper:LR0', 'constant:LR' or 'onecycle:LR'$"),
    (lambda: StopEvery(5, auto=True), ValueError, r"^stop every is a number of rounds or auto, not both$"),
    (lambda: StopEvery(0), ValueError, r"^stop every "),
    (lambda: StopEvery.of(2.5), TypeError, r"^stop_every must be StopEvery, a str or an int, got 2\.5$"),
])
def test_a_refusal_names_the_parameter_and_what_it_got(make, error, words) -> None:
    with pytest.raises(error, match=words):
        make()


def test_a_momentum_keeps_its_beta_as_a_float() -> None:
    beta = Momentum(0).beta
    assert beta == 0.0 and type(beta) is float


def test_the_declared_schedule_kinds_are_the_parsed_ones() -> None:
    from efpsn.params.values import ScheduleKind

    kinds = {Schedule.parse(t).kind for t in ("auto", "paper", "constant:0.1", "onecycle:0.1")}
    assert kinds == set(typing.get_args(ScheduleKind))
