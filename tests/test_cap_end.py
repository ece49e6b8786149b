"""A departure too late to re-base before the run's cap N (efpsn/departure/last_window.py, CapEnd):
who finishes N and where the others end; the coordinator's decision ("the run ended at the cap",
Departure.capped) through its board and its servicer; the simulator's replay, in which the
agents that never waited for the departed one hold exactly the iterates of the run without
the departure."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fake_context import FakeContext, assigned_coordinator

from coordinator.departures import DepartureBoard, Refused, Report
from efpsn.data.folders import inspect_data_dir, load_data_dir
from efpsn.departure.last_window import CapEnd, cap_end, capped_words, reach
from efpsn.departure.membership import Departure, parse_leave
from efpsn.departure.replay import departures_line
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.topology import ring
from efpsn.wire.v1 import coordinator_pb2

NAMES = [f"agent{i}" for i in range(1, 6)]


def report(sender: str, round_: int, *silent: str, last: int = 0) -> Report:
    return Report(sender, round_, frozenset(silent), 0, last=last)


def test_the_agents_far_from_it_finish_the_cap_and_the_others_end_where_they_wait() -> None:
    # a 5-ring without agent3 from round 59 of 60: its neighbours wait at 59, agents 1 and 5
    # (two hops) reach 60, the cap
    d = Departure(agent=2, round=59, rebase_round=64)
    ends = cap_end(reach(range(5), ring(5).neighbours, d), departure=d, cap=60)
    assert ends == CapEnd(departure=d, cap=60, ends={0: 60, 1: 59, 3: 59, 4: 60})
    assert ends.finished == (0, 4) and ends.ended_at(1) == 59
    assert ends.to_json() == {"capped": 60, "finished": ["agent1", "agent5"],
                              "ended": {"agent2": 59, "agent4": 59}}
    assert capped_words(ends.to_json()) == ("too late to re-base: the run ended at the cap 60: "
                                            "agent1, agent5 finished it, agent2 ended at 59, "
                                            "agent4 ended at 59")
    # earlier: nobody reaches the cap, each ends at its own round
    early = Departure(agent=2, round=55, rebase_round=60)
    assert cap_end(reach(range(5), ring(5).neighbours, early), departure=early,
                   cap=60).ends == {0: 56, 1: 55, 3: 55, 4: 56}
    with pytest.raises(ValueError, match="ended at its cap 60 before"):
        cap_end({}, departure=Departure(agent=2, round=60, rebase_round=65), cap=60)
    with pytest.raises(ValueError, match="ended before it"):
        Departure(agent=2, round=60, rebase_round=65, capped=60)
    with pytest.raises(ValueError, match="not both"):
        Departure(agent=2, round=50, rebase_round=55, capped=60, stopped=58)


def test_the_board_decides_a_late_departure_as_the_end_at_the_cap() -> None:
    # agents 1 and 5 finished the cap 60 and said so; agents 2 and 4 wait for agent3 at 59
    board = DepartureBoard(NAMES, iterations=60, graph=ring(5))
    assert not board.finish("agent1", 60, capped=True)
    assert not board.report(report("agent2", 59, "agent3"))
    assert not board.report(report("agent4", 59, "agent3"))
    assert board.finish("agent5", 60, capped=True)  # the last one accounted for decides
    assert board.decided == [Departure(agent=2, round=59, rebase_round=64, capped=60)]
    assert board.new_edges == [] and board.graph == ring(5)  # nobody re-bases, no edge
    # nobody reached the cap: too late to re-base all the same (R = 60 + ... >= 60)
    none = DepartureBoard(NAMES, iterations=60)
    for r in (report("agent2", 55, "agent3"), report("agent4", 55, "agent3"),
              report("agent1", 56), report("agent5", 56)):
        none.report(r)
    assert none.decided == [Departure(agent=2, round=55, rebase_round=60, capped=60)]
    # the reporters' cap when the coordinator knows none (--scale standard)
    theirs = DepartureBoard(NAMES[:3], iterations=0)
    theirs.report(report("agent1", 58, "agent2", last=60))
    assert theirs.report(report("agent3", 58, "agent2", last=60))
    assert theirs.decided[0].capped == 60


def test_the_board_refuses_an_end_at_the_cap_it_cannot_explain() -> None:
    mixed = DepartureBoard(NAMES[:4], iterations=60)
    mixed.finish("agent1", 60, capped=True)
    mixed.finish("agent3", 58)  # on the certificate: the same run cannot do both
    with pytest.raises(Refused, match="some on the certificate and some at the cap"):
        mixed.report(report("agent2", 57, "agent4"))
    apart = DepartureBoard(NAMES, iterations=60)
    apart.finish("agent1", 60, capped=True)
    apart.finish("agent5", 61, capped=True)
    apart.report(report("agent2", 59, "agent3"))
    with pytest.raises(Refused, match="different last rounds"):
        apart.report(report("agent4", 59, "agent3"))


def test_the_coordinator_tells_the_waiting_agents_the_run_ended_at_the_cap() -> None:
    service = assigned_coordinator(RunConfig(agents=5, iterations=60))

    def call(sender: str, round_: int, *silent: str, finished: int = 0) -> Any:
        return service.ReportSilence(coordinator_pb2.SilenceReport(
            run_id="r1", sender=sender, round=round_, silent=silent, epoch=0,
            finished=finished, capped=bool(finished)), FakeContext())

    async def scenario() -> tuple[Any, Any]:
        first = await call("agent1", 60, finished=60)  # answered at once
        held = asyncio.ensure_future(call("agent2", 59, "agent3"))
        await asyncio.sleep(0.05)
        assert not held.done()
        await call("agent5", 60, finished=60)
        fourth = await call("agent4", 59, "agent3")
        return first, await held, fourth

    first, second, fourth = asyncio.run(scenario())
    assert list(first.departed) == [] and second == fourth
    assert [(d.agent, d.round, d.capped, d.stopped) for d in second.departed] \
        == [("agent3", 59, 60, 0)]




def test_the_replay_ends_each_agent_where_the_rule_says_on_the_undeparted_iterates(
        wine5: Path) -> None:
    config = RunConfig(**{**inspect_data_dir(wine5).run_values(), "iterations": 60})  # type: ignore[arg-type]
    problem = build_problem(config, local=load_data_dir(config, wine5, holdout=0.0))
    whole = run_simulation(config, problem=problem, noise_seed=7)
    late = run_simulation(config, problem=problem, noise_seed=7,
                          departures=[parse_leave("agent3@59", agents=5)])
    assert late.departures is not None
    event = late.departures["departures"][0]
    assert {k: event[k] for k in ("capped", "finished", "ended")} == {
        "capped": 60, "finished": ["agent1", "agent5"], "ended": {"agent2": 59, "agent4": 59}}
    # agents 1 and 5 never waited: every message they took is the run's without agent3
    # leaving, so they end with exactly its iterates; agents 2 and 4 stopped a round earlier
    kept = [0, 1, 3, 4]
    for a, i in zip(late.xs, kept, strict=True):
        same = bool((a == whole.xs[i]).all())
        assert same == (i in (0, 4)), i
    assert late.timings["rounds"] == 60 and late.final["round"] == 60
    assert not late.convergence.converged and "ended at the cap 60" in late.convergence.line
    assert late.departures["optimum_of"].startswith("the iterate of agents 1,2,3,4,5's objective "
                                                     "at the rounds they ended (agent3's")
    assert "not the optimum of the remaining parties' objective" in \
        late.departures["optimum_of"]
    assert "agent3 left at round 59 (too late to re-base: the run ended at the cap 60: " \
        "agent1, agent5 finished it" in departures_line(late.departures)
    assert late.departures["remaining_masks_sum_to_zero"]
    # a departure whose re-base round would have come before the cap still re-bases
    rebased = run_simulation(config, problem=problem, noise_seed=7,
                             departures=[parse_leave("agent3@50", agents=5)])
    assert rebased.departures is not None and "capped" not in rebased.departures["departures"][0]
    assert rebased.timings["rounds"] == 60


def test_a_phase_one_report_gives_the_agents_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # as phase II's reports do (SilenceReport.last): the coordinator then judges a re-base by
    # the agents' cap when it knows none itself (--scale standard: 0 from phase I too)
    import agent.departure.phase_one as leave
    from agent.options import AgentFailure

    heard: list[dict[str, Any]] = []

    async def report_silence(channel: Any, **kwargs: Any) -> Any:
        heard.append(kwargs)
        raise AgentFailure("no decision")

    class Peers:
        async def unresponsive(self, names: list[str]) -> list[str]:
            return names

    monkeypatch.setattr(leave, "report_silence", report_silence)
    for iterations, last in ((60, 60), (None, 0)):
        session = type("Session", (), {})()
        session.assignment = type("Assignment", (), {"name": "agent2"})()
        session.config = type("Config", (), {})()
        session.config.iterations = type("Iterations", (), {"count": iterations})()
        departures = leave.PhaseOneDepartures(
            session=session, peers=Peers(), mailbox=None, coordinator=None,  # type: ignore[arg-type]
            deadline=1.0, wait=1.0, deciding=lambda _: None)
        with pytest.raises(AgentFailure, match="no decision"):
            asyncio.run(departures.recover(["agent3"], AgentFailure("agent3 is silent")))
        assert heard[-1]["phase_one"] and heard[-1]["last"] == last
        assert heard[-1]["silent"] == ["agent3"] and heard[-1]["round_"] == 0


def test_a_departure_at_round_0_with_fewer_rounds_than_agents_is_still_refused() -> None:
    # R = n >= the cap: no end at the cap for phase I (nobody has a round to end at)
    board = DepartureBoard(NAMES, iterations=4)
    board.report(Report("agent2", 0, frozenset({"agent3"}), 0, phase_one=True))
    board.report(Report("agent4", 0, frozenset({"agent3"}), 0, phase_one=True))
    board.report(Report("agent1", 0, frozenset(), 0, phase_one=True))
    with pytest.raises(Refused, match="too late to re-base before the last round 4"):
        board.report(Report("agent5", 0, frozenset(), 0, phase_one=True))
