"""A party that leaves for good, through real processes (agent/departure/silence.py and
coordinator/departures.py): 5 agents on breast-cancer folders of unequal size; agent3 kills
itself (SIGKILL, tests/crash_hook: localnet.crash_each) on reaching round 201, after its
checkpoint of round 200, and never comes back. The other four report it silent, the coordinator
decides agent3@201:206 (or @200:205 when its last messages died with it), and they finish on
their own data: exit 0, the records name agent3, and their iterates equal
`efpsn simulate --leave agent3@T:R` with the agreed T and R bit for bit.

In the same run agent4, an end of the remaining path 2-1-5-4, dies once its neighbour's
round-298 message came, two rounds before the cap 300: too late to re-base. agent2, three
hops away, finishes the cap before anyone knows and tells the coordinator it ended there;
agent5 waits for agent4 at 298, agent1 at 299; the coordinator decides "the run ended at the
cap 300" and they end with their iterates of those rounds and exit 0
(efpsn/departure/last_window.py, CapEnd), as `efpsn simulate --leave agent3@T:R --leave agent4@298`
replays it, bit for bit.

A party frozen past the deadline (SIGSTOP) is declared gone the same way; woken up (SIGCONT),
it is refused with the reason and exits 2, while the others finish."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from localnet import LocalNet, crash_each

from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.membership import parse_leave
from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import check_results, load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

# phase II's departure deadline is short (the departure costs about that much); the round
# timeout, which also bounds phase I's waits, is not, so that a loaded machine's start-up skew
# cannot stop the run
NOISE_SEED, CRASH_AT, DEADLINE, ROUND_TIMEOUT = 7, 201, 3.0, 30.0
CAP, LAST = 300, 298  # agent4 leaves at 298, too late to re-base before the cap
SURVIVORS = ["agent1", "agent2", "agent5"]


@pytest.fixture(scope="module")
def departed_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("departure")
    data = root / "data"
    # `efpsn data split --data sklearn:breast_cancer --agents 5 --partition dirichlet:1.0`:
    # folders of unequal size, with the public per-column scale (standardised)
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=data, test_fraction=0)
    config = RunConfig(**{**inspect_data_dir(data).run_values(), "l2": 0.01,  # type: ignore[arg-type]
                          "iterations": CAP, "eval_every": 100, "key_bits": 2048,
                          "round_timeout_seconds": ROUND_TIMEOUT})
    started = time.monotonic()
    # the launcher's environment, so the fork server loads the hook before it forks the agents
    # (it names agent3 and agent4: the others run on)
    with pytest.MonkeyPatch.context() as env:
        for variable, value in crash_each({"agent3": CRASH_AT, "agent4": f"{LAST}!"}).items():
            env.setenv(variable, value)
        summary = launch_local_network(
            config, results=root / "run", data_dir=data, quiet=True, holdout=0.0,
            insecure_noise_seed=NOISE_SEED, departure_deadline=DEADLINE)
    return {"root": root, "data": data, "config": config, "summary": summary,
            "wall": time.monotonic() - started}


def test_the_others_finish_and_the_records_name_agent3(departed_run) -> None:
    summary, run = departed_run["summary"], departed_run["root"] / "run"
    assert summary["ok"], summary["problems"]
    record = summary["departures"][0]
    # T is 201, or 200 when agent3's round-200 messages were still in its buffers when it died
    # (then a neighbour that did receive it is late); R = T + 5 agents
    assert record["agent"] == "agent3" and record["round"] in (CRASH_AT - 1, CRASH_AT)
    assert record["rebase_round"] == record["round"] + 5
    assert set(record["late"]) <= {"agent2", "agent4"}
    assert record["neighbours"] == ["agent2", "agent4"] and record["new_edges"] == []
    assert summary["remaining"] == SURVIVORS
    assert sorted(summary["agents"]) == SURVIVORS
    assert not (run / "agent3" / "result.json").exists()
    assert not (run / "agent4" / "result.json").exists()
    coordinator = (run / "logs" / "coordinator.log").read_text()
    assert f"departures decided: {_leave(record)}" in coordinator
    # the slowdown is about one departure deadline per departure (the silent wait)
    assert departed_run["wall"] < 75


def test_a_departure_too_late_to_rebase_ends_the_run_at_the_cap(departed_run) -> None:
    summary, run = departed_run["summary"], departed_run["root"] / "run"
    second = summary["departures"][1]
    assert (second["agent"], second["round"], second["capped"]) == ("agent4", LAST, CAP)
    assert second["finished"] == ["agent2"] and second["ended"] == {"agent1": LAST + 1,
                                                                   "agent5": LAST}
    assert second["neighbours"] == ["agent5"] and "new_edges" not in second
    # the model is said plainly: the iterate of the four's objective (agent4's data in it),
    # not certified and not the optimum of agents 1, 2 and 5
    assert summary["optimum_of"].startswith("the iterate of agents 1,2,4,5's objective at the "
                                            "rounds they ended (agent4's data included)")
    assert "not the optimum of the remaining parties' objective" in summary["optimum_of"]
    assert not summary["convergence"]["converged"]
    assert "ended at the cap 300" in summary["convergence"]["line"]
    results, _ = load_agent_results(run, SURVIVORS)
    assert [r["final"]["round"] for r in results] == [LAST + 1, CAP, LAST]
    assert check_results(results, iterations=CAP, ends={CAP, LAST, LAST + 1}) == []
    # agent2 finished before the decision: its record knows agent3 only
    assert [e["agent"] for e in results[1]["departures"]] == ["agent3"]
    coordinator = (run / "logs" / "coordinator.log").read_text()
    assert "agent2 finished at round 300 (its cap)" in coordinator


def test_the_network_equals_the_simulated_departure_bitwise(departed_run) -> None:
    config, data = departed_run["config"], departed_run["data"]
    problem = build_problem(config, local=load_data_dir(config, data, holdout=0.0))
    # `efpsn simulate --leave agent3@T:R[+agentJ] --leave agent4@298` with the T, R (and late
    # J) the network agreed
    first, second = departed_run["summary"]["departures"]
    leaves = [parse_leave(_leave(first), agents=5), parse_leave(f"agent4@{LAST}", agents=5)]
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem, departures=leaves)
    _, xs = load_agent_results(departed_run["root"] / "run", SURVIVORS)
    assert len(xs) == len(sim.xs) == 3
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    replayed = sim.departures["departures"][1]
    assert {k: replayed[k] for k in ("capped", "finished", "ended")} \
        == {k: second[k] for k in ("capped", "finished", "ended")}
    assert sim.departures["optimum_of"] == departed_run["summary"]["optimum_of"]


def _leave(record: dict[str, Any]) -> str:
    late = "".join(f"+{name}" for name in record["late"])
    return f"{record['agent']}@{record['round']}:{record['rebase_round']}{late}"


def test_nothing_private_reaches_the_coordinator(departed_run) -> None:
    # the coordinator hears names and round numbers: its log holds no file and no figure
    log = (departed_run["root"] / "run" / "logs" / "coordinator.log").read_text()
    assert str(departed_run["data"]) not in log and "train.npz" not in log
    assert "loss" not in log


def test_a_party_declared_gone_that_comes_back_is_refused(tmp_path) -> None:
    # prepare: a 4-ring; agent2 frozen (SIGSTOP) at round 10 for longer than the deadline
    config = RunConfig(agents=4, iterations=60, eval_every=30, key_bits=2048,
                       round_timeout_seconds=ROUND_TIMEOUT)
    others = ["agent1", "agent3", "agent4"]
    with LocalNet(tmp_path, config, agent_args=("--departure-deadline", str(DEADLINE))) as net:
        net.start_all()
        net.wait_round("agent2", 10, timeout=120)
        net.signal("agent2", signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(net.procs[n].poll() is None for n in others):
            time.sleep(0.2)
        codes = {n: net.procs[n].poll() for n in others}
        # execute: it wakes up after the others finished without it
        net.signal("agent2", signal.SIGCONT)
        back = net.procs["agent2"].wait(timeout=60)
        logs = {n: net.log(n) for n in ["coordinator", "agent2", *others]}
    # assert: the others exit 0 naming agent2; agent2 exits 2 with the reason, in one line
    assert codes == {n: 0 for n in others}, {n: logs[n][-1500:] for n in others}
    results, _ = load_agent_results(tmp_path, others)
    assert check_results(results, iterations=config.iterations.total) == []
    assert {r["departures"][0]["agent"] for r in results} == {"agent2"}
    assert {r["optimum_of"] for r in results} == {"the optimum of agents 1,3,4's objective"}
    assert back == 2, logs["agent2"][-2000:]
    error = [line for line in logs["agent2"].splitlines() if ": error: " in line]
    assert len(error) == 1 and "agent2 was declared gone at round" in error[0], error
    assert "Traceback" not in logs["agent2"]
