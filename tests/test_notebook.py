"""efpsn.notebook.train: a local network from Python with the command line's defaults, returning the
network's model (a torch module that predicts from raw features) and the run's summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from efpsn.data.folders import split_data
from efpsn.notebook import train

pytestmark = pytest.mark.timeout(600)


@pytest.mark.process
def test_train_runs_the_network_and_returns_its_model(tmp_path: Path) -> None:
    data = tmp_path / "D"
    split_data(source="sklearn:wine", agents=3, partition_spec="iid", out=data, raw=True)
    (data / "schema.json").unlink()  # the files give the schema; a table: scale standard
    model, summary = train(data, results=tmp_path / "R", insecure_noise_seed=3,
                                 iterations=200)
    assert summary["ok"] and summary["settings"]["scale"] == "standard"
    assert summary["settings"]["iterations"] == 200
    assert json.loads((tmp_path / "R" / "summary.json").read_text())["final"] == summary["final"]
    test = np.load(data / "test.npz")
    predicted = model.predict(test["X"])  # raw units in: the run's standardisation applied
    assert float((predicted == test["y"]).mean()) == pytest.approx(summary["final"]["accuracy"])
    assert isinstance(model.module, torch.nn.Module)
    assert list(model.state_dict()) == ["linear.weight", "linear.bias"]
    mean, std = model.metadata.standardisation
    assert len(mean) == 13 and min(std) > 0


def test_a_bad_flag_is_one_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="algorithm") as caught:
        train(tmp_path, algorithm="agtt")
    assert "\n" not in str(caught.value)
