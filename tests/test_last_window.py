"""A departure in the stop rule's last window (efpsn/departure/last_window.py): the round each agent
waits at without the departed agent, who finishes the stop round and who ends at the check round;
the driver that keeps its check round's state; the coordinator's decision (the run had
stopped) through its board and its servicer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from fake_context import FakeContext, assigned_coordinator

from coordinator.departures import DepartureBoard, Refused, Report
from efpsn.departure.last_window import LastWindow, last_window, reach
from efpsn.departure.membership import Departure
from efpsn.params.config import RunConfig
from efpsn.topology import path, ring
from efpsn.wire.v1 import coordinator_pb2

NAMES = [f"agent{i}" for i in range(1, 6)]


def test_reach_is_the_distance_from_the_departed_agents_neighbours() -> None:
    # a 5-ring without agent3 (index 2) from round 101: its neighbours wait at 101, the two
    # agents two hops away at 102
    five = ring(5)
    assert reach(range(5), five.neighbours, Departure(agent=2, round=101, rebase_round=106)) \
        == {0: 102, 1: 101, 3: 101, 4: 102}
    # a neighbour that got its round-101 message (late) steps it: it waits at 102, and so
    # does agent5 behind it; agent1 is two hops from agent2 (101) and from agent4 (102)
    late = Departure(agent=2, round=101, rebase_round=106, late=(3,))
    assert reach(range(5), five.neighbours, late) == {0: 102, 1: 101, 3: 102, 4: 103}
    # the end of a path: each hop one round later
    line = path(5)
    assert reach(range(5), line.neighbours, Departure(agent=0, round=50, rebase_round=55)) \
        == {1: 50, 2: 51, 3: 52, 4: 53}
    # the middle of a path cut in two
    assert reach(range(5), line.neighbours, Departure(agent=2, round=50, rebase_round=55)) \
        == {0: 51, 1: 50, 3: 50, 4: 51}
    # only the agents still in count (agent5 left before: agent4 is an end)
    assert reach([0, 1, 2, 3], line.neighbours, Departure(agent=0, round=50, rebase_round=55)) \
        == {1: 50, 2: 51, 3: 52}


def test_who_finishes_the_window_and_who_ends_at_its_check() -> None:
    d = Departure(agent=0, round=52, rebase_round=57)
    reached = {1: 52, 2: 53, 3: 54, 4: 55}
    # check at 50, diameter 4: the stop round 54 is reached by agents 4 and 5
    window = last_window(reached, departure=d, check_round=50, hops=4, bound=1e-4)
    assert window == LastWindow(departure=d, check_round=50, stop_round=54, finished=(3, 4),
                                at_check=(1, 2), bound=1e-4)
    assert [window.ended_at(i) for i in (1, 2, 3, 4)] == [50, 50, 54, 54]
    assert window.to_json() == {"stopped": 54, "check_round": 50,
                                "finished": ["agent4", "agent5"],
                                "at_check": ["agent2", "agent3"]}
    cert = window.certificate()
    assert cert.converged and cert.bound == 1e-4 and "at round 50" in cert.line
    # nobody reaches the stop round: no last window, the departure re-bases as any other
    assert last_window({1: 50, 2: 51}, departure=d, check_round=50, hops=4, bound=1e-4) is None
    with pytest.raises(ValueError, match="needs s < S"):
        LastWindow(departure=d, check_round=54, stop_round=54, finished=(1,), at_check=(),
                   bound=0.0)


def test_a_departure_record_says_the_run_had_stopped() -> None:
    d = Departure(agent=2, round=101, rebase_round=106, stopped=102)
    assert d.to_json()["stopped"] == 102 and "stopped" not in Departure(
        agent=2, round=101, rebase_round=106).to_json()
    with pytest.raises(ValueError, match="had ended before it"):
        Departure(agent=2, round=102, rebase_round=107, stopped=102)


def test_the_driver_ends_with_its_check_rounds_state() -> None:
    from efpsn.algorithms import make_algorithm
    from efpsn.algorithms.base import StepContext
    from efpsn.optimize.driver import RoundDriver
    from efpsn.optimize.stopping import StopRule
    from efpsn.params.schedules import make_schedule
    from efpsn.problem import build_problem
    from efpsn.simulator import make_mask_providers

    config = RunConfig(l2=10.0, eval_every=50, refresh="never", key_bits=512).resolved()
    problem = build_problem(config)
    rule = StopRule.for_run(config, problem.weights)
    schedule = make_schedule(config.schedule, iterations=config.iterations.total)
    driver = RoundDriver(
        algorithm=make_algorithm(config.algorithm, momentum=config.momentum.value),
        context=StepContext(agent=0, weights={0: 0.5, 1: 0.5}, lr=schedule(0),
                            oracle=problem.objective(0, make_mask_providers(problem)[0])),
        schedule=schedule, iterations=config.iterations.total, eval_every=50,
        x0=problem.initial_params(), stop=rule)
    with pytest.raises(ValueError, match="holds the state of check round None"):
        driver.end_at_check(rule.period)
    while driver.t < rule.period:  # with a mirror image of itself, up to the first check
        driver.step({1: dict(driver.outbox)})
    snapshot = {k: v.clone() for k, v in driver.state.tensors.items()}
    driver.step({1: dict(driver.outbox)})
    assert driver.t == rule.period + 1 and not torch.equal(driver.state["x"], snapshot["x"])
    with pytest.raises(ValueError, match=f"check round {rule.period} only"):
        driver.end_at_check(rule.period + rule.period)
    driver.end_at_check(rule.period)
    assert driver.t == rule.period and driver.done and driver.stopped_early
    assert all(torch.equal(driver.state[k], snapshot[k]) for k in snapshot)
    assert driver.sharing is None and set(driver.outbox) == set(driver.algorithm.message_keys)


def test_a_driver_restarted_inside_the_window_still_ends_with_its_check_state(tmp_path) -> None:
    # a checkpoint inside the window (agent/state.py: raw float64 arrays, no pickle) holds the
    # check round's state, so an agent restarted there can still end at the check round
    from agent.state import StateStore
    from efpsn.algorithms import make_algorithm
    from efpsn.algorithms.base import AgentState, StepContext
    from efpsn.optimize.driver import RoundDriver, checkpoint_shapes
    from efpsn.optimize.stopping import StopRule
    from efpsn.params.schedules import make_schedule
    from efpsn.problem import build_problem
    from efpsn.simulator import make_mask_providers

    config = RunConfig(l2=10.0, eval_every=50, refresh="never", key_bits=512).resolved()
    problem = build_problem(config)
    rule = StopRule.for_run(config, problem.weights)
    schedule = make_schedule(config.schedule, iterations=config.iterations.total)
    algorithm = make_algorithm(config.algorithm, momentum=config.momentum.value)
    oracle = problem.objective(0, make_mask_providers(problem)[0])

    def driver(**start: Any) -> RoundDriver:
        return RoundDriver(algorithm=algorithm, schedule=schedule, stop=rule,
                           context=StepContext(agent=0, weights={0: 0.5, 1: 0.5},
                                               lr=schedule(0), oracle=oracle),
                           iterations=config.iterations.total, eval_every=50, **start)

    store = StateStore(tmp_path)
    shapes = checkpoint_shapes(algorithm.state_keys, tuple(problem.initial_params().shape),
                               stop=True)

    def restarted(first: RoundDriver) -> RoundDriver:
        store.save_checkpoint(run_id="r", round_=first.t, tensors=first.checkpoint_tensors(),
                              history=[])
        saved = store.load_checkpoint(run_id="r", expected=shapes)
        assert saved is not None and saved.round == first.t
        return driver(resume_from=AgentState(t=saved.round, tensors=saved.tensors))

    first = driver(x0=problem.initial_params())
    while first.t < rule.period - 1:  # before the first check: nothing held, nothing restored
        first.step({1: dict(first.outbox)})
    assert set(first.checkpoint_tensors()) == set(shapes)
    assert restarted(first).check is None
    first.step({1: dict(first.outbox)})  # the check round
    snapshot = {k: v.clone() for k, v in first.state.tensors.items()}
    first.step({1: dict(first.outbox)})  # inside its window
    again = restarted(first)
    assert again.t == rule.period + 1 and again.sharing == first.sharing
    again.end_at_check(rule.period)
    assert again.t == rule.period and again.done and again.stopped_early
    assert all(torch.equal(again.state[k], snapshot[k]) for k in snapshot)


def report(sender: str, round_: int, *silent: str, epoch: int = 0) -> Report:
    return Report(sender, round_, frozenset(silent), epoch)


def test_the_board_decides_a_departure_after_a_stop_as_the_stop() -> None:
    # a 5-ring stopped at 102 (check 100): agent3 silent from 101; agents 1 and 5 finished
    board = DepartureBoard(NAMES, iterations=300, graph=path(5))
    assert not board.finish("agent1", 102)
    assert not board.report(report("agent2", 101, "agent3"))
    assert not board.report(report("agent4", 101, "agent3"))
    assert board.finish("agent5", 102)  # the last one accounted for
    assert board.decided == [Departure(agent=2, round=101, rebase_round=106, stopped=102)]
    assert board.gone == {"agent3"} and board.epoch == 1
    # no new edge for a run that is over (on a path agent3's departure would cut it), and the
    # cap check of a re-base does not apply (106 is past no cap here, but nothing re-bases)
    assert board.new_edges == [] and board.joining("agent2", 0) == []


def test_the_board_refuses_a_stop_it_cannot_explain() -> None:
    # finished agents that disagree on the stop round
    board = DepartureBoard(NAMES, iterations=300)
    board.finish("agent1", 102)
    board.finish("agent5", 105)
    board.report(report("agent2", 101, "agent3"))
    with pytest.raises(Refused, match="different stop rounds"):
        board.report(report("agent4", 101, "agent3"))
    # an agent waiting at or after the stop round cannot be behind a departure before it
    late = DepartureBoard(NAMES, iterations=300)
    late.finish("agent1", 102)
    late.finish("agent5", 102)
    late.report(report("agent2", 102, "agent3"))
    with pytest.raises(Refused, match="waits at round 102"):
        late.report(report("agent4", 102, "agent3"))
    # a finished agent named silent is not declared gone (it sent all its rounds)
    named = DepartureBoard(NAMES[:3], iterations=300)
    named.finish("agent1", 50)
    assert not named.report(report("agent2", 49, "agent1"))
    # a party declared gone cannot report that it finished
    gone = DepartureBoard(NAMES[:3], iterations=300)
    gone.report(report("agent1", 10, "agent2"))
    gone.report(report("agent3", 10, "agent2"))
    with pytest.raises(Refused, match="declared gone"):
        gone.finish("agent2", 20)


def test_the_coordinator_answers_a_finished_agent_at_once_and_the_stuck_with_the_stop() -> None:
    # a 5-ring stopped at 102 (check 100): agents 1 and 5 finished there, agent3 left at 101,
    # agents 2 and 4 wait for it at 101
    service = assigned_coordinator(RunConfig(agents=5, iterations=300))

    def call(sender: str, round_: int, *silent: str, finished: int = 0) -> Any:
        return service.ReportSilence(coordinator_pb2.SilenceReport(
            run_id="r1", sender=sender, round=round_, silent=silent, epoch=0,
            finished=finished), FakeContext())

    async def scenario() -> tuple[Any, ...]:
        first = await call("agent1", 102, finished=102)  # answered at once
        held = asyncio.ensure_future(call("agent2", 101, "agent3"))
        await asyncio.sleep(0.05)
        assert not held.done()  # agents 4 and 5 are not accounted for yet
        await call("agent5", 102, finished=102)
        fourth = await call("agent4", 101, "agent3")
        return first, await held, fourth

    first, second, fourth = asyncio.run(scenario())
    assert first.epoch == 0 and list(first.departed) == []
    assert second == fourth and second.epoch == 1 and list(second.joining) == []
    assert [(d.agent, d.round, d.stopped) for d in second.departed] == [("agent3", 101, 102)]


def test_the_board_judges_a_rebase_by_the_reporters_cap_when_it_knows_none() -> None:
    # --scale standard: the coordinator cannot compute the cap (its L2 weight is the agents'),
    # 0; the reporters give theirs (a second departure after the original cap, say)
    board = DepartureBoard(NAMES[:3], iterations=0)
    board.report(Report("agent1", 1500, frozenset({"agent2"}), 0, last=2225))
    assert board.report(Report("agent3", 1500, frozenset({"agent2"}), 0, last=2225))
    assert board.decided == [Departure(agent=1, round=1500, rebase_round=1503)]
    # a re-base past the cap the reporters give is too late: the run ends at that cap
    late = DepartureBoard(NAMES[:3], iterations=0)
    late.report(Report("agent1", 1500, frozenset({"agent2"}), 0, last=1502))
    assert late.report(Report("agent3", 1500, frozenset({"agent2"}), 0, last=1502))
    assert late.decided == [Departure(agent=1, round=1500, rebase_round=1503, capped=1502)]
    # the coordinator's own extended cap counts when it is the larger (an agent extends its
    # cap only at the re-base round)
    known = DepartureBoard(NAMES[:3], iterations=2225)
    known.report(Report("agent1", 1500, frozenset({"agent2"}), 0, last=1354))
    assert known.report(Report("agent3", 1500, frozenset({"agent2"}), 0, last=1354))


def test_a_scale_standard_coordinator_decides_a_departure_with_the_agents_cap() -> None:
    # its config is not resolved (the L2 weight comes from the agents' secure sum), so it knows
    # no cap and cannot extend one: the reporters' caps decide
    service = assigned_coordinator(RunConfig(agents=3, scale="standard", input_shape="4", classes=2,
                                  data="local"))

    def call(sender: str) -> Any:
        return service.ReportSilence(coordinator_pb2.SilenceReport(
            run_id="r1", sender=sender, round=40, silent=["agent2"], epoch=0, last=900),
            FakeContext())

    async def scenario() -> Any:
        held = asyncio.ensure_future(call("agent1"))
        await asyncio.sleep(0.05)
        await call("agent3")
        return await held

    decision = asyncio.run(scenario())
    assert [(d.agent, d.round, d.rebase_round) for d in decision.departed] == [("agent2", 40, 43)]
