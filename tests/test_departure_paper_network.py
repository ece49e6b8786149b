"""The paper's fixed mask (`--refresh never`, `--preset paper`'s) across a departure and a
restart, through real processes (agent/departure/fixed_terms.py): a 5-path on breast-cancer folders
of unequal size. First agent2 kills itself (SIGKILL, tests/crash_hook) on reaching round 25, before
any departure, and is started again with the same command: it reloads the per-edge terms it
saved when phase I ended (STATE/edge_terms.json). Then agent3 kills itself on reaching round
41, never back.
Its neighbours agent2 and agent4 decrypt agent3's phase I shares alone and subtract the terms
they share with it; the path falls in two and the new edge agent1-agent4 runs the paper's
phase I for that edge (fresh Paillier keys, a Masker on the one edge). agent4 saves its
per-edge terms (STATE/edge_terms.json), then kills itself too on reaching round 55, past the
re-base and its checkpoint of round 50, and is started again with the same command: it
reloads the terms and the decision and re-applies them. The four others exit 0 and equal
`efpsn simulate --leave agent3@T:R` bit for bit, whose remaining masks sum to zero exactly
every round (the same terms dropped and added: efpsn/departure/remask.py's PairShares). Few
rounds and 1024-bit keys: the distance to the optimum is the simulator's
(tests/test_departure.py), equal to this bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
from localnet import LocalNet, crash_at

from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.membership import parse_leave
from efpsn.launch.summary import check_results, load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

# the deadline is longer than agent4's restart (a few seconds to start python and torch): an
# agent silent past it is declared gone, and a restarted one must come back before that
NOISE_SEED, CRASH_AT, RESTART_AT, DEADLINE, ROUND_TIMEOUT = 7, 41, 55, 15.0, 30.0
EARLY = 25  # agent2's restart, before any departure (its checkpoint of round 20)
SURVIVORS = ["agent1", "agent2", "agent4", "agent5"]


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("departure-paper")
    data, run = root / "data", root / "run"
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=data, test_fraction=0)
    config = RunConfig(**{**inspect_data_dir(data).run_values(), "l2": 0.01,  # type: ignore[arg-type]
                          "iterations": 80, "eval_every": 40, "key_bits": 1024,
                          "refresh": "never", "topology": "path",
                          "round_timeout_seconds": ROUND_TIMEOUT})
    layout = inspect_data_dir(data)
    column = layout.label_column(None)
    own = {name: ("--data", str(layout.files[name]), "--holdout", "0.0", "--label-column",
                  column) for name in layout.files}
    args = ("--departure-deadline", str(DEADLINE), "--checkpoint-every", "10",
            "--allow-insecure-keys")
    with LocalNet(run, config, noise_seed=NOISE_SEED, agent_args=args, own_args=own,
                  coordinator_args=("--allow-insecure-keys",),
                  agent_env={"agent2": crash_at(EARLY), "agent3": crash_at(CRASH_AT),
                             "agent4": crash_at(RESTART_AT)},
                  ) as net:
        net.start_all()
        net.procs["agent2"].wait(timeout=240)  # killed itself at EARLY: nobody left yet
        early = run / "agent2" / "state"
        early_saved = {f: (early / f).exists() and (early / f).stat().st_mode & 0o777
                       for f in ("edge_terms.json", "departures.json")}
        net.restart("agent2")
        net.procs["agent4"].wait(timeout=240)  # killed itself at RESTART_AT
        terms = run / "agent4" / "state" / "edge_terms.json"
        saved = terms.exists() and terms.stat().st_mode & 0o777
        net.restart("agent4")
        codes = net.wait_agents(timeout=240)
        logs = {n: net.log(n) for n in SURVIVORS}
    return {"root": root, "data": data, "config": config, "run": run, "codes": codes,
            "logs": logs, "saved": saved, "terms_left": terms.exists(),
            "early_saved": early_saved}


def test_the_four_others_finish_with_the_fixed_mask_one_restarted(paper_run) -> None:
    codes, logs = paper_run["codes"], paper_run["logs"]
    assert codes["agent3"] not in (None, 0)
    assert {n: codes[n] for n in SURVIVORS} == {n: 0 for n in SURVIVORS}, \
        {n: logs[n][-2000:] for n in SURVIVORS}
    results, _ = load_agent_results(paper_run["run"], SURVIVORS)
    assert check_results(results, iterations=paper_run["config"].iterations.total) == []
    record = results[0]["departures"][0]
    assert record["agent"] == "agent3" and record["round"] in (CRASH_AT - 1, CRASH_AT)
    assert record["new_edges"] == [["agent1", "agent4"]]
    assert all(r["remaining"] == SURVIVORS for r in results)
    assert results[0]["optimum_of"] == "the optimum of agents 1,2,4,5's objective"
    assert "phase I on the new edge(s) with agent1" in logs["agent4"]
    # agent4 came back from its checkpoint past the re-base, with the saved per-edge terms
    assert paper_run["saved"] == 0o600
    assert record["rebase_round"] < results[2]["resumed_from_round"] == 50
    assert "resumed with the departures agent3@" in logs["agent4"]
    # agent2 came back before any departure, with the terms saved when phase I ended, and
    # subtracted agent3's edge from them
    assert paper_run["early_saved"] == {"edge_terms.json": 0o600, "departures.json": False}
    assert results[1]["resumed_from_round"] == 20 < record["round"]
    assert "resumes run" in logs["agent2"] and "edge_terms_decryptions" in results[1]["timings"]
    assert all("Traceback" not in log for log in logs.values())
    assert not paper_run["terms_left"]  # the finished run keeps no secret


def test_the_network_equals_the_simulated_departure_bitwise(paper_run) -> None:
    config, data = paper_run["config"], paper_run["data"]
    problem = build_problem(config, local=load_data_dir(config, data, holdout=0.0))
    results, xs = load_agent_results(paper_run["run"], SURVIVORS)
    record = results[0]["departures"][0]
    late = "".join(f"+{name}" for name in record["late"])
    leave = parse_leave(f"agent3@{record['round']}:{record['rebase_round']}{late}", agents=5)
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem, departures=[leave])
    assert len(xs) == len(sim.xs) == 4
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    assert sim.departures["rounds_zero_sum_checked"] > 0
