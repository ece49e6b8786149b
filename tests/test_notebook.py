"""efpsn.notebook.train: a local network from Python with the command line's defaults, returning the
network's model (a torch module that predicts from raw features) and the run's summary."""

from __future__ import annotations

import json
import re
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


@pytest.mark.process
def test_train_from_inside_a_running_event_loop(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A Jupyter cell runs inside the kernel's event loop: train() there runs the network in a
    worker thread, shows its progress as lines, and returns the model speaking the table's
    class names."""
    import asyncio

    from efpsn.data.folders import split_data

    data = tmp_path / "D"
    split_data(source="sklearn:iris", agents=3, partition_spec="iid", out=data, raw=True,
               format="csv")

    async def cell() -> tuple[object, dict]:
        return train(data, results=tmp_path / "R", insecure_noise_seed=3)

    model, summary = asyncio.run(cell())
    out = capsys.readouterr().out
    assert summary["ok"] and summary["convergence"]["converged"]
    assert re.search(r"^efpsn up: round \d+", out, re.MULTILINE), out  # progress, as lines
    assert model.class_names == ("setosa", "versicolor", "virginica")
    predicted = model.predict(data / "test.csv")
    truth = [line.rsplit(",", 1)[1] for line in (data / "test.csv").read_text().splitlines()[1:]]
    assert float(np.mean(predicted == np.array(truth))) == pytest.approx(
        summary["final"]["accuracy"])


@pytest.mark.process
def test_train_in_a_real_notebook(tmp_path: Path) -> None:
    """A notebook executed by a Jupyter kernel (nbclient): the cell that calls train() ends,
    its output holds the progress lines and the final line, and the model it returns
    predicts in class names."""
    import nbclient  # the dev extra installs nbclient, nbformat and ipykernel
    import nbformat

    from efpsn.data.folders import split_data

    split_data(source="sklearn:iris", agents=3, partition_spec="iid", out=tmp_path / "D",
               raw=True, format="csv")
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from efpsn.notebook import train\n"
                                  "model, summary = train('D', results='R')"),
        nbformat.v4.new_code_cell("print(sorted(set(model.predict('D/test.csv'))), "
                                  "summary['convergence']['converged'])"),
    ])
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    first = "".join(o.get("text", "") for o in notebook.cells[0].outputs)
    assert re.search(r"efpsn up: round \d+", first) and "final: test accuracy" in first, first
    second = "".join(o.get("text", "") for o in notebook.cells[1].outputs)
    assert second.strip() == "['setosa', 'versicolor', 'virginica'] True", second
