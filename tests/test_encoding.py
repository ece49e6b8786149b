"""Fixed-point encoding and slot packing: pinned integers and exact round-trip properties."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.crypto.encoding import SlotLayout, decode_fixed, encode_fixed

# --------------------------------------------------------------------------- encode / decode


def test_encode_fixed_regression_vectors() -> None:
    # floor of the exact float value times 10^P: -0.1 is -0.1000000000000000055..., so its
    # floor at P=3 is -101 (the rounded float product -100.0 would give -100); 2.675 is
    # 2.67499999999999982..., hence 2674.
    assert encode_fixed([1.5, -1.5, 0.1, -0.1, 1e-7, 0.0, -0.0], precision=3) == [
        1500, -1500, 100, -101, 0, 0, 0,
    ]
    assert encode_fixed([2.675, 0.5], precision=3) == [2674, 500]
    assert encode_fixed([1.5, -1.5], precision=0) == [1, -2]
    assert encode_fixed([0.5], precision=20) == [50_000_000_000_000_000_000]
    assert encode_fixed(np.array([[0.25], [-0.25]]), precision=2) == [25, -25]
    assert encode_fixed([], precision=5) == []


def test_encode_fixed_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="finite"):
        encode_fixed([1.0, float("nan")], precision=2)
    with pytest.raises(ValueError, match="finite"):
        encode_fixed([float("-inf")], precision=2)
    with pytest.raises(ValueError, match="precision must be >= 0"):
        encode_fixed([1.0], precision=-1)
    with pytest.raises(TypeError, match="precision must be an int"):
        encode_fixed([1.0], precision=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="precision must be an int"):
        encode_fixed([1.0], precision=True)


def test_decode_fixed_regression_vectors() -> None:
    out = decode_fixed([-101, 1500, 0, 7], precision=3)
    assert out.dtype == np.float64
    assert out.tolist() == [-0.101, 1.5, 0.0, 0.007]
    # Correctly rounded even when the int exceeds 2^53.
    assert decode_fixed([10**30 + 1], precision=30).tolist() == [1.0]
    with pytest.raises(TypeError, match=r"ints\[1\] must be an int"):
        decode_fixed([1, 2.5], precision=1)  # type: ignore[list-item]


@given(
    v=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12),
    precision=st.integers(0, 20),
)
@settings(max_examples=200, deadline=None)
def test_encode_fixed_is_the_exact_floor(v: float, precision: int) -> None:
    (z,) = encode_fixed([v], precision=precision)
    exact = Fraction(v) * 10**precision
    assert z <= exact < z + 1
    assert z == math.floor(exact)


# --------------------------------------------------------------------------- slot layout


def test_plan_regression_vectors() -> None:
    # bound = ceil(100 * 40 * 1) = 4000; sums of 3 biased values <= 24000 < 2^15; 62 // 15 = 4.
    assert SlotLayout.plan(precision=2, gamma=1.0, max_terms=3, key_bits=64) == SlotLayout(
        bound=4000, max_terms=3, slot_bits=15, slots=4
    )
    # bound = ceil(1e8 * 40 * sqrt(1e3)) = ceil(126491106406.73...); 8 * bound < 2^40; 2046 // 40.
    assert SlotLayout.plan(precision=8, gamma=1e3, max_terms=4, key_bits=2048) == SlotLayout(
        bound=126_491_106_407, max_terms=4, slot_bits=40, slots=51
    )
    assert SlotLayout.plan(precision=12, gamma=1e6, max_terms=6, key_bits=512) == SlotLayout(
        bound=40_000_000_000_000_000, max_terms=6, slot_bits=59, slots=8
    )
    # ceil(40 * sqrt(1e-3)) = ceil(1.26...) = 2.
    assert SlotLayout.plan(precision=0, gamma=1e-3, max_terms=1, key_bits=2048).bound == 2


def test_pack_regression_vectors() -> None:
    layout = SlotLayout(bound=4000, max_terms=3, slot_bits=15, slots=4)
    # Little-end first: (1+4000) + (−2+4000)·2^15 + (3+4000)·2^30 + (4000+4000)·2^45; the fifth
    # value alone in the second plaintext: −4000 + 4000 = 0.
    expected = 4001 + 3998 * 2**15 + 4003 * 2**30 + 8000 * 2**45
    assert expected == 281_479_275_030_187_937
    assert layout.pack([1, -2, 3, 4000, -4000]) == [expected, 0]
    assert layout.pack([]) == []
    assert layout.num_plaintexts(5) == 2 and layout.num_plaintexts(8) == 2
    assert layout.num_plaintexts(0) == 0
    assert layout.capacity_bits == 60
    # Two packed vectors summed as plain integers, then unpacked with terms=2.
    a, b = layout.pack([1, -2, 3, 4000, -4000]), layout.pack([-1, -4000, 10, 4000, -4000])
    summed = [x + y for x, y in zip(a, b, strict=True)]
    assert layout.unpack_sum(summed, terms=2, count=5) == [0, -4002, 13, 8000, -8000]
    assert layout.unpack_sum(a, terms=1, count=5) == [1, -2, 3, 4000, -4000]


def test_pack_refuses_values_beyond_bound() -> None:
    layout = SlotLayout(bound=4000, max_terms=3, slot_bits=15, slots=4)
    with pytest.raises(ValueError, match=r"ints\[1\] = 4001 is outside .*\[-4000, 4000\]"):
        layout.pack([0, 4001])
    with pytest.raises(ValueError, match="outside"):
        layout.pack([-4001])
    with pytest.raises(TypeError, match="must be an int"):
        layout.pack([1.0])  # type: ignore[list-item]


def test_plan_refuses_what_cannot_fit() -> None:
    # P = 30, gamma = 1: bound = 4e31, sums of 3 need 108-bit slots (6 * 4e31 < 2^108);
    # a 64-bit key holds 62 bits.
    with pytest.raises(ValueError, match=r"one slot needs 108 bits .* at most 62 bits"):
        SlotLayout.plan(precision=30, gamma=1.0, max_terms=3, key_bits=64)
    with pytest.raises(ValueError, match="gamma must be finite and > 0"):
        SlotLayout.plan(precision=2, gamma=0.0, max_terms=3, key_bits=2048)
    with pytest.raises(ValueError, match="max_terms must be >= 1"):
        SlotLayout.plan(precision=2, gamma=1.0, max_terms=0, key_bits=2048)
    with pytest.raises(ValueError, match="tail_sigmas"):
        SlotLayout.plan(precision=2, gamma=1.0, max_terms=1, key_bits=2048, tail_sigmas=-1.0)
    with pytest.raises(ValueError, match="cannot hold a sum of 3"):
        SlotLayout(bound=4000, max_terms=3, slot_bits=14, slots=4)
    with pytest.raises(TypeError):
        SlotLayout(4000, 3, 15, 4)  # type: ignore[misc]  # keyword-only


def test_unpack_sum_refuses_inconsistent_plaintexts() -> None:
    layout = SlotLayout(bound=4000, max_terms=3, slot_bits=15, slots=4)
    packed = layout.pack([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="terms=4 exceeds the layout's max_terms=3"):
        layout.unpack_sum(packed, terms=4, count=5)
    with pytest.raises(ValueError, match="expected 2 plaintexts for 5 values"):
        layout.unpack_sum(packed[:1], terms=1, count=5)
    with pytest.raises(ValueError, match="padding slot 1"):
        layout.unpack_sum([packed[0], packed[1] + (1 << 15)], terms=1, count=5)
    with pytest.raises(ValueError, match="> 2 \\* terms \\* bound = 8000"):
        layout.unpack_sum([8001, 0], terms=1, count=5)
    with pytest.raises(ValueError, match="more than the layout's 60"):
        layout.unpack_sum([1 << 60, 0], terms=1, count=5)


@st.composite
def layouts_and_terms(draw: st.DrawFn) -> tuple[SlotLayout, list[list[int]], int]:
    precision = draw(st.integers(0, 12))
    gamma = draw(st.floats(1e-3, 1e6))
    max_terms = draw(st.integers(1, 8))
    key_bits = draw(st.sampled_from([128, 256, 512, 1024, 2048, 3072]))
    layout = SlotLayout.plan(
        precision=precision, gamma=gamma, max_terms=max_terms, key_bits=key_bits
    )
    count = draw(st.integers(0, 3 * layout.slots + 1))
    terms = draw(st.integers(1, max_terms))
    edge = st.sampled_from([-layout.bound, layout.bound, 0])
    value = st.one_of(edge, st.integers(-layout.bound, layout.bound))
    vectors = draw(st.lists(st.lists(value, min_size=count, max_size=count),
                            min_size=terms, max_size=terms))
    return layout, vectors, key_bits


@pytest.mark.slow
@given(layouts_and_terms())
@settings(max_examples=150, deadline=None)
def test_pack_unpack_sums_are_exact(case: tuple[SlotLayout, list[list[int]], int]) -> None:
    layout, vectors, key_bits = case
    count, terms = len(vectors[0]), len(vectors)
    packed = [layout.pack(v) for v in vectors]
    summed = [sum(column) for column in zip(*packed, strict=True)]
    for plaintext in [p for row in packed for p in row] + summed:
        assert 0 <= plaintext < 2 ** (key_bits - 2)
    assert layout.unpack_sum(packed[0], terms=1, count=count) == vectors[0]
    expected = [sum(column) for column in zip(*vectors, strict=True)]
    assert layout.unpack_sum(summed, terms=terms, count=count) == expected
