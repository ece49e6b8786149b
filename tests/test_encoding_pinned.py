"""Encoding pinned down: every refusal by type and message, the 80-digit bound, the edges."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from efpsn.crypto.encoding import SlotLayout, decode_fixed, encode_fixed

LAYOUT = SlotLayout(bound=4000, max_terms=3, slot_bits=15, slots=4)


def plan(**changes: object) -> SlotLayout:
    kwargs: dict = {"precision": 2, "gamma": 1.0, "max_terms": 3, "key_bits": 64, **changes}
    return SlotLayout.plan(**kwargs)


def layout(**changes: int) -> SlotLayout:
    return SlotLayout(**{"bound": 1, "max_terms": 1, "slot_bits": 2, "slots": 1, **changes})


# Each integer argument, with a value below its minimum and a bool: what the caller is told.
INT_ARGUMENTS: list[tuple[str, Callable[[object], object], int]] = [
    ("precision", lambda v: encode_fixed([0.5], precision=v), 0),
    ("precision", lambda v: decode_fixed([5], precision=v), 0),
    ("bound", lambda v: layout(bound=v), 1),
    ("max_terms", lambda v: layout(max_terms=v), 1),
    ("slot_bits", lambda v: layout(slot_bits=v), 1),
    ("slots", lambda v: layout(slots=v), 1),
    ("precision", lambda v: plan(precision=v), 0),
    ("max_terms", lambda v: plan(max_terms=v), 1),
    ("key_bits", lambda v: plan(key_bits=v), 3),
    ("count", lambda v: LAYOUT.num_plaintexts(v), 0),
    ("terms", lambda v: LAYOUT.unpack_sum([], terms=v, count=0), 0),
    ("count", lambda v: LAYOUT.unpack_sum([], terms=1, count=v), 0),
]


@pytest.mark.parametrize(("name", "call", "minimum"), INT_ARGUMENTS)
def test_every_int_argument_is_refused_below_its_minimum(
    name: str, call: Callable[[object], object], minimum: int
) -> None:
    with pytest.raises(ValueError) as below:
        call(minimum - 1)
    assert str(below.value) == f"{name} must be >= {minimum}, got {minimum - 1}"
    with pytest.raises(TypeError) as flag:
        call(True)
    assert str(flag.value) == f"{name} must be an int, got bool True"
    with pytest.raises(TypeError) as fraction:
        call(1.5)
    assert str(fraction.value) == f"{name} must be an int, got float 1.5"


def test_every_minimum_itself_is_accepted() -> None:
    assert encode_fixed([0.5, -0.5], precision=0) == [0, -1]
    assert decode_fixed([5], precision=0).tolist() == [5.0]
    assert layout() == SlotLayout(bound=1, max_terms=1, slot_bits=2, slots=1)
    assert layout().pack([-1, 1]) == [0, 2]
    assert plan(precision=0, max_terms=1).max_terms == 1
    assert LAYOUT.num_plaintexts(0) == 0
    assert LAYOUT.unpack_sum([0], terms=0, count=1) == [0]
    # key_bits = 3 passes its own check, then one 2-bit slot does not fit 3 - 2 = 1 bit
    with pytest.raises(ValueError, match=r"one slot needs 2 bits .* a 3-bit key holds at most 1 "
                                         r"bits per plaintext: lower the precision or use a "
                                         r"larger key$"):
        plan(precision=0, gamma=1e-10, max_terms=1, key_bits=3)


def test_a_one_bit_slot_is_refused_for_what_it_cannot_hold() -> None:
    with pytest.raises(ValueError) as refused:
        layout(slot_bits=1)
    assert str(refused.value) == (
        "slot_bits=1 cannot hold a sum of 1 biased values in [0, 2*1]: need at least 2 bits")


def test_packed_and_unpacked_items_are_named_by_position() -> None:
    two = SlotLayout(bound=4000, max_terms=3, slot_bits=15, slots=2)
    with pytest.raises(TypeError) as refused:
        two.pack([0, 0, 0, True])
    assert str(refused.value) == "ints[3] must be an int, got bool True"
    with pytest.raises(ValueError) as negative:
        two.unpack_sum([0, -1], terms=1, count=4)
    assert str(negative.value) == "plaintexts[1] must be >= 0, got -1"
    with pytest.raises(TypeError, match=r"^plaintexts\[0\] must be an int, got float 1.0$"):
        two.unpack_sum([1.0], terms=1, count=1)  # type: ignore[list-item]


def test_every_padding_slot_is_checked_not_only_the_first() -> None:
    wide = SlotLayout(bound=4000, max_terms=3, slot_bits=15, slots=4)
    # one value in slot 0; slot 1 (padding) is 0 but slot 2 (padding) is not
    corrupted = wide.pack([5])[0] | (7 << (2 * 15))
    with pytest.raises(ValueError, match=r"^padding slot 2 of plaintexts\[0\] is 7, not 0$"):
        wide.unpack_sum([corrupted], terms=1, count=1)


def test_values_are_float64_before_they_are_encoded() -> None:
    # 2^53 + 1 is not a float64: like every value it is rounded to one first (to 2^53)
    assert encode_fixed([2**53 + 1], precision=0) == [2**53]
    assert encode_fixed([2**53 + 1, -(2**53) - 1], precision=1) == [10 * 2**53, -10 * 2**53]


def test_plan_bound_is_exact_beyond_28_digits() -> None:
    # ceil(sqrt(2) 10^30) has 31 digits; decimal's default 28-digit context would round sqrt(2)
    # to 1.414213562373095048801688724 and give ...724000.
    exact = math.isqrt(2 * 10**60) + 1
    assert exact == 1_414_213_562_373_095_048_801_688_724_210
    got = SlotLayout.plan(precision=30, gamma=2.0, tail_sigmas=1.0, max_terms=1, key_bits=2048)
    assert got.bound == exact
    # the default 40 sigma: ceil(40 sqrt(2) 10^30) = ceil(sqrt(3200 10^60))
    default = SlotLayout.plan(precision=30, gamma=2.0, max_terms=1, key_bits=2048)
    assert default.bound == math.isqrt(3200 * 10**60) + 1


def test_plan_edges_bound_one_and_a_slot_filling_the_plaintext() -> None:
    # 40 sqrt(1e-10) 10^0 = 0.0004: the bound is at least 1
    assert SlotLayout.plan(precision=0, gamma=1e-10, max_terms=1, key_bits=10).bound == 1
    # ceil(40 * 2.5) = 100, 2 * 100 = 200 needs 8 bits: exactly the 10 - 2 bits a key holds
    assert SlotLayout.plan(precision=0, gamma=6.25, max_terms=1, key_bits=10) == SlotLayout(
        bound=100, max_terms=1, slot_bits=8, slots=1)


@pytest.mark.parametrize("name", ["gamma", "tail_sigmas"])
def test_plan_refuses_real_arguments_by_name(name: str) -> None:
    with pytest.raises(TypeError) as text:
        plan(**{name: "1"})
    assert str(text.value) == f"{name} must be a real number, got str"
    with pytest.raises(TypeError) as flag:
        plan(**{name: True})
    assert str(flag.value) == f"{name} must be a real number, got bool"
    with pytest.raises(ValueError) as zero:
        plan(**{name: 0})
    assert str(zero.value) == f"{name} must be finite and > 0, got 0"
