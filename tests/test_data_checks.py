"""Data checks that catch the absurd: values that would overflow the model's float64
arithmetic, non-numeric .csv cells and text labels, each refused at load with its place."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.options import AgentOptions
from agent.prepare import failure_category, prepare
from efpsn.data.local import HEADROOM, DataError, feature_limit, load_local_data
from efpsn.params.config import RunConfig
from efpsn.tasks.catalog import make_task

COMMON = {"who": "agent2", "shape": (6,), "classes": 3, "divisor": 1.0, "seed": 0,
          "holdout": 0.0}


def tabular(n: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, n)
    return rng.normal(size=(n, 6)) + y[:, None], y


def write_csv(path: Path, x: np.ndarray, y: list[str] | np.ndarray, *,
              cells: dict[tuple[int, int], str] | None = None) -> Path:
    """A .csv with header f0..f5,label; cells[(row, col)] replaces one feature's text."""
    lines = [",".join(f"f{j}" for j in range(x.shape[1])) + ",label"]
    for r, (row, label) in enumerate(zip(x, y, strict=True)):
        texts = [repr(float(v)) for v in row]
        for (cr, cc), text in (cells or {}).items():
            if cr == r:
                texts[cc] = text
        lines.append(",".join(texts) + f",{label}")
    path.write_text("\n".join(lines) + "\n")
    return path


def refusal(path: Path, **kw: object) -> str:
    with pytest.raises(DataError) as info:
        load_local_data(path, **{**COMMON, **kw})
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"agent2: {path}: ") and "expected" in text
    return text


# ------------------------------------------------------------------------ the limit's arithmetic


def test_feature_limit_is_where_features_times_value_squared_meets_the_float64_range() -> None:
    biggest = float(np.finfo(np.float64).max)
    for d in (1, 6, 784, 3 * 32 * 32):
        limit = feature_limit(d)
        total = math.log(d) + 2 * math.log(limit) + math.log(HEADROOM)  # in logs: no overflow
        assert total == pytest.approx(math.log(biggest), rel=1e-14)
    assert 7e147 < feature_limit(784) < 8e147
    with pytest.raises(ValueError, match="features must be >= 1"):
        feature_limit(0)


def test_at_the_limit_two_logreg_steps_stay_finite_and_1e300_overflows() -> None:
    """The refusal is about the arithmetic: one gradient step makes the parameters of the
    features' order, the next logits features x value^2."""
    task = make_task("logreg", shape=(6,), classes=3, l2=0.01)
    labels = torch.tensor([0, 1, 2])

    def two_steps(value: float) -> tuple[float, torch.Tensor]:
        images = torch.full((3, 6), value, dtype=torch.float64)
        _, grad = task.loss_and_grad(torch.zeros(task.num_params, dtype=torch.float64), images,
                                     labels)
        with np.errstate(all="ignore"):
            return task.loss_and_grad(-grad, images, labels)  # one step at learning rate 1

    loss, grad = two_steps(feature_limit(6))
    assert math.isfinite(loss) and torch.isfinite(grad).all()
    loss, grad = two_steps(1e300)
    assert not (math.isfinite(loss) and torch.isfinite(grad).all())


# ------------------------------------------------------------------------ absurd values


def test_a_finite_absurd_value_is_refused_naming_its_cell(tmp_path: Path) -> None:
    x, y = tabular()
    x[5, 4] = 1e300
    np.savez(tmp_path / "d.npz", X=x, y=y)
    text = refusal(tmp_path / "d.npz")
    assert "X has a value too large for float64 arithmetic at X[5, 4]" in text
    assert "about 6 x value^2" in text and "--scale div:C" in text
    assert "1e+300" not in text and "1e300" not in text  # never the value itself
    csv = write_csv(tmp_path / "d.csv", x, y)
    assert "at row 6 (line 7), column 'f4'" in refusal(csv)


def test_images_name_their_cell_in_the_files_own_shape(tmp_path: Path) -> None:
    images = np.zeros((4, 1, 3, 2))
    images[2, 0, 1, 1] = -1e200
    np.savez(tmp_path / "img.npz", X=images, y=np.zeros(4, int))
    assert "at X[2, 0, 1, 1]" in refusal(tmp_path / "img.npz", shape=(6,))


def test_the_limit_applies_after_the_public_scale(tmp_path: Path) -> None:
    x, y = tabular()
    x[0, 0] = 1e149  # above feature_limit(6) ~ 8.3e148 as it stands
    np.savez(tmp_path / "d.npz", X=x, y=y)
    assert "at X[0, 0]" in refusal(tmp_path / "d.npz")
    scaled = load_local_data(tmp_path / "d.npz", **{**COMMON, "divisor": 1e10})
    assert float(scaled.train.images[0, 0]) == pytest.approx(1e139)
    x[0, 0] = 1e140  # fine as it stands, too large once divided by a tiny public scale
    np.savez(tmp_path / "d.npz", X=x, y=y)
    load_local_data(tmp_path / "d.npz", **COMMON)
    text = refusal(tmp_path / "d.npz", divisor=1e-10)
    assert "at X[0, 0]: its magnitude divided by the public scale 1e-10 exceeds" in text


def test_non_finite_values_name_their_cell(tmp_path: Path) -> None:
    x, y = tabular()
    x[7, 1] = -np.inf
    np.savez(tmp_path / "d.npz", X=x, y=y)
    assert "X has non-finite values (NaN or inf), the first at X[7, 1]" in refusal(
        tmp_path / "d.npz")
    x[7, 1] = 0.0
    csv = write_csv(tmp_path / "d.csv", x, y, cells={(2, 3): "inf"})
    assert "row 3 (line 4), column 'f3' is not finite (inf); expected finite numbers" in \
        refusal(csv)
    # "nan", like an empty cell, is a missing value: filled only under scale standard
    csv = write_csv(tmp_path / "e.csv", x, y, cells={(2, 3): "nan"})
    assert "has empty cells, the first at row 3 (line 4), column 'f3'; expected a number in " \
           "every cell: empty cells are filled with the network's column means, which only " \
           "scale standard computes" in refusal(csv)


def test_the_public_test_set_is_checked_the_same_way(tmp_path: Path) -> None:
    x, y = tabular()
    np.savez(tmp_path / "train.npz", X=x, y=y)
    x[1, 2] = 1e300
    np.savez(tmp_path / "test.npz", X=x, y=y)
    with pytest.raises(DataError, match=r"test.npz: X has a value too large .* at X\[1, 2\]"):
        load_local_data(tmp_path / "train.npz", test_path=tmp_path / "test.npz", **COMMON)


# ------------------------------------------------------------------------ text in a .csv


def test_a_non_numeric_csv_cell_names_row_line_and_column(tmp_path: Path) -> None:
    x, y = tabular()
    csv = write_csv(tmp_path / "d.csv", x, y, cells={(4, 2): "abc"})
    text = refusal(csv)
    assert "row 5 (line 6), column 'f2' is not a number; expected numeric features" in text
    assert "abc" not in text
    # an empty cell is a missing value, not a category: the hint is the fill policy's
    empty = write_csv(tmp_path / "e.csv", x, y, cells={(0, 5): ""})
    text = refusal(empty)
    assert "has empty cells, the first at row 1 (line 2), column 'f5'" in text
    assert "categor" not in text and "filled with the network's column means" in text


def test_blank_lines_keep_the_line_numbers_true(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("a,b,c,d,e,f,label\n\n1,2,3,4,5,6,0\n\n1,2,x,4,5,6,1\n")
    assert "row 2 (line 5), column 'c' is not a number" in refusal(tmp_path / "d.csv")


@pytest.mark.parametrize("labels, classes, span", [
    (["abc"] * 20, 3, "expected integer labels 0..2 in an .npz"),
    (["yes", "no"] * 10, 2, "expected integer labels 0 and 1 in an .npz"),
])
def test_text_labels_without_a_table_schema_say_what_they_need(
        tmp_path: Path, labels: list[str], classes: int, span: str) -> None:
    """Class names are labels of a run with a table schema (a --data-dir folder makes one;
    tests/test_own_tables.py); an agent of a run without one is told so, and an .npz how to
    give its labels."""
    x, _ = tabular()
    text = refusal(write_csv(tmp_path / "d.csv", x, labels), classes=classes)
    assert "rows 1, 2, 3 and more (lines 2, 3, 4), column 'label' is not a number; expected " \
           "class indices 0, 1, ...: the run has no table schema, which text columns and " \
           "class names need" in text
    np.savez(tmp_path / "d.npz", X=x, y=np.array(labels))
    text = refusal(tmp_path / "d.npz", classes=classes)
    assert "y holds text labels (<U3); " + span in text
    assert "a .csv table's label column may hold class names" in text


def test_text_features_in_an_npz_are_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", X=np.array([["1", "a"]] * 4), y=np.zeros(4, int))
    assert "X holds text (<U1); expected numbers" in refusal(tmp_path / "d.npz", shape=(2,))


def test_the_coordinator_learns_only_the_category(tmp_path: Path) -> None:
    x, y = tabular()
    x[0, 0] = 1e300
    np.savez(tmp_path / "d.npz", X=x, y=y)
    config = RunConfig(data="local", input_shape="6", classes=3, batch_size=4, m=3, N=3,
                       selection="last-bias", key_bits=2048)
    options = AgentOptions(name="agent2", listen="127.0.0.1:0", coordinator="127.0.0.1:1",
                           data=tmp_path / "d.npz")
    with pytest.raises(DataError) as info:
        prepare(config, options)
    assert "X[0, 0]" in str(info.value)
    assert failure_category(info.value) == "its local data cannot be used"


def test_the_step_rule_s_second_moment_bound_is_checked_on_the_training_part(
        tmp_path: Path) -> None:
    from efpsn.data.local import second_moment

    rng = np.random.default_rng(4)
    y = rng.integers(0, 3, 200)
    # standardised data meets lambda_max(E[x~ x~^T]) <= d + 1 = 7 by the cheap trace test
    unit = rng.normal(size=(200, 6))
    np.savez(tmp_path / "unit.npz", X=unit, y=y)
    load_local_data(tmp_path / "unit.npz", **COMMON, moment_bound=7.0)
    # independent columns of standard deviation 1.5: the trace (14.5) exceeds 7, the largest
    # eigenvalue (about 2.25) does not: accepted by the exact test
    wide = 1.5 * rng.normal(size=(200, 6))
    assert float(np.mean(wide**2)) * 6 + 1 > 7 and second_moment(wide) < 7
    np.savez(tmp_path / "wide.npz", X=wide, y=y)
    load_local_data(tmp_path / "wide.npz", **COMMON, moment_bound=7.0)
    # one column far out of scale: refused, naming that column and never a value
    far = unit.copy()
    far[:, 4] *= 40.0
    np.savez(tmp_path / "far.npz", X=far, y=y)
    text = refusal(tmp_path / "far.npz", moment_bound=7.0)
    assert "too large for the default step size" in text and "largest column: X[:, 4]" in text
    assert not re.search(r"\d+\.\d", text.split("largest column")[0].split("exceeds 7")[0])
    # the public scale is applied first: the same file divided by 40 per feature passes
    load_local_data(tmp_path / "far.npz", **{**COMMON, "divisor": np.array([1, 1, 1, 1, 40, 1.0])},
                    moment_bound=7.0)
    # a .csv names the column by its header
    write_csv(tmp_path / "far.csv", far, y)
    assert "largest column: column 'f4'" in refusal(tmp_path / "far.csv", moment_bound=7.0)


def test_second_moment_is_the_largest_eigenvalue_with_the_bias_column() -> None:
    from efpsn.data.local import second_moment

    x = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 2.0]])
    tilde = np.hstack([x, np.ones((3, 1))])
    expected = float(np.linalg.eigvalsh(tilde.T @ tilde / 3)[-1])
    assert second_moment(x) == pytest.approx(expected, rel=1e-12)
    tall = np.arange(12.0).reshape(2, 6)  # more features than samples: the other Gram side
    tilde = np.hstack([tall, np.ones((2, 1))])
    assert second_moment(tall) == pytest.approx(
        float(np.linalg.eigvalsh(tilde.T @ tilde / 2)[-1]), rel=1e-12)
