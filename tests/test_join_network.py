"""A party that joins a running network, through real processes (coordinator/joins.py,
agent/departure/local.py, efpsn/launch/late.py): 5 seats on breast-cancer folders of unequal
size, agent5's empty at the start (--late-seats agent5). The four members run phase I and
phase II on a 4-ring; once they have passed round 100 the launcher starts agent5, which asks
the coordinator to join; the coordinator names the next check round nobody has polled, R, and
from R on the graph is the 5-ring: agent5's new edges to agent1 and agent4 seeded under
Paillier, the edge agent1-agent4 dropped, everyone re-based. The run ends at the optimum of
all five parties' data, and the iterates equal `efpsn simulate --join agent5@R` bit for bit.

A join that comes too late (the run ends first) is refused with its reason in one line, and
the others finish on their own."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from localnet import LocalNet

from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.joins import JOIN_CHECK_EVERY, Join
from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import average, build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.optimum import centralized_optimum

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

# the members run about 200 rounds a second here: a joiner started after round 100 takes part
# from a check round some hundreds later, and the rounds after it reach the optimum of all five
NOISE_SEED, START_AFTER, CAP, DEADLINE, ROUND_TIMEOUT = 7, 100, 4000, 3.0, 30.0
EVERYONE = ["agent1", "agent2", "agent3", "agent4", "agent5"]


def _config(data: Any, **values: Any) -> RunConfig:
    return RunConfig(**{**inspect_data_dir(data).run_values(),  # type: ignore[arg-type]
                        "l2": 0.01, "eval_every": 100, "key_bits": 2048, "late": "agent5",
                        "round_timeout_seconds": ROUND_TIMEOUT, **values})


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # `efpsn data split --data sklearn:breast_cancer --agents 5 --partition dirichlet:1.0`
    out = tmp_path_factory.mktemp("join") / "data"
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=out, test_fraction=0)
    return out


@pytest.fixture(scope="module")
def joined_run(data: Any) -> dict[str, Any]:
    config = _config(data, iterations=CAP)
    results = data.parent / "run"
    started = time.monotonic()
    summary = launch_local_network(config, results=results, data_dir=data, quiet=True,
                                   holdout=0.0, insecure_noise_seed=NOISE_SEED,
                                   departure_deadline=DEADLINE, late={"agent5": START_AFTER})
    return {"config": config, "summary": summary, "results": results,
            "wall": time.monotonic() - started}


def test_agent5_joins_at_a_check_round_and_everyone_finishes(joined_run) -> None:
    summary = joined_run["summary"]
    assert summary["ok"], summary["problems"]
    [join] = summary["joins"]
    assert join["agent"] == "agent5" and join["epoch"] == 1
    r = join["round"]
    assert r % JOIN_CHECK_EVERY == 0 and START_AFTER < r < CAP - 1000
    # the 5-ring over the members: agent5 between agent4 and agent1
    assert join["neighbours"] == ["agent1", "agent4"]
    assert join["new_edges"] == [["agent1", "agent5"], ["agent4", "agent5"]]
    assert join["dropped_edges"] == [["agent1", "agent4"]]
    assert summary["remaining"] == EVERYONE and sorted(summary["agents"]) == EVERYONE
    assert summary["optimum_of"] == "the optimum of agents 1,2,3,4,5's objective"
    results, _ = load_agent_results(joined_run["results"], EVERYONE)
    assert {r_["final"]["round"] for r_ in results} == {CAP}
    newcomer = next(r_ for r_ in results if r_["name"] == "agent5")
    assert newcomer["joined"] == {"round": r, "epoch": 1, "neighbours": ["agent1", "agent4"]}
    log = (joined_run["results"] / "logs" / "coordinator.log").read_text()
    assert f"agent5 joins at round {r} (neighbours agent1, agent4)" in log


def test_the_network_equals_the_simulated_join_bitwise(joined_run, data) -> None:
    config = joined_run["config"]
    r = joined_run["summary"]["joins"][0]["round"]
    problem = build_problem(config, local=load_data_dir(config, data, holdout=0.0))
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem,
                         joins=[Join(agent=4, round=r)])  # `efpsn simulate --join agent5@R`
    _, xs = load_agent_results(joined_run["results"], EVERYONE)
    assert len(xs) == len(sim.xs) == 5
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    assert sim.departures["joins"][0]["new_edges"] == joined_run["summary"]["joins"][0][
        "new_edges"]
    # and the model is the optimum of all five parties' data
    x_star = centralized_optimum(problem.task, problem.shards).x
    x_bar = average(xs)
    assert float((x_bar - x_star).norm() / x_star.norm()) < 1e-6


def test_nothing_private_reaches_the_coordinator(joined_run, data) -> None:
    log = (joined_run["results"] / "logs" / "coordinator.log").read_text()
    assert str(data) not in log and "train.npz" not in log and "loss" not in log


def test_a_join_after_the_run_ended_is_refused_in_one_line(tmp_path) -> None:
    # the four members of a 60-round run finish; agent5 asks to join then, and the coordinator
    # (still serving) refuses it with the reason: exit 2, one line
    config = RunConfig(agents=5, late="agent5", iterations=60, eval_every=20, key_bits=1024,
                       round_timeout_seconds=ROUND_TIMEOUT)
    with LocalNet(tmp_path, config, agent_args=("--allow-insecure-keys",),
                  coordinator_args=("--allow-insecure-keys",),
                  own_args={"agent5": ("--join",)}) as net:
        net.start_coordinator()
        for name in EVERYONE[:4]:
            net.start_agent(name, wait=False)
        assert all(net.procs[n].wait(timeout=240) == 0 for n in EVERYONE[:4])
        net.start_agent("agent5", wait=False)
        assert net.procs["agent5"].wait(timeout=120) == 2
        lines = net.log("agent5").strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("efpsn: error: coordinator ")
    assert lines[0].endswith("refused agent5: FAILED_PRECONDITION: agent5 cannot join run "
                             f"{json.loads((tmp_path / 'agent1' / 'result.json').read_text())['run_id']}"
                             ": the run ended at round 60")
