"""Phase I with seeds and masks refreshed per period: exact zero sum, Paillier, validation, state."""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efpsn.crypto import paillier
from efpsn.masks.keystream import period_noise
from efpsn.masks.refresh import FixedMask, NoiseBlocks, RefreshedMask, refreshed_numerators
from efpsn.masks.seeds import (
    SEEDS_FORMAT,
    EdgeSeeds,
    SeedExchange,
    draw_seeds,
    exchange_seeds,
    exchange_seeds_fast,
)
from efpsn.masks.zero_sum import MaskCoefficients, MaskingStateError, NoiseSpec
from efpsn.params.refresh_setting import Refresh
from efpsn.topology import Graph, build_graph

SPEC = NoiseSpec(gamma=1e3, p=1.0, precision=6, num_coefficients=40)
FIVE = Graph(n=5, edges=((0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (0, 2)))  # degrees 3,2,3,2,2


@cache
def keys(bits: int = 512) -> tuple[tuple[paillier.PublicKey, paillier.PrivateKey], ...]:
    return tuple(paillier.generate_keypair(bits, allow_insecure=True) for _ in range(6))


# ------------------------------------------------------------------ the exact zero sum


@given(
    graph=st.sampled_from(["ring", "path", "star", "complete", "erdos-renyi:0.5", "grid"]),
    n=st.integers(min_value=2, max_value=6),
    precision=st.integers(min_value=0, max_value=9),
    gamma=st.sampled_from([1e-4, 1.0, 1e3, 1e6]),
    p=st.sampled_from([0.5, 1.0, 2.0]),
    noise_seed=st.integers(min_value=0, max_value=2**32),
    first=st.integers(min_value=0, max_value=2**40),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_masks_sum_to_zero_exactly_in_every_period(graph: str, n: int, precision: int,
                                                  gamma: float, p: float, noise_seed: int,
                                                  first: int) -> None:
    try:
        g = build_graph(graph, n, seed=noise_seed % 7)
    except ValueError:  # a disconnected random graph, or a grid that does not fit n
        return
    spec = NoiseSpec(gamma=gamma, p=p, precision=precision, num_coefficients=12)
    seeds = exchange_seeds_fast(g, noise_seed=noise_seed)
    for period in range(first, first + 25):
        numerators = refreshed_numerators(seeds, spec, period)
        assert not numerators.sum(axis=0).any()
        assert sum(int(v) for v in numerators[:, 0]) == 0  # the same in Python ints
    if gamma * 10 ** (2 * precision) > 1e3:  # not all rounded to zero: real noise
        assert numerators.any()


def test_real_paillier_exchange_gives_the_fast_path_seeds_and_zero_sum_masks() -> None:
    real = exchange_seeds(FIVE, keys()[:5], noise_seed=11, allow_insecure=True)
    with pytest.raises(ValueError, match="needs 5 key pairs"):
        exchange_seeds(FIVE, keys()[:4], noise_seed=11, allow_insecure=True)
    assert real == exchange_seeds_fast(FIVE, noise_seed=11)
    for i, s in enumerate(real):
        assert s.neighbours == FIVE.neighbours(i)
        for j, seed in s.received:
            assert dict(real[j].sent)[i] == seed  # what j sent is what i decrypted
    refresh = Refresh.parse("every:3")
    masks = [RefreshedMask(seeds=s, spec=SPEC, refresh=refresh) for s in real]
    for t in range(60):
        coefficients = [m.coefficients(t) for m in masks]
        assert all(sum(col) == 0 for col in zip(*(c.numerators for c in coefficients)))
        assert np.array_equal(masks[0].values(t), coefficients[0].values())
    # one period = three rounds; the next period is new noise
    assert masks[0].coefficients(3) is masks[0].coefficients(5)
    assert masks[0].coefficients(6) != masks[0].coefficients(5)


def test_production_seeds_are_fresh_and_the_test_hook_reproducible() -> None:
    a, b = exchange_seeds_fast(FIVE, noise_seed=None), exchange_seeds_fast(FIVE, noise_seed=None)
    assert a[0].sent != b[0].sent
    assert exchange_seeds_fast(FIVE, noise_seed=3) == exchange_seeds_fast(FIVE, noise_seed=3)
    assert exchange_seeds_fast(FIVE, noise_seed=3) != exchange_seeds_fast(FIVE, noise_seed=4)
    drawn = draw_seeds([4, 1], np.random.default_rng([3, 0]))
    rng = np.random.default_rng([3, 0])
    assert list(drawn) == [1, 4] and drawn == {1: rng.bytes(32), 4: rng.bytes(32)}
    # every edge direction has its own seed
    seeds = exchange_seeds_fast(FIVE, noise_seed=None)
    everything = [s for e in seeds for _, s in e.sent]
    assert len(set(everything)) == len(everything) == 2 * len(FIVE.edges)


# ------------------------------------------------------------------ the state machine


def make_pair(bits: int = 512) -> tuple[SeedExchange, SeedExchange]:
    pool = keys(bits)
    return (SeedExchange(agent=0, neighbours=[1], keypair=pool[0], allow_insecure=True),
            SeedExchange(agent=1, neighbours=[0], keypair=pool[1], allow_insecure=True))


def test_one_ciphertext_per_neighbour_and_retransmission_is_identical() -> None:
    a, b = make_pair()
    sent = a.outgoing({1: b.public_key, 7: keys()[5][0]})  # a non-neighbour's key is ignored
    assert list(sent) == [1] and len(sent[1]) == 1 and a.ciphertexts_per_neighbour == 1
    assert a.outgoing({1: b.public_key}) == sent and a.encryptions == 1
    with pytest.raises(MaskingStateError, match="different neighbour keys"):
        a.outgoing({1: keys()[2][0]})
    b.outgoing({0: a.public_key})
    assert b.finish({0: sent[1]}).received == ((0, dict(a._seeds)[1]),) and b.decryptions == 1
    with pytest.raises(MaskingStateError, match="comes once, after outgoing"):
        b.finish({0: sent[1]})


def test_what_arrives_is_validated() -> None:
    a, b = make_pair()
    b.outgoing({0: a.public_key})
    good = a.outgoing({1: b.public_key})[1]
    n = b.public_key.n
    cases = [
        ({}, "missing \\[0\\]"),
        ({0: good, 3: good}, "unexpected \\[3\\]"),
        ({0: []}, "expects 1 ciphertext .* got 0"),
        ({0: good + good}, "expects 1 ciphertext .* got 2"),
        ({0: [n * n]}, "0 < c < n\\^2"),
        ({0: [n]}, "shares a factor with n"),
        ({0: [paillier.encrypt(b.public_key, 2**256)]}, "has 257 bits, expected at most 256"),
    ]
    for incoming, message in cases:
        with pytest.raises(ValueError, match=message):
            b.finish(incoming)
    assert b.finish({0: good}).received == ((0, dict(a._seeds)[1]),)
    with pytest.raises(MaskingStateError, match="comes once, after outgoing"):
        SeedExchange(agent=2, neighbours=[0], keypair=keys()[2], allow_insecure=True).finish({})


def test_keys_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 2048 are required"):
        SeedExchange(agent=0, neighbours=[1], keypair=keys()[0])
    with pytest.raises(ValueError, match="cannot carry a 256-bit seed"):
        SeedExchange(agent=0, neighbours=[1], allow_insecure=True,
                     keypair=paillier.generate_keypair(256, allow_insecure=True))
    with pytest.raises(ValueError, match="does not belong"):
        SeedExchange(agent=0, neighbours=[1], keypair=(keys()[0][0], keys()[1][1]),
                     allow_insecure=True)
    a, _ = make_pair()
    with pytest.raises(ValueError, match="missing \\[1\\]"):
        a.outgoing({})
    with pytest.raises(TypeError, match="must be a PublicKey"):
        a.outgoing({1: 12345})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="lists itself"):
        SeedExchange(agent=0, neighbours=[0], keypair=keys()[0], allow_insecure=True)


# ------------------------------------------------------------------ the crash-safe state


def test_seeds_round_trip_through_json_and_bad_documents_are_refused() -> None:
    seeds = exchange_seeds_fast(FIVE, noise_seed=5)[0]
    text = seeds.to_json()
    doc = json.loads(text)
    assert doc["format"] == SEEDS_FORMAT and doc["agent"] == 0
    assert set(doc["sent"]) == set(doc["received"]) == {"1", "2", "4"}
    assert EdgeSeeds.from_json(text, agent=0, neighbours=[4, 2, 1]) == seeds
    assert "secret" in repr(seeds) and dict(seeds.sent)[1].hex() not in repr(seeds)

    def broken(**change: object) -> str:
        return json.dumps({**doc, **change})

    cases = [
        ("not json", "not JSON"),
        (broken(format="pickle"), "expected format"),
        (broken(extra=1), "expected keys"),
        (broken(sent={**doc["sent"], "1": "ab"}), "64 hex digits"),
        (broken(sent={**doc["sent"], "1": "zz" * 32}), "not hexadecimal"),
        (broken(sent={**doc["sent"], "x": "00" * 32}), "neighbour numbers"),
        (broken(received={"1": "00" * 32}), "same neighbours"),
        (broken(agent=-1), "non-negative int"),
        (broken(sent={**doc["sent"], "0": "00" * 32}, received={**doc["received"],
                                                               "0": "00" * 32}), "itself"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            EdgeSeeds.from_json(bad)
    with pytest.raises(ValueError, match="belong to agent 0, expected agent 1"):
        EdgeSeeds.from_json(text, agent=1)
    with pytest.raises(ValueError, match="expected \\[1, 2\\]"):
        EdgeSeeds.from_json(text, neighbours=[1, 2])


# ------------------------------------------------------------------ mask providers


def test_refresh_parses_and_maps_rounds_to_periods() -> None:
    assert Refresh.parse("never").period(12345) == 0 and not Refresh.parse("never").refreshed
    every = Refresh.parse(" every:4 ")
    assert [every.period(t) for t in (0, 3, 4, 7, 8)] == [0, 0, 1, 1, 2] and str(every) == "every:4"
    for bad in ("every:0", "every:", "always", "every:-2", "every:1.5"):
        with pytest.raises(ValueError, match="'never', 'every:R' with R >= 1"):
            Refresh.parse(bad)
    with pytest.raises(ValueError, match="round must be an int >= 0"):
        every.period(-1)


def test_fixed_and_refreshed_providers() -> None:
    fixed_mask = MaskCoefficients((1, -2, 3), 2)
    fixed = FixedMask(fixed_mask)
    assert fixed.coefficients(0) is fixed.coefficients(9999) is fixed_mask
    seeds = exchange_seeds_fast(FIVE, noise_seed=1)[1]
    every1 = RefreshedMask(seeds=seeds, spec=SPEC, refresh=Refresh(1))
    assert len({every1.coefficients(t) for t in range(20)}) == 20  # new noise every round
    assert every1.coefficients(7).numerators == tuple(seeds.numerators(7, SPEC).tolist())
    with pytest.raises(ValueError, match="FixedMask"):
        RefreshedMask(seeds=seeds, spec=SPEC, refresh=Refresh(None))
    with pytest.raises(ValueError, match="beyond the exactly representable"):
        RefreshedMask(seeds=seeds, spec=NoiseSpec(gamma=1e20, p=1, precision=6,
                                                  num_coefficients=3), refresh=Refresh(1))
    cached = every1.numerators(3)
    assert not cached.flags.writeable and every1.numerators(3) is cached


def test_blocks_of_periods_give_each_period_s_own_integers() -> None:
    # prepare: agent 1's seeds, masks drawing blocks of 1, 7 and 64 periods (the default for
    # N = 40), and a simulator-style block shared by every agent
    seeds = exchange_seeds_fast(FIVE, noise_seed=4)
    assert NoiseBlocks(SPEC).periods == 64
    assert NoiseBlocks(NoiseSpec(gamma=1.0, p=1.0, precision=6, num_coefficients=7851)).periods == 1
    shared = NoiseBlocks(SPEC, periods=5)
    masks = {size: RefreshedMask(seeds=seeds[1], spec=SPEC, refresh=Refresh(2),
                                 blocks=NoiseBlocks(SPEC, periods=size)) for size in (1, 7, 64)}
    everyone = [RefreshedMask(seeds=s, spec=SPEC, refresh=Refresh(2), blocks=shared)
                for s in seeds]
    # execute and assert: whatever the block, round t has period t // 2's numerators
    for t in [*range(40), 127, 128, 129, 3, 2**41]:
        expected = seeds[1].numerators(t // 2, SPEC)
        for mask in masks.values():
            assert np.array_equal(mask.numerators(t), expected), t
        rows = np.stack([m.numerators(t) for m in everyone])
        assert np.array_equal(rows[1], expected) and not rows.sum(axis=0).any()
    z = shared.noise([seeds[0].sent[0][1], seeds[3].received[0][1]], 2**41 // 2)
    assert np.array_equal(z[1], period_noise(seeds[3].received[0][1], 2**41 // 2, SPEC))
    assert shared.noise([], 3).shape == (0, 40)
    with pytest.raises(ValueError, match="periods must be an int >= 1"):
        NoiseBlocks(SPEC, periods=0)
    with pytest.raises(ValueError, match="own NoiseSpec"):
        RefreshedMask(seeds=seeds[1], spec=SPEC, refresh=Refresh(1),
                      blocks=NoiseBlocks(NoiseSpec(gamma=2.0, p=1.0, precision=6,
                                                   num_coefficients=40)))


# ------------------------------------------------------------------ edges of the seed state


def test_the_smallest_key_that_holds_a_seed_carries_one() -> None:
    # a 258-bit modulus exceeds every 256-bit seed: the exchange works and both ends agree
    pairs = [paillier.generate_keypair(258, allow_insecure=True) for _ in range(2)]
    two = Graph(n=2, edges=((0, 1),))
    a, b = exchange_seeds(two, pairs, noise_seed=7, allow_insecure=True)
    assert a.sent == ((1, b.received[0][1]),) and b.sent == ((0, a.received[0][1]),)
    assert (a.sent, b.sent) == tuple(s.sent for s in exchange_seeds_fast(two, noise_seed=7))


def test_a_document_in_the_documented_format_loads() -> None:
    # the crash-safe state as its docstring spells it, written by hand: a restarted agent of
    # this or a later version reads it
    sent, received = "11" * 32, "22" * 32
    text = json.dumps({"format": "efpsn-edge-seeds/1", "agent": 3,
                       "received": {"10": received, "2": received},
                       "sent": {"2": sent, "10": sent}})
    seeds = EdgeSeeds.from_json(text, agent=3, neighbours=[2, 10])
    assert seeds.neighbours == (2, 10) and seeds.sent[0] == (2, bytes.fromhex(sent))
    assert json.loads(seeds.to_json())["format"] == "efpsn-edge-seeds/1"
    for doc, message in (({"format": "efpsn-edge-seeds/2"}, "got 'efpsn-edge-seeds/2'"),
                         ([1, 2], "got 'list'")):
        with pytest.raises(ValueError, match=message):
            EdgeSeeds.from_json(json.dumps(doc))
    with pytest.raises(ValueError, match="edge seeds: sent must be an object, got list"):
        EdgeSeeds.from_json(json.dumps({"format": "efpsn-edge-seeds/1", "agent": 3,
                                        "sent": [], "received": {}}))


def test_edge_seeds_name_the_bad_seed_and_keep_plain_ints() -> None:
    good = bytes(32)
    with pytest.raises(ValueError, match=r"received\[1\] must be 32 bytes, got 3 bytes"):
        EdgeSeeds(agent=0, sent=((1, good),), received=((1, b"abc"),))
    # a numpy agent index is stored as a Python int: the state document is plain JSON
    seeds = EdgeSeeds(agent=np.int64(4), sent=((1, good),), received=((1, good),))
    assert type(seeds.agent) is int
    assert EdgeSeeds.from_json(seeds.to_json(), agent=4) == seeds


# ------------------------------------------------------------------ restarts and departures


def test_a_restart_sends_the_same_seeds_and_ciphertexts_again() -> None:
    a, b = make_pair()
    sent = a.outgoing({1: b.public_key})
    again = SeedExchange(agent=0, neighbours=[1], keypair=keys()[0], allow_insecure=True,
                         seeds=a.seeds)
    assert again.seeds == a.seeds  # the seeds drawn before it, not new ones
    with pytest.raises(ValueError, match=r"^seeds are for neighbours \[2\], expected \[1\]$"):
        SeedExchange(agent=0, neighbours=[1], keypair=keys()[0], allow_insecure=True,
                     seeds={2: bytes(32)})
    with pytest.raises(ValueError, match="seeds"):
        SeedExchange(agent=0, neighbours=[1], keypair=keys()[0], allow_insecure=True,
                     seeds={1: b"short"})
    with pytest.raises(TypeError, match=r"^public key of neighbour 1 must be a PublicKey, got "
                                        r"int$"):
        again.restore_outgoing({1: 7}, sent)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"^expected 1 ciphertext for neighbour 1, got 2$"):
        again.restore_outgoing({1: b.public_key}, {1: sent[1] * 2})
    with pytest.raises(ValueError, match="0 < c < n"):
        again.restore_outgoing({1: b.public_key}, {1: [b.public_key.n ** 2]})
    again.restore_outgoing({1: b.public_key}, sent)
    assert again.outgoing({1: b.public_key}) == sent and again.encryptions == 0
    with pytest.raises(MaskingStateError, match=r"^agent 0: outgoing\(\) was already called$"):
        again.restore_outgoing({1: b.public_key}, sent)
    with pytest.raises(MaskingStateError, match=r"^agent 0: outgoing\(\) was already called "
                                                r"with different neighbour keys$"):
        again.outgoing({1: keys()[3][0]})
    b.outgoing({0: a.public_key})
    assert b.finish({0: again.outgoing({1: b.public_key})[1]}).received == (
        (0, a.seeds[1]),)


def test_a_neighbour_gone_in_phase_one_is_neither_sent_nor_awaited() -> None:
    pool = keys()
    mid = SeedExchange(agent=1, neighbours=[0, 2], keypair=pool[1], allow_insecure=True)
    left = SeedExchange(agent=0, neighbours=[1], keypair=pool[0], allow_insecure=True)
    drawn = mid.seeds
    mid.outgoing({0: left.public_key, 2: pool[2][0]})
    mid.drop([2])
    assert mid.neighbours == (0,) and mid.seeds == {0: drawn[0]}
    assert list(mid.outgoing({0: left.public_key})) == [0]
    left.outgoing({1: mid.public_key})
    seeds = mid.finish({0: left.outgoing({1: mid.public_key})[1]})
    assert seeds.neighbours == (0,) and dict(seeds.sent) == {0: drawn[0]}
    with pytest.raises(MaskingStateError, match=r"^agent 1: drop\(\) comes before finish\(\)$"):
        mid.drop([0])


def test_edge_seeds_refuse_what_does_not_pair_and_write_a_stable_document() -> None:
    s = bytes(range(32))
    with pytest.raises(ValueError, match=r"^sent and received must cover the same neighbours"):
        EdgeSeeds(agent=0, sent=((1, s),), received=((2, s),))
    with pytest.raises(ValueError, match=r"^sent and received must name each neighbour once$"):
        EdgeSeeds(agent=0, sent=((1, s), (1, s)), received=((1, s),))
    with pytest.raises(ValueError, match=r"sent.*int"):
        EdgeSeeds(agent=0, sent=((1, 5),), received=((1, s),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"received"):
        EdgeSeeds(agent=0, sent=((1, s),), received=((1, b"x"),))
    seeds = EdgeSeeds(agent=0, sent=((2, s), (1, s)), received=((1, s), (2, s)))
    assert seeds.sent == ((1, s), (2, s)) and seeds.received == ((1, s), (2, s))
    text = seeds.to_json()
    assert text.index('"agent"') < text.index('"format"') < text.index('"received"') < text.index(
        '"sent"')  # sorted keys: the same bytes on every machine
