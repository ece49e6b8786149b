"""A join between departures, through real processes: 6 seats, agent6's empty at the start,
the five members on a 5-ring. agent3 kills itself (SIGKILL, tests/crash_hook) on reaching round
21 and never comes back: the others apply agent3@T:R and go on as the path 2-1-5-4. Past round
60 the members are frozen (SIGSTOP) while agent6 asks to join, so that the coordinator names
round 75; from there the graph is the ring over 1, 2, 4, 5, 6: agent6 between agent5 and
agent1, and the new edge agent2-agent4 between two members (each may hear of the join before
the other: the later one answers "retry" until it has). agent6 then leaves for good itself (it
kills itself at round 150): the four finish at the optimum of their own data, and every
iterate equals `efpsn simulate --leave agent3@T:R --join agent6@75 --leave agent6@T2:R2` bit for
bit."""

from __future__ import annotations

import re
import signal
import time
from typing import Any

import pytest
from localnet import LocalNet, crash_at

from efpsn.departure.joins import Join
from efpsn.departure.membership import parse_leave
from efpsn.launch.summary import check_results, load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(400)]

# the deadline outlasts the members' freeze (SIGSTOP until the coordinator decides the join):
# with 3 s a loaded machine's freeze let the members report each other silent
NOISE_SEED, DEADLINE, ROUND_TIMEOUT = 7, 12.0, 30.0
MEMBERS = ["agent1", "agent2", "agent3", "agent4", "agent5"]
SURVIVORS = ["agent1", "agent2", "agent4", "agent5"]


def test_a_party_joins_after_a_departure_and_leaves_for_good(tmp_path) -> None:
    config = RunConfig(agents=6, late="agent6", iterations=240, eval_every=60, key_bits=1024,
                       round_timeout_seconds=ROUND_TIMEOUT)
    args = ("--departure-deadline", str(DEADLINE), "--allow-insecure-keys")
    with LocalNet(tmp_path, config, noise_seed=NOISE_SEED, agent_args=args,
                  coordinator_args=("--allow-insecure-keys",),
                  own_args={"agent6": ("--join",)},
                  agent_env={"agent3": crash_at(21, name="agent3"),
                             "agent6": crash_at(150, name="agent6")}) as net:
        net.start_coordinator()
        for name in MEMBERS:
            net.start_agent(name, wait=False)
        for name in MEMBERS:
            net.wait_port(name)
        _wait("agent1 at round 60", lambda: _round(net, "agent1") >= 60)
        alive = [n for n in MEMBERS if n != "agent3"]
        for name in alive:
            net.signal(name, signal.SIGSTOP)
        try:
            time.sleep(0.3)
            net.start_agent("agent6", wait=False)
            _wait("the coordinator's decision",
                  lambda: "agent6 joins at round" in net.log("coordinator"))
        finally:
            for name in alive:
                net.signal(name, signal.SIGCONT)
        codes = net.wait_agents(timeout=300)
        logs = {n: net.log(n) for n in [*MEMBERS, "agent6", "coordinator"]}
    decided = re.search(r"agent6 joins at round (\d+)", logs["coordinator"])
    assert decided is not None and int(decided.group(1)) == 75
    assert codes["agent3"] == -signal.SIGKILL and codes["agent6"] == -signal.SIGKILL
    assert {n: codes[n] for n in SURVIVORS} == dict.fromkeys(SURVIVORS, 0), \
        {n: logs[n][-2000:] for n in SURVIVORS}
    results, xs = load_agent_results(tmp_path, SURVIVORS)
    assert check_results(results, iterations=config.iterations.total) == []
    record = results[0]
    first, second = record["departures"]
    assert first["agent"] == "agent3" and second["agent"] == "agent6"
    [join] = record["joins"]
    assert (join["agent"], join["round"]) == ("agent6", 75)
    assert join["new_edges"] == [["agent1", "agent6"], ["agent2", "agent4"],
                                 ["agent5", "agent6"]]
    assert record["optimum_of"] == "the optimum of agents 1,2,4,5's objective"
    assert all(r["departures"] == record["departures"] and r["joins"] == record["joins"]
               for r in results)
    leaves = [parse_leave(_leave(first), agents=6), parse_leave(_leave(second), agents=6)]
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=build_problem(config),
                         departures=leaves, joins=[Join(agent=5, round=75)])
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    assert sim.departures["optimum_of"] == record["optimum_of"]


def _round(net: LocalNet, name: str) -> int:
    status = net.status(name)  # None when it does not answer (not serving yet, or any more)
    return status.round if status is not None and status.phase.name == "OPTIMIZE" else -1


def _wait(what: str, predicate: Any, timeout: float = 240.0) -> None:
    # not LocalNet.wait_for: agent3's death is part of the test
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def _leave(record: dict) -> str:
    late = "".join(f"+{name}" for name in record["late"])
    return f"{record['agent']}@{record['round']}:{record['rebase_round']}{late}"
