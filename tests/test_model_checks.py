"""A user's model (--task python:MODULE:FACTORY) checked when it is built: one forward pass on one
sample of the schema's shape (zeros, nobody's data) must work and give one output per class;
otherwise one line naming the task, the agent and the fix, never a bare torch error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from agent.options import AgentOptions
from agent.prepare import prepare
from efpsn.params.config import RunConfig
from efpsn.tasks.catalog import make_task

pytestmark = pytest.mark.timeout(240)

MODELS = """
    import torch
    from torch import nn

    def good(schema):
        return nn.Sequential(nn.Flatten(), nn.Linear(schema.features, 4), nn.Tanh(),
                             nn.Linear(4, schema.classes))

    def three(schema):  # 3 outputs whatever the classes
        return nn.Sequential(nn.Flatten(), nn.Linear(schema.features, 3))

    def narrow(schema):  # takes 29 features whatever the data has
        return nn.Sequential(nn.Flatten(), nn.Linear(29, schema.classes))

    def flat_output(schema):  # one score per sample, shape (batch,)
        class Squeeze(nn.Module):
            def forward(self, x):
                return x.squeeze(1)
        return nn.Sequential(nn.Flatten(), nn.Linear(schema.features, 1), Squeeze())

    def batchnorm(schema):  # BatchNorm takes a batch of one in eval mode only
        return nn.Sequential(nn.Flatten(), nn.Linear(schema.features, 4), nn.BatchNorm1d(4),
                             nn.Linear(4, schema.classes))
"""


@pytest.fixture()
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "usermodels.py").write_text(textwrap.dedent(MODELS))
    monkeypatch.syspath_prepend(str(folder))
    return folder


def refused(factory: str, *, shape: tuple[int, ...] = (30,), classes: int = 2) -> str:
    with pytest.raises(ValueError) as info:
        make_task(f"python:usermodels:{factory}", shape=shape, classes=classes)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"task 'python:usermodels:{factory}': ")
    return text


def test_a_model_that_fits_the_schema_is_built(models: Path) -> None:
    for factory in ("good", "batchnorm"):  # batchnorm: the pass runs in eval mode
        task = make_task(f"python:usermodels:{factory}", shape=(30,), classes=2)
        assert task.classes == 2 and task.num_params > 0
    make_task("python:usermodels:three", shape=(30,), classes=3)  # 3 outputs, 3 classes


def test_three_outputs_for_two_classes_names_both_and_the_fix(models: Path) -> None:
    assert refused("three") == (
        "task 'python:usermodels:three': the model gives 3 outputs per sample, but the data "
        "has 2 classes; expected one output (logit) per class, shape (batch, 2): build its "
        "last layer with schema.classes (2) outputs")


def test_an_output_of_another_shape_is_named(models: Path) -> None:
    assert "the model gives outputs of shape (1,) for one sample, but the data has 2 " \
           "classes" in refused("flat_output")


def test_a_wrong_input_width_names_the_width_and_the_fix(models: Path) -> None:
    text = refused("narrow")
    assert text.startswith("task 'python:usermodels:narrow': the model does not take the "
                           "data's samples (shape 30, 30 values): one sample gave RuntimeError: ")
    assert text.endswith("expected its first layer to take schema.features (30) or "
                         "schema.input_shape, from the schema FACTORY(schema) receives")


def test_the_agent_names_itself_and_the_task_once(models: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", X=np.zeros((10, 30)), y=np.arange(10) % 2)
    config = RunConfig(data="local", input_shape="30", classes=2, task="python:usermodels:three",
                       schedule="constant:0.1", iterations=5)
    options = AgentOptions(name="agent3", listen="127.0.0.1:0", coordinator="127.0.0.1:1",
                           data=tmp_path / "d.npz")
    with pytest.raises(ValueError) as info:
        prepare(config, options)
    assert str(info.value) == (
        "agent3: cannot build the model of task 'python:usermodels:three': the model gives 3 "
        "outputs per sample, but the data has 2 classes; expected one output (logit) per "
        "class, shape (batch, 2): build its last layer with schema.classes (2) outputs")


@pytest.mark.process
def test_efpsn_up_refuses_it_in_one_line_for_every_agent(models: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for k in (1, 2, 3):
        (tmp_path / "D" / f"agent{k}").mkdir(parents=True)
        np.savez(tmp_path / "D" / f"agent{k}" / "train.npz", X=rng.uniform(-1, 1, (20, 30)),
                 y=np.arange(20) % 2)
    out = subprocess.run(
        [sys.executable, "-m", "efpsn", "up", "--data-dir", str(tmp_path / "D"), "--task",
         "python:usermodels:three", "--schedule", "constant:0.1", "--iterations", "5",
         "--quiet", "--insecure", "--results", str(tmp_path / "r")],
        check=False, capture_output=True, text=True, timeout=200,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(models), *sys.path])})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == ("efpsn: error: agent1, agent2, agent3: cannot build the model of task "
                        "'python:usermodels:three': the model gives 3 outputs per sample, but "
                        "the data has 2 classes; expected one output (logit) per class, shape "
                        "(batch, 2): build its last layer with schema.classes (2) outputs")
    assert len(lines) == 2 and lines[1].startswith("logs: "), lines  # nothing else, no torch
