"""Fixed-point integer encoding of noise and slot packing into Paillier plaintexts (pure ints)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Context, Decimal

import numpy as np

__all__ = ["SlotLayout", "decode_fixed", "encode_fixed"]

# Plaintexts produced by SlotLayout.pack stay below 2^(key_bits - PLAINTEXT_MARGIN_BITS). A
# key_bits-bit modulus n satisfies n >= 2^(key_bits - 1), so one bit of margin already keeps every
# homomorphic sum below n; the second bit is slack against a modulus one bit shorter than announced.
PLAINTEXT_MARGIN_BITS = 2


def _check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """Return `value` as an int (bool refused), optionally checking value >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def encode_fixed(values: Sequence[float], *, precision: int) -> list[int]:
    """z = floor(10^P * v) for every v, as exact Python ints.

    The floor is taken of the exact real number the float64 `v` stands for, times 10^P, not of
    the rounded float product: v = a / 2^e exactly (float.as_integer_ratio), so
    z = (a * 10^P) // 2^e in integer arithmetic. This is deterministic on every platform and exact
    for every P. It differs from math.floor(10**P * v) only when the float product rounds across an
    integer, e.g. -0.1 is stored as -0.1000000000000000055..., so encode_fixed([-0.1], precision=3)
    is [-101] while math.floor(-0.1 * 1000) is -100.
    """
    precision = _check_int("precision", precision, minimum=0)
    scale = 10**precision
    out: list[int] = []
    for index, v in enumerate(np.asarray(values, dtype=np.float64).ravel().tolist()):
        if not math.isfinite(v):
            raise ValueError(f"encode_fixed needs finite values, got {v!r} at position {index}")
        numerator, denominator = v.as_integer_ratio()  # denominator is a power of two, > 0
        out.append((numerator * scale) // denominator)  # Python's // floors towards -infinity
    return out


def decode_fixed(ints: Sequence[int], *, precision: int) -> np.ndarray:
    """ints / 10^P as float64, each correctly rounded (Python's int / int true division)."""
    precision = _check_int("precision", precision, minimum=0)
    scale = 10**precision
    out = np.empty(len(ints), dtype=np.float64)
    for index, z in enumerate(ints):
        out[index] = _check_int(f"ints[{index}]", z) / scale
    return out


@dataclass(frozen=True, kw_only=True)
class SlotLayout:
    """How signed integers |z| <= bound are packed, `slots` per Paillier plaintext.

    Slot order is little-end first: slot 0 occupies the lowest `slot_bits` bits of a plaintext,
    slot s the bits [s * slot_bits, (s + 1) * slot_bits). Value number v of a sequence goes to
    plaintext v // slots, slot v % slots. Each slot stores z + bound, which lies in [0, 2 * bound];
    a sum of up to `max_terms` packed plaintexts therefore holds in each slot a value in
    [0, 2 * max_terms * bound] < 2^slot_bits: no carry crosses into the next slot, and the whole
    sum stays below 2^(slots * slot_bits) <= 2^(key_bits - 2) < n, so it never wraps modulo n.
    """

    bound: int
    max_terms: int
    slot_bits: int
    slots: int

    def __post_init__(self) -> None:
        _check_int("bound", self.bound, minimum=1)
        _check_int("max_terms", self.max_terms, minimum=1)
        _check_int("slot_bits", self.slot_bits, minimum=1)
        _check_int("slots", self.slots, minimum=1)
        needed = (2 * self.max_terms * self.bound).bit_length()
        if self.slot_bits < needed:
            raise ValueError(
                f"slot_bits={self.slot_bits} cannot hold a sum of {self.max_terms} biased values "
                f"in [0, 2*{self.bound}]: need at least {needed} bits"
            )

    @classmethod
    def plan(
        cls,
        *,
        precision: int,
        gamma: float,
        max_terms: int,
        key_bits: int,
        tail_sigmas: float = 40.0,
    ) -> SlotLayout:
        """The densest layout for noise of variance <= gamma encoded at precision P.

        bound = ceil(10^P * tail_sigmas * sqrt(gamma)): sigma_1^2 = gamma is the largest variance
        (sigma_k^2 = gamma / k^p with k >= 1, p > 0), and a Gaussian beyond 40 sigma has
        probability below 1e-340, so pack() refusing |z| > bound never happens in practice.
        The bound is computed in 80-digit decimal arithmetic so every agent gets the same integer.
        slot_bits = bit_length(2 * max_terms * bound); slots = floor((key_bits - 2) / slot_bits).
        Raises ValueError when not even one slot fits in a plaintext.
        """
        precision = _check_int("precision", precision, minimum=0)
        max_terms = _check_int("max_terms", max_terms, minimum=1)
        key_bits = _check_int("key_bits", key_bits, minimum=PLAINTEXT_MARGIN_BITS + 1)
        for name, value in (("gamma", gamma), ("tail_sigmas", tail_sigmas)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        ctx = Context(prec=80)
        # Decimal(float) is exact, so only sqrt and the product round (at the 80th digit).
        scaled = ctx.multiply(Decimal(float(tail_sigmas)), ctx.sqrt(Decimal(float(gamma))))
        scaled = scaled.scaleb(precision, context=ctx)  # times 10^P, exact
        bound = max(1, int(scaled.to_integral_value(rounding=ROUND_CEILING, context=ctx)))
        slot_bits = (2 * max_terms * bound).bit_length()
        capacity = key_bits - PLAINTEXT_MARGIN_BITS
        if slot_bits > capacity:
            raise ValueError(
                f"one slot needs {slot_bits} bits (bound={bound} from precision={precision}, "
                f"gamma={gamma}, tail_sigmas={tail_sigmas}; sums of max_terms={max_terms}) but a "
                f"{key_bits}-bit key holds at most {capacity} bits per plaintext: lower the "
                "precision or use a larger key"
            )
        slots = capacity // slot_bits
        return cls(bound=bound, max_terms=max_terms, slot_bits=slot_bits, slots=slots)

    @property
    def capacity_bits(self) -> int:
        """Bits used by a packed plaintext: every plaintext and every sum is < 2^capacity_bits."""
        return self.slots * self.slot_bits

    def num_plaintexts(self, count: int) -> int:
        """How many plaintexts carry `count` values: ceil(count / slots)."""
        count = _check_int("count", count, minimum=0)
        return -(-count // self.slots)

    def pack(self, ints: Sequence[int]) -> list[int]:
        """Pack signed ints (|z| <= bound) into ceil(len / slots) non-negative plaintexts.

        Each plaintext is sum_s (z_s + bound) * 2^(s * slot_bits) < 2^capacity_bits; unused slots
        of the last plaintext are 0 (not biased), which unpack_sum checks.
        """
        plaintexts: list[int] = []
        for start in range(0, len(ints), self.slots):
            plaintext = 0
            for s, z in enumerate(ints[start : start + self.slots]):
                z = _check_int(f"ints[{start + s}]", z)
                if not -self.bound <= z <= self.bound:
                    raise ValueError(
                        f"ints[{start + s}] = {z} is outside the layout's range "
                        f"[-{self.bound}, {self.bound}]; plan the layout with a larger tail_sigmas"
                    )
                plaintext |= (z + self.bound) << (s * self.slot_bits)
            plaintexts.append(plaintext)
        return plaintexts

    def unpack_sum(self, plaintexts: Sequence[int], *, terms: int, count: int) -> list[int]:
        """Exact signed sums from the sum of `terms` packed plaintexts holding `count` values.

        Slot s of plaintext q holds sum_t (z_t + bound) for value number q * slots + s, so the
        signed sum is that slot minus terms * bound. Raises ValueError when the plaintexts cannot
        be such a sum (wrong number, too large, a slot above 2 * terms * bound, or a non-zero
        padding slot): a sign of a layout mismatch or a corrupted ciphertext.
        """
        terms = _check_int("terms", terms, minimum=0)
        count = _check_int("count", count, minimum=0)
        if terms > self.max_terms:
            raise ValueError(
                f"terms={terms} exceeds the layout's max_terms={self.max_terms}: slots could carry"
            )
        expected = self.num_plaintexts(count)
        if len(plaintexts) != expected:
            raise ValueError(
                f"expected {expected} plaintexts for {count} values at {self.slots} slots each, "
                f"got {len(plaintexts)}"
            )
        mask = (1 << self.slot_bits) - 1
        offset = terms * self.bound
        top = 2 * terms * self.bound
        sums: list[int] = []
        for q, plaintext in enumerate(plaintexts):
            plaintext = _check_int(f"plaintexts[{q}]", plaintext, minimum=0)
            if plaintext.bit_length() > self.capacity_bits:
                raise ValueError(
                    f"plaintexts[{q}] has {plaintext.bit_length()} bits, more than the layout's "
                    f"{self.capacity_bits}: not a sum of packed plaintexts"
                )
            used = min(self.slots, count - q * self.slots)
            for s in range(self.slots):
                slot = (plaintext >> (s * self.slot_bits)) & mask
                if s >= used:
                    if slot != 0:
                        raise ValueError(f"padding slot {s} of plaintexts[{q}] is {slot}, not 0")
                    continue
                if slot > top:
                    raise ValueError(
                        f"slot {s} of plaintexts[{q}] is {slot} > 2 * terms * bound = {top}: "
                        f"not a sum of {terms} packed values"
                    )
                sums.append(slot - offset)
        return sums
