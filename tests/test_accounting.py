"""The accountant for refreshed masks: pinned epsilons, the Gaussian RDP closed form, the reasons."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from efpsn.params.refresh_setting import Refresh
from efpsn.perturbation.basis import OrthonormalSystem
from efpsn.perturbation.monomials import choose_monomials
from efpsn.privacy.accounting import (
    account_refreshed,
    compose_gaussian,
    gamma_for_refreshed_epsilon,
    gradient_noise_scale,
    uncancelled_streams,
)
from efpsn.topology import Graph, build_graph

RING = build_graph("ring", 5)
LOGREG: dict[str, Any] = {
    "graph": RING, "p": 1.0, "K": 1, "m": 7850, "N": 7851, "num_params": 7850,
    "measure": "uniform", "refresh": Refresh(1), "iterations": 10_000, "clip": 1.0,
    "batch_size": 64, "delta": 1e-5,
}


def closed_form_epsilon(z: float, count: int, delta: float) -> float:
    """Gaussian RDP count * a / (2 z^2) at the accountant's orders, converted to epsilon by
    Proposition 12 of Canonne, Kamath & Steinke (2020): r + log(1 - 1/a) - log(delta a)/(a - 1),
    minimised over the library's default orders (the orders are a choice, not the theory)."""
    best = math.inf
    for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS:
        r = count * a / (2 * z * z)
        best = min(best, r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1))
    return best


def test_pinned_epsilons() -> None:
    assert account_refreshed(gamma=1e6, **LOGREG).epsilon == pytest.approx(0.42839336084442137,
                                                                             rel=1e-10)
    assert account_refreshed(gamma=1e6, attacker="eavesdropper", **LOGREG).epsilon == (
        pytest.approx(0.2946467549467323, rel=1e-10))
    with_count = account_refreshed(gamma=1e4, samples=800, **LOGREG)
    assert with_count.compositions == 834  # ceil(10,000 / floor(800 / 64)) = ceil(10,000 / 12)
    assert with_count.epsilon == pytest.approx(1.3544956088711797, rel=1e-10)
    assert compose_gaussian(noise_multiplier=3.0, count=100, delta=1e-6) == pytest.approx(
        21.977543149182978, rel=1e-10)


def test_the_library_agrees_with_the_gaussian_closed_form() -> None:
    for z, count, delta in ((3.0, 100, 1e-6), (88.46329567076033, 10_000, 1e-5), (0.8, 1, 1e-3)):
        assert compose_gaussian(noise_multiplier=z, count=count, delta=delta) == pytest.approx(
            closed_form_epsilon(z, count, delta), rel=1e-9)


def test_noise_multiplier_follows_from_the_uncancelled_seeds() -> None:
    result = account_refreshed(gamma=1e4, **LOGREG)
    # ring: 2 (2 - 1) = 2 seed streams a single neighbour cannot cancel; sqrt(3) from the
    # uniform basis x_v; sensitivity 2C/B; the smallest variance is at k = N
    assert result.noise_multiplier == pytest.approx(
        math.sqrt(3) * math.sqrt(2 * 1e4 / 7851) / (2 * 1.0 / 64), rel=1e-14)
    assert result.epsilon == pytest.approx(closed_form_epsilon(result.noise_multiplier, 10_000,
                                                               1e-5), rel=1e-9)
    assert [uncancelled_streams(d, a) for d in (1, 3) for a in
            ("neighbour", "eavesdropper", "neighbours")] == [0, 2, 0, 4, 6, 0]
    # more noise, more privacy; the complete graph's agents have 4 neighbours
    assert account_refreshed(gamma=1e5, **LOGREG).epsilon < result.epsilon
    complete = account_refreshed(gamma=1e4, **{**LOGREG, "graph": build_graph("complete", 5)})
    assert complete.epsilon < result.epsilon


def test_the_basis_gradient_scale_is_the_systems() -> None:
    for measure in ("uniform", "lebesgue"):
        system = OrthonormalSystem.from_monomials(choose_monomials(m=4, K=1, N=5, seed=0),
                                                  measure=measure)
        coefficients = system.monomial_coefficients(np.eye(5)[2])  # e_3 = c x_v for some v
        assert np.abs(coefficients).max() == pytest.approx(
            gradient_noise_scale(measure=measure, m=4), rel=1e-12)


def test_what_gives_no_bound_says_why() -> None:
    cases = [
        ({"refresh": Refresh(None)}, "fixed for the whole run"),
        ({"refresh": Refresh(10)}, "repeats within a refresh period of 10 rounds"),
        ({"m": 10, "N": 11}, "perturbs 10 of the model's 7850 parameters"),
        ({"N": 100}, "cannot give each of the m = 7850 coordinates"),
        ({"clip": None}, "not clipped"),
        ({"attacker": "neighbours"}, "together they hold every seed"),
        ({"graph": build_graph("path", 5)}, "agent 1 has a single neighbour"),
        ({"measure": "lebesgue"}, "underflows"),
    ]
    for change, why in cases:
        result = account_refreshed(gamma=1e6, **{**LOGREG, **change})
        assert math.isinf(result.epsilon) and why in result.reason, (change, result.reason)
        assert result.statement.startswith("No differential privacy") and why in result.statement
    finite = account_refreshed(gamma=1e6, **LOGREG)
    assert finite.reason == "" and "coalition of all of an agent's neighbours" in (
        finite.statement) and "(0.4284, 1e-05)" in finite.statement


def test_worst_agent_is_the_least_connected() -> None:
    star_plus = Graph(n=4, edges=((0, 1), (0, 2), (0, 3), (1, 2)))  # degrees 3, 2, 2, 1
    result = account_refreshed(gamma=1e6, **{**LOGREG, "graph": star_plus,
                                             "attacker": "eavesdropper"})
    assert result.worst_agent == 3 and result.per_agent[3] == max(result.per_agent)
    assert result.per_agent[0] < result.per_agent[1]


def test_inverse_reaches_the_target_and_refuses_what_cannot() -> None:
    gamma = gamma_for_refreshed_epsilon(target_epsilon=1.0, **LOGREG)
    assert account_refreshed(gamma=gamma, **LOGREG).epsilon <= 1.0
    assert account_refreshed(gamma=gamma * (1 - 1e-6), **LOGREG).epsilon > 1.0
    with pytest.raises(ValueError, match="no gamma helps: the noise repeats"):
        gamma_for_refreshed_epsilon(target_epsilon=1.0, **{**LOGREG, "refresh": Refresh(2)})


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="K = 1 .* only, got K = 2"):
        account_refreshed(gamma=1.0, **{**LOGREG, "K": 2})
    with pytest.raises(ValueError, match="delta must lie in"):
        account_refreshed(gamma=1.0, **{**LOGREG, "delta": 1.0})
    with pytest.raises(ValueError, match="needs the agent's sample count"):
        account_refreshed(gamma=1.0, **{**LOGREG, "batch_size": None})
    with pytest.raises(ValueError, match="attacker must be one of"):
        account_refreshed(gamma=1.0, **{**LOGREG, "attacker": "anyone"})
    with pytest.raises(TypeError, match="iterations must be an int"):
        account_refreshed(gamma=1.0, **{**LOGREG, "iterations": 10.5})
