"""The one place a mask's kind is chosen (efpsn/masks/factory.py): phase I's fixed coefficients
give the paper's fixed mask, seeds give a fading or a refreshed mask by the run's refresh, and a
party that joined at round R gets edges that fade from R."""

from __future__ import annotations

import numpy as np
import pytest

from efpsn.masks.factory import mask_of, seeded_blocks, seeded_mask
from efpsn.masks.fading import FadingMask
from efpsn.masks.refresh import FixedMask, RefreshedMask
from efpsn.masks.seeds import exchange_seeds_fast
from efpsn.masks.zero_sum import MaskCoefficients, NoiseSpec
from efpsn.params.refresh_setting import Refresh
from efpsn.topology import build_graph

SPEC = NoiseSpec(gamma=1e3, p=1.0, precision=6, num_coefficients=8)
SEEDS = exchange_seeds_fast(build_graph("ring", 4), noise_seed=2)


def test_the_kind_follows_what_phase_one_ended_with_and_the_refresh() -> None:
    fixed = MaskCoefficients((1, -2, 3, 0, 0, 0, 0, 0), 6)
    assert isinstance(mask_of(fixed, spec=SPEC, refresh=Refresh.parse("never")), FixedMask)
    fading = mask_of(SEEDS[0], spec=SPEC, refresh=Refresh.parse("fading:0.9"))
    assert isinstance(fading, FadingMask) and set(fading.starts.values()) == {0}
    refreshed = mask_of(SEEDS[0], spec=SPEC, refresh=Refresh.parse("every:5"))
    assert isinstance(refreshed, RefreshedMask)
    with pytest.raises(ValueError, match="has no seeds"):
        seeded_mask(SEEDS[0], spec=SPEC, refresh=Refresh.parse("never"))
    with pytest.raises(ValueError, match="draws no seeded masks"):
        seeded_blocks(SPEC, Refresh.parse("never"))


def test_a_joiners_edges_fade_from_its_round() -> None:
    rate = Refresh.parse("fading:0.9")
    joined = mask_of(SEEDS[1], spec=SPEC, refresh=rate, since=75)
    assert isinstance(joined, FadingMask)
    assert joined.starts == {j: 75 for j in SEEDS[1].neighbours} and not joined.edges
    start = mask_of(SEEDS[1], spec=SPEC, refresh=rate)
    # at its round R a joiner's fresh part is what a starter's is at 0 in size, not faded by R
    ((r, part, k),) = joined.later_parts(75)
    assert r == 75 and k == 0 and start.exponent(75) > 5
    own = np.abs(part).max()  # over 10^P: k = 0
    faded = np.ldexp(float(np.abs(start.fresh(75)[0]).max()), -start.exponent(75))  # over 10^P
    assert own > 2.0 ** (start.exponent(75) - 2) * faded
    # the blocks: one period at a time for fading, shared periods for refreshed masks
    assert seeded_blocks(SPEC, rate).periods == 1
    assert seeded_blocks(SPEC, Refresh.parse("every:5")).periods != 1


def test_agents_of_one_process_share_the_blocks_they_are_given() -> None:
    every = Refresh.parse("every:5")
    shared = seeded_blocks(SPEC, every)
    masks = [seeded_mask(s, spec=SPEC, refresh=every, blocks=shared) for s in SEEDS]
    assert all(m.blocks is shared for m in masks)
    assert seeded_mask(SEEDS[0], spec=SPEC, refresh=every).blocks is not shared
