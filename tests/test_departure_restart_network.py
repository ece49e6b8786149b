"""Restarts around departures, through real processes (agent/departure/records.py): a 5-ring.

agent1 kills itself (SIGKILL, tests/crash_hook) in phase I, before sending its key, never back:
the coordinator decides agent1@I:5. agent2, its neighbour, finishes phase I without it, saves
the decision with its seeds and is killed -9 before phase II adopted it (`adopt`): started
again with the same command, it reloads the decision and adopts it again. Then agent3 kills
itself on reaching round 21, never back: the others apply agent3@T:R (agent2 is left alone and
gets the new edge agent2-agent4; it checkpoints at the round it applied the decision). agent2
is killed -9 once more, after the re-base and its next periodic checkpoint, and started again:
it reloads both departures and the new edge's seeds, re-applies what they changed up to its
checkpoint (not the re-based trackers, which the checkpoint holds) and resumes. The three left
exit 0 and equal `efpsn simulate --leave agent1@I:5 --leave agent3@T:R` bit for bit."""

from __future__ import annotations

import time
from typing import Any

import pytest
from localnet import LocalNet, crash_at

from efpsn.departure.membership import parse_leave
from efpsn.launch.summary import check_results, load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

# the deadline is longer than agent2's restart (a few seconds to start python and torch): an
# agent silent past it is declared gone, and a restarted one must come back before that
NOISE_SEED, CRASH_AT, DEADLINE, ROUND_TIMEOUT, CHECKPOINTS = 7, 21, 15.0, 30.0, 10
SURVIVORS = ["agent2", "agent4", "agent5"]


def _round(net: LocalNet, name: str) -> int:
    status = net.status(name)  # None when it does not answer (not serving yet, or any more)
    return status.round if status is not None and status.phase.name == "OPTIMIZE" else -1


def _wait(what: str, predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def test_a_neighbour_restarted_around_two_departures_resumes_bit_for_bit(tmp_path) -> None:
    config = RunConfig(agents=5, iterations=90, eval_every=30, key_bits=1024,
                       round_timeout_seconds=ROUND_TIMEOUT)
    args = ("--departure-deadline", str(DEADLINE), "--checkpoint-every", str(CHECKPOINTS),
            "--allow-insecure-keys")
    state = tmp_path / "agent2" / "state"
    with LocalNet(tmp_path, config, noise_seed=NOISE_SEED, agent_args=args,
                  coordinator_args=("--allow-insecure-keys",),
                  agent_env={"agent1": crash_at("keys"), "agent2": crash_at("adopt"),
                             "agent3": crash_at(CRASH_AT)}) as net:
        net.start_all()
        # agent1 gone in phase I; agent2 dies after saving phase I and the decision, before
        # phase II adopted it, and comes back without the hook
        net.procs["agent2"].wait(timeout=120)
        unadopted = (state / "departures.json").read_text()
        net.restart("agent2")
        # agent3 dies at 21; the others apply agent3@T:T+5 and go on: agent2 past the re-base
        # and its checkpoint of round 30 (a periodic one after the forced one at T)
        _wait("agent2 past round 33", lambda: _round(net, "agent2") >= 33)
        net.kill("agent2")
        assert (state / "departures.json").exists()
        net.restart("agent2")
        codes = net.wait_agents(timeout=180)
        logs = {n: net.log(n) for n in SURVIVORS}
    assert '"adopted": false' in unadopted and "agent1" in unadopted
    assert codes["agent1"] not in (None, 0) and codes["agent3"] not in (None, 0)
    assert {n: codes[n] for n in SURVIVORS} == {n: 0 for n in SURVIVORS}, \
        {n: logs[n][-2000:] for n in SURVIVORS}
    assert "resumes with the departures agent1@I:5 decided in phase I" in logs["agent2"]
    assert "resumed with the departures agent1@I:5, agent3@" in logs["agent2"]
    assert "Traceback" not in logs["agent2"]
    results, xs = load_agent_results(tmp_path, SURVIVORS)
    assert check_results(results, iterations=config.iterations.total) == []
    assert results[0]["resumed_from_round"] >= 30  # after the re-base, from a checkpoint
    first, second = results[0]["departures"]
    assert (first["agent"], first["phase_one"], first["late"]) == ("agent1", True, [])
    assert second["new_edges"] == [["agent2", "agent4"]]
    assert {r["departures"][1]["round"] for r in results} == {second["round"]}
    late = "".join(f"+{name}" for name in second["late"])
    leaves = [parse_leave(f"agent1@I:{first['rebase_round']}", agents=5),
              parse_leave(f"agent3@{second['round']}:{second['rebase_round']}{late}", agents=5)]
    assert second["rebase_round"] < results[0]["resumed_from_round"]
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=build_problem(config),
                         departures=leaves)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    # the finished run keeps no secret: the new edges' seeds and the record go with the seeds
    assert not (state / "departures.json").exists()
