"""Tests for efpsn.perturbation.basis: monomials, exact Gram-Schmidt, the paper's (3, 2, 5) example."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.perturbation.basis import OrthonormalSystem
from efpsn.perturbation.monomials import (
    Monomials,
    candidate_monomials,
    choose_monomials,
    count_monomials,
    format_monomial,
    format_polynomial,
    parse_monomials,
    power_monomials,
)

# The paper's example (Sec. 5.1): (K, m, N) = (3, 2, 5), monomials [1, x2, x2^3, x1, x1^2 x2].
PAPER_MONOMIALS = [(0, 0), (0, 1), (0, 3), (1, 0), (2, 1)]
PAPER_ETA = [0.180, 0.628, -0.374, 0.817, 2.015]


def paper_basis_by_hand() -> list[dict[tuple[int, int], float]]:
    """Closed forms on [-1, 1]^2 (Lebesgue), derived by hand from Legendre polynomials.

    e1 = 1/2; e2 = (sqrt3/2) x2; e3 = (sqrt7/2) P3(x2) = (sqrt7/4)(5 x2^3 - 3 x2);
    e4 = (sqrt3/2) x1; e5 = c (x1^2 - 1/3) x2 with ||(x1^2 - 1/3) x2||^2 = (8/45)(2/3) = 16/135.
    """
    s3, s7, s135 = math.sqrt(3), math.sqrt(7), math.sqrt(135)
    return [
        {(0, 0): 0.5},
        {(0, 1): s3 / 2},
        {(0, 3): 5 * s7 / 4, (0, 1): -3 * s7 / 4},
        {(1, 0): s3 / 2},
        {(2, 1): s135 / 4, (0, 1): -s135 / 12},
    ]


def quadrature_gram(system: OrthonormalSystem, *, points: int) -> np.ndarray:
    """<e_i, e_j> by tensor Gauss-Legendre quadrature (independent of the Gram formula)."""
    nodes, weights = np.polynomial.legendre.leggauss(points)
    m = system.m
    grid = np.array(list(itertools.product(nodes, repeat=m)))
    w = np.prod(np.array(list(itertools.product(weights, repeat=m))), axis=1)
    if system.measure == "uniform":
        w = w / 2.0**m
    values = system.evaluate(grid)  # (P, N)
    return values.T @ (w[:, None] * values)


def dense_gram(monomials: list[tuple[int, ...]], *, measure: str) -> np.ndarray:
    """Float Gram matrix of all monomials, including the zero cross-parity entries."""
    size = len(monomials)
    g = np.zeros((size, size))
    per_dim = 2.0 if measure == "lebesgue" else 1.0
    for i, a in enumerate(monomials):
        for j, b in enumerate(monomials):
            if all((x + y) % 2 == 0 for x, y in zip(a, b, strict=True)):
                g[i, j] = np.prod([per_dim / (x + y + 1) for x, y in zip(a, b, strict=True)])
    return g


# ----------------------------------------------------------------------------- the paper


def test_paper_basis_matches_printed_values_to_3_decimals() -> None:
    # prepare
    system = OrthonormalSystem.from_monomials(PAPER_MONOMIALS)
    printed = [
        {(0, 0): 0.5},
        {(0, 1): 0.866},
        {(0, 3): 3.307, (0, 1): -1.984},
        {(1, 0): 0.866},
        {(2, 1): 2.905, (0, 1): -0.968},
    ]
    # execute / assert
    for k, expected in enumerate(printed, start=1):
        got = system.basis_polynomial(k)
        assert set(got) == set(expected)
        for mono, coef in expected.items():
            assert round(got[mono], 3) == pytest.approx(coef, abs=1e-12)
    assert system.format_basis() == (
        "{0.500, 0.866*x2, 3.307*x2^3 - 1.984*x2, 0.866*x1, 2.905*x1^2*x2 - 0.968*x2}"
    )


def test_paper_basis_matches_closed_forms() -> None:
    system = OrthonormalSystem.from_monomials(PAPER_MONOMIALS)
    for k, expected in enumerate(paper_basis_by_hand(), start=1):
        got = system.basis_polynomial(k)
        assert set(got) == set(expected)
        for mono, coef in expected.items():
            assert got[mono] == pytest.approx(coef, rel=1e-14)


def test_paper_perturbing_function_corrected() -> None:
    # The paper prints 5.853 x1^2 x2 - 2.137 x2^3 + 0.708 x1 - 1.310 x2 + 0.090; the x2^3 and x2
    # coefficients are typos. By hand: sum_k eta_k e_k with the closed forms above.
    s3, s7, s135 = math.sqrt(3), math.sqrt(7), math.sqrt(135)
    e1, e2, e3, e4, e5 = PAPER_ETA
    by_hand = {
        (2, 1): e5 * s135 / 4,
        (0, 3): e3 * 5 * s7 / 4,
        (1, 0): e4 * s3 / 2,
        (0, 1): e2 * s3 / 2 - e3 * 3 * s7 / 4 - e5 * s135 / 12,
        (0, 0): e1 * 0.5,
    }
    system = OrthonormalSystem.from_monomials(PAPER_MONOMIALS)
    poly = system.polynomial(PAPER_ETA)
    assert set(poly) == set(by_hand)
    for mono, coef in by_hand.items():
        assert poly[mono] == pytest.approx(coef, rel=1e-13)
    # pinned
    assert poly[(2, 1)] == pytest.approx(5.853046082, abs=1e-9)
    assert poly[(0, 3)] == pytest.approx(-1.236888738, abs=1e-9)
    assert poly[(1, 0)] == pytest.approx(0.707542755, abs=1e-9)
    assert poly[(0, 1)] == pytest.approx(-0.665018164, abs=1e-9)
    assert poly[(0, 0)] == pytest.approx(0.09, abs=1e-15)
    assert system.format_polynomial(PAPER_ETA) == (
        "5.853*x1^2*x2 - 1.237*x2^3 + 0.708*x1 - 0.665*x2 + 0.090"
    )
    assert format_polynomial(poly) == system.format_polynomial(PAPER_ETA)


def test_paper_system_blocks_by_parity() -> None:
    system = OrthonormalSystem.from_monomials(PAPER_MONOMIALS)
    # parity classes: (0,0) -> {1}; (0,1) -> {x2, x2^3, x1^2 x2}; (1,0) -> {x1}
    assert sorted(system.blocks) == [(0,), (1, 2, 4), (3,)]


def test_paper_monomials_parse() -> None:
    parsed = parse_monomials("1, x2, x2^3, x1, x1^2*x2", m=2)
    assert parsed == PAPER_MONOMIALS
    assert [format_monomial(mono) for mono in parsed] == ["1", "x2", "x2^3", "x1", "x1^2*x2"]


# ----------------------------------------------------------------------------- candidates


def test_candidate_monomials_graded_lex_order() -> None:
    got = candidate_monomials(m=3, K=2)
    assert list(got) == [
        (0, 0, 0),
        (1, 0, 0),
        (0, 1, 0),
        (0, 0, 1),
        (2, 0, 0),
        (1, 1, 0),
        (1, 0, 1),
        (0, 2, 0),
        (0, 1, 1),
        (0, 0, 2),
    ]


@pytest.mark.parametrize(("m", "K"), [(1, 0), (1, 5), (2, 3), (3, 4), (5, 2), (4, 1)])
def test_candidate_monomials_count_and_distinct(m: int, K: int) -> None:
    got = candidate_monomials(m=m, K=K)
    assert len(got) == math.comb(m + K, K) == count_monomials(m=m, K=K)
    assert len(set(got)) == len(got)
    assert all(sum(a) <= K and len(a) == m for a in got)
    degrees = [sum(a) for a in got]
    assert degrees == sorted(degrees)
    brute = {a for a in itertools.product(range(K + 1), repeat=m) if sum(a) <= K}
    assert set(got) == brute


def test_candidate_monomials_large_m_is_cheap_and_capped() -> None:
    got = candidate_monomials(m=7850, K=1)
    assert len(got) == 7851
    assert got.sparse(0) == () and got.sparse(1) == ((0, 1),) and got.sparse(7850) == ((7849, 1),)
    with pytest.raises(ValueError, match="cap"):
        candidate_monomials(m=7850, K=2)


def test_choose_monomials_seeded_constant_first_distinct() -> None:
    a = choose_monomials(m=4, K=3, N=12, seed=7)
    b = choose_monomials(m=4, K=3, N=12, seed=7)
    c = choose_monomials(m=4, K=3, N=12, seed=8)
    assert a == b
    assert a != c
    assert a[0] == (0, 0, 0, 0)
    assert len(set(a)) == 12
    assert all(sum(mono) <= 3 for mono in a)
    assert choose_monomials(m=4, K=3, N=1, seed=0) == [(0, 0, 0, 0)]


def test_choose_monomials_rejects_too_many_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="only 10 monomials"):
        choose_monomials(m=2, K=3, N=11, seed=0)
    with pytest.raises(ValueError, match="N must be a positive integer"):
        choose_monomials(m=2, K=3, N=0, seed=0)
    with pytest.raises(ValueError, match="m must be a positive integer"):
        choose_monomials(m=0, K=3, N=1, seed=0)


def test_choose_all_candidates_is_a_permutation() -> None:
    got = choose_monomials(m=3, K=2, N=10, seed=3)
    assert set(got) == set(candidate_monomials(m=3, K=2))


# ----------------------------------------------------------------------------- the system


def test_from_monomials_rejects_duplicates_and_bad_input() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        OrthonormalSystem.from_monomials([(0, 0), (1, 0), (1, 0)])
    with pytest.raises(ValueError, match="expected m = 2"):
        OrthonormalSystem.from_monomials([(0, 0), (1, 0, 0)])
    with pytest.raises(ValueError, match=">= 0"):
        OrthonormalSystem.from_monomials([(0, 0), (-1, 0)])
    with pytest.raises(ValueError, match="at least one"):
        OrthonormalSystem.from_monomials([])
    with pytest.raises(ValueError, match="measure"):
        OrthonormalSystem.from_monomials([(0,)], measure="gaussian")  # type: ignore[arg-type]


def test_constant_need_not_come_first() -> None:
    system = OrthonormalSystem.from_monomials([(2,), (0,)])  # x^2 first, then 1
    gram = quadrature_gram(system, points=4)
    np.testing.assert_allclose(gram, np.eye(2), atol=1e-12)
    # e1 = x^2 / ||x^2|| = sqrt(5/2) x^2
    assert system.basis_polynomial(1) == {(2,): pytest.approx(math.sqrt(2.5), rel=1e-15)}


def test_uniform_measure_is_lebesgue_times_2_to_m_over_2() -> None:
    monos = choose_monomials(m=3, K=3, N=15, seed=1)
    leb = OrthonormalSystem.from_monomials(monos).coefficient_matrix().toarray()
    uni = OrthonormalSystem.from_monomials(monos, measure="uniform").coefficient_matrix().toarray()
    np.testing.assert_allclose(uni, leb * 2.0**1.5, rtol=1e-14)


def test_evaluate_shapes_and_polynomial_agree() -> None:
    system = OrthonormalSystem.from_monomials(choose_monomials(m=3, K=3, N=9, seed=2))
    rng = np.random.default_rng(0)
    xs = rng.uniform(-1, 1, size=(4, 5, 3))
    values = system.evaluate(xs)
    assert values.shape == (4, 5, 9)
    assert system.evaluate(xs[0, 0]).shape == (9,)
    eta = rng.normal(size=9)
    poly = system.polynomial(eta)
    direct = sum(c * np.prod(xs ** np.array(mono), axis=-1) for mono, c in poly.items())
    np.testing.assert_allclose(values @ eta, direct, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 3\)"):
        system.evaluate(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="expected 9 coefficients"):
        system.polynomial(np.zeros(8))


def test_monomials_sequence_behaviour() -> None:
    monos = Monomials.from_dense(PAPER_MONOMIALS)
    assert len(monos) == 5 and monos.m == 2
    assert monos[2] == (0, 3) and monos[-1] == (2, 1)
    assert monos[1:3] == [(0, 1), (0, 3)]
    assert monos == PAPER_MONOMIALS and monos != PAPER_MONOMIALS[::-1]
    assert "x1^2*x2" in repr(monos)


def _gram_entries_at_most(monkeypatch: pytest.MonkeyPatch, bound: int) -> list[int]:
    """Count the exact Gram entries the orthonormalisation computes, failing at once past
    `bound`: a deterministic complexity guard (a dense path costs N^2 entries), not a timing."""
    import efpsn.perturbation.basis

    real, count = efpsn.perturbation.basis._gram_entry, [0]

    def counted(a: Any, b: Any) -> Any:
        count[0] += 1
        assert count[0] <= bound, f"more than {bound} Gram entries: no longer linear in N"
        return real(a, b)

    monkeypatch.setattr(efpsn.perturbation.basis, "_gram_entry", counted)
    return count


def test_large_affine_system_builds_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # "all" parameters of the MNIST logistic regression: m = 7850, K = 1, N = 7851.
    count = _gram_entries_at_most(monkeypatch, 7851)  # one 1x1 block per monomial
    monos = choose_monomials(m=7850, K=1, N=7851, seed=0)
    system = OrthonormalSystem.from_monomials(monos, measure="uniform")
    assert count[0] == 7851
    assert system.size == 7851 and len(system.blocks) == 7851
    c = system.coefficient_matrix()
    assert c.nnz == 7851  # diagonal: 1 for the constant, sqrt(3) for each x_j
    assert sorted(set(np.round(c.data, 12))) == [1.0, round(math.sqrt(3), 12)]


def test_lebesgue_underflow_is_refused() -> None:
    # 2^(-7850/2) underflows float64: the perturbation would silently be zero.
    monos = choose_monomials(m=7850, K=1, N=3, seed=0)
    with pytest.raises(ValueError, match="measure='uniform'"):
        OrthonormalSystem.from_monomials(monos)


def test_power_monomials_order_and_count() -> None:
    monos = power_monomials(m=3, K=2)
    assert list(monos) == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 1, 0), (0, 2, 0), (0, 0, 1),
                           (0, 0, 2)]
    assert len(power_monomials(m=7850, K=2)) == 2 * 7850 + 1
    with pytest.raises(ValueError, match="m must be a positive integer"):
        power_monomials(m=0, K=2)


@pytest.mark.parametrize("measure", ["lebesgue", "uniform"])
def test_power_family_per_variable_path_equals_dense_cholesky(measure: str) -> None:
    # The per-variable Gram-Schmidt (constant first, univariate powers) against the dense one.
    monos = list(power_monomials(m=3, K=3))
    system = OrthonormalSystem.from_monomials(monos, measure=measure)  # type: ignore[arg-type]
    dense = np.linalg.inv(np.linalg.cholesky(dense_gram(monos, measure=measure)))
    np.testing.assert_allclose(system.coefficient_matrix().toarray(), dense, rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(quadrature_gram(system, points=4), np.eye(10), atol=1e-12)


def test_power_family_is_legendre_per_variable_and_builds_in_linear_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # K = 2 on every logistic-regression parameter: N = 2 * 7850 + 1 = 15,701. The constant and
    # every x_v^2 share a parity class; one Gram-Schmidt over it would cost 7851^2 entries, the
    # per-variable path a 3x3 block (1, x_v, x_v^2) per variable.
    count = _gram_entries_at_most(monkeypatch, 9 * 7850)
    system = OrthonormalSystem.from_monomials(power_monomials(m=7850, K=2), measure="uniform")
    assert count[0] == 5 * 7850 + 1  # 1 for the constant; 1 + 2 + 2 per variable
    assert system.size == 15701 and system.max_degree == 2
    # Uniform measure: e = sqrt(3) x_v and sqrt(45)/2 (x_v^2 - 1/3) = (sqrt5/2)(3 x_v^2 - 1).
    c = system.coefficient_matrix()
    assert c.nnz == 1 + 7850 + 2 * 7850
    x7850 = tuple(0 if v < 7849 else 1 for v in range(7850))
    sq7850 = tuple(0 if v < 7849 else 2 for v in range(7850))
    const = (0,) * 7850
    assert system.basis_polynomial(15700) == {x7850: pytest.approx(math.sqrt(3), rel=1e-15)}
    assert system.basis_polynomial(15701) == {
        sq7850: pytest.approx(1.5 * math.sqrt(5), rel=1e-15),
        const: pytest.approx(-0.5 * math.sqrt(5), rel=1e-15),
    }


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 2**31),
       st.sampled_from(["lebesgue", "uniform"]))
def test_univariate_path_equals_dense_in_any_order(m: int, K: int, seed: int,
                                                   measure: str) -> None:
    # Any order of the univariate powers after the constant (interleaved variables included).
    rest = list(power_monomials(m=m, K=K))[1:]
    order = np.random.default_rng(seed).permutation(len(rest))
    monos = [(0,) * m, *(rest[int(i)] for i in order)]
    system = OrthonormalSystem.from_monomials(monos, measure=measure)  # type: ignore[arg-type]
    dense = np.linalg.inv(np.linalg.cholesky(dense_gram(monos, measure=measure)))
    np.testing.assert_allclose(system.coefficient_matrix().toarray(), dense, rtol=1e-9,
                               atol=1e-9 * np.abs(dense).max())


# ----------------------------------------------------------------------------- properties


@st.composite
def random_systems(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], str]:
    m = draw(st.integers(1, 3))
    K = draw(st.integers(0, 4 if m < 3 else 3))
    total = math.comb(m + K, K)
    N = draw(st.integers(1, min(total, 20)))
    seed = draw(st.integers(0, 2**31))
    measure = draw(st.sampled_from(["lebesgue", "uniform"]))
    return list(choose_monomials(m=m, K=K, N=N, seed=seed)), measure


@settings(max_examples=40, deadline=None)
@given(random_systems())
def test_orthonormal_by_gauss_legendre_quadrature(case: tuple[list[tuple[int, ...]], str]) -> None:
    monos, measure = case
    system = OrthonormalSystem.from_monomials(monos, measure=measure)  # type: ignore[arg-type]
    degree = max(sum(a) for a in monos)
    # n Gauss points integrate degree 2n - 1 exactly per variable; products reach 2 * degree.
    gram = quadrature_gram(system, points=degree + 1)
    np.testing.assert_allclose(gram, np.eye(len(monos)), atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(random_systems())
def test_block_gram_schmidt_equals_dense_cholesky(case: tuple[list[tuple[int, ...]], str]) -> None:
    monos, measure = case
    system = OrthonormalSystem.from_monomials(monos, measure=measure)  # type: ignore[arg-type]
    # Dense Gram-Schmidt in the given order: C = L^-1 with G = L L^T.
    chol = np.linalg.cholesky(dense_gram(monos, measure=measure))
    dense = np.linalg.inv(chol)
    got = system.coefficient_matrix().toarray()
    np.testing.assert_allclose(got, dense, rtol=1e-7, atol=1e-7 * np.abs(dense).max())
    # Lower triangular in the given order: e_k only uses monomials 1..k.
    assert np.allclose(np.triu(got, 1), 0.0)
    # Blocks partition the positions and share a parity vector.
    assert sorted(i for b in system.blocks for i in b) == list(range(len(monos)))
    for block in system.blocks:
        assert len({tuple(e % 2 for e in monos[i]) for i in block}) == 1
