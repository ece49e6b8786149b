"""The operator's words, without a network: `efpsn status`'s line per agent (a party's view, an
outsider's counts, an agent that does not answer), the launcher's line for a dead agent, and
an assignment's roster of parties (checked on the wire)."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time

import pytest

from efpsn.launch.deaths import Ending, death_line, how_it_ended
from efpsn.monitor.gather import AgentRow, RunProgress
from efpsn.monitor.lines import agent_line, progress_json, progress_lines
from efpsn.wire import records
from efpsn.wire.records import Phase, WireError
from efpsn.wire.status_client import AgentStatus, NeighbourView, RunView


def _status(**fields: object) -> AgentStatus:
    base: dict[str, object] = {
        "run_id": "", "name": "agent2", "phase": Phase.OPTIMIZE, "round": 120,
        "total_rounds": 6919, "loss": math.nan, "accuracy": math.nan, "error": "",
        "finished": False, "last_round": 6919, "neighbour_count": 2}
    return AgentStatus(**{**base, **fields})  # type: ignore[arg-type]


def test_a_partys_line_names_the_neighbours_and_when_each_was_heard() -> None:
    s = _status(neighbours=(NeighbourView("agent1", "h:1", 0.04), NeighbourView("agent3", "h:3",
                                                                                None)),
                departed=("agent4",), departed_count=1, waiting_for=("agent3",))
    assert agent_line(AgentRow("agent2", "h:2", s)) == (
        "agent2: phase II, round 120 of 6919, about 6799 left; neighbours agent1 0.0 s ago, "
        "agent3 never heard; departed agent4; waiting for agent3")


def test_an_outsiders_line_holds_counts_and_the_operators_its_figures() -> None:
    outsider = _status(departed_count=1)
    assert agent_line(AgentRow("agent2", "h:2", outsider)) == (
        "agent2: phase II, round 120 of 6919, about 6799 left; 2 neighbours (names for the "
        "run's parties only); 1 departed")
    own = _status(loss=0.6628, accuracy=0.878, resumed_from_round=100, phase=Phase.DONE,
                  round=6919, finished=True)
    assert agent_line(AgentRow("agent2", "h:2", own)).endswith(
        "done, round 6919 of 6919; 2 neighbours (names for the run's parties only); resumed "
        "from round 100; loss 0.6628, accuracy 0.878")


def test_an_agent_that_does_not_answer_says_whether_its_process_exists() -> None:
    assert agent_line(AgentRow("agent2", "h:2", None, pid=41, alive=False)) == (
        "agent2: not answering at h:2 (its process 41 is gone)")
    assert agent_line(AgentRow("agent2", "h:2", None)) == "agent2: not answering at h:2"
    progress = RunProgress(source="coordinator h:0", rows=[AgentRow("agent2", "h:2", None)],
                           run=RunView("r1", 2, 2, True, {"agent2": "h:2"}, ("agent1",)))
    assert progress_lines(progress)[0] == (
        "coordinator h:0: run r1, 2 of 2 agents registered, departed agent1; 0 of 1 agents "
        "answer")
    assert progress_json(progress)["agents"] == [
        {"name": "agent2", "address": "h:2", "answering": False}]


def test_the_dead_agents_line_says_what_the_others_do() -> None:
    killed = Ending(signal="SIGKILL", code=None)
    assert death_line("agent2", 7, killed, _status(round=2250), deadline=60.0) == (
        "agent2 (pid 7) was killed by SIGKILL at round 2250; the others wait for it until the "
        "departure deadline (60 s), then go on without it once the coordinator declares it "
        "gone")
    assert death_line("agent2", 7, Ending(signal=None, code=1), _status(phase=Phase.KEYS),
                      deadline=0.0) == (
        "agent2 (pid 7) exited with code 1, last seen in phase I; departures are off "
        "(--departure-deadline 0): the run stops, every other process is stopped")
    assert "killed by SIGKILL before it reported phase I or II;" in death_line(
        "agent2", 7, killed, None, deadline=3.0)


@pytest.mark.process
def test_how_a_child_ended_is_read_without_reaping_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert how_it_ended(child.pid) is None
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (ending := how_it_ended(child.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ending == Ending(signal="SIGKILL", code=None)
        assert how_it_ended(child.pid) == ending  # not reaped: asked again, the same
        assert child.wait(timeout=10) == -signal.SIGKILL  # still the owner's to reap
        assert how_it_ended(child.pid) is None  # reaped: no longer a child
    finally:
        child.kill()
        child.wait()


def test_an_assignments_roster_is_checked() -> None:
    peer = records.Peer("agent2", 1, "h:2", 0.5)
    good = records.Assignment(run_id="r", index=0, name="agent1", neighbours=(peer,),
                              self_weight=0.5, num_agents=2, members=["agent1", "agent2"])
    assert good.members == ("agent1", "agent2")
    assert records.assignment_from_proto(records.assignment_to_proto(good)) == good
    for members in (("agent2", "agent1"), ("agent1",), ("agent1", "agent1")):
        with pytest.raises(WireError, match="members must be 2 distinct names"):
            records.check_assignment(records.Assignment(
                run_id="r", index=0, name="agent1", neighbours=(peer,), self_weight=0.5,
                num_agents=2, members=members))
