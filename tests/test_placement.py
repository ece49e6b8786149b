"""`efpsn up --cpu-placement` (efpsn/launch/placement.py): which CPUs each local agent is given,
and, over a real network, that every thread of each agent ran only there (or, placed none,
anywhere the launcher may run)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from efpsn.launch.network import launch_local_network
from efpsn.launch.placement import assign_cpus, launcher_cpus
from efpsn.params.config import RunConfig

NAMES = ["agent1", "agent2", "agent3"]


def _cpus(assignment: list[frozenset[int] | None]) -> list[list[int] | None]:
    return [None if c is None else sorted(c) for c in assignment]


def test_spread_puts_ring_neighbours_on_different_cpus() -> None:
    assert _cpus(assign_cpus("spread", 5, {0, 1})) == [[0], [1], [0], [1], [0]]
    # the set as the system gives it, not 0..m-1: agent k on the k-th CPU of it, mod m
    assert _cpus(assign_cpus("spread", 7, {7, 2, 5})) == [[2], [5], [7], [2], [5], [7], [2]]


def test_blocks_put_consecutive_agents_on_one_cpu() -> None:
    # the brief's case: agents 1-3 on the first CPU, 4-5 on the second
    assert _cpus(assign_cpus("blocks", 5, {0, 1})) == [[0], [0], [0], [1], [1]]
    assert _cpus(assign_cpus("blocks", 7, {7, 2, 5})) == [[2], [2], [2], [5], [5], [7], [7]]
    assert _cpus(assign_cpus("blocks", 4, {0, 1})) == [[0], [0], [1], [1]]


@pytest.mark.parametrize("mode", ["spread", "blocks"])
def test_fewer_agents_than_cpus_each_get_their_own_share(mode: str) -> None:
    assert _cpus(assign_cpus(mode, 3, range(8))) == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert _cpus(assign_cpus(mode, 2, {0, 1})) == [[0], [1]]
    assert _cpus(assign_cpus(mode, 1, {3, 4})) == [[3, 4]]  # one agent: the whole set


@pytest.mark.parametrize("agents", range(1, 30))
@pytest.mark.parametrize("cpus", [2, 3, 4, 7, 16])
@pytest.mark.parametrize("mode", ["spread", "blocks"])
def test_every_cpu_carries_its_fair_share(mode: str, cpus: int, agents: int) -> None:
    given = assign_cpus(mode, agents, range(10, 10 + cpus))
    assert len(given) == agents and all(c for c in given)
    load = {cpu: sum(cpu in c for c in given if c) for cpu in range(10, 10 + cpus)}
    if agents >= cpus:  # one CPU each, n // m or n // m + 1 agents on every CPU
        assert all(c is not None and len(c) == 1 for c in given)
        assert set(load.values()) <= {agents // cpus, -(-agents // cpus)}
    else:  # disjoint shares that cover the set
        assert set(load.values()) == {1}


def test_one_cpu_or_none_places_nothing() -> None:
    assert assign_cpus("spread", 5, {3}) == [None] * 5
    assert assign_cpus("blocks", 2, {0}) == [None] * 2
    assert assign_cpus("spread", 3, set()) == [None] * 3  # the system did not say
    assert assign_cpus("none", 5, range(8)) == [None] * 5
    assert assign_cpus("spread", 0, {0, 1}) == []


def test_bad_placements_are_refused() -> None:
    with pytest.raises(ValueError, match="one of blocks, spread, none, got 'ring'"):
        assign_cpus("ring", 5, {0, 1})
    with pytest.raises(ValueError, match="agents must be >= 0"):
        assign_cpus("spread", -1, {0, 1})


def test_the_launcher_knows_its_cpus() -> None:
    assert launcher_cpus() == frozenset(os.sched_getaffinity(0))


# A small run of the default masks (seeds, no Paillier): a few seconds.
SMALL = RunConfig(agents=3, iterations=6, eval_every=3, round_timeout_seconds=60.0)


@pytest.mark.process
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "fork"), [("spread", True), ("blocks", False), ("none", True)],
                         ids=["spread-forked", "blocks-no-fork", "none-forked"])
def test_each_agent_ran_on_the_cpus_it_was_given(tmp_path: Path, mode: str, fork: bool) -> None:
    # prepare: what the launcher will give (on a one-CPU machine: nothing, all unplaced)
    mine = sorted(launcher_cpus())
    expected = _cpus(assign_cpus(mode, len(NAMES), mine))
    # execute
    summary = launch_local_network(SMALL, results=tmp_path, quiet=True, insecure=True,
                                   fork_agents=fork, cpu_placement=mode)
    # assert: the summary says what each agent was given, and each agent's threads (its
    # main thread, gRPC's, torch's), as it recorded them at the end of phase II, could run only
    # there; an agent left unplaced could run on every CPU of the launcher
    assert summary["ok"]
    assert summary["placement"] == {"mode": mode, "cpus": dict(zip(NAMES, expected, strict=True))}
    ran = {n: summary["agents"][n]["cpus"] for n in NAMES}
    assert ran == {n: mine if c is None else c for n, c in zip(NAMES, expected, strict=True)}
    if mode != "none" and len(mine) > 1:  # placed: each on fewer CPUs than the launcher
        assert all(len(cpus) < len(mine) for cpus in ran.values())
    if len(mine) == 2:  # this machine's case: one CPU each, neighbours apart or together
        assert list(ran.values()) == {"spread": [[mine[0]], [mine[1]], [mine[0]]],
                                      "blocks": [[mine[0]], [mine[0]], [mine[1]]],
                                      "none": [mine] * 3}[mode]


@pytest.mark.process
def test_a_thread_started_before_the_placement_is_seen(tmp_path: Path) -> None:
    # prepare: a process whose second thread starts on every CPU, then its main thread is
    # placed on one (what placing an agent after gRPC started its threads would do)
    import subprocess
    import sys

    script = tmp_path / "late.py"
    script.write_text(
        "import json, os, threading\n"
        "from efpsn.process.runtime import thread_cpus\n"
        "first = min(os.sched_getaffinity(0))\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop.wait).start()\n"
        "os.sched_setaffinity(0, {first})\n"
        "print(json.dumps([thread_cpus(), sorted(os.sched_getaffinity(0))]))\n"
        "stop.set()\n")
    # execute
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    # assert: the main thread alone is on one CPU; the record shows the escaped thread's CPUs
    mine = sorted(launcher_cpus())
    assert json.loads(out) == [mine, mine[:1]]


def test_an_agent_started_by_hand_is_placed_only_if_the_variable_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from efpsn.launch.placement import cpus_env
    from efpsn.process.runtime import CPUS_ENV, place_from_environment

    assert cpus_env(None) == {} and cpus_env({3, 1}) == {CPUS_ENV: "1,3"}
    monkeypatch.delenv(CPUS_ENV, raising=False)
    assert place_from_environment() is None  # `efpsn agent` by hand: nothing placed
    monkeypatch.setenv(CPUS_ENV, "0,x")
    with pytest.raises(ValueError, match="CPU numbers separated by commas, got '0,x'"):
        place_from_environment()
    # (the variable's effect, on a real agent started as its own interpreter:
    # test_each_agent_ran_on_the_cpus_it_was_given[blocks-no-fork])


def test_efpsn_up_places_blocks_unless_told() -> None:
    from efpsn.cli.up import parse_up

    assert parse_up([]).cpu_placement == "blocks"  # the measured default
    assert parse_up(["--cpu-placement", "none"]).cpu_placement == "none"
    with pytest.raises(ValueError, match="invalid choice: 'ring'"):
        parse_up(["--cpu-placement", "ring"])
