"""Features in any units: a `scale standard` run standardises with the network's totals (secure
sum), takes l2 = 1/N_total, lands within a point of scikit-learn's pooled pipeline, stays exact
under large masks, and its saved model carries the standardisation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from efpsn.cli.main import main
from efpsn.data.folders import load_data_dir, split_data
from efpsn.departure.membership import parse_leave
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.stats.standardise import check_standardisable, left_in_phase_one, simulate_standardising
from efpsn.tasks.model_io import read_model, save_model


def _raw_folder(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    split_data(source=f"sklearn:{name}", agents=4, partition_spec="iid", out=out, raw=True)
    return out


def _pooled(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    parts = [np.load(folder / f"agent{k}" / "train.npz") for k in range(1, 5)]
    test = np.load(folder / "test.npz")
    return (np.concatenate([p["X"] for p in parts]), np.concatenate([p["y"] for p in parts]),
            test["X"], test["y"])


def _config(folder: Path, **changes) -> RunConfig:
    schema = json.loads((folder / "schema.json").read_text())
    return RunConfig(data="local", agents=4, input_shape=schema["input_shape"],
                     classes=schema["classes"], scale=schema["scale"], **changes)


def test_raw_split_says_standard(tmp_path):
    folder = _raw_folder(tmp_path, "wine")
    assert json.loads((folder / "schema.json").read_text())["scale"] == "standard"
    x, _, _, _ = _pooled(folder)
    assert x.max() > 100  # raw units (proline), no public divisor


def test_every_agent_standardises_with_the_global_statistics(tmp_path):
    folder = _raw_folder(tmp_path, "wine")
    config = _config(folder)
    local = load_data_dir(config, folder, holdout=0)
    config, standardised, totals = simulate_standardising(config, local)
    pooled = np.concatenate([standardised[i].train.images.numpy() for i in range(4)])
    np.testing.assert_allclose(pooled.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(pooled.std(axis=0), 1.0, rtol=1e-12)
    assert totals.count == len(pooled)
    assert config.l2.weight == 1.0 / len(pooled)  # what scikit-learn's C = 1 means for the mean loss
    raw_test = local[0].test.images.numpy()
    np.testing.assert_array_equal(standardised[0].test.images.numpy(),
                                  (raw_test - totals.mean()) / totals.std())


@pytest.mark.slow
def test_standardised_run_matches_scikit_learn_pipeline(tmp_path, capsys):
    sklearn = pytest.importorskip("sklearn.linear_model")
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    folder = _raw_folder(tmp_path, "breast_cancer")
    x, y, xt, yt = _pooled(folder)
    reference = make_pipeline(StandardScaler(), sklearn.LogisticRegression()).fit(x, y)
    out = tmp_path / "run.json"
    assert main(["simulate", "--data-dir", str(folder), "--holdout", "0", "--quiet",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("converged")
    result = json.loads(out.read_text())
    assert result["settings"]["l2"] == 1.0 / len(x)
    assert result["final"]["accuracy"] >= reference.score(xt, yt) - 0.01


def test_masked_run_ends_where_the_unmasked_one_ends_at_gamma_1e6(tmp_path):
    folder = _raw_folder(tmp_path, "wine")
    ends = {}
    for mask, gamma in (("none", 1e3), ("zero-sum", 1e6)):
        config = _config(folder, mask=mask, gamma=gamma)
        config, local, _ = simulate_standardising(config, load_data_dir(config, folder,
                                                                        holdout=0))
        config = config.replace(stop_every=0).resolved()  # every round: the method's end point
        result = run_simulation(config, problem=build_problem(config, local=local))
        ends[mask] = sum(result.xs) / 4
    gap = torch.linalg.vector_norm(ends["zero-sum"] - ends["none"])
    assert float(gap / torch.linalg.vector_norm(ends["none"])) < 1e-5


def test_an_agent_gone_in_phase_one_is_out_of_the_statistics(tmp_path):
    """`--leave agent3@I`: the totals, the standardisation and l2 = 1/N_total are the three
    remaining agents' (agent3's vector unsummed, its edges' pads dropped); a departure after
    the sum (agent3@40) leaves them the four agents'."""
    folder = _raw_folder(tmp_path, "wine")
    config = _config(folder, topology="ring")
    local = load_data_dir(config, folder, holdout=0)
    gone = parse_leave("agent3@I", agents=4)
    assert left_in_phase_one([gone, parse_leave("agent2@40", agents=4)]) == {2}
    config3, standardised, totals = simulate_standardising(config, local, departures=[gone])
    kept = [0, 1, 3]
    pooled = np.concatenate([local[i].train.images.numpy() for i in kept])
    assert totals.count == len(pooled) and config3.l2.weight == 1.0 / len(pooled)
    np.testing.assert_allclose(totals.mean(), pooled.mean(axis=0), rtol=1e-12)
    z = np.concatenate([standardised[i].train.images.numpy() for i in kept])
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=1e-12)
    _, _, later = simulate_standardising(config, local,
                                         departures=[parse_leave("agent3@40", agents=4)])
    assert later.count == sum(len(local[i].train) for i in range(4)) > totals.count


def test_refused_without_edge_seeds():
    config = RunConfig(data="local", agents=4, input_shape="3", classes=2, scale="standard",
                       refresh="never")
    with pytest.raises(ValueError, match="refresh fading"):
        check_standardisable(config)
    check_standardisable(config.replace(mask="none"))  # nothing private: a plain sum


def test_saved_model_carries_the_standardisation(tmp_path):
    folder = _raw_folder(tmp_path, "wine")
    config = _config(folder, iterations=200)
    config, local, totals = simulate_standardising(config, load_data_dir(config, folder,
                                                                         holdout=0))
    config = config.resolved()
    problem = build_problem(config, local=local)
    x = sum(run_simulation(config, problem=problem).xs) / 4
    path = save_model(tmp_path / "model.safetensors", task=problem.task, x=x, scale="standard",
                      standardisation=(totals.mean(), totals.std()))
    saved = read_model(path)
    assert saved.metadata.scale.standard
    _, _, xt, yt = _pooled(folder)
    inputs = saved.inputs(xt)  # raw test features in, the run's standardised features out
    torch.testing.assert_close(inputs, problem.test.images, rtol=0, atol=0)
    logits = torch.nn.functional.linear(inputs, saved.state["linear.weight"],
                                        saved.state["linear.bias"])
    accuracy = float((logits.argmax(dim=1).numpy() == yt).mean())
    assert accuracy == pytest.approx(problem.task.accuracy(x, problem.test))
    from efpsn.cli.evaluate import evaluate_model

    assert evaluate_model(path, folder / "test.npz").accuracy == pytest.approx(accuracy)


def test_networked_runs_send_standard_unresolved(tmp_path):
    """efpsn up and the coordinator hand a standard run out as given: its l2 and step rule
    wait for the network's totals (agent/phases/secure_sum.py)."""
    import argparse

    from efpsn.flags.arguments import add_run_arguments, network_config
    from efpsn.flags.parser import add_data_dir_arguments

    folder = _raw_folder(tmp_path, "wine")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    add_data_dir_arguments(parser)
    config = network_config(parser.parse_args(["--data-dir", str(folder)]))
    assert config.scale.standard and not config.resolved_ok and config.l2.default
    public = network_config(parser.parse_args(["--data-dir", str(folder), "--scale", "none"]))
    assert public.resolved_ok
    with pytest.raises(ValueError, match="public scales"):  # refused before anything starts
        network_config(parser.parse_args(["--data-dir", str(folder), "--refresh", "never"]))


def test_metadata_standardisation_is_checked():
    from efpsn.tasks.model_io import ModelMetadata

    base = {"task": "logreg", "input_shape": "2", "classes": 2, "l2": 0.1,
            "parameters": (("linear.weight", (2, 2)), ("linear.bias", (2,)))}
    with pytest.raises(ValueError, match="scale standard comes with"):
        ModelMetadata(scale="standard", **base)
    with pytest.raises(ValueError, match="positive standard deviations"):
        ModelMetadata(scale="standard", standardisation=((0.0, 1.0), (1.0, 0.0)), **base)
    meta = ModelMetadata(scale="standard", standardisation=((1.0, -2.0), (2.0, 4.0)), **base)
    assert ModelMetadata.from_json(meta.to_json()) == meta
    assert meta.inputs(np.array([[3.0, 2.0]])).tolist() == [[1.0, 1.0]]
    assert ModelMetadata(scale="div:2,4", **base).inputs([[3.0, 2.0]]).tolist() == [[1.5, 0.5]]


def test_the_disclosure_is_named_by_the_run_and_by_efpsn_privacy(tmp_path, capsys):
    """A standard run's privacy line and `efpsn privacy --data-dir D` name what it discloses."""
    from efpsn.params.schema import STANDARD_DISCLOSURE
    from efpsn.privacy.modes import privacy_statement
    from efpsn.topology import build_graph

    folder = _raw_folder(tmp_path, "wine")
    config = _config(folder).resolved()
    graph = build_graph(config.topology, config.agents)
    assert STANDARD_DISCLOSURE in privacy_statement(config, graph).line()
    assert STANDARD_DISCLOSURE not in privacy_statement(config.replace(scale="none"),
                                                        graph).line()
    assert main(["privacy", "--data-dir", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "global mean and variance and the total sample count" in out[1]
