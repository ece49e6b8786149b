"""Per-period Gaussian noise from a secret seed: a ChaCha20 stream and only exactly rounded
arithmetic.

Both ends of an edge expand the same 32-byte seed into the same integers on any machine. The
derivation therefore uses only operations IEEE-754 binary64 rounds exactly (+ - * / sqrt,
frexp/ldexp, floor, comparisons, int <-> float conversions of exactly representable values) and
integer arithmetic; never a libm function (log, exp, cos), whose last bit differs between
platforms and numpy builds. Every numpy ufunc used here evaluates one such operation per element,
so SIMD and scalar paths agree bit for bit. (It assumes binary64 with round-to-nearest-even, as on
x86-64 and aarch64.)

The derivation, for seed s, period t and NoiseSpec (gamma, p, P, N):

1. Stream: ChaCha20 (RFC 7539, `cryptography`) with key s and the 16-byte nonce
   counter = 0 (4 bytes little-endian) || b"efpn" || t (8 bytes little-endian); the keystream
   (the encryption of zero bytes) is read as little-endian uint64 words w_0, w_1, ...
2. Uniforms: a_i = (w_i >> 11) * 2^-52 - 1, a multiple of 2^-52 in [-1, 1) (each step exact).
3. Normals (Marsaglia's polar method): candidate pair r is (u, v) = (a_2r, a_2r+1) and
   q = u*u + v*v; pairs with q == 0 or q >= 1 are rejected. Accepted pair number c gives normals
   2c and 2c+1: u*f and v*f with f = sqrt((log(q) * -2) / q), where log is `portable_log` below
   (fdlibm's algorithm with its fixed coefficients). Normal k-1 is used for coefficient k.
4. Scales: c_k = 10^P sqrt(gamma / k^p) computed in 60-digit decimal arithmetic (exact integer
   powers; otherwise exp(p ln k), ln and exp correctly rounded) and rounded once to the nearest
   float64 (`fixed_point_scales`).
5. Fixed point: z_k = floor(n_k * c_k), the product rounded to nearest, the floor exact because
   |n_k * c_k| < 2^52 is checked up front: q >= 2^-104, so |n| <= sqrt(-2 ln q) <= 12.01 always,
   and `exact_bound` refuses a spec for which 12.5 * c_1 could reach 2^52 (EXACT_LIMIT).

So z_k is floor(10^P eta_k) for eta_k ~ N(0, gamma / k^p), up to the rounding of one product.
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
from collections.abc import Sequence
from decimal import Context, Decimal

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from efpsn.masks.zero_sum import NoiseSpec

__all__ = [
    "EXACT_LIMIT",
    "NORMAL_BOUND",
    "SEED_BYTES",
    "exact_bound",
    "fixed_point_scales",
    "period_noise",
    "period_noise_block",
    "period_noises",
    "portable_log",
    "standard_normals",
    "stream_nonce",
]

SEED_BYTES = 32
"""A seed is a 256-bit ChaCha20 key."""
NORMAL_BOUND = 12.5
"""Every normal the polar method yields here satisfies |n| <= sqrt(208 ln 2) < 12.01 < 12.5."""
EXACT_LIMIT = 2**52
"""|z_k| and every float product before the floor stay below this, so the floor is exact."""
MAX_PERIOD = 2**64 - 1
_DOMAIN = b"efpn"
_ACCEPT = math.pi / 4  # acceptance rate of the polar method

# fdlibm e_log.c (Sun Microsystems, 1993): ln2 split in two and the minimax coefficients of
# R(z) ~ log((1+s)/(1-s)) / s - 2, z = s^2, on [0, 0.1716]; error below 1 ulp.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_SQRT_HALF = 0.70710678118654752440


def portable_log(x: np.ndarray) -> np.ndarray:
    """Natural log of positive normal float64 values, the same bits on every IEEE-754 machine.

    fdlibm's __ieee754_log without its shortcuts: x = 2^k (1 + f) with sqrt(2)/2 <= 1 + f <
    sqrt(2) (frexp, an exact doubling, and 1 + f - 1 exact by Sterbenz), s = f / (2 + f),
    log(x) = k ln2_hi - ((f^2/2 - (s (f^2/2 + R(s^2)) + k ln2_lo)) - f). Only + - * / and
    comparisons, in a fixed order. Zero, negative, subnormal or non-finite input is refused.
    """
    x = np.asarray(x, dtype=np.float64)
    if not (np.all(x >= np.finfo(np.float64).tiny) and np.all(np.isfinite(x))):
        raise ValueError("portable_log needs positive, normal, finite float64 values")
    return _log(x)


class _LogWork:
    """Scratch arrays of _log for inputs of one shape (reused from call to call)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.mantissa = np.empty(shape)
        self.exponent = np.empty(shape, dtype=np.intc)
        self.low = np.empty(shape, dtype=bool)
        self.k, self.hfsq, self.s, self.z, self.w, self.r, self.r2 = (
            np.empty(shape) for _ in range(7))


def _log(x: np.ndarray, work: _LogWork | None = None) -> np.ndarray:
    """portable_log without the input check (x positive, normal, finite float64), into `work`'s
    arrays (the result is work.k: valid until work is used again).

    Each line is one of fdlibm's operations on every element, in fdlibm's order (products and
    sums written the other way round are the same IEEE operation)."""
    w_ = _LogWork(x.shape) if work is None else work
    mantissa, exponent = np.frexp(x, out=(w_.mantissa, w_.exponent))  # mantissa in [0.5, 1)
    np.less(mantissa, _SQRT_HALF, out=w_.low)
    np.multiply(mantissa, 2.0, out=mantissa, where=w_.low)  # exact
    np.subtract(exponent, 1, out=exponent, where=w_.low)
    k = w_.k
    np.copyto(k, exponent)  # int -> float64, exact
    f = mantissa
    f -= 1.0  # exact (Sterbenz)
    hfsq = np.multiply(f, 0.5, out=w_.hfsq)
    hfsq *= f  # 0.5 * f * f
    s = np.add(f, 2.0, out=w_.s)
    np.divide(f, s, out=s)  # f / (2 + f)
    z = np.multiply(s, s, out=w_.z)
    w = np.multiply(z, z, out=w_.w)
    r = np.multiply(w, _LG7, out=w_.r)
    for c in (_LG5, _LG3):
        r += c
        r *= w
    r += _LG1
    r *= z  # z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)))
    r2 = np.multiply(w, _LG6, out=w_.r2)
    r2 += _LG4
    r2 *= w
    r2 += _LG2
    r2 *= w
    r += r2  # + w * (LG2 + w * (LG4 + w * LG6))
    r += hfsq
    r *= s  # s * (hfsq + r)
    np.multiply(k, _LN2_LO, out=w)
    r += w  # ... + k * ln2_lo
    np.subtract(hfsq, r, out=r)
    r -= f  # (hfsq - (...)) - f
    k *= _LN2_HI
    k -= r  # k * ln2_hi - (...)
    return k


def _check_seed(seed: object) -> bytes:
    if not isinstance(seed, bytes | bytearray):
        raise TypeError(f"a seed must be {SEED_BYTES} bytes, got {type(seed).__name__}")
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a seed must be {SEED_BYTES} bytes, got {len(seed)}")
    return bytes(seed)


def _check_count(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{upper}, got {value}")
    return int(value)


def stream_nonce(period: int) -> bytes:
    """The 16-byte ChaCha20 nonce of `period`: counter 0 (4 bytes) || b"efpn" || period (8, LE)."""
    period = _check_count("period", period, minimum=0, maximum=MAX_PERIOD)
    return b"\x00\x00\x00\x00" + _DOMAIN + period.to_bytes(8, "little")


def _uniform_pairs(words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u, v, q = u*u + v*v) of the candidate pairs in uint64 `words` (..., 2M) -> (..., M)."""
    a = (words >> np.uint64(11)).astype(np.float64)  # < 2^53: exact
    a *= 2.0**-52  # exact (a power of two), in [0, 2)
    a -= 1.0  # exact: a multiple of 2^-52 in [-1, 1)
    u, v = a[..., 0::2], a[..., 1::2]
    return u, v, u * u + v * v


def _candidates(pairs: int) -> int:
    """Candidate pairs read for `pairs` accepted ones: enough for 6 standard deviations of bad
    luck (more are read when that is not enough; the result does not depend on this number)."""
    return int(pairs / _ACCEPT + 6.0 * math.sqrt(pairs * (1 - _ACCEPT)) / _ACCEPT) + 16


def _accepted_one(seed: bytes, period: int, pairs: int, first: bytes
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first `pairs` accepted (u, v, q) of one stream whose first bytes are `first`
    (continuing the stream while too few candidates were accepted)."""
    encryptor = Cipher(algorithms.ChaCha20(seed, stream_nonce(period)), mode=None).encryptor()
    encryptor.update(bytes(len(first)))  # skip what `first` holds
    chunks = [_uniform_pairs(np.frombuffer(first, dtype="<u8"))]
    have = sum(int(((q > 0.0) & (q < 1.0)).sum()) for _, _, q in chunks)
    while have < pairs:
        words = np.frombuffer(encryptor.update(bytes(16 * _candidates(pairs - have))), "<u8")
        chunks.append(_uniform_pairs(words))
        have += int(((chunks[-1][2] > 0.0) & (chunks[-1][2] < 1.0)).sum())
    u, v, q = (np.concatenate([c[i] for c in chunks]) for i in range(3))
    keep = (q > 0.0) & (q < 1.0)
    return u[keep][:pairs], v[keep][:pairs], q[keep][:pairs]


def _polar(uv: np.ndarray, q: np.ndarray, work: _LogWork | None = None) -> np.ndarray:
    """Accepted pairs (M, 2) and their q (M,) -> the pairs' normals, in place in `uv` (step 3):
    u * f and v * f with f = sqrt((log(q) * -2) / q)."""
    factor = _log(q, work)
    factor *= -2.0
    factor /= q
    np.sqrt(factor, out=factor)
    np.multiply(uv, factor[:, None], out=uv)
    return uv


class _Pass:
    """One pass over `rows` streams of `count` normals: steps 1-3 for all of them at once, in
    buffers reused from pass to pass (arrays allocated anew on every call cost more in page
    faults and cache misses than the arithmetic)."""

    def __init__(self, rows: int, count: int, draw: int) -> None:
        self.rows, self.count, self.draw = rows, count, draw
        self.pairs = pairs = (count + 1) // 2
        self.size = 16 * draw
        self.zeros = bytes(self.size)
        self.stream = bytearray(rows * self.size + 63)  # + room that update_into may ask for
        self.words = np.frombuffer(self.stream, dtype="<u8", count=rows * 2 * draw).reshape(
            rows, 2 * draw)
        self.shifted = np.empty_like(self.words)
        self.uniform = np.empty(self.words.shape)
        self.q, self.vv = np.empty((rows, draw)), np.empty((rows, draw))
        self.keep, self.ok = np.empty((rows, draw), bool), np.empty((rows, draw), bool)
        self.rank = np.empty((rows, draw), dtype=np.int64)
        self.uv, self.accepted = np.empty((rows * pairs, 2)), np.empty(rows * pairs)
        self.log = _LogWork((rows * pairs,))

    def normals(self, streams: Sequence[tuple[bytes, int]]) -> np.ndarray | None:
        """(rows, count) normals of the streams (a view of the pass's buffer, valid until its
        next use), or None when some stream's first candidates hold too few accepted pairs."""
        view = memoryview(self.stream)
        for row, (seed, period) in enumerate(streams):
            Cipher(algorithms.ChaCha20(seed, stream_nonce(period)), mode=None).encryptor(
            ).update_into(self.zeros, view[row * self.size:])
        np.right_shift(self.words, np.uint64(11), out=self.shifted)  # < 2^53
        np.multiply(self.shifted, 2.0**-52, out=self.uniform)  # exact: to float64, times 2^-52
        self.uniform -= 1.0  # exact: a multiple of 2^-52 in [-1, 1)
        u, v = self.uniform[:, 0::2], self.uniform[:, 1::2]
        q = np.multiply(u, u, out=self.q)
        q += np.multiply(v, v, out=self.vv)  # u*u + v*v
        keep = np.greater(q, 0.0, out=self.keep)
        keep &= np.less(q, 1.0, out=self.ok)
        rank = np.cumsum(keep, axis=1, out=self.rank)
        if int(rank[:, -1].min()) < self.pairs:
            return None
        keep &= np.less_equal(rank, self.pairs, out=self.ok)  # the first `pairs` accepted
        flat = keep.reshape(-1)
        np.compress(flat, self.uniform.reshape(-1, 2), axis=0, out=self.uv)
        np.compress(flat, q.reshape(-1), out=self.accepted)
        _polar(self.uv, self.accepted, self.log)
        return self.uv.reshape(self.rows, 2 * self.pairs)[:, :self.count]


_PASS_PAIRS = 4096
"""Accepted pairs per pass (several streams per pass when N is small): a pass's buffers then
stay in the CPU's caches."""
_KEPT_PAIRS = 16_384  # larger passes (one huge stream) are not kept for reuse
_passes = threading.local()


def _normals(streams: Sequence[tuple[bytes, int]], count: int) -> np.ndarray:
    """`count` N(0, 1) draws of each (seed, period) stream (steps 1-3 above), (len(streams),
    count): the reused pass's buffer, or new arrays when a stream needs to read on."""
    pairs = (count + 1) // 2
    key = (len(streams), count, _candidates(pairs))
    cache: dict[tuple[int, int, int], _Pass] = _passes.__dict__.setdefault("cache", {})
    work = cache.get(key) or _Pass(*key)
    if key not in cache and len(streams) * pairs <= _KEPT_PAIRS:
        if len(cache) >= 8:
            cache.pop(next(iter(cache)))
        cache[key] = work
    normals = work.normals(streams)
    if normals is not None:
        return normals
    out = np.empty((len(streams), 2 * pairs))
    for row, (seed, period) in enumerate(streams):
        u, v, q = _accepted_one(seed, period, pairs, b"")
        out[row] = _polar(np.stack([u, v], axis=1), q).reshape(-1)
    return out[:, :count]


def standard_normals(seed: bytes, period: int, count: int) -> np.ndarray:
    """`count` N(0, 1) draws (float64) of the seed's stream for `period` (steps 1-3 above)."""
    seed = _check_seed(seed)
    count = _check_count("count", count, minimum=1)
    period = _check_count("period", period, minimum=0, maximum=MAX_PERIOD)
    return _normals([(seed, period)], count)[0].copy()


@functools.lru_cache(maxsize=16)
def fixed_point_scales(spec: NoiseSpec) -> np.ndarray:
    """c_k = 10^P sqrt(gamma / k^p), k = 1..N: the float64 nearest a 60-digit decimal value.

    Decimal arithmetic is software (the same digits everywhere): k^p is exact for integral p and
    exp(p ln k) otherwise, then the quotient and sqrt are correctly rounded at 60 digits, the
    power of ten exact, and float() rounds once more, to nearest. A read-only array.
    """
    if not isinstance(spec, NoiseSpec):
        raise TypeError(f"spec must be a NoiseSpec, got {type(spec).__name__}")
    ctx = Context(prec=60)
    gamma, p = Decimal(spec.gamma), Decimal(spec.p)
    integral = spec.p == int(spec.p)
    scales = np.empty(spec.num_coefficients, dtype=np.float64)
    for k in range(1, spec.num_coefficients + 1):
        if integral:
            power = Decimal(k ** int(spec.p))
        else:
            power = ctx.exp(ctx.multiply(p, ctx.ln(Decimal(k))))
        scales[k - 1] = float(ctx.sqrt(ctx.divide(gamma, power)).scaleb(spec.precision))
    scales.setflags(write=False)
    return scales


def exact_bound(spec: NoiseSpec) -> int:
    """An upper bound on |z_k| for the spec; ValueError if z could leave the exact range.

    |n_k c_k| <= 12.01 c_1 (1 + 2^-52) < 12.5 c_1, which must stay below 2^52 (EXACT_LIMIT) so
    that every product before the floor lies where float64 holds every integer.
    """
    top = NORMAL_BOUND * float(fixed_point_scales(spec)[0])
    if not top < EXACT_LIMIT:
        raise ValueError(
            f"gamma={spec.gamma:g} at precision P={spec.precision} gives fixed-point noise up to "
            f"{top:.3g}, beyond the exactly representable 2^52 = {EXACT_LIMIT:.3g}: lower the "
            "precision or gamma"
        )
    return math.ceil(top)


def period_noise(seed: bytes, period: int, spec: NoiseSpec) -> np.ndarray:
    """z_k = floor(n_k c_k), k = 1..N, of one seed and period: int64 of shape (N,)."""
    return period_noise_block([seed], period, 1, spec)[0, 0]


def period_noises(seeds: Sequence[bytes], period: int, spec: NoiseSpec) -> np.ndarray:
    """period_noise of each seed, stacked: int64 of shape (len(seeds), N)."""
    return period_noise_block(seeds, period, 1, spec)[:, 0]


def period_noise_block(seeds: Sequence[bytes], first: int, periods: int, spec: NoiseSpec
                       ) -> np.ndarray:
    """period_noise of every seed for periods first..first+periods-1 in one pass: int64 of
    shape (len(seeds), periods, N). The same integers as one call per (seed, period): every
    element goes through the same operations; the pass only saves the per-call overhead."""
    if not isinstance(spec, NoiseSpec):
        raise TypeError(f"spec must be a NoiseSpec, got {type(spec).__name__}")
    exact_bound(spec)
    checked = [_check_seed(seed) for seed in seeds]
    periods = _check_count("periods", periods, minimum=1)
    first = _check_count("period", first, minimum=0, maximum=MAX_PERIOD - periods + 1)
    streams = [(seed, first + t) for seed in checked for t in range(periods)]
    count = spec.num_coefficients
    out = np.empty((len(streams), count), dtype=np.int64)
    scales = fixed_point_scales(spec)
    per_pass = max(1, _PASS_PAIRS // ((count + 1) // 2))
    for start in range(0, len(streams), per_pass):
        products = _normals(streams[start:start + per_pass], count)
        products *= scales
        np.floor(products, out=products)
        out[start:start + len(products)] = products  # exact integers to int64
    return out.reshape(len(checked), periods, count)
