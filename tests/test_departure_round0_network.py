"""A party that leaves right after phase I, through real processes: a 5-path on breast-cancer
folders of unequal size; agent3 finishes phase I and kills itself (SIGKILL, tests/crash_hook)
before sending anything for round 0. The others report it silent at round 0 (agent1, not next
to it, may already be at round 1) and the coordinator decides agent3@0:5: its neighbours drop
its weights and seeds from round 0 on, the new edge agent1-agent4 runs phase I's seed exchange
and mixes from the re-base round 5. The four exit 0 and equal `efpsn simulate --leave
agent3@0:5` bit for bit."""

from __future__ import annotations

import pytest
from localnet import launch_with_agent_killed

from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.membership import parse_leave
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

NOISE_SEED, DEADLINE, ROUND_TIMEOUT = 7, 3.0, 30.0
SURVIVORS = ["agent1", "agent2", "agent4", "agent5"]


def test_an_agent_gone_before_round_0_is_left_out_from_the_start(tmp_path) -> None:
    data = tmp_path / "data"
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=data, test_fraction=0)
    config = RunConfig(**{**inspect_data_dir(data).run_values(), "l2": 0.01,  # type: ignore[arg-type]
                          "iterations": 60, "eval_every": 30, "key_bits": 1024,
                          "topology": "path", "round_timeout_seconds": ROUND_TIMEOUT})
    summary = launch_with_agent_killed(config, at=0, name="agent3", results=tmp_path / "run",
                                       data=data, noise_seed=NOISE_SEED,
                                       departure_deadline=DEADLINE)
    assert summary["ok"], summary["problems"]
    record = summary["departures"][0]
    assert (record["agent"], record["round"], record["rebase_round"]) == ("agent3", 0, 5)
    assert record["new_edges"] == [["agent1", "agent4"]]
    assert summary["remaining"] == SURVIVORS
    problem = build_problem(config, local=load_data_dir(config, data, holdout=0.0))
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem,
                         departures=[parse_leave("agent3@0:5", agents=5)])
    _, xs = load_agent_results(tmp_path / "run", SURVIVORS)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
