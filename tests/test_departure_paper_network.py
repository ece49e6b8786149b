"""The paper's fixed mask (`--refresh never`, `--preset paper`'s) across a departure, through
real processes (agent/fixed_terms.py): a 5-path on breast-cancer folders of unequal size;
agent3 kills itself (SIGKILL, tests/crash_hook) on reaching round 41, never back. Its
neighbours agent2 and agent4 decrypt agent3's phase I shares alone and subtract the terms they
share with it; the path falls in two and the new edge agent1-agent4 runs the paper's phase I
for that edge (fresh Paillier keys, a Masker on the one edge). The four others exit 0 and equal
`efpsn simulate --leave agent3@T:R` bit for bit, whose remaining masks sum to zero exactly
every round (the same terms dropped and added: efpsn/departure_masks.py's PairShares). Few
rounds and 1024-bit keys: the distance to the optimum is the simulator's
(tests/test_departure.py), equal to this bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
from localnet import crash_at

from efpsn.config import RunConfig
from efpsn.datadir import inspect_data_dir, load_data_dir, split_data
from efpsn.departure import parse_leave
from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = pytest.mark.timeout(300)

NOISE_SEED, CRASH_AT, DEADLINE, ROUND_TIMEOUT = 7, 41, 3.0, 30.0
SURVIVORS = ["agent1", "agent2", "agent4", "agent5"]


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("departure-paper")
    data = root / "data"
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=data, test_fraction=0)
    config = RunConfig(**{**inspect_data_dir(data).run_values(), "l2": 0.01,  # type: ignore[arg-type]
                          "iterations": 80, "eval_every": 40, "key_bits": 1024,
                          "refresh": "never", "topology": "path",
                          "round_timeout_seconds": ROUND_TIMEOUT})
    with pytest.MonkeyPatch.context() as env:
        for variable, value in crash_at(CRASH_AT, name="agent3").items():
            env.setenv(variable, value)
        summary = launch_local_network(
            config, results=root / "run", data_dir=data, quiet=True, holdout=0.0,
            insecure_noise_seed=NOISE_SEED, departure_deadline=DEADLINE,
            allow_insecure_keys=True)
    return {"root": root, "data": data, "config": config, "summary": summary}


def test_the_four_others_finish_with_the_fixed_mask(paper_run) -> None:
    summary, run = paper_run["summary"], paper_run["root"] / "run"
    assert summary["ok"], summary["problems"]
    record = summary["departures"][0]
    assert record["agent"] == "agent3" and record["round"] in (CRASH_AT - 1, CRASH_AT)
    assert record["new_edges"] == [["agent1", "agent4"]]
    assert summary["remaining"] == SURVIVORS
    assert summary["optimum_of"] == "the optimum of agents 1,2,4,5's objective"
    log = (run / "logs" / "agent4.log").read_text()
    assert "phase I on the new edge(s) with agent1" in log
    assert "Traceback" not in log


def test_the_network_equals_the_simulated_departure_bitwise(paper_run) -> None:
    config, data = paper_run["config"], paper_run["data"]
    problem = build_problem(config, local=load_data_dir(config, data, holdout=0.0))
    record = paper_run["summary"]["departures"][0]
    late = "".join(f"+{name}" for name in record["late"])
    leave = parse_leave(f"agent3@{record['round']}:{record['rebase_round']}{late}", agents=5)
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem, departures=[leave])
    _, xs = load_agent_results(paper_run["root"] / "run", SURVIVORS)
    assert len(xs) == len(sim.xs) == 4
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    assert sim.departures["rounds_zero_sum_checked"] > 0
