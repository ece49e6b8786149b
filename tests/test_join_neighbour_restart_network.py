"""A new neighbour killed during a join's seed exchange, through real processes: 5 seats,
agent5's empty at the start, the four members on a 4-ring, frozen (SIGSTOP) past round 30 so
that the coordinator names round 50. agent1, which gains agent5 as a neighbour, kills itself
(SIGKILL, tests/crash_hook) in that edge's seed exchange before it sends its shares
(`rejoin-shares`); started again with the same command, it resumes the exchange from its state
folder (the joiner waits in its exchange meanwhile) and the run goes on: all five exit 0 and
equal `efpsn simulate --join agent5@50` bit for bit."""

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


def test_a_new_neighbour_killed_in_the_joins_exchange_resumes_it_bit_for_bit(tmp_path) -> None:
    config = RunConfig(agents=5, late="agent5", iterations=200, eval_every=50, key_bits=1024,
                       round_timeout_seconds=ROUND_TIMEOUT)
    args = ("--departure-deadline", str(DEADLINE), "--checkpoint-every", str(CHECKPOINTS),
            "--allow-insecure-keys")
    with LocalNet(tmp_path, config, noise_seed=NOISE_SEED, agent_args=args,
                  coordinator_args=("--allow-insecure-keys",),
                  own_args={"agent5": ("--join",)},
                  agent_env={"agent1": crash_at("rejoin-shares", name="agent1")}) as net:
        net.start_coordinator()
        for name in MEMBERS:
            net.start_agent(name, wait=False)
        for name in MEMBERS:
            net.wait_port(name)
        net.wait_round("agent1", 30, timeout=240)
        assert net.join_frozen("agent5", MEMBERS) == 50
        assert net.procs["agent1"].wait(timeout=120) == -signal.SIGKILL
        net.restart("agent1")
        codes = net.wait_agents(timeout=300)
        logs = {n: net.log(n) for n in EVERYONE}
    assert codes == dict.fromkeys(EVERYONE, 0), {n: logs[n][-2000:] for n in EVERYONE}
    assert "agent1 resumes the seed exchange of its new edge(s) with agent5" in logs["agent1"]
    assert "Traceback" not in logs["agent1"] and "Traceback" not in logs["agent5"]
    results, xs = load_agent_results(tmp_path, EVERYONE)
    assert check_results(results, iterations=config.iterations.total) == []
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=build_problem(config),
                         joins=[Join(agent=4, round=50)])
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
