"""Secure summation of column statistics: pinned encoding, zero-sum pads, exact totals."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from efpsn.masks.seeds import exchange_seeds_fast
from efpsn.stats.column_sums import (
    FRACTION_BITS,
    MODULUS,
    decode_totals,
    encode_value,
    local_vector,
    masked_vector,
    stats_mask,
    sum_masked,
)
from efpsn.topology import build_graph


def _seeds(topology: str, n: int, noise_seed: int = 3):
    return exchange_seeds_fast(build_graph(topology, n, seed=0), noise_seed=noise_seed)


def test_encoding_is_exact_fixed_point():
    assert encode_value(1.5) == 3 << (FRACTION_BITS - 1)
    assert encode_value(-0.25) == -(1 << (FRACTION_BITS - 2))
    assert encode_value(0.0) == 0
    assert encode_value(2.0**-200) == 0  # below the grid: rounds to zero
    with pytest.raises(ValueError, match="not finite"):
        encode_value(float("nan"))


@pytest.mark.parametrize("topology", ["ring", "complete", "star", "path"])
def test_pads_sum_to_zero_modulo_m(topology):
    seeds = _seeds(topology, 5)
    pads = [stats_mask(s, 7) for s in seeds]
    assert all(any(p) for p in pads)  # every agent is padded
    assert sum_masked(pads) == [0] * 7


def test_masked_total_equals_the_exact_pooled_statistics():
    rng = np.random.default_rng(0)
    parts = [rng.normal(1e4, 3e3, size=(n, 3)) for n in (17, 40, 5, 23)]
    seeds = _seeds("ring", 4)
    masked = [masked_vector(x, s) for x, s in zip(parts, seeds, strict=True)]
    for x, v in zip(parts, masked, strict=True):
        assert v != [u % MODULUS for u in local_vector(x)]  # what travels is padded
    totals = decode_totals(sum_masked(masked))
    plain = [sum(col) for col in zip(*(local_vector(x) for x in parts), strict=True)]
    assert totals.count == 85 == plain[0] and list(totals.present) == plain[1:4] == [85] * 3
    assert list(totals.sums) == plain[4:7] and list(totals.squares) == plain[7:]
    pooled = np.concatenate(parts)
    np.testing.assert_allclose(totals.mean(), pooled.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(totals.std(), pooled.std(axis=0), rtol=1e-11)
    # the mean is the float nearest the exact quotient of the exact integers
    assert totals.mean()[0] == float(Fraction(plain[4], 85 << FRACTION_BITS))
    # the summation order does not matter: the same integers at every agent
    assert sum_masked(masked[::-1]) == sum_masked(masked)


def test_without_seeds_the_vector_is_plain_and_constant_columns_get_std_one():
    x = np.array([[2.0, 5.0], [4.0, 5.0]])
    totals = decode_totals(sum_masked([masked_vector(x, None), masked_vector(x, None)]))
    assert totals.count == 4
    assert totals.mean().tolist() == [3.0, 5.0]
    assert totals.std().tolist() == [1.0, 1.0]  # std 1 (first), and 0 -> 1 (second)


def test_decode_refuses_inconsistent_sums():
    with pytest.raises(ValueError, match="count below 1"):
        decode_totals([0, 0, 1, 1])
    with pytest.raises(ValueError, match="more values than rows"):
        decode_totals([2, 3, 1, 1])
    with pytest.raises(ValueError, match="1 \\+ 3d"):
        decode_totals([1, 2, 3])
    with pytest.raises(ValueError, match="integer in"):
        sum_masked([[MODULUS, 0, 0]])


def test_a_masked_vector_looks_uniform():
    """Each entry is padded by a uniform integer mod M: about half of the entries have the top
    bit set, whatever the data (all-zero features here)."""
    seeds = _seeds("complete", 3)
    v = masked_vector(np.zeros((4, 200)), seeds[0])
    top = sum(e >> (1024 - 1) for e in v[1:])  # 600 entries: counts, sums, squares
    assert 250 < top < 350


def test_empty_cells_are_counted_and_the_filled_column_s_statistics_come_out():
    """A table's empty cells (NaN) are not summed: each column's count of values travels with
    the sums, the mean is over the values, and the standard deviation is the column's once its
    empty cells are filled with that mean (scikit-learn's SimpleImputer + StandardScaler on the
    pooled rows), exactly; nothing but network totals comes out."""
    from sklearn.impute import SimpleImputer

    rng = np.random.default_rng(1)
    parts = [rng.normal(50.0, 7.0, size=(n, 4)) for n in (11, 30, 19)]
    for x in parts:
        x[rng.random(x.shape) < 0.2] = np.nan
    parts[1][:, 2] = np.nan  # one party holds no value of a column at all
    seeds = _seeds("ring", 3)
    totals = decode_totals(sum_masked([masked_vector(x, s) for x, s in zip(parts, seeds,
                                                                             strict=True)]))
    pooled = np.concatenate(parts)
    assert totals.count == 60 and list(totals.present) == list((~np.isnan(pooled)).sum(axis=0))
    assert totals.filled
    filled = SimpleImputer(strategy="mean").fit_transform(pooled)
    np.testing.assert_allclose(totals.mean(), np.nanmean(pooled, axis=0), rtol=1e-14)
    np.testing.assert_allclose(totals.std(), filled.std(axis=0), rtol=1e-12)
