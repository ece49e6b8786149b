"""A party that leaves in phase I itself, without I/O: its neighbours finish phase I without it
(SeedExchange.drop, Masker.drop), drawing its seeds / shares as if it were there, so every
other edge's integers are the simulator's (exchange_seeds_fast, draw_pair_shares) with its
edges dropped; the coordinator decides it as a departure at round 0 marked phase I; and the
coordinator's cap follows the re-bases, so a second departure after the first cap is
decided (coordinator/departures.py); a restarted neighbour reloads its seeds without that
edge (agent/resume.py)."""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

import pytest

from agent.departure import records
from agent.departure.fixed_terms import EdgeTerms
from agent.departure.phase_one import PhaseOneDepartures
from agent.departure.silence import Silence
from agent.departure.subsystem import Departures
from agent.options import AgentFailure, AgentOptions
from agent.phases.phase_one import PhaseOne
from agent.state import StateStore
from coordinator.departures import DepartureBoard, Refused, Report
from coordinator.registry import Registry
from coordinator.service import CoordinatorService
from efpsn.crypto import paillier
from efpsn.departure.membership import Departure, parse_leave, reconfigure
from efpsn.departure.remask import draw_pair_shares, drop_seeds, sums_to_zero
from efpsn.masks.refresh import FixedMask
from efpsn.masks.seeds import SeedExchange, exchange_seeds_fast
from efpsn.masks.zero_sum import Masker, MaskingStateError, NoiseSpec, noise_generator
from efpsn.optimize.stopping import StopRule
from efpsn.params.config import RunConfig
from efpsn.topology import path, ring

SPEC = NoiseSpec(gamma=1e3, p=1.5, precision=6, num_coefficients=5)
SEED = 11
NAMES = [f"agent{i}" for i in range(1, 6)]
GONE = 2  # agent3 of a 5-path: neighbours 1 and 3 (0-based)


@cache
def keys() -> tuple[tuple[paillier.PublicKey, paillier.PrivateKey], ...]:
    return tuple(paillier.generate_keypair(512, allow_insecure=True) for _ in range(5))


@pytest.mark.parametrize("when", ["before keys", "after keys"])
def test_seeds_without_a_neighbour_gone_in_phase_one_are_the_replays(when: str) -> None:
    # prepare: agent3 sends nothing (before keys) or only its key (after keys: its neighbours
    # encrypted a seed for it already)
    graph = path(5)
    live = [i for i in range(5) if i != GONE]
    agents = {i: SeedExchange(agent=i, neighbours=graph.neighbours(i), keypair=keys()[i],
                              rng=noise_generator(SEED, i), allow_insecure=True) for i in live}
    public = {i: keys()[i][0] for i in range(5)}  # agent3's key too, when it came
    # execute
    for i, agent in agents.items():
        if when == "before keys":
            agent.drop([GONE])
            sent = agent.outgoing({j: public[j] for j in live})
            assert GONE not in sent
        else:
            assert GONE in agent.outgoing(public) or GONE not in graph.neighbours(i)
            agent.drop([GONE])
    sent = {i: agent.outgoing({j: public[j] for j in range(5)}) for i, agent in agents.items()}
    seeds = {i: agent.finish({j: sent[j][i] for j in graph.neighbours(i) if j != GONE})
             for i, agent in agents.items()}
    # assert: the replay's seeds (every agent drawn as if agent3 were there), agent3 dropped
    fast = exchange_seeds_fast(graph, noise_seed=SEED)
    for i in live:
        assert seeds[i] == drop_seeds(fast[i], [GONE])
    with pytest.raises(MaskingStateError):
        agents[1].drop([0])  # after finish: too late


@pytest.mark.parametrize("when", ["before keys", "after keys"])
def test_fixed_mask_without_a_neighbour_gone_in_phase_one_is_pair_shares_without(
        when: str) -> None:
    graph = path(5)
    live = [i for i in range(5) if i != GONE]
    maskers = {i: Masker(agent=i, neighbours=graph.neighbours(i), spec=SPEC,
                         rng=noise_generator(SEED, i), layout=None, keypair=keys()[i],
                         allow_insecure=True) for i in live}
    public = {i: keys()[i][0] for i in range(5)}
    for m in maskers.values():
        if when == "before keys":
            m.drop([GONE])
        m.outgoing(public)
        m.drop([GONE])  # twice (before keys) is harmless
    sent = {i: m.outgoing(public) for i, m in maskers.items()}
    masks = {i: FixedMask(m.finish({j: sent[j][i] for j in m.neighbours}))
             for i, m in maskers.items()}
    shares = draw_pair_shares(graph, SPEC, noise_seed=SEED)
    n = SPEC.num_coefficients
    for i in live:
        assert masks[i].mask.numerators == shares[i].without({GONE}).numerators(n)
    for i in (1, 3):  # its neighbours' drop at round 0 (agent/departure/silence.py): nothing more
        assert EdgeTerms(maskers[i]).dropped(masks[i], [GONE]).mask == masks[i].mask
    assert sums_to_zero(masks.values(), 0)
    assert maskers[1].departed == {GONE} and maskers[0].departed == frozenset()


def report(sender: str, *silent: str, round_: int = 0, phase_one: bool = False,
           epoch: int = 0) -> Report:
    return Report(sender, round_, frozenset(silent), epoch, phase_one)


def test_a_departure_in_phase_one_is_one_at_round_0_marked_phase_one() -> None:
    # agent3 of a 5-path died before sending its shares: agents 2 and 4 miss it in phase I,
    # agents 1 and 5 wait there for them (they answer: not named)
    board = DepartureBoard(NAMES, iterations=60, graph=path(5))
    assert not board.report(report("agent2", "agent3", phase_one=True))
    assert not board.report(report("agent1", phase_one=True))
    assert not board.report(report("agent5", phase_one=True))
    assert board.report(report("agent4", "agent3", phase_one=True))
    assert board.decided == [Departure(agent=2, round=0, rebase_round=5, phase_one=True)]
    assert board.decided[0].to_json()["phase_one"] is True
    assert board.joining("agent1", 0) == [3]
    # a neighbour that finished phase I with it (it died while sending its shares) reports
    # from round 0 of phase II: the same departure, still marked (one neighbour never got its
    # shares), with that neighbour late: its round-0 message held agent3's terms
    mixed = DepartureBoard(NAMES, iterations=60)
    for r in (report("agent2", "agent3"), report("agent4", "agent3", phase_one=True),
              report("agent1", round_=1), report("agent5", phase_one=True)):
        mixed.report(r)
    assert mixed.decided == [Departure(agent=2, round=0, rebase_round=5, late=(1,),
                                       phase_one=True)]
    assert mixed.decided[0].label() == "agent3@I:5+agent2"
    assert parse_leave("agent3@I:5+agent2", agents=5) == mixed.decided[0]
    with pytest.raises(ValueError, match="re-based after round 0"):
        Departure(agent=2, round=0, rebase_round=0, late=(1,), phase_one=True)
    with pytest.raises(Refused, match="from phase I at round 3"):
        DepartureBoard(NAMES, iterations=60).report(report("agent1", round_=3, phase_one=True))
    with pytest.raises(ValueError, match="left in phase I"):
        Departure(agent=2, round=4, rebase_round=9, phase_one=True)


def test_a_second_departure_after_the_original_cap_is_decided() -> None:
    # prepare: the cap is 100; the first re-base (at 56) extends it to 56 + 80 (as the agents'
    # StopRule.rebased does), so agent1 leaving at 120 can re-base at 125
    calls = []

    def extend(recon, origin: int, cap: int) -> int:
        calls.append((sorted(recon.remaining), origin, cap))
        return max(cap, origin + 80)

    board = DepartureBoard(NAMES, iterations=100, graph=path(5), extend=extend)
    for r in (report("agent4", "agent5", round_=51),
              report("agent3", round_=52), report("agent2", round_=52),
              report("agent1", round_=53)):
        board.report(r)
    assert board.decided[0] == Departure(agent=4, round=51, rebase_round=56)
    assert calls == [([0, 1, 2, 3], 56, 100)] and board.iterations == 136
    for r in (report("agent2", "agent1", round_=120, epoch=1),
              report("agent3", round_=121, epoch=1), report("agent4", round_=121, epoch=1)):
        board.report(r)
    assert board.decided[1] == Departure(agent=0, round=120, rebase_round=125)
    # without `extend` (the old board) the same second report is refused
    old = DepartureBoard(NAMES, iterations=100)
    for r in (report("agent4", "agent5", round_=51),
              report("agent3", round_=52), report("agent2", round_=52),
              report("agent1", round_=53)):
        old.report(r)
    old.report(report("agent2", "agent1", round_=120, epoch=1))  # too late: past its cap
    old.report(report("agent3", round_=121, epoch=1))
    with pytest.raises(Refused, match="waits at round 121, but the run's last round is 100"):
        old.report(report("agent4", round_=121, epoch=1))


def test_a_restart_reloads_seeds_without_a_neighbour_gone_in_phase_one(tmp_path) -> None:
    # prepare: agent2 of a 5-path finished phase I without agent3 (its seeds lack that edge)
    store = StateStore(tmp_path)
    seeds = drop_seeds(exchange_seeds_fast(path(5), noise_seed=SEED)[1], [GONE])
    store.save_seeds(seeds.to_json(), run_id="r", stats={})
    session = SimpleNamespace(problem=SimpleNamespace(N=5), run_id="r", index=1,
                              config=SimpleNamespace(refresh=SimpleNamespace(refreshed=True)),
                              names={0: "agent1", 2: "agent3"})

    def record(phase_one: bool) -> None:
        records.save(store, run_id="r", epoch=1, events=[], names={2: "agent3"},
                     decided=[Departure(agent=GONE, round=0, rebase_round=5,
                                        phase_one=phase_one)], joining={}, seeds={})

    departures = Departures(options=AgentOptions(name="agent2", listen="127.0.0.1:0",
                                                 coordinator="127.0.0.1:1"),
                            peers=None, mailbox=None, store=store)  # type: ignore[arg-type]
    phase_one = PhaseOne(name="agent2", peers=None, mailbox=None, store=store)  # type: ignore[arg-type]

    def reload() -> object:
        return phase_one.reload(session, left=departures.left_in_phase_one)[0]  # type: ignore[arg-type]

    # execute / assert: without the decision saved, the missing edge is an error
    with pytest.raises(AgentFailure, match="cannot resume: edge seeds are for neighbours"):
        reload()
    record(phase_one=False)  # a departure at round 0: it finished phase I with agent2
    with pytest.raises(AgentFailure, match="cannot resume: edge seeds are for neighbours"):
        reload()
    record(phase_one=True)
    assert reload() == seeds
    assert records.load(store, run_id="r")["decided"][0].phase_one


def test_a_restart_before_phase_two_adopted_a_phase_one_departure_adopts_it_again(
        tmp_path) -> None:
    # prepare: agent2 of a 5-path saved agent3@I:5 before its phase I result (adopted false)
    left = SimpleNamespace(session=SimpleNamespace(run_id="r", joining={}), epoch=1,
                           decided=[Departure(agent=GONE, round=0, rebase_round=5,
                                              phase_one=True)], names={GONE: "agent3"},
                           joining={})
    PhaseOneDepartures.save(left, StateStore(tmp_path))  # type: ignore[arg-type]
    dropped: list[str] = []
    session = SimpleNamespace(run_id="r", assignment=SimpleNamespace(name="agent2"),
                              neighbour_names={"agent1", "agent3"},
                              drop=lambda name, reason: dropped.append(name))
    silence = Silence(departures=SimpleNamespace(session=session, terms=None, masks=None),
                      coordinator=None, mailbox=None, store=StateStore(tmp_path),
                      timeout=1.0, edges=None,  # type: ignore[arg-type]
                      deciding=lambda awaited: None)
    # execute: the restart's resume finds the decision not adopted
    decision = silence.resume(driver=None)  # type: ignore[arg-type]
    # assert: returned to adopt again, agent3 out of the session as phase I had it
    assert decision is not None and decision.decided == left.decided
    assert (decision.epoch, decision.joining, dropped) == (1, {}, ["agent3"])
    assert records.load(StateStore(tmp_path), run_id="r")["adopted"] is False
    # an end of a new edge adopts it again, its new neighbour with it: the edge's exchange
    # then resumes from what it saved (agent/departure/exchange_file.py), or starts if nothing was
    left.joining = {"agent4": (3, "127.0.0.1:9")}
    left.session.joining = {"agent4": (3, "127.0.0.1:9", 5)}
    PhaseOneDepartures.save(left, StateStore(tmp_path))  # type: ignore[arg-type]
    again = silence.resume(driver=None)  # type: ignore[arg-type]
    assert again is not None and again.joining == {"agent4": (3, "127.0.0.1:9")}


def test_the_coordinators_cap_is_the_one_the_agents_extend_to() -> None:
    # prepare: a default run (the stop rule on, cap 1354) on a 5-ring, assigned
    config = RunConfig(agents=5, task="logreg", data="local", input_shape="30", classes=2,
                       l2=0.01).resolved()
    registry = Registry(config, run_id="r1")
    for i, name in enumerate(NAMES):
        registry.register(name, f"127.0.0.1:{5001 + i}")
    service = CoordinatorService(registry, register_timeout=5.0)
    recon = reconfigure(ring(5), {2})
    # execute: what the board's `extend` gives for agent3 gone with the re-base at 1300
    cap = service._extended_cap(recon, 1300, config.iterations.total)
    # assert: what every agent and the replay take at the re-base (StopRule.rebased)
    assert cap == StopRule.rebased(config, recon.remaining_weights(), origin=1300, until=None,
                                   cap=config.iterations.total).cap
    assert cap > config.iterations.total  # so a later departure past 1354 can be decided
