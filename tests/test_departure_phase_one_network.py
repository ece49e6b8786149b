"""A party that leaves in phase I itself, through real processes: a 5-path on breast-cancer
folders of unequal size; agent3 sends its public key, then kills itself (SIGKILL,
tests/crash_hook) while sending its shares: they reach agent2 only (`shares1`). A neighbour
that waits for its shares (agent1 and agent5 wait for theirs) reports from phase I; agent2,
which got them, finished phase I, sent round 0 with agent3's terms and reports from round 0
(when its own shares reached agent3 before the kill; otherwise their send fails and it
reports from phase I too, and nobody is late: a race the test accepts both ways).
The coordinator decides agent3@I:5+agent2 (round 0, marked phase I, agent2 late); agent4
finishes phase I without it (its seed drawn, never sent nor awaited), agent2 drops agent3 at
round 0, the new edge agent1-agent4 runs phase I's seed exchange, and from the re-base round 5
the four mix on the joined path. With `--scale standard` agent3 finishes phase I and dies
during the secure sum's flood, after its round-0 message (`stats`): every agent reports from
the flood, the flood starts again without it (agent/phases/secure_sum.py) and the totals are the
four others'. They exit 0 and equal `efpsn simulate --leave agent3@I:5[+agent2]` bit for bit
(agent/departure/phase_one.py)."""

from __future__ import annotations

import pytest
from localnet import launch_with_agent_killed

from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.membership import parse_leave
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.stats.standardise import simulate_standardising

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

NOISE_SEED, DEADLINE, ROUND_TIMEOUT = 7, 3.0, 30.0
SURVIVORS = ["agent1", "agent2", "agent4", "agent5"]


@pytest.mark.parametrize(("standard", "at", "late"), [(False, "shares1", ["agent2"]),
                                                      (True, "stats", [])],
                         ids=["public-scale-shares-to-agent2", "scale-standard-in-the-flood"])
def test_an_agent_gone_in_phase_one_is_left_out_and_the_rest_equal_the_replay(
        tmp_path, standard, at, late) -> None:
    data = tmp_path / "data"
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=data, test_fraction=0, raw=standard)
    values = {**inspect_data_dir(data).run_values(), "l2": 0.01,
              "iterations": 60, "eval_every": 30, "key_bits": 1024,
              "topology": "path", "round_timeout_seconds": ROUND_TIMEOUT}
    if standard:  # l2 left to its default: 1/N_total of the remaining agents' samples
        del values["l2"]
    config = RunConfig(**values)  # type: ignore[arg-type]
    assert config.scale.standard == standard
    summary = launch_with_agent_killed(config, at=at, name="agent3", results=tmp_path / "run",
                                       data=data, noise_seed=NOISE_SEED,
                                       departure_deadline=DEADLINE)
    assert summary["ok"], summary["problems"]
    record = summary["departures"][0]
    assert (record["agent"], record["round"], record["rebase_round"]) == ("agent3", 0, 5)
    # agent2 is late when its own shares reached agent3 before the kill (it then finishes phase
    # I and reports from round 0); when agent3 died first, agent2's send of its shares fails and
    # it reports from phase I like agent4: not late. Both are decisions the replay knows; which
    # one came depends on that race only, and the run must equal the replay of the one decided
    assert record["phase_one"] is True and record["late"] in (late, [])
    late = record["late"]
    assert record["new_edges"] == [["agent1", "agent4"]]
    assert summary["remaining"] == SURVIVORS
    leave = [parse_leave("agent3@I:5" + "".join(f"+{n}" for n in late), agents=5)]
    local = load_data_dir(config, data, holdout=0.0)
    if standard:  # the secure sum of the remaining four (efpsn/stats/standardise.py)
        config, local, totals = simulate_standardising(config, local, noise_seed=NOISE_SEED,
                                                       departures=leave)
        assert totals.count == sum(len(local[i].train) for i in (0, 1, 3, 4))
        assert config.l2.weight == 1.0 / totals.count
    problem = build_problem(config.resolved(), local=local)
    sim = run_simulation(config, noise_seed=NOISE_SEED, problem=problem, departures=leave)
    _, xs = load_agent_results(tmp_path / "run", SURVIVORS)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.departures is not None and sim.departures["remaining_masks_sum_to_zero"]
