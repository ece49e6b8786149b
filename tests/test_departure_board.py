"""The coordinator's departure rule (coordinator/departures.py), without I/O: who left, from
which round, who used its last message, and the reports it refuses; and its servicer
(ReportSilence), which holds every report until the decision and answers all with it."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from fake_context import FakeContext, assigned_coordinator

from coordinator.departures import DepartureBoard, Refused, Report
from efpsn.departure.membership import Departure
from efpsn.params.config import RunConfig
from efpsn.topology import path, ring
from efpsn.wire.v1 import coordinator_pb2

NAMES = [f"agent{i}" for i in range(1, 6)]


def report(sender: str, round_: int, *silent: str, epoch: int = 0) -> Report:
    return Report(sender, round_, frozenset(silent), epoch)


def test_agent3_gone_from_a_ring_is_decided_once_every_live_agent_reported() -> None:
    # prepare: a 5-ring; agent3 died before sending round 201; its neighbours wait at 201,
    # theirs at 202 for them
    board = DepartureBoard(NAMES, iterations=4000)
    # execute / assert: nothing is decided while a live agent has not reported
    assert not board.report(report("agent2", 201, "agent3"))
    assert not board.report(report("agent4", 201, "agent3"))
    assert not board.report(report("agent1", 202, "agent2"))
    assert board.decided == []
    assert board.report(report("agent5", 202, "agent4"))
    assert board.decided == [Departure(agent=2, round=201, rebase_round=206)]
    assert board.epoch == 1 and board.gone == {"agent3"}


def test_a_decision_that_cuts_the_graph_names_the_new_edges_ends_to_each_other() -> None:
    # a path 1-2-3-4-5 without agent3: the pieces {1,2} and {4,5} are joined by 1-4
    board = DepartureBoard(NAMES, iterations=4000, graph=path(5))
    for r in (report("agent2", 201, "agent3"), report("agent4", 201, "agent3"),
              report("agent1", 202, "agent2"), report("agent5", 202, "agent4")):
        board.report(r)
    assert board.decided == [Departure(agent=2, round=201, rebase_round=206)]
    assert board.joining("agent1", 0) == [3] and board.joining("agent4", 0) == [0]
    assert board.joining("agent2", 0) == [] and board.joining("agent5", 0) == []
    assert board.joining("agent1", 1) == []  # an agent that applied the decision already
    # a ring stays connected without one agent: no new edge
    ring_board = DepartureBoard(NAMES, iterations=4000, graph=ring(5))
    for r in (report("agent2", 201, "agent3"), report("agent4", 201, "agent3"),
              report("agent1", 202, "agent2"), report("agent5", 202, "agent4")):
        ring_board.report(r)
    assert all(ring_board.joining(n, 0) == [] for n in NAMES if n != "agent3")


def test_a_neighbour_that_used_the_last_message_is_late() -> None:
    # agent3 died while sending round 201: agent2 received it and waits at 202
    board = DepartureBoard(NAMES, iterations=4000)
    for r in (report("agent2", 202, "agent3"), report("agent4", 201, "agent3"),
              report("agent1", 203, "agent2"), report("agent5", 202, "agent4")):
        board.report(r)
    assert board.decided == [Departure(agent=2, round=201, rebase_round=206, late=(1,))]


def test_two_neighbours_that_blame_each_other_never_both_go_on() -> None:
    # no split brain: whoever reports is alive, so neither is declared gone while both report
    board = DepartureBoard(NAMES[:3], iterations=100)
    assert not board.report(report("agent1", 10, "agent2"))
    assert not board.report(report("agent2", 10, "agent1"))
    assert not board.report(report("agent3", 11, "agent1"))
    assert board.decided == [] and board.epoch == 0
    # four agents, two pairs blaming each other across: the first two reports decide (agent2
    # and agent3 gone, 1 and 4 stay), the blamed ones are refused: never both sides go on
    four = DepartureBoard(NAMES[:4], iterations=100)
    assert not four.report(report("agent1", 10, "agent2"))
    assert four.report(report("agent4", 10, "agent3"))
    assert four.gone == {"agent2", "agent3"}
    with pytest.raises(Refused, match="agent2 was declared gone"):
        four.report(report("agent2", 10, "agent1"))
    # two agents: one alone cannot go on (test_a_decision_that_would_leave_one_party_is_refused)
    pair = DepartureBoard(NAMES[:2], iterations=100)
    with pytest.raises(Refused, match="only agent1 would stay"):
        pair.report(report("agent1", 10, "agent2"))


def test_a_withdrawn_report_does_not_count() -> None:
    board = DepartureBoard(NAMES[:3], iterations=100)
    board.report(report("agent1", 10, "agent2"))
    board.withdraw("agent1")
    assert not board.report(report("agent3", 10, "agent2"))  # agent1's report is gone
    assert board.report(report("agent1", 10, "agent2"))
    assert board.decided == [Departure(agent=1, round=10, rebase_round=13)]


def test_a_party_declared_gone_is_refused_with_the_reason() -> None:
    board = DepartureBoard(NAMES[:3], iterations=100)
    board.report(report("agent1", 10, "agent2"))
    board.report(report("agent3", 10, "agent2"))
    with pytest.raises(Refused, match="agent2 was declared gone at round 10.*cannot come back"):
        board.report(report("agent2", 11, "agent1"))


def test_a_decision_that_would_leave_one_party_is_refused() -> None:
    # three agents on a ring; agent2 and agent3 never came back from phase I: agent1 alone
    # would train on its own data only (nobody to mix with), so nobody goes on
    board = DepartureBoard(NAMES[:3], iterations=10, graph=ring(3))
    with pytest.raises(Refused, match="agent2, agent3 silent: only agent1 would stay, and a run "
                                      "goes on with at least 2 parties"):
        board.report(report("agent1", 0, "agent2", "agent3"))
    assert board.decided == [] and board.failure is not None
    # one of three silent: two stay, decided as usual
    two = DepartureBoard(NAMES[:3], iterations=4000, graph=ring(3))
    two.report(report("agent1", 201, "agent3"))
    assert two.report(report("agent2", 201, "agent3"))
    assert [d.agent for d in two.decided] == [2]


def test_an_agent_silent_from_round_0_leaves_and_the_rebase_comes_later() -> None:
    # it finished phase I and sent no round message: its neighbours drop it from round 0,
    # the re-base comes n rounds later (agents far from it may have stepped round 0 already)
    board = DepartureBoard(NAMES[:4], iterations=100)
    assert not board.report(report("agent1", 0, "agent2"))
    assert not board.report(report("agent4", 0))
    assert board.report(report("agent3", 0, "agent2"))
    assert [d.label() for d in board.decided] == ["agent2@0:4"]


def test_a_late_report_of_an_older_epoch_gets_the_decision_at_once() -> None:
    board = DepartureBoard(NAMES[:3], iterations=100)
    board.report(report("agent1", 10, "agent2"))
    board.report(report("agent3", 10, "agent2"))
    assert not board.report(report("agent1", 11, "agent3", epoch=0))
    assert board.since(0) == board.decided and board.since(1) == []


@pytest.mark.parametrize(("reports", "match"), [
    ([report("agent1", 10, "agent2"), report("agent3", 12, "agent2")], "contradict"),
    ([report("agent1", 100, "agent2"), report("agent3", 100, "agent2")],
     "waits at round 100, but the run's last round is 100"),
    ([report("agent1", 0, "agent2"), report("agent3", 1, "agent2")], "while sending round 0"),
])
def test_reports_that_cannot_be_decided_stop_every_waiter(reports: list[Report],
                                                          match: str) -> None:
    board = DepartureBoard(NAMES[:3], iterations=100)
    board.report(reports[0])
    with pytest.raises(Refused, match=match):
        board.report(reports[1])
    assert board.failure is not None and board.decided == []
    with pytest.raises(Refused, match=match):  # and every later report hears the same
        board.report(report("agent1", 10, "agent2"))


# ------------------------------------------------------------------ the coordinator's servicer


def test_the_coordinator_answers_every_held_report_with_one_decision() -> None:
    # prepare: a 3-ring, assigned; agent2 is silent
    service = assigned_coordinator(RunConfig(agents=3, iterations=100))

    def silence(sender: str, round_: int, *silent: str, run_id: str = "r1") -> Any:
        return service.ReportSilence(coordinator_pb2.SilenceReport(
            run_id=run_id, sender=sender, round=round_, silent=silent, epoch=0), FakeContext())

    async def scenario() -> tuple[Any, ...]:
        held = asyncio.ensure_future(silence("agent1", 10, "agent2"))
        await asyncio.sleep(0.05)
        assert not held.done()  # held until every live agent reported
        second = await silence("agent3", 10, "agent2")
        first = await held
        refused = FakeContext()
        with pytest.raises(grpc.aio.AbortError):
            await service.ReportSilence(coordinator_pb2.SilenceReport(
                run_id="r1", sender="agent2", round=11, silent=["agent1"]), refused)
        other = FakeContext()
        with pytest.raises(grpc.aio.AbortError):
            await service.ReportSilence(coordinator_pb2.SilenceReport(
                run_id="r2", sender="agent1", round=11, silent=["agent3"]), other)
        return first, second, refused, other

    first, second, refused, other = asyncio.run(scenario())
    # assert: both held calls get the same decision: agent2 left at 10, re-base at 13
    assert first == second
    assert [(d.agent, d.index, d.round, d.rebase_round, list(d.late))
            for d in first.departed] == [("agent2", 1, 10, 13, [])]
    assert first.epoch == 1 and first.run_id == "r1"
    # the party declared gone is refused with the reason; another run's report too
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "agent2 was declared gone at round 10" in refused.details
    assert other.code == grpc.StatusCode.FAILED_PRECONDITION and "run 'r2'" in other.details
