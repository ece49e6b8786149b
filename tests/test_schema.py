"""The public data schema's words (efpsn/params/schema.py) at their edges: every task form, the
scale divisors (one or one per feature), and refusals that name what came without echoing a whole
oversized value."""

from __future__ import annotations

import numpy as np
import pytest

from efpsn.params.schema import Scale, TaskSpec


def check_task_spec(task: str) -> None:
    TaskSpec.parse(task)


def scale_divisor(scale: str, *, features: int | None = None) -> float | np.ndarray:
    return Scale.parse(scale).divisor(features=features)


def test_every_task_form_is_accepted_at_its_smallest_and_shows_its_text() -> None:
    for task in ("logreg", "lenet", "mlp:1", "mlp:1,1", "mlp:32,16", "python:m:make",
                 "python:pkg.models:build_net", "python:a:b:c"):
        spec = TaskSpec.parse(task)
        assert str(spec) == spec.wire() == task and TaskSpec.of(task) == spec
        assert TaskSpec.of(spec) is spec
    assert TaskSpec.parse("mlp:32,16").hidden == (32, 16)
    assert TaskSpec.parse("python:a:b:c").factory == "a:b:c"
    assert TaskSpec.parse("logreg").logreg and not TaskSpec.parse("mlp:4").logreg


def test_every_scale_shows_the_text_it_parses() -> None:
    for text in ("none", "unit", "standard", "div:255", "div:0.5", "div:2,4,0.5", "div:1e+20"):
        scale = Scale.parse(text)
        assert str(scale) == scale.wire() == text and Scale.of(text) == scale
        assert Scale.parse(str(scale)) == scale and Scale.of(scale) is scale
    assert Scale.parse("standard").standard and not Scale.parse("div:3").standard
    assert Scale.parse("div:3").divisors == (3.0,)
    with pytest.raises(ValueError, match="divisors"):
        Scale("div")
    with pytest.raises(ValueError, match="hidden widths"):
        TaskSpec("mlp")


@pytest.mark.parametrize(("task", "words"), [
    ("mlp:0", "expected mlp:H1,H2,... with positive hidden widths"),
    ("mlp:", "expected mlp:H1,H2,... with positive hidden widths"),
    ("python:mymodel:", "expected python:MODULE:FACTORY"),
    ("python:mymodel:1x", "expected python:MODULE:FACTORY"),
    ("python::make", "expected python:MODULE:FACTORY"),
    ("python:mymodel", "expected python:MODULE:FACTORY"),
])
def test_a_malformed_task_is_refused(task: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        check_task_spec(task)


def test_an_unknown_task_is_refused_with_every_accepted_form() -> None:
    with pytest.raises(ValueError) as refused:
        check_task_spec("svm")
    assert str(refused.value) == ("task must be one of ('logreg', 'ridge', 'lenet', "
                                  "'mlp:H1,H2,...', 'python:MODULE:FACTORY'), got 'svm'")


def test_scale_divisors() -> None:
    # unit: 8-bit intensities onto [0, 1]; div:C one public constant; div:C1,...,Cd per feature
    assert scale_divisor("none") == 1.0
    assert scale_divisor("standard") == 1.0  # read raw; standardised after phase I
    assert np.uint8(255) / scale_divisor("unit") == 1.0 and 0 / scale_divisor("unit") == 0.0
    assert scale_divisor("div:0.5") == 0.5 and scale_divisor("div:3") == 3.0
    per_feature = scale_divisor("div:2,4,0.5", features=3)
    assert isinstance(per_feature, np.ndarray) and per_feature.dtype == np.float64
    assert per_feature.tolist() == [2.0, 4.0, 0.5]
    assert scale_divisor("div:2,4").tolist() == [2.0, 4.0]  # the count unchecked without it
    with pytest.raises(ValueError, match="scale 'div:2,4,8' gives 3 divisors, but a sample has "
                                         "2 features: one each"):
        scale_divisor("div:2,4,8", features=2)
    for bad in ("div:0", "div:-1", "div:", "div:1,,2", "div:inf", "unit8"):
        with pytest.raises(ValueError, match="scale must be none, standard, unit, div:C"):
            scale_divisor(bad)


def test_a_refusal_quotes_at_most_60_characters_of_the_scale() -> None:
    short = "div:0"
    with pytest.raises(ValueError) as refused:
        scale_divisor(short)
    assert str(refused.value).endswith(f"got {short!r}")
    long = "div:" + "1," * 5000 + "x"
    with pytest.raises(ValueError) as refused:
        scale_divisor(long)
    assert str(refused.value).endswith(f"got {long[:60] + '...'!r}")
    assert len(str(refused.value)) < 200
    exactly = "div:" + "9" * 55 + ",0"  # 61 characters: cut
    with pytest.raises(ValueError) as refused:
        scale_divisor(exactly)
    assert str(refused.value).endswith(f"got {exactly[:60] + '...'!r}")


def test_the_kinds_the_values_declare_are_the_kinds_they_accept() -> None:
    import typing

    from efpsn.params.schema import ScaleKind, TaskKind

    tasks = {TaskSpec.parse(t).kind for t in ("logreg", "ridge", "lenet", "mlp:8",
                                              "python:m:make")}
    assert tasks == set(typing.get_args(TaskKind))
    scales = {Scale.parse(s).kind for s in ("none", "unit", "div:2", "standard")}
    assert scales == set(typing.get_args(ScaleKind))


def test_a_bad_python_task_names_the_expected_form_with_an_example() -> None:
    with pytest.raises(ValueError, match=r"expected python:MODULE:FACTORY, e\.g\. python:mymodel:make$"):
        TaskSpec.parse("python:nomodule")
    with pytest.raises(ValueError, match=r"is python's, MODULE:FACTORY$"):
        TaskSpec("python", factory="nocolon")


def test_a_zero_or_negative_divisor_is_refused_and_divisors_are_float64() -> None:
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="finite floats > 0"):
            Scale("div", divisors=(1.0, bad))
    per_feature = Scale.parse("div:2,4").divisor(features=2)
    assert isinstance(per_feature, np.ndarray) and per_feature.dtype == np.float64
    np.testing.assert_array_equal(per_feature, [2.0, 4.0])


def test_the_standard_disclosure_is_named_in_plain_words() -> None:
    from efpsn.params.schema import STANDARD_DISCLOSURE

    assert STANDARD_DISCLOSURE.startswith(
        "disclosed by design to every agent (scale standard): every column's global mean and "
        "variance and the total sample count")


def test_scale_standard_needs_the_seeds_of_a_refreshed_zero_sum_mask() -> None:
    from efpsn.params.refresh_setting import Refresh
    from efpsn.params.schema import check_standard_masks

    standard, none = Scale.parse("standard"), Scale.parse("none")
    fading, never = Refresh.parse("fading"), Refresh.parse("never")
    check_standard_masks(standard, mask="zero-sum", refresh=fading)  # the default: fine
    check_standard_masks(standard, mask="none", refresh=never)  # nothing private: fine
    check_standard_masks(none, mask="zero-sum", refresh=never)  # public scales: nothing to check
    with pytest.raises(ValueError, match="mask 'zero-sum' with refresh 'never'"):
        check_standard_masks(standard, mask="zero-sum", refresh=never)
    with pytest.raises(ValueError, match="scale standard sums the column statistics"):
        check_standard_masks(standard, mask="gaussian", refresh=fading)
