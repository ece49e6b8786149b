"""A model the user can use: model.safetensors (a named state dict, no pickle, its public
metadata in the header), read back, loaded into the built-in and into the user's own module,
and `efpsn evaluate` printing the accuracy and loss the task computes."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from efpsn.cli.evaluate import evaluate_model, register
from efpsn.data.local import load_local_data
from efpsn.flags.parser import run_command
from efpsn.tasks.catalog import make_task
from efpsn.tasks.model_io import (
    FORMAT_VERSION,
    ModelMetadata,
    load_into,
    read_model,
    save_model,
    state_dict_of,
    vector_of,
)
from efpsn.tasks.models import LogisticRegression

ROOT = Path(__file__).resolve().parents[1]


def blobs(n: int = 200, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """2 classes, 12 features in raw units of ~10 (the run divides by the public div:10)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return 10.0 * (rng.normal(size=(n, 12)) + 0.4 * (2 * y[:, None] - 1)), y


def write_csv(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    header = ",".join(f"f{j}" for j in range(x.shape[1])) + ",label"
    rows = [",".join(repr(float(v)) for v in r) + f",{int(c)}" for r, c in zip(x, y)]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def trained_logreg(tmp_path: Path) -> tuple[object, torch.Tensor, Path]:
    """A logistic regression fitted by 200 full-batch gradient steps on blobs, saved."""
    task = make_task("logreg", shape=(12,), classes=2)
    x_raw, y = blobs()
    data = load_local_data(write_csv(tmp_path / "train.csv", x_raw, y), who="t", shape=(12,),
                           classes=2, divisor=10.0, seed=0, holdout=0.0).train
    x = torch.zeros(task.num_params, dtype=torch.float64)
    for _ in range(200):
        _, grad = task.loss_and_grad(x, data.images, data.labels)
        x = x - 0.5 * grad
    path = tmp_path / "agent1" / "model.safetensors"
    save_model(path, task=task, x=x, scale="div:10")
    return task, x, path


def test_the_state_dict_loads_into_the_built_in_and_a_user_module(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    task, x, path = trained_logreg(tmp_path)
    state = load_file(path)  # as the README shows: the library's own reader, no pickle
    assert sorted(state) == ["linear.bias", "linear.weight"]
    state = read_model(path).state  # in model order
    assert list(state) == ["linear.weight", "linear.bias"]
    assert state["linear.weight"].dtype == torch.float64 and state["linear.weight"].shape == (2, 12)
    images = torch.randn(7, 12, dtype=torch.float64)
    expected = task.logits(x, images)

    model = LogisticRegression(12, 2)  # the built-in (README: names match)
    model.load_state_dict(state)
    torch.testing.assert_close(model(images), expected, rtol=0, atol=0)

    mine = nn.Sequential(nn.Flatten(), nn.Linear(12, 2))  # the user's own, float32 (README)
    mine.load_state_dict(dict(zip(mine.state_dict(), state.values(), strict=True)))
    torch.testing.assert_close(mine(images.float()), expected.float())
    other = load_into(nn.Sequential(nn.Flatten(), nn.Linear(12, 2)).double(), state)
    torch.testing.assert_close(other(images), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="do not match the saved"):
        load_into(nn.Linear(12, 3), state)


def _header(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as fh:
        return json.loads(fh.metadata()["efpsn"])


def _rewrite(path: Path, state: dict, header: dict | None) -> None:
    from safetensors.torch import save_file

    save_file(state, path, metadata=None if header is None else {"efpsn": json.dumps(header)})


def test_metadata_is_public_json_in_the_header_and_the_file_is_private(tmp_path: Path) -> None:
    task, x, path = trained_logreg(tmp_path)
    meta = _header(path)
    assert meta == {"format": "efpsn-model", "format_version": FORMAT_VERSION, "task": "logreg",
                    "input_shape": "12", "classes": 2, "scale": "div:10", "l2": 0.01,
                    "parameters": [["linear.weight", [2, 12]], ["linear.bias", [2]]]}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.safetensors"]
    assert b"pickle" not in path.read_bytes() and path.read_bytes()[8:9] == b"{"
    saved = read_model(path)
    assert torch.equal(vector_of(task, saved.state), x)  # bit for bit
    assert saved.metadata == ModelMetadata.from_json(meta)


def test_lenet_and_mlp_round_trip(tmp_path: Path) -> None:
    for spec, shape in (("lenet", (1, 28, 28)), ("mlp:5,4", (6,))):
        task = make_task(spec, shape=shape, classes=10)
        x = task.init_params(3)
        save_model(tmp_path / spec / "model.safetensors", task=task, x=x, scale="unit")
        saved = read_model(tmp_path / spec / "model.safetensors")
        assert torch.equal(vector_of(task, saved.state), x)
        assert list(saved.state) == [n for n, _ in task.build_model().named_parameters()]
        assert torch.equal(state_dict_of(task, x)["layers.0.weight" if spec != "lenet"
                                                  else "fc.bias"].reshape(-1),
                           x[task.parameter_slices()["layers.0.weight" if spec != "lenet"
                                                    else "fc.bias"]])


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="efpsn")
    register(parser.add_subparsers(dest="command", required=True))
    return run_command(parser, argv)


def test_evaluate_prints_the_accuracy_and_loss_the_task_computes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task, x, path = trained_logreg(tmp_path)
    x_raw, y = blobs(seed=1)
    test_csv = write_csv(tmp_path / "test.csv", x_raw, y)
    data = load_local_data(test_csv, who="t", shape=(12,), classes=2, divisor=10.0, seed=0,
                           holdout=0.0).train
    accuracy = task.accuracy(x, data)
    loss = task.loss(x, data.images, data.labels)
    assert 0.75 < accuracy < 1.0  # a real model, not a constant
    assert _cli(["evaluate", "--model", str(path), "--data", str(test_csv)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"accuracy {accuracy:.4f}, loss {loss:.4f} on 200 samples "
                          "(task logreg; loss = mean loss + (l2/2)||x||^2 with l2 = 0.01")
    result = evaluate_model(path, test_csv)
    assert (result.accuracy, result.loss) == (accuracy, loss)
    # the saved scale is applied: without it, the raw units give another loss
    assert evaluate_model(path, test_csv, scale="none").loss != loss


def test_evaluate_reads_a_flat_model_npy_with_result_json(tmp_path: Path) -> None:
    _, x, path = trained_logreg(tmp_path)
    flat = tmp_path / "agent1" / "model.npy"
    np.save(flat, x.numpy(), allow_pickle=False)
    x_raw, y = blobs(seed=1)
    test_csv = write_csv(tmp_path / "test.csv", x_raw, y)
    with pytest.raises(ValueError, match="needs --task, --scale, --input-shape, --classes"):
        evaluate_model(flat, test_csv)
    settings = {"task": "logreg", "scale": "div:10", "input_shape": "12", "classes": 2,
                "l2": -1.0}
    (tmp_path / "agent1" / "result.json").write_text(json.dumps({"settings": settings}))
    assert evaluate_model(flat, test_csv) == evaluate_model(path, test_csv)


def test_evaluate_reads_a_data_folders_agent_folder_and_the_folder_itself(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # prepare: a data folder D/agent1/train.csv and its public D/test.csv
    _, _, path = trained_logreg(tmp_path)
    (tmp_path / "D" / "agent1").mkdir(parents=True)
    train = write_csv(tmp_path / "D" / "agent1" / "train.csv", *blobs(seed=2))
    test = write_csv(tmp_path / "D" / "test.csv", *blobs(80, seed=3))
    # execute / assert: the folder reads as its one data file
    assert evaluate_model(path, tmp_path / "D" / "agent1") == evaluate_model(path, train)
    assert evaluate_model(path, tmp_path / "D") == evaluate_model(path, test)
    assert _cli(["evaluate", "--model", str(path), "--data", str(tmp_path / "D" / "agent1")]) == 0
    assert " on 200 samples " in capsys.readouterr().out
    # two data files, or none: one line saying what was expected
    write_csv(tmp_path / "D" / "agent1" / "test.csv", *blobs(10, seed=4))
    for folder, words in ((tmp_path / "D" / "agent1", "holds train.csv and test.csv"),
                          (tmp_path / "empty", "is not a usable data folder")):
        folder.mkdir(exist_ok=True)
        assert _cli(["evaluate", "--model", str(path), "--data", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and "expected" in err, err


def test_evaluate_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, path = trained_logreg(tmp_path)
    x_raw, y = blobs()
    test_csv = write_csv(tmp_path / "test.csv", x_raw, y)
    cases = {
        "wrong task": (["--task", "mlp:3"], "are not the model's"),
        "wrong schema": (["--data", str(write_csv(tmp_path / "w.csv", x_raw[:, :5], y))],
                         "samples have shape 5; expected the run's input shape 12"),
        "labels": (["--label-column", "nope"], "has no column 'nope'"),
    }
    for flags, message in cases.values():
        argv = ["evaluate", "--model", str(path), "--data", str(test_csv), *flags]
        assert _cli(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    state = read_model(path).state
    _rewrite(path, state, None)
    assert _cli(["evaluate", "--model", str(path), "--data", str(test_csv)]) == 2
    assert "no efpsn metadata in its header" in capsys.readouterr().err


def test_read_model_refuses_what_is_not_ours(tmp_path: Path) -> None:
    _, _, path = trained_logreg(tmp_path)
    meta, state = _header(path), read_model(path).state
    for change, message in (({"format_version": 2}, "format_version 2 is not supported"),
                            ({"extra": 1}, r"unknown \['extra'\]"),
                            ({"classes": "two"}, "classes must be an integer"),
                            ({"parameters": [["linear.weight", [2, 12]]]}, "disagree with")):
        _rewrite(path, state, {**meta, **change})
        with pytest.raises(ValueError, match=message):
            read_model(path)
    import pickle

    path.write_bytes(pickle.dumps({"linear.weight": torch.zeros(2, 12)}))  # never unpickled
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        read_model(path)


@pytest.mark.process
def test_the_evaluate_parser_imports_no_torch(tmp_path: Path) -> None:
    probe = ("import argparse, sys\nfrom efpsn.cli.evaluate import register\n"
             "p = argparse.ArgumentParser(prog='efpsn')\n"
             "register(p.add_subparsers(dest='c'))\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"
