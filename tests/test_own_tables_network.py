"""The three tables of the issue over real gRPC agents, each with `efpsn up --data-dir D` and its
label column alone (tests/own_tables.py): the wine cellar (class names, two category columns,
empty cells) at scikit-learn's pipeline; the same with an id, free text and a date, refused in
one message and then dropped; diabetes with --task ridge at scikit-learn's Ridge, equal to the
simulator bit for bit. The models the runs write answer `efpsn evaluate` and speak in the
class names; each agent's count of filled cells is in its own log only."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from commands import efpsn
from own_tables import cellar, diabetes, reference_classifier, reference_ridge

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

NOISE_SEED = 5


def up(data: Path, results: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str],
                                                       dict[str, Any]]:
    proc = efpsn("up", "--data-dir", str(data), "--results", str(results), "--quiet", *flags)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads((results / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("own")
    data = {"cellar": cellar(root / "cellar"), "extra": cellar(root / "extra", extra=True),
            "diabetes": diabetes(root / "diabetes")}
    out: dict[str, Any] = {"data": data, "root": root}
    out["cellar"] = up(data["cellar"], root / "R1", "--label-column", "cultivar")
    out["refused"] = efpsn("up", "--data-dir", str(data["extra"]), "--results",
                           str(root / "R2x"), "--label-column", "cultivar")
    out["extra"] = up(data["extra"], root / "R2", "--label-column", "cultivar", "--drop",
                      "bottle_id,tasting_note", "--drop", "bottled", "--insecure-noise-seed",
                      str(NOISE_SEED))
    out["ridge"] = up(data["diabetes"], root / "R3", "--label-column", "progression",
                      "--task", "ridge", "--insecure-noise-seed", str(NOISE_SEED))
    return out


def test_the_cellar_converges_at_scikit_learn_with_its_label_column_alone(runs) -> None:
    proc, summary = runs["cellar"]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("converged:"), proc.stdout
    reference = reference_classifier(runs["data"]["cellar"], "cultivar")
    assert summary["final"]["accuracy"] >= reference - 0.02, (summary["final"], reference)
    assert summary["settings"]["scale"] == "standard"
    assert set(summary["final"]["accuracy_by_class"]) == {"Barbera", "Barolo", "Grignolino"}
    assert "the class names that occur in any party's table" in summary["privacy"]["line"]


def test_a_free_text_and_a_date_column_are_one_message_then_dropped(runs) -> None:
    refused = runs["refused"]
    assert refused.returncode == 2 and not (runs["root"] / "R2x").exists()
    assert refused.stderr.startswith("efpsn: error: data folder ")
    assert "column 'tasting_note' looks like free text" in refused.stderr
    assert "column 'bottled' holds dates" in refused.stderr
    _, summary = runs["extra"]
    reference = reference_classifier(runs["data"]["extra"], "cultivar",
                                     drop=("bottle_id", "tasting_note", "bottled"))
    assert summary["final"]["accuracy"] >= reference - 0.02
    assert summary["convergence"]["converged"]


def simulated(data: Path, label: str, given: dict[str, Any], drop: tuple[str, ...] = ()):
    """The simulator's run of the folder with the network's noise seed (the default holdout)."""
    from efpsn.data.folders import load_data_dir
    from efpsn.data.inspection import inspect_folder
    from efpsn.flags.names import config_from_values
    from efpsn.problem import build_problem
    from efpsn.simulator import run_simulation
    from efpsn.stats.standardise import simulate_standardising

    folder = inspect_folder(data, label_column=label, given=given, drop=drop)
    config = config_from_values(given, folder=folder, resolve=False)
    local = load_data_dir(config, folder.layout)
    config, local, _ = simulate_standardising(config, local, noise_seed=NOISE_SEED)
    config = config.resolved()
    return config, run_simulation(config, problem=build_problem(config, local=local),
                                  noise_seed=NOISE_SEED)


def test_a_table_with_categories_and_empty_cells_equals_the_simulator(runs) -> None:
    from efpsn.launch.summary import load_agent_results

    config, sim = simulated(runs["data"]["extra"], "cultivar", {},
                            drop=("bottle_id", "tasting_note", "bottled"))
    reports, xs = load_agent_results(runs["root"] / "R2", [f"agent{k}" for k in range(1, 5)])
    assert reports[0]["settings"] == config.to_dict() and config.table.given
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0


def test_every_model_file_gives_the_run_s_accuracy_or_names_the_one_to_use(runs) -> None:
    from efpsn.notebook import load_trained

    _, summary = runs["cellar"]
    results, data = runs["root"] / "R1", runs["data"]["cellar"]
    shown = f"accuracy {summary['final']['accuracy']:.4f}, "
    for model in (results / "model.safetensors", results / "agent2" / "model.safetensors"):
        proc = efpsn("evaluate", "--model", str(model), "--data", str(data / "test.csv"))
        assert proc.returncode == 0 and proc.stdout.startswith(shown), proc.stdout + proc.stderr
        assert "by class: Barbera " in proc.stdout
    flat = efpsn("evaluate", "--model", str(results / "agent2" / "model.npy"), "--data",
                 str(data / "test.csv"))
    assert flat.returncode == 2 and flat.stderr.count("\n") == 1
    assert f"--model {results / 'agent2' / 'model.safetensors'}" in flat.stderr
    # the network's model predicts class names from the table's raw rows
    model = load_trained(results / "model.safetensors")
    predicted = model.predict(data / "test.csv")
    truth = [line.rsplit(",", 1)[1] for line in (data / "test.csv").read_text().splitlines()[1:]]
    assert float(np.mean(predicted == np.array(truth))) == pytest.approx(
        summary["final"]["accuracy"])


def test_each_agent_s_filled_cells_are_in_its_own_log_only(runs) -> None:
    from efpsn.data.folders import inspect_data_dir
    from efpsn.data.local import load_local_data

    results, data = runs["root"] / "R1", runs["data"]["cellar"]
    counts = {}
    for k in range(1, 5):
        table = json.loads((results / "summary.json").read_text())["settings"]["table"]
        from efpsn.params.table import TableSchema

        local = load_local_data(inspect_data_dir(data).files[f"agent{k}"], who="t",
                                shape=(18,), classes=3, divisor=1.0, seed=0, holdout=0.0,
                                table=TableSchema.parse(table), fills=True)
        counts[f"agent{k}"] = local.missing
    logs = {p.stem: p.read_text() for p in (results / "logs").glob("*.log")}
    for name, count in counts.items():
        line = f"{name}: filled {count} empty cells of its own table"
        assert line in logs[name]
        assert not any(line in text for other, text in logs.items() if other != name)
    assert "filled" not in (results / "summary.json").read_text()


def test_ridge_on_diabetes_equals_the_simulator_and_lands_at_scikit_learn(runs) -> None:
    from efpsn.launch.summary import load_agent_results

    proc, summary = runs["ridge"]
    data, results = runs["data"]["diabetes"], runs["root"] / "R3"
    final = re.search(r"^final: test R\^2 ([0-9.]+) \(x_bar, public test set\)", proc.stdout,
                      re.MULTILINE)
    assert final, proc.stdout
    assert float(final.group(1)) >= reference_ridge(data, "progression") - 0.02
    assert summary["final"]["r2"] == summary["final"]["accuracy"]
    assert proc.stdout.strip().splitlines()[-1].startswith("converged:")
    assert "ridge" in summary["privacy"]["line"]
    # the simulator with the same noise seed: the same bits
    config, sim = simulated(data, "progression", {"task": "ridge"})
    reports, xs = load_agent_results(results, [f"agent{k}" for k in range(1, 5)])
    assert reports[0]["settings"] == config.to_dict()
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    evaluated = efpsn("evaluate", "--model", str(results / "model.safetensors"), "--data",
                      str(data / "test.csv"))
    assert evaluated.stdout.startswith(f"R^2 {final.group(1)}, loss "), evaluated.stdout
