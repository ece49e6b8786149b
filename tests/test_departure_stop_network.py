"""A departure in a default run (no --iterations: the stop rule, efpsn/stopping.py), through
real processes: `efpsn up` on 5 breast-cancer folders of unequal size with the defaults (the
step rule's rounds as the cap, the stop rule, fading masks, 3072-bit keys); agent3 kills itself
(SIGKILL, tests/crash_hook: localnet.crash_at) on reaching round 600 and never comes back: late,
the whole ring stops at 1077 of the cap 1354, and the four others need more than the 749
rounds left. The other four exit 0 and stop at the round `efpsn simulate --leave agent3@T:R`
stops at (the windows the departure cut are void, the rule restarts at R on the remaining
graph, the cap extended to R + the step rule's rounds for it: StopRule.rebased), past the old
cap, with the same iterates bit for bit, within the certificate of the four folders' optimum."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from localnet import crash_at

from efpsn.certificate import TARGET
from efpsn.config import RunConfig
from efpsn.datadir import inspect_data_dir, load_data_dir, split_data
from efpsn.departure import parse_leave
from efpsn.launch.summary import load_agent_results
from efpsn.problem import average, build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.optimum import centralized_optimum

pytestmark = pytest.mark.timeout(600)

NOISE_SEED, CRASH_AT, DEADLINE = 7, 600, 3.0
SURVIVORS = ["agent1", "agent2", "agent4", "agent5"]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("departure-stop")
    data, results = root / "data", root / "run"
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=data, test_fraction=0)
    # efpsn up with the defaults; the departure deadline is short (the departure costs about
    # that much; its default is the round timeout, 60 s), the noise seed makes the masks
    # reproducible by the simulator (a test hook)
    command = [sys.executable, "-m", "efpsn", "up", "--data-dir", str(data), "--holdout", "0",
               "--results", str(results), "--quiet", "--departure-deadline", str(DEADLINE),
               "--insecure-noise-seed", str(NOISE_SEED)]
    env = {**os.environ, **crash_at(CRASH_AT, name="agent3")}
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=540,
                          check=False)
    return {"root": root, "data": data, "results": results, "done": done,
            "wall": time.monotonic() - started}


def test_the_four_others_stop_where_the_simulator_stops_bit_for_bit(default_run) -> None:
    done, results = default_run["done"], default_run["results"]
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    summary = json.loads((results / "summary.json").read_text())
    record = summary["departures"][0]
    assert record["agent"] == "agent3" and record["round"] in (CRASH_AT - 1, CRASH_AT)
    assert summary["remaining"] == SURVIVORS
    assert "agent3 left at round" in done.stdout.strip().splitlines()[-1]
    # `efpsn simulate --leave agent3@T:R[+agentJ]` with what the network agreed, defaults
    config = RunConfig(**inspect_data_dir(default_run["data"]).run_values())  # type: ignore[arg-type]
    problem = build_problem(config, local=load_data_dir(config, default_run["data"],
                                                        holdout=0.0))
    late = "".join(f"+{name}" for name in record["late"])
    leave = parse_leave(f"agent3@{record['round']}:{record['rebase_round']}{late}", agents=5)
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem, departures=[leave])
    rounds = sim.timings["rounds"]
    # the stop rule ended the run past the old cap, before the extended one (the same in the
    # network's records and the replay's), at a round counted from the re-base
    assert sim.departures is not None and record["cap"] == sim.departures["departures"][0]["cap"]
    assert sim.config.stop_every.rounds and sim.config.iterations.total < rounds < record["cap"]
    agent_results, xs = load_agent_results(results, SURVIVORS)
    assert {r["final"]["round"] for r in agent_results} == {rounds}
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    # what it stopped at: within the certificate of the four remaining folders' optimum
    assert sim.convergence is not None and sim.convergence.converged
    x_star = centralized_optimum(problem.task, [s for i, s in enumerate(problem.shards)
                                                if i != 2]).x
    distance = float(torch.linalg.vector_norm(average(xs) - x_star)
                     / torch.linalg.vector_norm(x_star))
    assert distance <= sim.convergence.bound <= TARGET
    print(f"\ndefault run, agent3 gone at {record['round']}:{record['rebase_round']}: stopped at "
          f"round {rounds} of {sim.config.iterations}, relative distance {distance:.2e} "
          f"(certified {sim.convergence.bound:.2e}), wall {default_run['wall']:.1f} s")


def test_without_the_departure_the_run_stops_elsewhere(default_run) -> None:
    # the re-based rule is what decided the round: the same run without anyone leaving stops
    # at another round (the rule of the whole ring, counted from 0)
    config = RunConfig(**inspect_data_dir(default_run["data"]).run_values())  # type: ignore[arg-type]
    problem = build_problem(config, local=load_data_dir(config, default_run["data"],
                                                        holdout=0.0))
    whole = run_simulation(config, noise_seed=NOISE_SEED, problem=problem)
    summary = json.loads((Path(default_run["results"]) / "summary.json").read_text())
    agent_results, _ = load_agent_results(default_run["results"], SURVIVORS)
    assert whole.timings["rounds"] != agent_results[0]["final"]["round"]
    assert summary["departures"][0]["agent"] == "agent3"
