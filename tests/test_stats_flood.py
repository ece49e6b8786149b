"""The secure sum's flood (efpsn/stats/flood.py) and its wire form (efpsn/wire/stats.py): after
diameter rounds every agent holds every masked vector and the same totals as the simulator's
sum; wrong agents, sizes or contradicting copies are refused."""

from __future__ import annotations

import numpy as np
import pytest

from efpsn.departure.membership import reconfigure
from efpsn.departure.remask import drop_seeds
from efpsn.masks.seeds import exchange_seeds_fast
from efpsn.stats.column_sums import MODULUS, masked_vector, stats_mask
from efpsn.stats.flood import (
    ENTRY_BYTES,
    StatsFlood,
    ball,
    decode_vector,
    encode_vector,
    flood_round_base,
    flood_rounds,
)
from efpsn.stats.standardise import network_totals
from efpsn.topology import build_graph
from efpsn.wire.records import Phase, WireError, make_header
from efpsn.wire.stats import parse_stats, stats_message


@pytest.mark.parametrize(("spec", "n", "rounds"), [("ring", 4, 2), ("ring", 7, 3), ("path", 5, 4),
                                                   ("star", 6, 2), ("complete", 5, 1)])
def test_flood_takes_the_diameter(spec, n, rounds):
    graph = build_graph(spec, n)
    assert flood_rounds(graph) == rounds
    assert ball(graph, 0, 0) == {0} and ball(graph, 0, rounds) == set(range(n))


def _flood(spec: str, n: int) -> tuple[list[StatsFlood], list[np.ndarray], list]:
    graph = build_graph(spec, n)
    seeds = exchange_seeds_fast(graph, noise_seed=3)
    rng = np.random.default_rng(0)
    features = [rng.normal(50.0, 20.0, size=(10 + 3 * i, 4)) for i in range(n)]
    floods = [StatsFlood(graph=graph, agent=i, own=masked_vector(features[i], seeds[i]))
              for i in range(n)]
    for r in range(floods[0].rounds):
        sent = [f.outgoing(r) for f in floods]
        for i, f in enumerate(floods):
            for j in graph.neighbours(i):
                f.merge(j, r, sent[j])
    return floods, features, seeds


@pytest.mark.parametrize(("spec", "n"), [("ring", 5), ("path", 4), ("star", 5)])
def test_every_agent_gets_the_simulators_totals(spec, n):
    floods, features, seeds = _flood(spec, n)
    expected = network_totals(features, seeds)
    assert all(f.totals() == expected for f in floods)
    assert expected.count == sum(len(x) for x in features)
    pooled = np.concatenate(features)
    np.testing.assert_allclose(expected.mean(), pooled.mean(axis=0), rtol=1e-12)


def test_a_flood_without_an_agent_gone_in_phase_one_sums_the_remaining_statistics():
    """agent3 of a 5-path left in phase I: the flood runs on the joined path (the new edge
    agent2-agent4 carries messages, no pad), its neighbours drop the pads of its edges, and
    every remaining agent gets the remaining agents' totals exactly, as the simulator's."""
    graph = build_graph("path", 5)
    recon = reconfigure(graph, {2})
    full = exchange_seeds_fast(graph, noise_seed=3)
    seeds = [drop_seeds(s, {2}) for s in full]
    rng = np.random.default_rng(0)
    features = [rng.normal(50.0, 20.0, size=(10 + 3 * i, 4)) for i in range(5)]
    kept = [0, 1, 3, 4]
    floods = {i: StatsFlood(graph=recon.graph, agent=i, gone={2},  # the flood after decision 1
                            own=masked_vector(features[i], seeds[i], 1)) for i in kept}
    # fresh pads: agent2's vectors of the two floods do not differ by the pad of its edge with
    # agent3 alone (which, with agent4's, would unpad agent3's vector of the first flood)
    before, after = masked_vector(features[1], full[1]), masked_vector(features[1], seeds[1], 1)
    edge = drop_seeds(full[1], {0})  # agent2's seeds with agent3 only
    assert [(a - b) % MODULUS for a, b in zip(before, after, strict=True)] != stats_mask(edge, 9)
    assert floods[0].rounds == flood_rounds(recon.graph, {2}) == 3
    for r in range(3):
        sent = {i: f.outgoing(r) for i, f in floods.items()}
        for i, f in floods.items():
            for j in recon.graph.neighbours(i):
                f.merge(j, r, sent[j])
    expected = network_totals([features[i] for i in kept], [seeds[i] for i in kept])
    assert all(f.totals() == expected for f in floods.values())
    assert expected.count == sum(len(features[i]) for i in kept)
    pooled = np.concatenate([features[i] for i in kept])
    np.testing.assert_allclose(expected.mean(), pooled.mean(axis=0), rtol=1e-12)
    with pytest.raises(ValueError, match="still have edges"):
        StatsFlood(graph=graph, agent=0, own=floods[0].known[0], gone={2})
    with pytest.raises(ValueError, match="remaining agent"):
        StatsFlood(graph=recon.graph, agent=2, own=floods[0].known[0], gone={2})


def test_a_death_during_the_flood_starts_it_again_without_it():
    """agent3 of a 5-path sends its round-0 message of the flood (its masked vector), then
    dies (crash_at("stats")): the flood cannot finish anywhere. After the decision (epoch 1)
    it starts again on the joined path, on wire rounds above the first flood's, with fresh pads
    and without agent3's vector and the pads of its edges: every remaining agent gets the
    remaining agents' totals, and agent3's vector of the first flood, which its neighbours
    hold, cannot be unpadded from their vectors of the two floods."""
    graph = build_graph("path", 5)
    full = exchange_seeds_fast(graph, noise_seed=3)
    rng = np.random.default_rng(0)
    features = [rng.normal(50.0, 20.0, size=(10 + 3 * i, 4)) for i in range(5)]
    kept = [0, 1, 3, 4]
    first = [StatsFlood(graph=graph, agent=i, own=masked_vector(features[i], full[i]))
             for i in range(5)]
    sent = [f.outgoing(0) for f in first]
    for i, f in enumerate(first):
        for j in graph.neighbours(i):
            f.merge(j, 0, sent[j])
    later = {i: first[i].outgoing(1) for i in kept}  # agent3 never sends its round 1
    for i in kept:
        for j in graph.neighbours(i):
            if j != 2:
                first[i].merge(j, 1, later[j])
        with pytest.raises(RuntimeError, match="the flood knows"):
            first[i].totals()
    assert 2 in first[1].known and 2 in first[3].known  # its masked vector of flood 0
    recon = reconfigure(graph, {2})
    seeds = {i: drop_seeds(full[i], {2}) for i in kept}
    second = {i: StatsFlood(graph=recon.graph, agent=i, gone={2},
                            own=masked_vector(features[i], seeds[i], 1)) for i in kept}
    assert flood_round_base(1, 5) >= flood_round_base(0, 5) + first[0].rounds
    for r in range(second[0].rounds):
        out = {i: f.outgoing(r) for i, f in second.items()}
        for i, f in second.items():
            for j in recon.graph.neighbours(i):
                f.merge(j, r, out[j])
    expected = network_totals([features[i] for i in kept], [seeds[i] for i in kept])
    assert all(f.totals() == expected for f in second.values())
    assert expected.count == sum(len(features[i]) for i in kept)

    def unpadded(nonce: int) -> bool:  # agent3's vector from agents 2 and 4's of both floods
        plain = masked_vector(features[2], None)
        moves = [[(a - b) % MODULUS for a, b in zip(
            first[i].known[i], masked_vector(features[i], seeds[i], nonce), strict=True)]
            for i in (1, 3)]
        return any([(v + s * (m2 + m4)) % MODULUS for v, m2, m4 in zip(
            first[2].known[2], *moves, strict=True)] == plain for s in (1, -1))

    assert unpadded(0)  # control: pads without nonce would give it away
    assert not unpadded(1)  # the second flood's fresh pads (epoch 1) do not


def test_wrong_agents_and_contradicting_copies_are_refused():
    floods, _, _ = _flood("ring", 4)
    one = floods[0]
    own = one.known[1]
    with pytest.raises(ValueError, match="must carry agents"):
        one.merge(1, 0, {1: own, 2: own})
    with pytest.raises(ValueError, match="differ"):
        one.merge(1, 0, {1: ((own[0] + 1) % MODULUS, *own[1:])})
    with pytest.raises(ValueError, match="not a neighbour"):
        one.merge(2, 0, {2: own})
    with pytest.raises(ValueError, match="rounds 0..1"):
        one.outgoing(2)


def test_wire_form_round_trips_and_checks_sizes_before_decoding():
    floods, _, _ = _flood("ring", 4)
    vectors = floods[1].outgoing(1)
    header = make_header(run_id="r", sender="agent2", round=1, phase=Phase.STATS)
    pb = stats_message(header=header, vectors=vectors)
    record = parse_stats(pb, run_id="r", senders={"agent2"}, rounds=2, agents=4, length=13)
    assert record.vectors == {j: list(v) for j, v in vectors.items()} and record.round == 1
    pb.vectors[0].values = pb.vectors[0].values[:-1]
    with pytest.raises(WireError, match="bytes, expected"):
        parse_stats(pb, run_id="r", senders={"agent2"}, rounds=2, agents=4, length=13)
    late = make_header(run_id="r", sender="agent2", round=2, phase=Phase.STATS)
    with pytest.raises(WireError, match="rounds 0..1"):
        parse_stats(stats_message(header=late, vectors=vectors), run_id="r",
                    senders={"agent2"}, rounds=2, agents=4, length=13)
    other = make_header(run_id="r", sender="agent2", round=0, phase=Phase.SHARES)
    with pytest.raises(WireError, match="phase"):
        parse_stats(stats_message(header=other, vectors=vectors), run_id="r",
                    senders={"agent2"}, rounds=2, agents=4, length=13)
    assert decode_vector(encode_vector([1, MODULUS - 1]), length=2) == [1, MODULUS - 1]
    assert len(encode_vector([0])) == ENTRY_BYTES


def test_totals_are_saved_for_a_restart_and_checked(tmp_path):
    from agent.phases.secure_sum import SecureSum
    from agent.state import TOTALS, StateError, StateStore

    floods, _, _ = _flood("ring", 4)
    totals = floods[0].totals()
    store = StateStore(tmp_path)
    phase = SecureSum(peers=None, mailbox=None, store=store)  # type: ignore[arg-type]
    assert phase.load(run_id="run-1") is None  # stopped before: nothing to reload
    phase.save(totals, run_id="run-1")
    assert (tmp_path / TOTALS).stat().st_mode & 0o777 == 0o600
    assert phase.load(run_id="run-1") == totals  # the very integers, never resummed
    with pytest.raises(StateError, match="belongs to run"):
        phase.load(run_id="run-2")
    (tmp_path / TOTALS).write_text('{"format": 1, "run_id": "run-1", "count": 3}')
    with pytest.raises(StateError, match="damaged"):
        phase.load(run_id="run-1")


def test_the_flood_ledger_takes_copies_and_refuses_changes():
    from efpsn.ledger import FirstCopyLedger, Verdict

    ledger = FirstCopyLedger("the statistics flood")
    assert ledger.judge("0", "agent2", b"a").verdict == Verdict.ACCEPT
    assert ledger.judge("0", "agent2", b"a").verdict == Verdict.DUPLICATE
    assert ledger.judge("0", "agent2", b"b").code == "INVALID_ARGUMENT"
    ledger.close()
    assert ledger.judge("0", "agent2", b"a").verdict == Verdict.DUPLICATE
    refused = ledger.judge("1", "agent2", b"c", what="round-1 statistics")
    assert refused.code == "FAILED_PRECONDITION"
    assert refused.reason.startswith("the statistics flood is over at this agent, and this "
                                     "round-1 statistics message")
