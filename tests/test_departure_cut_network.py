"""Departures that cut the graph, through real processes (agent/departure/new_edges.py, coordinator/
departures.py): a path of 5 losing its middle agent, and a 5-ring losing two non-adjacent
agents at once (killed -9 by tests/crash_hook (localnet.crash_at) on reaching round 201,
never back); and a party withdrawn on purpose (its agent stopped by SIGTERM there). The
coordinator's decision names the new edge's ends to each other (the rule of
efpsn.departure.membership.rejoin_edges), they open a channel (mutual TLS names checked), run phase
I's seed exchange for that edge under fresh Paillier keys before the re-base round, and mix from it
on. The others exit 0 within 1e-6 of the remaining folders' optimum, and their iterates equal `efpsn
simulate --leave ...` with the agreed rounds bit for bit (the simulator draws the new edge's seeds
from the same generator: departure_masks.new_edge_seeds)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from localnet import crash_at

from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.membership import parse_leave
from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import average, build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.optimum import centralized_optimum

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

NOISE_SEED, CRASH_AT, DEADLINE, ROUND_TIMEOUT = 7, 201, 3.0, 30.0


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cut-data")
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=root, test_fraction=0)
    return root


def _run(data: Path, out: Path, *, topology: str, victims: list[str],
         at: int | str = CRASH_AT) -> dict[str, Any]:
    config = RunConfig(**{**inspect_data_dir(data).run_values(), "l2": 0.01,  # type: ignore[arg-type]
                          "iterations": 2000, "eval_every": 500, "key_bits": 2048,
                          "topology": topology, "round_timeout_seconds": ROUND_TIMEOUT})
    started = time.monotonic()
    # the fork server's children inherit the crash hook from its environment (forked, not
    # started: a per-agent environment would not load it)
    with pytest.MonkeyPatch.context() as env:
        for variable, value in crash_at(at, name=",".join(victims)).items():
            env.setenv(variable, value)
        summary = launch_local_network(
            config, results=out, data_dir=data, quiet=True, holdout=0.0,
            insecure_noise_seed=NOISE_SEED, departure_deadline=DEADLINE)
    wall = time.monotonic() - started
    assert summary["ok"], summary["problems"]
    survivors = summary["remaining"]
    problem = build_problem(config, local=load_data_dir(config, data, holdout=0.0))
    leaves = [parse_leave(_label(r), agents=5) for r in summary["departures"]]
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem, departures=leaves)
    _, xs = load_agent_results(out, survivors)
    gone = {d.agent for d in leaves}
    x_star = centralized_optimum(problem.task, [s for i, s in enumerate(problem.shards)
                                                if i not in gone]).x
    distance = float(torch.linalg.vector_norm(average(xs) - x_star)
                     / torch.linalg.vector_norm(x_star))
    print(f"\n{topology} without {victims}: {[_label(r) for r in summary['departures']]}, "
          f"new edges {summary['departures'][-1]['new_edges']}, relative distance "
          f"{distance:.2e}, wall {wall:.1f} s")
    return {"summary": summary, "survivors": survivors, "xs": xs, "sim": sim,
            "distance": distance, "out": out}


def _label(record: dict[str, Any]) -> str:
    late = "".join(f"+{name}" for name in record["late"])
    return f"{record['agent']}@{record['round']}:{record['rebase_round']}{late}"


def _equal_to_the_simulator(run: dict[str, Any]) -> None:
    sim = run["sim"]
    assert len(run["xs"]) == len(sim.xs)
    assert max(float((a - b).abs().max()) for a, b in zip(run["xs"], sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    assert run["distance"] < 1e-6


def test_a_path_cut_in_two_is_rejoined(data: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(data, tmp_path / "run", topology="path", victims=["agent3"])
    printed = capsys.readouterr().out.strip().splitlines()
    record = run["summary"]["departures"][0]
    assert record["agent"] == "agent3"
    assert record["new_edges"] == [["agent1", "agent4"]]
    assert run["survivors"] == ["agent1", "agent2", "agent4", "agent5"]
    _equal_to_the_simulator(run)
    log = (run["out"] / "logs" / "agent1.log").read_text()
    assert "new neighbour agent4" in log and "phase I on the new edge(s) with agent4" in log
    last = next(line for line in reversed(printed) if "left at round" in line)
    assert "agent3 left at round" in last and ", new edge agent1-agent4)" in last


def test_two_non_adjacent_agents_of_a_ring_gone(data: Path, tmp_path: Path) -> None:
    run = _run(data, tmp_path / "run", topology="ring", victims=["agent2", "agent4"])
    records = run["summary"]["departures"]
    assert sorted(r["agent"] for r in records) == ["agent2", "agent4"]
    # the two may be decided together (each record then names the decision's new edge) or one
    # round apart (crash_at lets a victim die at T - 1: the edge is on the record that cut)
    assert {tuple(map(tuple, r["new_edges"])) for r in records if r["new_edges"]} \
        == {(("agent1", "agent3"),)}
    assert run["survivors"] == ["agent1", "agent3", "agent5"]
    _equal_to_the_simulator(run)


def test_a_party_withdrawn_on_purpose_leaves_like_a_silent_one(data: Path, tmp_path: Path) -> None:
    # its operator stops agent3 (SIGTERM, as `kill` or Ctrl-C) before its round-201 message:
    # its own handler stops it (exit 130, "interrupted"), nothing more is sent, its neighbours
    # report it after the departure deadline and the other four finish on their optimum
    run = _run(data, tmp_path / "run", topology="ring", victims=["agent3"], at=f"{CRASH_AT}~")
    record = run["summary"]["departures"][0]
    assert record["agent"] == "agent3" and record["new_edges"] == []
    assert run["survivors"] == ["agent1", "agent2", "agent4", "agent5"]
    assert run["summary"]["optimum_of"] == "the optimum of agents 1,2,4,5's objective"
    _equal_to_the_simulator(run)
    assert "interrupted" in (run["out"] / "logs" / "agent3.log").read_text()
