"""A restart after a departure, through real processes (agent/departure_state.py): a 5-ring;
agent3 kills itself (SIGKILL, tests/crash_hook) on reaching round 21 and never comes back; the
others apply the decision agent3@T:R (agent2, its neighbour, drops its weights and mask terms
and checkpoints at the round it applied it). Then agent2 is killed -9 too, after the re-base
and its next periodic checkpoint, and started again with the same command: it reloads the
departure from its state folder, re-applies what it changed up to its checkpoint (not the
re-based trackers, which the checkpoint holds) and resumes. The four exit 0 and equal
`efpsn simulate --leave agent3@T:R` bit for bit."""

from __future__ import annotations

import time
from typing import Any

import pytest
from localnet import LocalNet, crash_at

from efpsn.config import RunConfig
from efpsn.departure import parse_leave
from efpsn.launch.summary import check_results, load_agent_results
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = pytest.mark.timeout(300)

# the deadline is longer than agent2's restart (a few seconds to start python and torch): an
# agent silent past it is declared gone, and a restarted one must come back before that
NOISE_SEED, CRASH_AT, DEADLINE, ROUND_TIMEOUT, CHECKPOINTS = 7, 21, 15.0, 30.0, 10
SURVIVORS = ["agent1", "agent2", "agent4", "agent5"]


def _round(net: LocalNet, name: str) -> int:
    status = net.status(name)  # None when it does not answer (not serving yet, or any more)
    return status.round if status is not None and status.phase.name == "OPTIMIZE" else -1


def _wait(what: str, predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def test_a_neighbour_restarted_after_the_departure_resumes_bit_for_bit(tmp_path) -> None:
    config = RunConfig(agents=5, iterations=90, eval_every=30, key_bits=2048,
                       round_timeout_seconds=ROUND_TIMEOUT)
    args = ("--departure-deadline", str(DEADLINE), "--checkpoint-every", str(CHECKPOINTS))
    with LocalNet(tmp_path, config, noise_seed=NOISE_SEED, agent_args=args,
                  agent_env={"agent3": crash_at(CRASH_AT)}) as net:
        net.start_all()
        # agent3 dies at 21; the others apply agent3@T:T+5 and go on: agent2 past the re-base
        # and its checkpoint of round 30 (a periodic one after the forced one at T)
        _wait("agent2 past round 33", lambda: _round(net, "agent2") >= 33)
        net.kill("agent2")
        state = tmp_path / "agent2" / "state"
        assert (state / "departures.json").exists()
        net.restart("agent2")
        codes = net.wait_agents(timeout=180)
        logs = {n: net.log(n) for n in SURVIVORS}
    assert codes["agent3"] not in (None, 0)
    assert {n: codes[n] for n in SURVIVORS} == {n: 0 for n in SURVIVORS}, \
        {n: logs[n][-2000:] for n in SURVIVORS}
    assert "resumes run" in logs["agent2"] and "resumed with the departures agent3@" in logs["agent2"]
    assert "Traceback" not in logs["agent2"]
    results, xs = load_agent_results(tmp_path, SURVIVORS)
    assert check_results(results, iterations=config.iterations.total) == []
    assert results[1]["resumed_from_round"] >= 30  # after the re-base, from a checkpoint
    record = results[0]["departures"][0]
    assert {r["departures"][0]["round"] for r in results} == {record["round"]}
    late = "".join(f"+{name}" for name in record["late"])
    leave = parse_leave(f"agent3@{record['round']}:{record['rebase_round']}{late}", agents=5)
    assert record["rebase_round"] < results[1]["resumed_from_round"]
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=build_problem(config),
                         departures=[leave])
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    # the finished run keeps no secret: the new edges' seeds and the record go with the seeds
    assert not (state / "departures.json").exists()
