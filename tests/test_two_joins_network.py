"""Two parties join one running network at different rounds, through real processes: 6
breast-cancer folders, seats agent5 and agent6 empty at the start; agent5's process starts once
the four members passed round 100, agent6's once everyone passed round 600. Each joins at its
own check round with its own new edges (the 6-ring over the members at each step); all six exit
0 at the optimum of every folder, and `efpsn simulate --join agent5@R1 --join agent6@R2` gives the
same bits."""

from __future__ import annotations

from typing import Any

import pytest

from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.joins import JOIN_CHECK_EVERY, Join
from efpsn.departure.replay import joins_line
from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import average, build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.optimum import centralized_optimum

pytestmark = [pytest.mark.process, pytest.mark.timeout(400)]

NOISE_SEED, CAP, DEADLINE = 5, 4000, 3.0
FIRST, SECOND = 100, 600  # the rounds every member has passed when each process starts
EVERYONE = [f"agent{k}" for k in range(1, 7)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = tmp_path_factory.mktemp("two-joins") / "data"
    split_data(source="sklearn:breast_cancer", agents=6, partition_spec="dirichlet:1.0",
               out=data, test_fraction=0)
    config = RunConfig(**{**inspect_data_dir(data).run_values(),  # type: ignore[arg-type]
                          "l2": 0.01, "eval_every": 100, "key_bits": 2048,
                          "late": "agent5,agent6", "iterations": CAP,
                          "round_timeout_seconds": 30.0})
    results = data.parent / "run"
    summary = launch_local_network(config, results=results, data_dir=data, quiet=True,
                                   holdout=0.0, insecure_noise_seed=NOISE_SEED,
                                   departure_deadline=DEADLINE,
                                   late={"agent5": FIRST, "agent6": SECOND})
    return {"config": config, "summary": summary, "results": results, "data": data}


def test_each_joins_at_its_own_check_round_and_everyone_finishes(run) -> None:
    summary = run["summary"]
    assert summary["ok"], summary["problems"]
    first, second = summary["joins"]
    assert (first["agent"], first["epoch"], second["agent"], second["epoch"]) == (
        "agent5", 1, "agent6", 2)
    assert FIRST < first["round"] < second["round"] and second["round"] > SECOND
    assert first["round"] % JOIN_CHECK_EVERY == 0 == second["round"] % JOIN_CHECK_EVERY
    # the ring over the members in index order, each time: 1-2-3-4-5 then 1-2-3-4-5-6
    assert first["new_edges"] == [["agent1", "agent5"], ["agent4", "agent5"]]
    assert second["new_edges"] == [["agent1", "agent6"], ["agent5", "agent6"]]
    assert second["dropped_edges"] == [["agent1", "agent5"]]
    assert summary["remaining"] == EVERYONE
    assert summary["optimum_of"] == "the optimum of agents 1,2,3,4,5,6's objective"
    line = joins_line(summary)  # what the last line says of them
    assert f"agent5 joined at round {first['round']}" in line
    assert f"agent6 joined at round {second['round']}" in line


def test_the_network_equals_the_simulated_joins_bitwise(run) -> None:
    config, summary = run["config"], run["summary"]
    problem = build_problem(config, local=load_data_dir(config, run["data"], holdout=0.0))
    joins = [Join(agent=int(j["agent"][5:]) - 1, round=j["round"]) for j in summary["joins"]]
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem, joins=joins)
    _, xs = load_agent_results(run["results"], EVERYONE)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    x_star = centralized_optimum(problem.task, problem.shards).x
    assert float((average(xs) - x_star).norm() / x_star.norm()) < 1e-6
