"""Features in any units over real gRPC agents (`scale standard`): after phase I the agents
learn the network's column totals by flooding masked statistics vectors (PutStats), resolve the
step rule with l2 = 1 / N_total and standardise; the run equals the simulator bit for bit, also
after an agent is killed (SIGKILL) mid-run and restarted from its saved totals; the saved models
carry the standardisation, so `efpsn evaluate` on the raw test set gives the run's accuracy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from localnet import LocalNet, crash_at

from efpsn.data.folders import load_data_dir, split_data
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.stats.standardise import simulate_standardising
from efpsn.tasks.model_io import MODEL_FILE, read_model

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

NOISE_SEED = 13
VICTIM, CRASH_AT, CHECKPOINT_EVERY = "agent2", 57, 25


def _config(folder: Path) -> RunConfig:
    schema = json.loads((folder / "schema.json").read_text())
    assert schema["scale"] == "standard"  # raw columns, no public scale
    # 150 rounds of the defaults (agt, fading masks, step rule with l2 = 1 / N_total)
    return RunConfig(data="local", agents=4, input_shape=schema["input_shape"],
                     classes=schema["classes"], scale=schema["scale"], iterations=150,
                     eval_every=50, key_bits=2048, round_timeout_seconds=60.0)


@pytest.fixture(scope="module")
def standard_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("standard")
    data = root / "D"
    split_data(source="sklearn:breast_cancer", agents=4, partition_spec="dirichlet:1",
               out=data, raw=True)
    config = _config(data)
    names = [f"agent{i}" for i in range(1, 5)]
    folder = root / "net"
    seen: dict[str, Any] = {"folder": folder, "data": data, "config": config, "names": names}
    own = {n: ("--data", str(data / n / "train.npz"), "--holdout", "0",
               "--test-data", str(data / "test.npz")) for n in names}
    crash = {VICTIM: crash_at(CRASH_AT)}
    with LocalNet(folder, config, noise_seed=NOISE_SEED, agent_env=crash, own_args=own,
                  agent_args=("--checkpoint-every", str(CHECKPOINT_EVERY))) as net:
        net.start_all()
        seen["victim_rc"] = net.procs[VICTIM].wait(timeout=300)
        seen["state_while_down"] = sorted(p.name for p in (folder / VICTIM / "state").iterdir())
        net.restart(VICTIM)
        seen["agent_rc"] = net.wait_agents(timeout=400)
        seen["logs"] = {n: net.log(n) for n in ["coordinator", *names]}
    return seen


def _simulated(seen: dict[str, Any]) -> tuple[Any, Any, Any]:
    config = seen["config"]
    local = load_data_dir(config, seen["data"], holdout=0)
    config, local, totals = simulate_standardising(config, local, noise_seed=NOISE_SEED)
    config = config.resolved()
    return config, run_simulation(config, problem=build_problem(config, local=local),
                                  noise_seed=NOISE_SEED), totals


def test_network_equals_the_simulator_after_a_crash(standard_run) -> None:
    seen = standard_run
    assert seen["victim_rc"] == -9
    assert seen["agent_rc"] == {n: 0 for n in seen["names"]}, {
        n: t[-2000:] for n, t in seen["logs"].items()}
    assert "totals.json" in seen["state_while_down"]
    config, sim, totals = _simulated(seen)
    results, xs = load_agent_results(seen["folder"], seen["names"])
    sizes = [len(np.load(seen["data"] / n / "train.npz")["y"]) for n in seen["names"]]
    assert len(set(sizes)) > 1 and totals.count == sum(sizes)  # unequal folders, all counted
    for r in results:  # every agent resolved the run the simulator resolved
        assert r["settings"] == config.to_dict()
    assert config.l2.weight == 1.0 / sum(sizes)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    for name in seen["names"]:  # the seeds and the totals are deleted when the run ends
        assert sorted(p.name for p in (seen["folder"] / name / "state").iterdir()) == [
            "assignment.json"]
    victim = next(r for r in results if r["name"] == seen["names"][1])
    assert victim["resumed_from_round"] == CRASH_AT // CHECKPOINT_EVERY * CHECKPOINT_EVERY


def test_saved_models_carry_the_standardisation(standard_run) -> None:
    from efpsn.cli.evaluate import evaluate_model

    seen = standard_run
    _, _, totals = _simulated(seen)
    path = seen["folder"] / seen["names"][0] / MODEL_FILE
    saved = read_model(path)
    mean, std = saved.metadata.standardisation
    assert np.array_equal(mean, totals.mean()) and np.array_equal(std, totals.std())
    result = json.loads((seen["folder"] / seen["names"][0] / "result.json").read_text())
    evaluated = evaluate_model(path, seen["data"] / "test.npz")  # raw features in
    assert evaluated.accuracy == pytest.approx(result["final"]["accuracy"], abs=1e-12)
    assert evaluated.accuracy > 0.9


def test_no_statistic_reaches_a_log(standard_run) -> None:
    """Only masked vectors travel, and nothing logs them or what they hide: no agent's local
    sums (fixed point) and no network total appear in any log."""
    from efpsn.stats.column_sums import local_vector

    seen = standard_run
    _, _, totals = _simulated(seen)
    logs = "".join(seen["logs"].values())
    local = [local_vector(np.load(seen["data"] / n / "train.npz")["X"]) for n in seen["names"]]
    secrets = [v for vector in local for v in vector[1:]] + [*totals.sums, *totals.squares]
    # each local vector: 30 counts of values, 30 sums, 30 sums of squares (the counts are
    # small integers, left out of the search below: they appear in any log by chance)
    assert len(secrets) == 4 * 90 + 60 and not any(str(v) in logs for v in secrets if abs(v) > 10**6)
