"""The default mask (`--refresh fading:RHO[:FLOOR]`): a fixed zero-sum part and a fresh zero-sum
part every round that fades as RHO^t down to FLOOR (0 unless given), both from the seeds phase I
shares under Paillier.

Agent i's mask of round t, two integer vectors over public denominators:

    eta_bar_i(t) = fixed_i / 10^P + fresh_i(t) / (10^P 2^k(t)),
    fresh_i(t) = sum_{j in N(i)} sign_ij trunc(f(t) 2^k(t) w_k(e_ij, t)),
    f(t) = max(fade(RHO, t), FLOOR),

- fixed_i = sum_j (z(s_ij, 0) - z(s_ji, 0)): period 0 of the per-direction seed streams
  (efpsn/masks/keystream.py), the same integers `every:R` uses for its first period;
- e_ij = SHA-256("efpsn fading edge" || s_lo,hi || s_hi,lo), one secret per edge that both ends
  derive from the two seeds they exchanged (lo < hi the two agents' indices), so each edge's
  stream is derived once per round instead of once per direction;
- w_k(e, t) = (c_k sqrt(2) / 4) (b_k - 32), b_k the number of set bits of the k-th little-endian
  uint64 word of ChaCha20 (key e, nonce counter 0 || "efpf" || t, 8 bytes LE): b_k - 32 is a
  centred binomial of variance 16, so an edge's term has variance 2 c_k^2 at round 0 and
  deg(i) edges give 2 deg(i) c_k^2, the fixed part's variance (c_k = 10^P sqrt(gamma / k^p),
  keystream.fixed_point_scales); one popcount per coefficient instead of a polar-method
  normal;
- sign_ij = +1 when i < j, -1 otherwise, and fade(RHO, t) = RHO^t by binary powering, every
  step one IEEE multiplication (the same bits on every machine);
- k(t) >= 0 the public exponent that puts f(t) 2^k(t) in [1/2, 1] (math.frexp, exact),
  so the fresh integers keep their 40-odd significant bits in every round: the fresh part
  shrinks as RHO^t but never rounds to zero, and late rounds are never bare.

Both ends of an edge compute the same trunc(...) integer, once with + and once with -, so both
integer vectors sum to zero exactly over the agents, every round. The float64 value is
(fixed + ldexp(fresh, -k)) / 10^P: one exact power-of-two scaling, one addition and one
division, the same bits on every machine.

Why it keeps both promises: the fixed part is mixed away like the paper's mask; the fresh part's
increments enter gradient tracking's trackers but die out no faster than the algorithm contracts
(RHO is the step rule's rate, efpsn.params.step_rule.fading_rate), so the run ends where the
unmasked run ends, while every two rounds' difference (which cancels a fixed mask) carries fresh
noise that is large against the gradient's own change for as long as that change is.

What it costs, and why RHO is not faster (docs/RESULTS.md "Why a masked run stops
later"): the fresh part starts about sqrt(gamma) in size, orders above the gradient's change, and
drives the agents apart by that much, so the stop rule's certificate waits until it has faded
below the target: about twice the unmasked run's rounds. Fading faster (RHO^1.5, RHO^2) ends
near the unmasked round but leaves the last rounds with less fresh noise than gradient change,
and the many-round regressions then recover a private sample better than the output alone
does (wine: 0.155 at RHO^1.1 down to 0.002 at RHO^2, against 0.175 at RHO and 0.169 from the
output), even on the rounds the stop rule really runs.

The floor is for mini-batch training (efpsn.params.step_rule.fading_floor): there the steps' own
batch noise never dies out, so a fresh part that does leaves late rounds' difference a bare batch
gradient, from which iDLG reconstructed a LeNet training image (docs/RESULTS.md section 12,
with the floor's figures). Full-batch runs have none: a fresh part that stays would keep their
iterates apart, so RunConfig refuses a floor there.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from efpsn.masks.keystream import fixed_point_scales
from efpsn.masks.refresh import NoiseBlocks, check_seeded_mask
from efpsn.masks.seeds import EdgeSeeds
from efpsn.masks.zero_sum import MaskCoefficients, NoiseSpec
from efpsn.params.refresh_setting import Refresh

__all__ = ["FadingMask", "binomial_noise", "edge_seed", "fade", "fresh_scales"]

_EDGE_DOMAIN = b"efpsn fading edge"
_NONCE_DOMAIN = b"efpf"
_BINOMIAL_MAX = 32  # |b - 32| <= 32 for a 64-bit word


def fade(rate: float, t: int) -> float:
    """rate^t by binary powering: one correctly rounded multiplication per step, so every
    machine gets the same float64 (libm's pow may differ in the last bit)."""
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
        raise ValueError(f"round must be an int >= 0, got {t!r}")
    result, base, power = 1.0, float(rate), int(t)
    while power:
        if power & 1:
            result *= base
        base *= base
        power >>= 1
    return result


def edge_seed(low_sent: bytes, high_sent: bytes) -> bytes:
    """The edge's fresh-noise key from the seed the lower-indexed agent sent and the one the
    higher-indexed agent sent (both ends hold both)."""
    return hashlib.sha256(_EDGE_DOMAIN + low_sent + high_sent).digest()


def binomial_noise(seed: bytes, t: int, count: int) -> np.ndarray:
    """b_k - 32 for k = 1..count: popcounts of ChaCha20's words (key `seed`, round t), int64."""
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < 2**64:
        raise ValueError(f"round must be an int in [0, 2^64), got {t!r}")
    stream = Cipher(algorithms.ChaCha20(seed, _nonce(t)), mode=None).encryptor()
    words = np.frombuffer(stream.update(bytes(8 * count)), dtype="<u8")
    return np.bitwise_count(words).astype(np.int64) - _BINOMIAL_MAX


def _nonce(t: int) -> bytes:
    return b"\x00\x00\x00\x00" + _NONCE_DOMAIN + int(t).to_bytes(8, "little")


class _Scratch:
    """Buffers one agent's fresh part reuses from round to round (binomial_noise's steps for
    every edge, in place: a round's arrays allocated anew cost more in page faults and cache
    misses than the arithmetic)."""

    def __init__(self, count: int) -> None:
        self.zeros = bytes(8 * count)
        self.stream = bytearray(8 * count + 63)  # + room that update_into may ask for
        self.words = np.frombuffer(self.stream, dtype="<u8", count=count)
        self.bits = np.empty(count, dtype=np.uint8)
        self.weights = np.empty(count)
        self.term = np.empty(count, dtype=np.int64)

    def truncated(self, seed: bytes, t: int, scales: np.ndarray, factor: float) -> np.ndarray:
        """trunc(scales (b - 32) factor) as float64 integers (a view of the scratch: use it at
        once): the same operations as binomial_noise then FadingMask.fresh's, element by
        element. b - 32 is formed in the popcounts' own bytes (b <= 64: b - 32 wraps to the
        same int8), which the product converts exactly."""
        Cipher(algorithms.ChaCha20(seed, _nonce(t)), mode=None).encryptor().update_into(
            self.zeros, self.stream)
        np.bitwise_count(self.words, out=self.bits)
        np.subtract(self.bits, _BINOMIAL_MAX, out=self.bits)  # b - 32 mod 256
        np.multiply(self.bits.view(np.int8), scales, out=self.weights)  # (b - 32) scales
        self.weights *= factor
        np.trunc(self.weights, out=self.weights)
        return self.weights

    def term_of(self, seed: bytes, t: int, scales: np.ndarray, factor: float) -> np.ndarray:
        """truncated(...) as int64 (a view of the scratch: use it at once); |.| < 2^52: exact."""
        np.copyto(self.term, self.truncated(seed, t, scales, factor), casting="unsafe")
        return self.term


def fresh_scales(spec: NoiseSpec) -> np.ndarray:
    """c_k sqrt(2) / 4: a fresh term's weight per unit of (b_k - 32) (read-only)."""
    scales = fixed_point_scales(spec) * (math.sqrt(2.0) / 4.0)
    scales.setflags(write=False)
    return scales


class FadingMask:
    """Agent i's mask of round t (a MaskProvider): the fixed part plus the fading fresh part.

    ValueError when the refresh is not a resolved `fading:RHO`, or when the sum could
    leave int64 (3 deg(i) max|z| < 2^63 is checked)."""

    new_values = True  # values(t) is a new array at every call (a round's perturbation keeps it)

    def __init__(self, *, seeds: EdgeSeeds, spec: NoiseSpec, refresh: Refresh,
                 blocks: NoiseBlocks | None = None,
                 starts: Mapping[int, int] | None = None) -> None:
        # two fixed streams and one fresh stream per neighbour
        check_seeded_mask(seeds, spec, blocks, streams_per_neighbour=3)
        if not isinstance(refresh, Refresh) or refresh.fade is None:
            raise ValueError(f"FadingMask needs a resolved 'fading:RHO' refresh, got {refresh}")
        self.seeds, self.spec, self.refresh = seeds, spec, refresh
        self.rate, self.floor = refresh.fade, refresh.floor
        blocks = NoiseBlocks(spec, periods=1) if blocks is None else blocks
        rows = blocks.noise([s for _, s in seeds.sent] + [s for _, s in seeds.received], 0)
        deg = len(seeds.neighbours)
        self.fixed = rows[:deg].sum(axis=0) - rows[deg:].sum(axis=0)
        self.fixed.setflags(write=False)
        sent, received = dict(seeds.sent), dict(seeds.received)
        # the round each edge's fresh part fades from: 0 (phase I's), or a join's round
        self.starts = {j: int((starts or {}).get(j, 0)) for j in seeds.neighbours}
        if any(v < 0 for v in self.starts.values()):
            raise ValueError(f"an edge's fading starts at a round >= 0, got {self.starts}")
        signed = {j: (1, edge_seed(sent[j], received[j])) if seeds.agent < j
                  else (-1, edge_seed(received[j], sent[j])) for j in seeds.neighbours}
        self.edges = tuple(signed[j] for j in seeds.neighbours if not self.starts[j])
        # the edges a join made, by the round they fade from (efpsn/departure/joins.py)
        self.later = {r: tuple(signed[j] for j in seeds.neighbours if self.starts[j] == r)
                      for r in sorted(set(self.starts.values()) - {0})}
        self._later_t: int | None = None
        self._later: tuple[tuple[int, np.ndarray, int], ...] = ()
        self.scales = fresh_scales(spec)
        self._fixed_values = self.fixed.astype(np.float64)  # what adding the int64s converts
        self._divisor = float(10**spec.precision)
        self._scratch = _Scratch(spec.num_coefficients)
        self._t: int | None = None
        self._fresh = np.zeros_like(self.fixed)
        self._exponent = 0
        # the fresh sum in float64 is exact while every partial sum stays below 2^53: then
        # values() adds the edges' truncated terms as floats, without int64 conversions
        self._float_exact = (len(self.edges) * 2.0 * _BINOMIAL_MAX
                             * float(np.max(self.scales, initial=0.0)) < 2.0**52)
        self._float_t: int | None = None
        self._float_fresh = np.zeros(spec.num_coefficients)
        self._float_exponent = 0

    def faded(self, t: int) -> float:
        """The fresh part's size at round t: max(RHO^t, FLOOR), the same float64 everywhere."""
        return max(fade(self.rate, t), self.floor)

    def exponent(self, t: int) -> int:
        """k(t): faded(t) 2^k(t) lies in [1/2, 1] (k = 0 while it is above 1/2)."""
        mantissa, power = math.frexp(self.faded(t))
        return max(0, -power) if mantissa else 0

    def fresh(self, t: int) -> tuple[np.ndarray, int]:
        """Round t's fresh integers (int64, read-only) and k(t): the fresh part is
        fresh / (10^P 2^k). Cached for the last round asked. While the float sum is exact
        (_float_exact) they are values()'s fresh floats converted, so a round whose integers
        are checked too (the simulator's zero sum) runs each edge's keystream once."""
        if t != self._t:
            if self._float_exact:  # values()'s exact float sum, converted: one keystream pass
                values, exponent = self._fresh_values(t)
                fresh = values.astype(np.int64)
            else:
                exponent = self.exponent(t)
                factor = math.ldexp(self.faded(t), exponent)  # exact: a power of two
                fresh = np.zeros(self.spec.num_coefficients, dtype=np.int64)
                for sign, seed in self.edges:  # binomial_noise's words, weighted, truncated
                    term = self._scratch.term_of(seed, t, self.scales, factor)
                    if sign > 0:
                        fresh += term
                    else:
                        fresh -= term
            fresh.setflags(write=False)
            self._t, self._fresh, self._exponent = t, fresh, exponent
        return self._fresh, self._exponent

    def integer_parts(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(fixed, fresh(t)): the two integer vectors of phase I's edges that each sum to zero
        over the agents (integer_groups adds the edges a join made)."""
        return self.fixed, self.fresh(t)[0]

    def later_parts(self, t: int) -> tuple[tuple[int, np.ndarray, int], ...]:
        """The fresh part of the edges a join made at round r, per r: (r, its integers (int64,
        read-only), k(t - r)); it fades from r as phase I's edges fade from 0, so a party
        that joins late is not masked by a part already faded. Cached for the last round."""
        if t != self._later_t:
            parts = []
            for start, edges in self.later.items():
                age = max(0, t - start)
                exponent = self.exponent(age)
                factor = math.ldexp(self.faded(age), exponent)  # exact: a power of two
                fresh = np.zeros(self.spec.num_coefficients, dtype=np.int64)
                for sign, seed in edges:  # the round's own keystream (nonce t), faded from r
                    term = self._scratch.term_of(seed, t, self.scales, factor)
                    if sign > 0:
                        fresh += term
                    else:
                        fresh -= term
                fresh.setflags(write=False)
                parts.append((start, fresh, exponent))
            self._later_t, self._later = t, tuple(parts)
        return self._later

    def integer_groups(self, t: int) -> dict[str, np.ndarray]:
        """Every integer vector of round t's mask that sums to zero over the agents, by name:
        "fixed", "fresh" (phase I's edges) and "fresh from round r" per join."""
        groups = {"fixed": self.fixed, "fresh": self.fresh(t)[0]}
        for start, fresh, _ in self.later_parts(t):
            groups[f"fresh from round {start}"] = fresh
        return groups

    def coefficients(self, t: int) -> MaskCoefficients:
        """Round t's mask as exact integers over 10^P: only while k(t) = 0 (the first rounds,
        where the fresh part shares the fixed part's denominator)."""
        fresh, exponent = self.fresh(t)
        later = self.later_parts(t)
        if exponent or any(k for _, _, k in later):
            raise ValueError(f"round {t}'s fresh part has denominator 10^P 2^k, k > 0: use "
                             "integer_parts()")
        total = self.fixed + fresh
        for _, part, _ in later:
            total = total + part
        return MaskCoefficients(tuple(total.tolist()), self.spec.precision)

    def values(self, t: int) -> np.ndarray:
        """eta_bar_i(t) = (fixed + ldexp(fresh, -k)) / 10^P as float64 (|integers| < 2^53), a
        new array at every call."""
        if self._float_exact:
            fresh_values, exponent = self._fresh_values(t)
            total = (np.ldexp(fresh_values, -exponent) if exponent
                     else fresh_values.copy())
        else:
            fresh, exponent = self.fresh(t)
            total = fresh.astype(np.float64)
            if exponent:
                np.ldexp(total, -exponent, out=total)
        for _, part, k in self.later_parts(t):  # each join's edges over their own 2^k
            total += np.ldexp(part.astype(np.float64), -k)
        total += self._fixed_values
        total /= self._divisor
        return total

    def _fresh_values(self, t: int) -> tuple[np.ndarray, int]:
        """Round t's fresh integers as float64 (a reused buffer) and k(t): the edges' truncated
        terms summed as floats, in fresh()'s order. Every partial sum is an integer below
        2^53 (_float_exact), so each addition is exact and the total is fresh()'s, converted;
        0 - 0 and x - x are +0.0, as the conversion of an int64 0 gives."""
        if t != self._float_t:
            exponent = self.exponent(t)
            factor = math.ldexp(self.faded(t), exponent)  # exact: a power of two
            total = self._float_fresh
            for e, (sign, seed) in enumerate(self.edges):
                term = self._scratch.truncated(seed, t, self.scales, factor)
                base = 0.0 if e == 0 else total  # the first edge: 0 + term, 0 - term
                (np.add if sign > 0 else np.subtract)(base, term, out=total)
            if not self.edges:
                total.fill(0.0)
            self._float_t, self._float_exponent = t, exponent
        return self._float_fresh, self._float_exponent
