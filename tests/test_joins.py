"""A party that joins a running network, without a network: the public rule
(efpsn/departure/joins.py), the coordinator's decision (coordinator/joins.py, its registry's late
seats) and the simulator's replay (efpsn/departure/replay.py), whose masks sum to zero exactly
every round and whose run ends at the optimum of every member's data."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from agent.departure import silence as silence_module
from agent.departure.reports import JoinNotice
from agent.departure.silence import Silence
from agent.state import StateStore
from coordinator.joins import JoinBoard, JoinRefused
from coordinator.registry import NotExpected, Registry
from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.joins import (
    JOIN_CHECK_EVERY,
    JOIN_EPOCHS,
    Join,
    check_round,
    join_reconfiguration,
    late_for,
    parse_join,
    seed_epoch,
)
from efpsn.departure.membership import Departure
from efpsn.params.config import RunConfig
from efpsn.problem import average, build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.optimum import centralized_optimum
from efpsn.topology import graph_over

# ------------------------------------------------------------------------------ the rule


def test_members_poll_every_check_round_but_the_first_and_the_last() -> None:
    assert [t for t in range(101) if check_round(t, last=100)] == [25, 50, 75]
    assert JOIN_CHECK_EVERY == 25


def test_a_joins_seeds_are_drawn_for_an_epoch_no_departure_uses() -> None:
    assert seed_epoch(1) == JOIN_EPOCHS + 1 and seed_epoch(2) == JOIN_EPOCHS + 2
    with pytest.raises(ValueError, match="numbered from 1"):
        seed_epoch(0)


@pytest.mark.parametrize(("text", "message"), [
    ("agent5", "--join expects agentK@R"), ("agent5@x", "--join expects agentK@R"),
    ("agent9@100", "there is no agent9"), ("agent5@0", "after round 0")])
def test_a_bad_join_is_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_join(text, agents=5)


def test_a_join_reads_and_writes_the_command_lines_agentK_at_R() -> None:
    join = parse_join(" agent1@75 ", agents=5)
    assert join == Join(agent=0, round=75) and join.label() == "agent1@75"
    assert parse_join("agent5@1", agents=5).to_json() == {"agent": "agent5", "round": 1}
    chosen = Join(agent=4, round=50, neighbours=(2, 0, 2))
    assert chosen.neighbours == (0, 2)  # sorted, each once
    assert chosen.to_json() == {"agent": "agent5", "round": 50,
                                "chosen_neighbours": ["agent1", "agent3"]}
    assert not check_round(JOIN_EPOCHS, last=JOIN_EPOCHS)  # the last round polls no more
    assert check_round(JOIN_CHECK_EVERY, last=JOIN_CHECK_EVERY + 1)
    assert JOIN_EPOCHS == 2**20  # far above any departure's epoch: no seed is drawn twice


@pytest.mark.parametrize(("values", "message"), [
    ({"agent": -1, "round": 5}, r"join agent must be an int >= 0, got -1"),
    ({"agent": True, "round": 5}, r"join agent must be an int >= 0, got True"),
    ({"agent": 1, "round": 2.0}, r"join round must be an int >= 0, got 2.0"),
    ({"agent": 1, "round": 0}, (r"^agent2 joins at round 0: a join takes effect at a round of "
                                r"phase II after round 0$")),
    ({"agent": 1, "round": 5, "neighbours": (1,)}, r"^agent2 cannot be its own neighbour$")])
def test_a_join_that_cannot_be_is_refused_by_name(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Join(**values)


def test_chosen_neighbours_must_be_members() -> None:
    before = graph_over("ring", [0, 1, 2, 3], agents=5)
    with pytest.raises(ValueError, match=r"^agent5@9: its chosen neighbours \['agent3'\] are not "
                                         r"members of the run$"):
        join_reconfiguration(before, members=[0, 1, 3],
                             join=Join(agent=4, round=9, neighbours=(2,)), topology="ring")
    with pytest.raises(ValueError, match=r"^agent4 is already a member of the run$"):
        join_reconfiguration(before, members=[0, 1, 2, 3], join=Join(agent=3, round=9),
                             topology="ring")


def test_a_ring_takes_the_newcomer_between_its_first_and_last_members() -> None:
    before = graph_over("ring", [0, 1, 2, 3], agents=5)
    assert before.edges == ((0, 1), (0, 3), (1, 2), (2, 3)) and before.degree(4) == 0
    recon = join_reconfiguration(before, members=[0, 1, 2, 3], join=Join(agent=4, round=100),
                                 topology="ring")
    assert recon.graph.edges == graph_over("ring", range(5), agents=5).edges
    assert recon.dropped_edges == ((0, 3),) and recon.new_edges == ((0, 4), (3, 4))
    assert recon.remaining == (0, 1, 2, 3, 4)
    np.testing.assert_allclose(recon.weights.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="already a member"):
        join_reconfiguration(before, members=[0, 1, 2, 3], join=Join(agent=2, round=100),
                             topology="ring")


def test_chosen_neighbours_add_edges_and_drop_none() -> None:
    before = graph_over("ring", [0, 1, 2, 3], agents=5)
    recon = join_reconfiguration(before, members=[0, 1, 2, 3], topology="ring",
                                 join=Join(agent=4, round=50, neighbours=(1, 2)))
    assert recon.dropped_edges == () and recon.new_edges == ((1, 4), (2, 4))
    with pytest.raises(ValueError, match="not members"):
        join_reconfiguration(before, members=[0, 1, 2], topology="ring",
                             join=Join(agent=4, round=50, neighbours=(3,)))


def test_late_seats_are_checked_with_the_run() -> None:
    config = RunConfig(agents=5)
    assert late_for(["agent5@100", "agent3@200"], config) == "agent3,agent5"
    assert RunConfig(agents=5, late="agent5").starting_members == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="named twice"):
        RunConfig(agents=5, late="agent5,agent5")
    with pytest.raises(ValueError, match="1 of 3 agents would start"):
        RunConfig(agents=3, late="agent1,agent3")
    with pytest.raises(ValueError, match="no part in phase I's column statistics"):
        RunConfig(agents=5, late="agent5", scale="standard", data="local",
                  input_shape="4", classes=2)


# ------------------------------------------------------------------------- the coordinator


def test_a_join_takes_the_next_check_round_nobody_has_polled() -> None:
    board = JoinBoard(members={"agent1", "agent2"})
    board.poll("agent1", 50)
    board.poll("agent2", 75)
    first = board.decide(4, pending_until=None, last=1000)
    assert first == Join(agent=4, round=100)
    recon = join_reconfiguration(graph_over("ring", [0, 1, 2, 3], agents=6),
                                 members=[0, 1, 2, 3], join=first, topology="ring")
    assert board.record(first, "agent5", graph=recon, last=1000) == 1
    assert "agent5" in board.members and board.since(0) == [(1, first, "agent5")]
    # after the join decided before it, and after a departure being re-based
    assert board.decide(5, pending_until=None, last=1000).round == 125
    assert board.decide(5, pending_until=130, last=1000).round == 150


def test_a_join_the_run_cannot_take_is_refused_with_its_reason() -> None:
    board = JoinBoard(members={"agent1"})
    board.poll("agent1", 975)
    with pytest.raises(JoinRefused, match="last round is 1000: a join takes effect at a check "
                                          "round before it"):
        board.decide(4, pending_until=None, last=1000)
    board.poll("agent1", 1000, finished=True)
    with pytest.raises(JoinRefused, match="the run ended at round 1000"):
        board.decide(4, pending_until=None, last=1000)
    with pytest.raises(JoinRefused, match="no member"):
        board.poll("intruder", 25)


def test_a_late_seat_cannot_register_and_the_run_starts_without_it() -> None:
    registry = Registry(RunConfig(agents=3, late="agent3"), run_id="run-1")
    registry.register("agent1", "10.0.0.1:50051")
    assert not registry.complete
    with pytest.raises(ValueError, match="asks to join run run-1, which has not started"):
        registry.seat_of("agent3", "10.0.0.3:50051", _declared(registry))
    with pytest.raises(NotExpected, match="efpsn agent --join"):
        registry.register("agent3", "10.0.0.3:50051")
    registry.register("agent2", "10.0.0.2:50051")
    assert registry.complete
    with pytest.raises(NotExpected, match="not a seat of this run that joins later"):
        registry.seat_of("agent2", "10.0.0.9:50051", _declared(registry))
    with pytest.raises(ValueError, match="already registered by 'agent1'"):
        registry.seat_of("agent3", "10.0.0.1:50051", _declared(registry))
    assert registry.seat_of("agent3", "10.0.0.3:50051", _declared(registry)) == 2
    assert "agent3" not in registry.joined  # checked only: nothing recorded
    assert registry.take_seat("agent3", "10.0.0.3:50051", _declared(registry)) == 2
    assert registry.joined == {"agent3": 2}


def _declared(registry: Registry):
    from coordinator.registry import Declaration

    c = registry.config
    return Declaration(input_shape=c.input_shape, classes=c.classes)


# --------------------------------------------------------------------------- the simulator


@pytest.fixture(scope="module")
def cancer(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("cancer") / "data"
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=out, test_fraction=0)
    config = RunConfig(**{**inspect_data_dir(out).run_values(),  # type: ignore[arg-type]
                          "l2": 0.01, "late": "agent5", "iterations": 1500, "eval_every": 500})
    return config, build_problem(config, local=load_data_dir(config, out, holdout=0.0))


def test_a_replayed_join_ends_at_the_optimum_of_every_member(cancer) -> None:
    config, problem = cancer
    sim = run_simulation(config, noise_seed=3, problem=problem, joins=[Join(agent=4, round=200)])
    record = sim.departures
    assert record is not None and record["remaining_masks_sum_to_zero"]
    assert record["rounds_zero_sum_checked"] == 1300  # every round from the join on
    [join] = record["joins"]
    assert (join["agent"], join["round"], join["neighbours"]) == ("agent5", 200,
                                                                 ["agent1", "agent4"])
    assert record["optimum_of"] == "the optimum of agents 1,2,3,4,5's objective"
    x_star = centralized_optimum(problem.task, problem.shards).x
    assert float((average(sim.xs) - x_star).norm() / x_star.norm()) < 1e-6
    # without the join: the optimum of the four, which the five's is not
    four = run_simulation(config, noise_seed=3, problem=problem)
    x_four = centralized_optimum(problem.task, problem.shards[:4]).x
    assert float((average(four.xs[:4]) - x_four).norm() / x_four.norm()) < 1e-6
    assert float((x_four - x_star).norm() / x_star.norm()) > 1e-2


def test_a_join_is_refused_during_a_departures_rebase_and_after_the_cap(cancer) -> None:
    config, problem = cancer
    with pytest.raises(ValueError, match="a departure is being re-based then"):
        run_simulation(config, noise_seed=3, problem=problem,
                       departures=[Departure(agent=2, round=195, rebase_round=205)],
                       joins=[Join(agent=4, round=200)])
    with pytest.raises(ValueError, match="the run ended at round 1500, before the joins"):
        run_simulation(config, noise_seed=3, problem=problem, joins=[Join(agent=4, round=1500)])


def test_a_member_exchanges_a_new_edges_seeds_at_the_join_round_not_when_it_learns(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # prepare: a member that learns at check round 450 of a join at 475 (another member may
    # learn of it only at 475, and could not get there while this one waited in the exchange)
    notice = JoinNotice(name="agent5", index=4, round=475, address="127.0.0.1:9", number=1,
                        edges=(), cap=2000, ends={})
    polls = {450: [notice], 475: [], 500: []}

    async def poll(_coordinator, *, round_, **_kw):
        return polls[round_]

    monkeypatch.setattr(silence_module, "poll_membership", poll)
    saved: list[int] = []
    departures = SimpleNamespace(
        session=SimpleNamespace(assignment=SimpleNamespace(name="agent4"),
                                config=SimpleNamespace(round_timeout_seconds=1.0)),
        known_joins=0, learn_join=lambda n, driver: {n.name: n.index},
        save=lambda store: saved.append(1))
    silence = Silence(departures=departures, coordinator=None, mailbox=None,  # type: ignore[arg-type]
                      store=StateStore(tmp_path), timeout=1.0, edges=None,  # type: ignore[arg-type]
                      deciding=lambda awaited: None)
    exchanged: list[tuple[int, dict[str, int]]] = []
    current = {"t": 0}

    async def new_edges(partners, *, epoch=None):
        exchanged.append((current["t"], partners))

    silence._new_edges = new_edges  # type: ignore[method-assign]

    async def step(t: int, **kw) -> None:
        current["t"] = t
        await silence.learn_joins(t, driver=None, **kw)  # type: ignore[arg-type]

    # execute / assert: learned at 450, exchanged (and saved) only before stepping 475, once
    asyncio.run(step(450))
    assert (exchanged, saved) == ([], [])
    asyncio.run(step(475))
    assert (exchanged, saved) == ([(475, {"agent5": 4})], [1])
    asyncio.run(step(500))
    assert len(exchanged) == 1
    # a member that ends before the join's round exchanges at once (the newcomer waits for it)
    polls[450] = [JoinNotice(name="agent6", index=5, round=475, address="127.0.0.1:8",
                             number=2, edges=(), cap=2000, ends={})]
    asyncio.run(step(450, finished=True))
    assert exchanged[-1] == (450, {"agent6": 5})
