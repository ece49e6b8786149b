"""Masks per round (efpsn/masks/refresh.py) at their edges: the refresh period's text and rounds,
the int64 guard of a refreshed mask, a block at the last period, and a block shared by agents."""

from __future__ import annotations

import json

import numpy as np
import pytest

import efpsn.masks.refresh as refresh_module
from efpsn.masks.keystream import MAX_PERIOD, exact_bound, period_noise
from efpsn.masks.refresh import NoiseBlocks, RefreshedMask
from efpsn.masks.seeds import EdgeSeeds, exchange_seeds_fast
from efpsn.masks.zero_sum import NoiseSpec
from efpsn.params.refresh_setting import Refresh
from efpsn.topology import Graph

SPEC = NoiseSpec(gamma=1e3, p=1.0, precision=6, num_coefficients=40)
FIVE = Graph(n=5, edges=((0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (0, 2)))


def test_a_refresh_prints_as_the_text_it_parses_from() -> None:
    for text in ("never", "every:1", "every:25"):
        assert str(Refresh.parse(text)) == text and Refresh.parse(str(Refresh.parse(text))) \
            == Refresh.parse(text)
    # a numpy integer period is stored as a Python int: it goes into JSON documents as is
    every = Refresh(np.int64(4))
    assert type(every.every) is int and json.loads(json.dumps({"every": every.every})) \
        == {"every": 4}
    assert type(every.period(9)) is int and every.period(9) == 2


def test_refusals_say_what_was_expected_and_what_came() -> None:
    with pytest.raises(TypeError, match="refresh period must be an int or None, got .*float"):
        Refresh(2.0)
    with pytest.raises(ValueError, match="refresh period must be >= 1 round, got 0"):
        Refresh(0)
    with pytest.raises(TypeError, match="refresh must be a str, got int"):
        Refresh.parse(3)
    for bad in (True, 2.5, -1):
        with pytest.raises(ValueError, match="round must be an int >= 0"):
            Refresh(4).period(bad)
    with pytest.raises(TypeError, match="spec must be a NoiseSpec, got dict"):
        NoiseBlocks({"gamma": 1.0})
    seeds = exchange_seeds_fast(FIVE, noise_seed=1)[1]
    with pytest.raises(TypeError, match="seeds must be EdgeSeeds, got tuple"):
        RefreshedMask(seeds=(), spec=SPEC, refresh=Refresh(1))
    with pytest.raises(TypeError, match="spec must be a NoiseSpec, got str"):
        RefreshedMask(seeds=seeds, spec="1e3", refresh=Refresh(1))


def test_a_mask_that_could_overflow_int64_is_refused_up_front() -> None:
    # every stream is exact (|z| < 2^52), but 2 deg(i) of them summed could pass 2^63: an agent
    # with 1,200 neighbours is refused at that spec, one with 1,100 is not
    spec = NoiseSpec(gamma=1e17, p=1.0, precision=6, num_coefficients=2)
    bound = exact_bound(spec)
    assert 2 * 1100 * bound < 2**63 <= 2 * 1200 * bound

    def agent(degree: int) -> EdgeSeeds:
        pairs = tuple((j, j.to_bytes(32, "big")) for j in range(1, degree + 1))
        return EdgeSeeds(agent=0, sent=pairs, received=pairs)

    with pytest.raises(ValueError, match=f"agent 0: 2400 noise streams of up to {bound} could "
                                         "overflow int64"):
        RefreshedMask(seeds=agent(1200), spec=spec, refresh=Refresh(1))
    assert RefreshedMask(seeds=agent(1100), spec=spec, refresh=Refresh(1)).spec == spec


def test_a_block_at_the_last_period_stops_there() -> None:
    # blocks of 7 periods start at multiples of 7; the last one starts at MAX_PERIOD - 1 and
    # holds only the two periods that exist
    seed = exchange_seeds_fast(FIVE, noise_seed=2)[0].sent[0][1]
    first = MAX_PERIOD - MAX_PERIOD % 7
    assert first == MAX_PERIOD - 1
    for period in (MAX_PERIOD, first):
        blocks = NoiseBlocks(SPEC, periods=7)
        assert np.array_equal(blocks.noise([seed], period)[0], period_noise(seed, period, SPEC))


def test_agents_sharing_blocks_derive_each_edge_s_stream_once(monkeypatch) -> None:
    # the simulator's agents share one NoiseBlocks: each edge has two seeds (s_ij, s_ji), and
    # each is expanded once per block, not once per agent that holds it
    derived: list[bytes] = []
    real = refresh_module.period_noise_block

    def counting(seeds, first, count, spec):
        derived.extend(seeds)
        return real(seeds, first, count, spec)

    monkeypatch.setattr(refresh_module, "period_noise_block", counting)
    seeds = exchange_seeds_fast(FIVE, noise_seed=5)
    shared = NoiseBlocks(SPEC, periods=8)
    masks = [RefreshedMask(seeds=s, spec=SPEC, refresh=Refresh(1), blocks=shared)
             for s in seeds]
    for t in range(8):  # one block
        rows = np.stack([m.numerators(t) for m in masks])
        assert not rows.sum(axis=0).any()
    assert len(derived) == len(set(derived)) == 2 * len(FIVE.edges)
