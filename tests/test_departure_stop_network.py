"""Departures in a default run (no --iterations: the stop rule, efpsn/optimize/stopping.py), through
real processes: `efpsn up` on 5 breast-cancer folders of unequal size with the defaults (the
step rule's rounds as the cap, the stop rule, fading masks, 3072-bit keys), one run:

- agent3 kills itself (SIGKILL, tests/crash_hook: localnet.crash_each) on reaching round 600
  and never comes back: late, the whole ring stops at 1077 of the cap 1354, and the four
  others need more than the 749 rounds left. They re-base at R (the windows the departure cut
  are void, the rule restarts at R on the remaining path 2-1-5-4, the cap extended to R + the
  step rule's rounds for it: StopRule.rebased) and stop past the old cap;
- agent4, at the end of that path, then dies inside the last window of the re-based rule
  (one round before its stop round S, computed by the replay first): agents 1 and 2, two and
  three hops from it, complete S on the certificate of the four and exit before anyone knows;
  agent5 waits for agent4, reports, and the coordinator (which the finished agents told their
  stop) decides "the run had stopped at S": agent5 ends with its model of the check round
  S - 3 and exits 0 (efpsn/departure/last_window.py). A second departure after the original cap.

The three stop where `efpsn simulate --leave agent3@T:R --leave agent4@T2:R2` stops them, with
the same iterates bit for bit, within the certificate of the four folders' optimum."""

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
from localnet import crash_each

from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.membership import parse_leave
from efpsn.launch.summary import load_agent_results
from efpsn.optimize.certificate import TARGET
from efpsn.params.config import RunConfig
from efpsn.problem import average, build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.optimum import centralized_optimum

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

NOISE_SEED, CRASH_AT, DEADLINE = 7, 600, 3.0
SURVIVORS = ["agent1", "agent2", "agent5"]


def _problem(data: Path) -> tuple[RunConfig, Any]:
    config = RunConfig(**inspect_data_dir(data).run_values())  # type: ignore[arg-type]
    return config, build_problem(config, local=load_data_dir(config, data, holdout=0.0))


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("departure-stop")
    data, results = root / "data", root / "run"
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=data, test_fraction=0)
    # where the four stop after agent3 leaves at 600 (the replay): agent4 dies one round
    # before, inside that stop's window
    config, problem = _problem(data)
    first = run_simulation(config, noise_seed=NOISE_SEED, problem=problem,
                           departures=[parse_leave(f"agent3@{CRASH_AT}", agents=5)])
    stop = first.timings["rounds"]
    # efpsn up with the defaults; the departure deadline is short (the departure costs about
    # that much; its default is the round timeout, 60 s), the noise seed makes the masks
    # reproducible by the simulator (a test hook)
    command = [sys.executable, "-m", "efpsn", "up", "--data-dir", str(data), "--holdout", "0",
               "--results", str(results), "--quiet", "--departure-deadline", str(DEADLINE),
               "--insecure-noise-seed", str(NOISE_SEED)]
    # "T!": each dies once its neighbours sent round T, so it left at T exactly
    env = {**os.environ, **crash_each({"agent3": f"{CRASH_AT}!", "agent4": f"{stop - 1}!"})}
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=540,
                          check=False)
    return {"root": root, "data": data, "results": results, "done": done, "stop": stop,
            "wall": time.monotonic() - started}


def test_the_others_stop_where_the_simulator_stops_bit_for_bit(default_run) -> None:
    done, results, stop = default_run["done"], default_run["results"], default_run["stop"]
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    summary = json.loads((results / "summary.json").read_text())
    first, second = summary["departures"]
    assert (first["agent"], first["round"]) == ("agent3", CRASH_AT)
    assert (second["agent"], second["round"], second["stopped"]) == ("agent4", stop - 1, stop)
    assert second["finished"] == ["agent1", "agent2"] and second["at_check"] == ["agent5"]
    assert summary["remaining"] == SURVIVORS
    assert summary["optimum_of"] == "the optimum of agents 1,2,4,5's objective"
    assert summary["ok"], summary["problems"]
    last = done.stdout.strip().splitlines()[-1]
    assert "agent3 left at round 600 (re-based" in last and f"had stopped at round {stop}" in last
    assert last.startswith("converged") and f"at round {stop - 3}" in last
    # `efpsn simulate --leave agent3@T:R --leave agent4@T2` with what the network agreed
    config, problem = _problem(default_run["data"])
    leaves = [parse_leave(f"{e['agent']}@{e['round']}:{e['rebase_round']}", agents=5)
              for e in (first, second)]
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem, departures=leaves)
    assert sim.departures is not None
    replayed = sim.departures["departures"]
    assert first["cap"] == replayed[0]["cap"] and sim.timings["rounds"] == stop
    assert {k: replayed[1][k] for k in ("stopped", "check_round", "finished", "at_check")} \
        == {k: second[k] for k in ("stopped", "check_round", "finished", "at_check")}
    # past the old cap, before the extended one; agent5 ended at the check round
    assert sim.config.stop_every.rounds and sim.config.iterations.total < stop < first["cap"]
    agent_results, xs = load_agent_results(results, SURVIVORS)
    assert [r["final"]["round"] for r in agent_results] == [stop, stop, stop - 3]
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    # what it stopped at: the window certifies x_bar of round S - 3 over agents 1, 2, 4, 5;
    # each model then is within the gap terms of that bound (efpsn/optimize/stopping.py)
    assert sim.convergence is not None and sim.convergence.converged
    assert summary["convergence"]["certificate"] == sim.convergence.bound <= TARGET
    x_star = centralized_optimum(problem.task, [s for i, s in enumerate(problem.shards)
                                                if i != 2]).x
    distance = float(torch.linalg.vector_norm(average(xs) - x_star)
                     / torch.linalg.vector_norm(x_star))
    assert distance <= TARGET
    print(f"\ndefault run, agent3 gone at {first['round']}:{first['rebase_round']}, agent4 at "
          f"{second['round']}: stopped at round {stop} of {sim.config.iterations} "
          f"(agent5 at {stop - 3}), relative distance {distance:.2e} (certified "
          f"{sim.convergence.bound:.2e}), wall {default_run['wall']:.1f} s\n{last}")


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
