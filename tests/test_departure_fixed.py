"""The paper's fixed mask across a departure at one agent (agent/departure/fixed_terms.py), in
process:
phase I's Maskers over real Paillier (packed and not), then a neighbour's terms decrypted alone
(Masker.edge_terms) and dropped, and a new edge's Masker added: the same integers as the
simulator's PairShares (efpsn/departure/remask.py), so the remaining masks sum to zero."""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

import pytest

from agent.departure import records
from agent.departure.fixed_terms import EdgeTerms, save_phase_one
from agent.departure.silence import Silence
from agent.state import StateStore
from efpsn.crypto import paillier
from efpsn.crypto.encoding import SlotLayout
from efpsn.departure.membership import Departure
from efpsn.departure.remask import draw_pair_shares, new_edge_shares, rejoin_generator, sums_to_zero
from efpsn.masks.refresh import FixedMask
from efpsn.masks.zero_sum import Masker, MaskingStateError, NoiseSpec, noise_generator
from efpsn.topology import Graph, path

SPEC = NoiseSpec(gamma=1e3, p=1.5, precision=6, num_coefficients=7)
SEED = 4


@cache
def keys(bits: int = 512) -> tuple[tuple[paillier.PublicKey, paillier.PrivateKey], ...]:
    return tuple(paillier.generate_keypair(bits, allow_insecure=True) for _ in range(6))


def _phase_one(graph: Graph, layout: SlotLayout | None, rngs: dict[int, object],
               agents: list[int], key_offset: int = 0,
               ) -> tuple[dict[int, Masker], dict[int, FixedMask]]:
    maskers = {i: Masker(agent=i, neighbours=graph.neighbours(i), spec=SPEC, rng=rngs[i],
                         layout=layout, keypair=keys()[i + key_offset], allow_insecure=True)
               for i in agents}
    public = {i: m.public_key for i, m in maskers.items()}
    sent = {i: m.outgoing(public) for i, m in maskers.items()}
    masks = {i: FixedMask(m.finish({j: sent[j][i] for j in graph.neighbours(i)}))
             for i, m in maskers.items()}
    return maskers, masks


@pytest.mark.parametrize("packed", [True, False])
def test_a_departed_neighbours_terms_are_dropped_as_the_simulator_drops_them(packed) -> None:
    graph = path(5)  # agent3 (index 2) leaves: the path falls in two, joined by 0-3
    layout = SlotLayout.plan(precision=6, gamma=1e3, max_terms=2, key_bits=512) if packed else None
    maskers, masks = _phase_one(graph, layout, {i: noise_generator(SEED, i) for i in range(5)},
                                list(range(5)))
    shares = draw_pair_shares(graph, SPEC, noise_seed=SEED)
    n = SPEC.num_coefficients
    for i in range(5):
        assert masks[i].mask.numerators == shares[i].numerators(n)
    # agent 1's terms with agent 2, decrypted alone: exactly what it drew and received
    assert maskers[1].edge_terms(2) == (shares[1].sent[2], shares[1].received[2])
    terms = {i: EdgeTerms(maskers[i]) for i in range(5)}
    left = {i: terms[i].dropped(masks[i], [2]) if i in (1, 3) else masks[i] for i in (0, 1, 3, 4)}
    for i in (1, 3):
        assert left[i].mask.numerators == shares[i].without({2}).numerators(n)
    assert sums_to_zero(left.values(), 0)
    # the new edge 0-3: the paper's phase I on it alone, drawn as new_edge_shares draws it
    new = Graph(5, ((0, 3),))
    edge, _ = _phase_one(new, layout, {i: rejoin_generator(SEED, i, 1) for i in (0, 3)}, [0, 3],
                      key_offset=1)
    fresh = new_edge_shares(((0, 3),), SPEC, noise_seed=SEED, epoch=1)
    for i in (0, 3):
        terms[i].add(edge[i])
        left[i] = terms[i].joined(left[i], [3 - i])
        assert left[i].mask.numerators == shares[i].without({2}).plus(fresh[i]).numerators(n)
    assert sums_to_zero(left.values(), 0)
    # agent 0 can drop its new neighbour later too (its newest Masker holds the edge)
    assert terms[0].dropped(left[0], [3]).mask.numerators == shares[0].without({2}).numerators(n)


def test_terms_need_a_finished_phase_one_and_a_neighbour() -> None:
    graph = path(3)
    masker = Masker(agent=1, neighbours=graph.neighbours(1), spec=SPEC,
                    rng=noise_generator(SEED, 1), layout=None, keypair=keys()[1],
                    allow_insecure=True)
    with pytest.raises(MaskingStateError, match="finish"):
        masker.edge_terms(0)
    maskers, _ = _phase_one(graph, None, {i: noise_generator(SEED, i) for i in range(3)},
                            [0, 1, 2])
    with pytest.raises(ValueError, match="no edge with 0"):
        maskers[2].edge_terms(0)
    assert not EdgeTerms(None).available  # a restarted agent: refused with the reason
    with pytest.raises(ValueError, match="shares no mask terms"):
        EdgeTerms(maskers[2])._terms(0)


def test_the_terms_saved_for_a_restart_drop_and_join_as_the_maskers_do(tmp_path) -> None:
    """agent 1 of a 5-path applies agent 2's departure and saves its terms; after a restart
    (no Masker), the reloaded terms drop and join the same integers, and the file is private,
    holds only ints, and is refused when it does not belong to the saved mask."""
    graph = path(5)
    maskers, masks = _phase_one(graph, None, {i: noise_generator(SEED, i) for i in range(5)},
                                list(range(5)))
    live = EdgeTerms(maskers[3])
    edge, _ = _phase_one(Graph(5, ((0, 3),)), None,
                         {i: rejoin_generator(SEED, i, 1) for i in (0, 3)}, [0, 3], key_offset=1)
    live.add(edge[3])
    live.save(StateStore(tmp_path), run_id="r1")
    path_ = tmp_path / "edge_terms.json"
    assert path_.stat().st_mode & 0o777 == 0o600
    text = path_.read_text()
    assert paillier.fingerprint(maskers[3].public_key).hex() in text
    restarted = EdgeTerms(None)
    assert not restarted.available
    restarted.restore(StateStore(tmp_path), run_id="r1", mask=masks[3])
    assert restarted.available
    for gone, new in (([2], [0]), ([2, 4], [0])):
        expected = live.joined(live.dropped(masks[3], gone), new).mask.numerators
        got = restarted.joined(restarted.dropped(masks[3], gone), new).mask.numerators
        assert got == expected != masks[3].mask.numerators
    with pytest.raises(ValueError, match="belongs to run .r1., not .r2."):
        EdgeTerms(None).restore(StateStore(tmp_path), run_id="r2", mask=masks[3])
    with pytest.raises(ValueError, match="do not add up to the saved mask"):
        EdgeTerms(None).restore(StateStore(tmp_path), run_id="r1", mask=masks[1])
    path_.write_text(text.replace('"terms"', '"trems"'))
    with pytest.raises(ValueError, match="damaged"):
        EdgeTerms(None).restore(StateStore(tmp_path), run_id="r1", mask=masks[3])
    path_.unlink()
    with pytest.raises(ValueError, match="no per-edge terms"):
        EdgeTerms(None).restore(StateStore(tmp_path), run_id="r1", mask=masks[3])


def test_a_neighbour_that_left_in_phase_one_is_saved_as_such(tmp_path) -> None:
    graph = path(3)  # agent 0 leaves in phase I: agent 1's mask holds only its edge with 2
    maskers = {i: Masker(agent=i, neighbours=graph.neighbours(i), spec=SPEC,
                         rng=noise_generator(SEED, i), layout=None, keypair=keys()[i],
                         allow_insecure=True) for i in (1, 2)}
    public = {i: m.public_key for i, m in maskers.items()} | {0: keys()[0][0]}
    sent = {i: m.outgoing(public) for i, m in maskers.items()}
    maskers[1].drop([0])
    mask = FixedMask(maskers[1].finish({2: sent[2][1]}))
    EdgeTerms(maskers[1]).save(StateStore(tmp_path), run_id="r")
    restarted = EdgeTerms(None)
    restarted.restore(StateStore(tmp_path), run_id="r", mask=mask)
    assert restarted.dropped(mask, [0]).mask == mask.mask  # never held its terms
    assert restarted.dropped(mask, [2]).mask.numerators == (0,) * SPEC.num_coefficients


@pytest.mark.parametrize("packed", [True, False])
def test_phase_one_saves_every_edges_terms_for_a_restart_before_any_departure(
        tmp_path, packed) -> None:
    """Departures on: when phase I ends, agent 1 of a 5-path decrypts each edge's terms alone
    (deg * ceil(N / slots) decryptions) and saves them; restarted before any departure, it
    drops agent 2 from the reloaded terms exactly as the live Masker does."""
    graph = path(5)
    layout = SlotLayout.plan(precision=6, gamma=1e3, max_terms=2, key_bits=512) if packed else None
    maskers, masks = _phase_one(graph, layout, {i: noise_generator(SEED, i) for i in range(5)},
                                list(range(5)))
    live, cost = save_phase_one(maskers[1], StateStore(tmp_path), run_id="r")
    per_edge = maskers[1].ciphertexts_per_neighbour
    assert per_edge == (1 if packed else SPEC.num_coefficients)
    assert cost["edge_terms_decryptions"] == 2 * per_edge and cost["edge_terms_seconds"] > 0
    assert (tmp_path / "edge_terms.json").stat().st_mode & 0o777 == 0o600
    before = maskers[1].decryptions
    dropped = live.dropped(masks[1], [2]).mask.numerators
    assert maskers[1].decryptions == before  # the departure decrypts nothing more
    assert EdgeTerms(maskers[1]).dropped(masks[1], [2]).mask.numerators == dropped
    restarted = EdgeTerms(None)
    restarted.restore(StateStore(tmp_path), run_id="r", mask=masks[1])
    assert restarted.dropped(masks[1], [2]).mask.numerators == dropped != masks[1].mask.numerators


@pytest.mark.parametrize("fixed", [True, False])
def test_an_end_of_a_new_edge_restarted_before_its_phase_one_was_saved(tmp_path, fixed) -> None:
    """agent1 of a 5-path is given the new edge agent1-agent4 when agent3 leaves; the decision
    is saved before that edge's phase I. Restarted before the edge's seeds (terms) are saved,
    it re-applies the decision and marks the edge's exchange to finish
    (agent/departure/exchange_file.py); restarted after, it re-applies the decision, nothing left to
    finish."""
    # prepare: the decision saved as Silence.recover saves it before the new edge's phase I
    maskers, masks = _phase_one(path(5), None, {i: noise_generator(SEED, i) for i in range(5)},
                                list(range(5)))
    if fixed:
        save_phase_one(maskers[0], StateStore(tmp_path), run_id="r")  # when its phase I ended
    session = SimpleNamespace(run_id="r", assignment=SimpleNamespace(name="agent1"))
    restored: list[object] = []
    departures = SimpleNamespace(session=session, terms=EdgeTerms(None) if fixed else None,
                                 masks=masks[0] if fixed else None,
                                 restore=lambda record, driver: restored.append(record))
    silence = Silence(departures=departures, coordinator=None, mailbox=None,  # type: ignore[arg-type]
                      store=StateStore(tmp_path), timeout=1.0, edges=None,  # type: ignore[arg-type]
                      deciding=lambda awaited: None)

    def save(seeds: dict[int, tuple[bytes, bytes]]) -> None:
        records.save(StateStore(tmp_path), run_id="r", epoch=1, events=[], names={2: "agent3"},
                     decided=[Departure(agent=2, round=41, rebase_round=46)],
                     joining={"agent4": (3, "127.0.0.1:9", 46)}, seeds=seeds)

    save({})
    # execute / assert: the decision is re-applied and the edge's exchange left to finish
    # (Silence.restart: from agent/departure/exchange_file.py's file, or afresh without one)
    assert silence.resume(driver=None) is None  # type: ignore[arg-type]
    assert silence.unfinished == {"agent4": 3} and len(restored) == 1
    restored.clear()
    silence.unfinished = {}
    # the edge's phase I saved (its seeds, or its terms beside phase I's): resumed
    if fixed:
        live = EdgeTerms(maskers[0])
        edge, _ = _phase_one(Graph(5, ((0, 3),)), None,
                             {i: rejoin_generator(SEED, i, 1) for i in (0, 3)}, [0, 3],
                             key_offset=1)
        live.add(edge[0])
        live.save(StateStore(tmp_path), run_id="r")
    save({} if fixed else {3: (b"\x01" * 16, b"\x02" * 16)})
    assert silence.resume(driver=None) is None  # type: ignore[arg-type]
    assert len(restored) == 1 and restored[0]["joining"]["agent4"][0] == 3  # type: ignore[index]
    assert silence.unfinished == {}
