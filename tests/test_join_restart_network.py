"""Restarts around a join, through real processes (agent/pipeline.py's join path,
agent/departure/records.py): 5 seats, agent5's empty at the start, the four members on a 4-ring.

The members are frozen (SIGSTOP) past round 30, so that none has polled round 50 when agent5
asks to join: the coordinator names round 50. agent5 kills itself (SIGKILL, tests/crash_hook)
in the seed exchange of its new edges, before it sends its shares (`rejoin-shares`); started
again with the same command, it resumes the exchange from its state folder and takes part
from round 50. It kills itself once more on reaching round 120 and resumes from its
checkpoint; then agent1, a member that gained agent5 as a neighbour, does the same at round
150, and resumes with the join from its records. All five exit 0 and equal
`efpsn simulate --join agent5@50` bit for bit."""

from __future__ import annotations

import signal

import pytest
from localnet import LocalNet, crash_at

from efpsn.departure.joins import Join
from efpsn.launch.summary import check_results, load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(400)]

# the deadline is longer than a restart (an interpreter and torch; over 10 s on a loaded
# machine): a restarted agent is back before anyone declares it gone
NOISE_SEED, DEADLINE, ROUND_TIMEOUT, CHECKPOINTS = 7, 25.0, 30.0, 10
MEMBERS = ["agent1", "agent2", "agent3", "agent4"]
EVERYONE = [*MEMBERS, "agent5"]


def test_a_joiner_and_its_new_neighbour_restarted_around_the_join_resume_bit_for_bit(
        tmp_path) -> None:
    config = RunConfig(agents=5, late="agent5", iterations=240, eval_every=60, key_bits=1024,
                       round_timeout_seconds=ROUND_TIMEOUT)
    args = ("--departure-deadline", str(DEADLINE), "--checkpoint-every", str(CHECKPOINTS),
            "--allow-insecure-keys")
    with LocalNet(tmp_path, config, noise_seed=NOISE_SEED, agent_args=args,
                  coordinator_args=("--allow-insecure-keys",),
                  own_args={"agent5": ("--join",)},
                  agent_env={"agent1": crash_at(150, name="agent1"),
                             "agent5": crash_at("rejoin-shares")}) as net:
        net.start_coordinator()
        for name in MEMBERS:
            net.start_agent(name, wait=False)
        for name in MEMBERS:
            net.wait_port(name)
        net.wait_round("agent1", 30, timeout=240)
        rounds = {"join": net.join_frozen("agent5", MEMBERS)}
        # killed in its new edges' exchange, started again: it resumes the exchange
        assert net.procs["agent5"].wait(timeout=120) == -signal.SIGKILL
        net.restart("agent5", env=crash_at(120, name="agent5"))
        # killed at round 120, started again: it resumes from its checkpoint
        assert net.procs["agent5"].wait(timeout=240) == -signal.SIGKILL
        net.restart("agent5")
        assert net.procs["agent1"].wait(timeout=240) == -signal.SIGKILL
        net.restart("agent1")
        codes = net.wait_agents(timeout=300)
        logs = {n: net.log(n) for n in EVERYONE}
    assert codes == dict.fromkeys(EVERYONE, 0), {n: logs[n][-2000:] for n in EVERYONE}
    assert rounds["join"] == 50
    assert "agent5 resumes the seed exchange of its new edge(s) with agent1, agent4" in logs[
        "agent5"]
    assert "agent1 resumed with the membership changes agent5@50 joined" in logs["agent1"]
    assert "Traceback" not in logs["agent5"] and "Traceback" not in logs["agent1"]
    results, xs = load_agent_results(tmp_path, EVERYONE)
    assert check_results(results, iterations=config.iterations.total) == []
    by_name = {r["name"]: r for r in results}
    assert by_name["agent5"]["joined"]["round"] == 50
    assert by_name["agent5"]["resumed_from_round"] in (110, 120)
    assert by_name["agent1"]["resumed_from_round"] in (140, 150)
    assert [j["agent"] for j in by_name["agent1"]["joins"]] == ["agent5"]
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=build_problem(config),
                         joins=[Join(agent=4, round=50)])
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    # the finished run keeps no secret: the new edges' seeds and the records are gone
    for name in ("agent1", "agent5"):
        assert not (tmp_path / name / "state" / "departures.json").exists()
