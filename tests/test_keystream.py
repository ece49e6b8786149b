"""Per-period noise from a seed: pinned vectors, a scalar reference, the distribution, the range."""

from __future__ import annotations

import hashlib
import math
import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats

from efpsn.masks.keystream import (
    EXACT_LIMIT,
    MAX_PERIOD,
    exact_bound,
    fixed_point_scales,
    period_noise,
    period_noise_block,
    period_noises,
    portable_log,
    standard_normals,
    stream_nonce,
)
from efpsn.masks.zero_sum import NoiseSpec

SEED = bytes(range(32))
SPEC = NoiseSpec(gamma=1e3, p=1.0, precision=6, num_coefficients=6)

# ------------------------------------------------------------------ a scalar reference, no numpy

_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
       2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
       1.479819860511658591e-01)


def reference_log(x: float) -> float:
    """fdlibm's log with Python floats (binary64, one rounding per operation)."""
    m, e = math.frexp(x)
    if m < 0.70710678118654752440:
        m, e = m * 2.0, e - 1
    k, f = float(e), m - 1.0
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = z * (_LG[0] + w * (_LG[2] + w * (_LG[4] + w * _LG[6])))
    r += w * (_LG[1] + w * (_LG[3] + w * _LG[5]))
    return k * 6.93147180369123816490e-01 - (
        (hfsq - (s * (hfsq + r) + k * 1.90821492927058770002e-10)) - f)


def reference_noise(seed: bytes, period: int, spec: NoiseSpec) -> list[int]:
    """The module docstring's derivation, one value at a time in plain Python."""
    nonce = b"\0\0\0\0efpn" + period.to_bytes(8, "little")
    encryptor = Cipher(algorithms.ChaCha20(seed, nonce), mode=None).encryptor()
    scales = fixed_point_scales(spec)
    normals: list[float] = []
    while len(normals) < spec.num_coefficients:
        w1, w2 = struct.unpack("<QQ", encryptor.update(bytes(16)))
        u, v = (w1 >> 11) * 2.0**-52 - 1.0, (w2 >> 11) * 2.0**-52 - 1.0
        q = u * u + v * v
        if 0.0 < q < 1.0:
            factor = math.sqrt((reference_log(q) * -2.0) / q)
            normals += [u * factor, v * factor]
    return [math.floor(n * float(c)) for n, c in zip(normals, scales, strict=False)]


def test_vectorised_derivation_equals_the_scalar_reference() -> None:
    for spec in (SPEC, NoiseSpec(gamma=7.5, p=2.0, precision=3, num_coefficients=101),
                 NoiseSpec(gamma=1e6, p=0.5, precision=4, num_coefficients=64)):
        for period in (0, 1, 2**40 + 3):
            assert period_noise(SEED, period, spec).tolist() == reference_noise(SEED, period, spec)


def test_portable_log_is_fdlibm_and_within_one_ulp_of_the_true_log() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([np.exp(rng.uniform(-700, 700, 20_000)), rng.uniform(0.5, 2.0, 20_000),
                        [np.finfo(np.float64).tiny, 1.0, 2.0**-104, 1 - 2.0**-52]])
    got = portable_log(x)
    assert got.tolist() == [reference_log(float(v)) for v in x]
    # strided input (another SIMD path) gives the same bits
    assert portable_log(x[::3]).tolist() == got[::3].tolist()
    ulps = np.abs(got - np.log(x)) / np.spacing(np.abs(np.log(x)) + 1e-300)
    assert ulps.max() <= 1.0
    with pytest.raises(ValueError, match="positive, normal"):
        portable_log(np.array([0.5, 0.0]))
    with pytest.raises(ValueError, match="positive, normal"):
        portable_log(np.array([5e-324]))


# ------------------------------------------------------------------ pinned vectors


def test_pinned_vectors() -> None:
    assert stream_nonce(258).hex() == "000000006566706e0201000000000000"
    assert period_noise(SEED, 0, SPEC).tolist() == [
        34693927, 22174782, -4749137, -7227886, -11055122, 1315170]
    assert period_noise(SEED, 1, SPEC).tolist() == [
        19473790, -65192176, -9993822, -12511311, 3199030, -8485609]
    big = period_noise(SEED, 123456789, NoiseSpec(gamma=2.5, p=1.5, precision=9,
                                                   num_coefficients=7851))
    assert big[:3].tolist() == [-2849581200, -1130242058, -1140493126]
    assert hashlib.sha256(big.astype("<i8").tobytes()).hexdigest() == (
        "82a6c698e5ee6ae1e638362c4da70a42f8754b207bc1adf83df980dfeb3c58d5")
    assert standard_normals(SEED, 0, 3).tolist() == [
        1.0971183070776689, 0.9916864164614875, -0.2601209440687592]
    assert [float(v).hex() for v in portable_log(np.array([0.1, 0.5, 1e-300]))] == [
        "-0x1.26bb1bbb55515p+1", "-0x1.62e42fefa39efp-1", "-0x1.5963447f87fb5p+9"]


def test_same_seed_and_period_same_noise_else_different() -> None:
    again = period_noise(bytes(range(32)), 5, SPEC)
    assert np.array_equal(again, period_noise(SEED, 5, SPEC))
    other_seed = bytearray(SEED)
    other_seed[31] ^= 1
    spec = NoiseSpec(gamma=1e3, p=1.0, precision=6, num_coefficients=200)
    rows = [period_noise(SEED, t, spec) for t in range(50)] + [period_noise(bytes(other_seed), 5,
                                                                            spec)]
    assert len({r.tobytes() for r in rows}) == len(rows)
    # ... and not merely different: uncorrelated across periods
    eta = np.stack(rows[:50]) / fixed_point_scales(spec)
    corr = np.corrcoef(eta)
    assert np.abs(corr[np.triu_indices(50, 1)]).max() < 0.35  # 200 samples: |r| ~ 0.07
    assert np.array_equal(period_noises([SEED, bytes(other_seed)], 5, spec)[1], rows[-1])


def test_a_block_of_seeds_and_periods_is_one_call_per_seed_and_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seeds = [SEED, bytes(range(1, 33)), bytes(32)]
    for spec in (SPEC, NoiseSpec(gamma=1e6, p=0.5, precision=4, num_coefficients=7851)):
        block = period_noise_block(seeds, 2**40, 3, spec)
        assert block.shape == (3, 3, spec.num_coefficients) and block.dtype == np.int64
        for i, seed in enumerate(seeds):
            for t in range(3):
                assert np.array_equal(block[i, t], reference_noise(seed, 2**40 + t, spec)
                                      if spec is SPEC else period_noise(seed, 2**40 + t, spec))
    # a stream whose first candidates are too few reads on: force it with no margin at all
    monkeypatch.setattr("efpsn.masks.keystream._candidates", lambda pairs: pairs)
    spec = NoiseSpec(gamma=7.5, p=2.0, precision=3, num_coefficients=101)
    block = period_noise_block(seeds, 7, 2, spec)
    assert [block[i, t].tolist() for i in range(3) for t in range(2)] == [
        reference_noise(seed, 7 + t, spec) for seed in seeds for t in range(2)]
    assert period_noise_block([], 0, 4, spec).shape == (0, 4, 101)
    with pytest.raises(ValueError, match="periods must be >= 1"):
        period_noise_block(seeds, 0, 0, spec)
    with pytest.raises(ValueError, match="period must be"):
        period_noise_block(seeds, 2**64 - 2, 3, spec)


# ------------------------------------------------------------------ distribution


@pytest.mark.slow
def test_normals_are_standard_normal_and_the_test_can_fail() -> None:
    n = standard_normals(SEED, 7, 2_000_000)
    assert stats.kstest(n, "norm").pvalue > 1e-3
    # the same test rejects a 2% scale error and a 0.01 shift: it has the power to fail
    assert stats.kstest(n * 1.02, "norm").pvalue < 1e-9
    assert stats.kstest(n + 0.01, "norm").pvalue < 1e-9
    # tails: |n| > 4 and > 5 as often as a Gaussian's (two-sided binomial tests)
    for cut in (3.0, 4.0, 5.0):
        count = int((np.abs(n) > cut).sum())
        expected = 2 * stats.norm.sf(cut)
        assert stats.binomtest(count, n.size, expected).pvalue > 1e-3, (cut, count)
    assert stats.binomtest(int((np.abs(n * 1.05) > 4).sum()), n.size,
                           2 * stats.norm.sf(4.0)).pvalue < 1e-9


def test_noise_has_mean_zero_and_variance_gamma_over_k_to_the_p() -> None:
    spec = NoiseSpec(gamma=50.0, p=1.0, precision=5, num_coefficients=8)
    z = np.stack([period_noise(SEED, t, spec) for t in range(4000)])
    eta = (z + 0.5) / 10**spec.precision  # floor loses 0.5 units on average
    sigma2 = spec.gamma / np.arange(1, 9) ** spec.p
    df = z.shape[0] - 1
    for k in range(8):
        mean_z = eta[:, k].mean() / math.sqrt(sigma2[k] / z.shape[0])
        assert abs(mean_z) < 4.0, (k, mean_z)
        chi2 = df * eta[:, k].var(ddof=1) / sigma2[k]
        assert 1e-4 < stats.chi2.sf(chi2, df) < 1 - 1e-4, (k, chi2)
    # control: the variance test rejects p = 1.2 at k = 8 (a 52% variance error)
    wrong = spec.gamma / 8**1.2
    assert stats.chi2.sf(df * eta[:, 7].var(ddof=1) / wrong, df) < 1e-9


# ------------------------------------------------------------------ the exact range


def test_scales_are_the_decimal_values_rounded_once() -> None:
    spec = NoiseSpec(gamma=1e3, p=1.5, precision=6, num_coefficients=5)
    scales = fixed_point_scales(spec)
    expected = [1e6 * math.sqrt(1e3 / k**1.5) for k in range(1, 6)]
    assert np.allclose(scales, expected, rtol=1e-15, atol=0)
    assert fixed_point_scales(SPEC)[0] == 31622776.601683792  # 10^6 sqrt(1000), nearest float
    assert not scales.flags.writeable


def test_specs_that_would_leave_the_exact_range_are_refused() -> None:
    assert exact_bound(SPEC) == math.ceil(12.5 * 10**6 * math.sqrt(1e3))
    too_much = NoiseSpec(gamma=1e12, p=1.0, precision=9, num_coefficients=3)
    with pytest.raises(ValueError, match="beyond the exactly representable"):
        period_noise(SEED, 0, too_much)
    edge = NoiseSpec(gamma=1e16, p=1.0, precision=6, num_coefficients=3)  # 12.5 * 1e14 < 2^52
    assert exact_bound(edge) < EXACT_LIMIT
    assert np.abs(period_noise(SEED, 0, edge)).max() < EXACT_LIMIT


def test_bad_seeds_and_periods_are_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes, got 31"):
        period_noise(SEED[:31], 0, SPEC)
    with pytest.raises(TypeError, match="32 bytes, got str"):
        period_noise("x" * 32, 0, SPEC)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="period must be >= 0"):
        period_noise(SEED, -1, SPEC)
    with pytest.raises(ValueError, match="<= 18446744073709551615"):
        stream_nonce(2**64)


def test_a_block_past_the_last_period_is_refused_before_any_stream() -> None:
    # periods first..first+1 must all exist: the largest first period of a 2-period block is
    # MAX_PERIOD - 1, and the refusal says so
    assert period_noise_block([SEED], MAX_PERIOD - 1, 2, SPEC).shape == (1, 2, 6)
    with pytest.raises(ValueError, match=f"period must be >= 0 and <= {MAX_PERIOD - 1}, got "
                                         f"{MAX_PERIOD}"):
        period_noise_block([SEED], MAX_PERIOD, 2, SPEC)
    with pytest.raises(ValueError, match="count must be >= 1, got 0"):
        standard_normals(SEED, 0, 0)
