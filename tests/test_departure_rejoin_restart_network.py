"""The end of a new edge killed while that edge's seed exchange runs, and restarted (the same
command), through real processes (agent/departure/exchange_file.py): a 5-path whose agent2 kills
itself (SIGKILL, tests/crash_hook) in phase I, before sending its key, never back. The coordinator
decides agent2@I:5 and joins the pieces {agent1} and {agent3, agent4, agent5} with the new edge
agent1-agent3. agent1 saves its exchange (its key pair for the edge, its seed), sends its key,
takes agent3's (on disk before it is acknowledged), saves the ciphertext of its seed and is
killed before sending it (`rejoin-shares`); agent3 waits for it in its own exchange. Started
again, agent1 reloads the exchange, sends its key again (a duplicate agent3 acknowledges), then
the very ciphertext it had saved, takes agent3's seed (from its disk, or from agent3's retry)
and goes on: the four exit 0 and equal `efpsn simulate --leave agent2@I:5` bit for bit. Before
this, the restarted agent1 exited 2 ("its key pair for that exchange is gone") and agent3,
waiting, did too."""

from __future__ import annotations

import json

import pytest
from localnet import LocalNet, crash_at

from efpsn.departure.membership import parse_leave
from efpsn.launch.summary import check_results, load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

# the deadline is longer than agent1's restart and agent3's wait for it in their exchange (its
# neighbour agent4 waits for agent3 meanwhile): a restart must be back within it, and on a loaded
# machine the restart alone (an interpreter and torch) has taken over 10 s
NOISE_SEED, DEADLINE, ROUND_TIMEOUT = 7, 25.0, 30.0
SURVIVORS = ["agent1", "agent3", "agent4", "agent5"]


def test_a_new_edges_end_killed_in_its_exchange_resumes_it_bit_for_bit(tmp_path) -> None:
    config = RunConfig(agents=5, topology="path", iterations=40, eval_every=20, key_bits=1024,
                       round_timeout_seconds=ROUND_TIMEOUT)
    args = ("--departure-deadline", str(DEADLINE), "--allow-insecure-keys")
    state = tmp_path / "agent1" / "state"
    with LocalNet(tmp_path, config, noise_seed=NOISE_SEED, agent_args=args,
                  coordinator_args=("--allow-insecure-keys",),
                  agent_env={"agent1": crash_at("rejoin-shares"),
                             "agent2": crash_at("keys")}) as net:
        net.start_all()
        killed = net.procs["agent1"].wait(timeout=120)
        saved = json.loads((state / "rejoin.json").read_text())
        mode = (state / "rejoin.json").stat().st_mode & 0o777
        net.restart("agent1")  # without the hook
        codes = net.wait_agents(timeout=180)
        logs = {n: net.log(n) for n in SURVIVORS}
    assert killed != 0 and codes["agent2"] not in (None, 0)
    assert {n: codes[n] for n in SURVIVORS} == {n: 0 for n in SURVIVORS}, \
        {n: logs[n][-2000:] for n in SURVIVORS}
    # what the killed agent1 had saved: its exchange with agent3 (index 2), private to it,
    # agent3's key taken, its own ciphertext for agent3 saved before it was to be sent
    assert mode == 0o600 and saved["joiners"] == {"agent3": 2}
    assert list(saved["received"]["key"]) == ["agent3"] and list(saved["sent"]) == ["2"]
    assert "resumes the seed exchange of its new edge(s) with agent3" in logs["agent1"]
    assert "Traceback" not in logs["agent1"]
    results, xs = load_agent_results(tmp_path, SURVIVORS)
    assert check_results(results, iterations=config.iterations.total) == []
    record = results[0]["departures"][0]
    assert (record["agent"], record["phase_one"], record["late"]) == ("agent2", True, [])
    assert record["new_edges"] == [["agent1", "agent3"]]
    leave = parse_leave(f"agent2@I:{record['rebase_round']}", agents=5)
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=build_problem(config),
                         departures=[leave])
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
    # the finished run keeps no secret: the exchange's state went once its seeds were saved
    assert not (state / "rejoin.json").exists() and not (state / "departures.json").exists()
