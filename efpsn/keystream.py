"""Per-period Gaussian noise from a secret seed: a ChaCha20 stream and only exactly rounded arithmetic.

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
from collections.abc import Sequence
from decimal import Context, Decimal

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from efpsn.masking import NoiseSpec

__all__ = [
    "EXACT_LIMIT",
    "NORMAL_BOUND",
    "SEED_BYTES",
    "exact_bound",
    "fixed_point_scales",
    "period_noise",
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


def _log(x: np.ndarray) -> np.ndarray:
    """portable_log without the input check (x positive, normal, finite float64)."""
    mantissa, exponent = np.frexp(x)  # x = mantissa * 2^exponent, mantissa in [0.5, 1)
    low = mantissa < _SQRT_HALF
    mantissa[low] *= 2.0  # exact
    exponent[low] -= 1
    k = exponent.astype(np.float64)
    f = mantissa
    f -= 1.0  # exact (Sterbenz)
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    r += w * (_LG2 + w * (_LG4 + w * _LG6))
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


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


def _accepted(seed: bytes, period: int, pairs: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first `pairs` accepted (u, v, q) of the seed's stream for `period`."""
    draw = _candidates(pairs)
    block = Cipher(algorithms.ChaCha20(seed, stream_nonce(period)), mode=None).encryptor().update(
        bytes(16 * draw))
    u, v, q = _uniform_pairs(np.frombuffer(block, dtype="<u8"))
    keep = (q > 0.0) & (q < 1.0)
    if int(keep.sum()) < pairs:
        return _accepted_one(seed, period, pairs, block)
    last = int(np.flatnonzero(keep)[pairs - 1]) + 1
    keep = keep[:last]
    return u[:last][keep], v[:last][keep], q[:last][keep]


def standard_normals(seed: bytes, period: int, count: int) -> np.ndarray:
    """`count` N(0, 1) draws (float64) of the seed's stream for `period` (steps 1-3 above).

    One seed at a time keeps every temporary small: arrays large enough to be mapped and
    unmapped on each call cost more in page faults than the arithmetic.
    """
    seed = _check_seed(seed)
    count = _check_count("count", count, minimum=1)
    period = _check_count("period", period, minimum=0, maximum=MAX_PERIOD)
    pairs = (count + 1) // 2
    u, v, q = _accepted(seed, period, pairs)
    factor = _log(q)
    factor *= -2.0
    factor /= q
    np.sqrt(factor, out=factor)
    out = np.empty(2 * pairs, dtype=np.float64)
    np.multiply(u, factor, out=out[0::2])
    np.multiply(v, factor, out=out[1::2])
    return out[:count]


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
    if not isinstance(spec, NoiseSpec):
        raise TypeError(f"spec must be a NoiseSpec, got {type(spec).__name__}")
    exact_bound(spec)
    products = standard_normals(seed, period, spec.num_coefficients)
    products *= fixed_point_scales(spec)
    np.floor(products, out=products)
    return products.astype(np.int64)


def period_noises(seeds: Sequence[bytes], period: int, spec: NoiseSpec) -> np.ndarray:
    """period_noise of each seed, stacked: int64 of shape (len(seeds), N)."""
    out = np.empty((len(seeds), spec.num_coefficients), dtype=np.int64)
    for row, seed in enumerate(seeds):
        out[row] = period_noise(seed, period, spec)
    return out
