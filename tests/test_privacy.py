"""Tests for efpsn.privacy.theorem: Theorem 4.1, its inverse, pinned numbers and properties."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.privacy.theorem import (
    account,
    calibrate,
    convert_sensitivity,
    epsilon_delta,
    gamma_for_epsilon,
    protection_statement,
    vq_norm,
)
from efpsn.topology import DisconnectedGraphError, Graph, ring

# 5-ring: Laplacian eigenvalues 2 - 2 cos(2 pi k / 5).
RING5_MU2 = 2 - 2 * math.cos(2 * math.pi / 5)
RING5_MU_MAX = 2 - 2 * math.cos(4 * math.pi / 5)


def epsilon_by_hand(
    *, gamma: float, zeta_value: float, sensitivity: float, delta: float, mu2: float, mu_max: float
) -> float:
    A = math.sqrt(zeta_value) * sensitivity**2 / gamma
    R = math.sqrt(2 * math.log(1 / delta))
    return (A / 4 + R * math.sqrt(mu_max * A / 2)) / mu2


def test_pinned_epsilon_for_5_ring() -> None:
    # prepare: q - p = 1, so zeta(2) = pi^2 / 6
    expected = epsilon_by_hand(
        gamma=1e3,
        zeta_value=math.pi**2 / 6,
        sensitivity=1.0,
        delta=1e-5,
        mu2=RING5_MU2,
        mu_max=RING5_MU_MAX,
    )
    # execute
    result = account(ring(5), gamma=1e3, p=1.0, q=2.0, sensitivity=1.0, delta=1e-5)
    # assert
    assert result.epsilon == pytest.approx(expected, rel=1e-13)
    assert result.epsilon == pytest.approx(0.1674830949, abs=5e-11)
    assert result.delta == 1e-5
    assert result.R == pytest.approx(math.sqrt(2 * math.log(1e5)), rel=1e-15)
    assert result.A == pytest.approx(math.pi / math.sqrt(6) / 1e3, rel=1e-14)
    assert result.mu2 == pytest.approx(RING5_MU2, rel=1e-13)


def test_R_and_delta_are_equivalent() -> None:
    kwargs = {"gamma": 10.0, "p": 0.75, "q": 1.5, "sensitivity": 2.0, "mu2": 1.0, "mu_max": 4.0}
    by_delta = epsilon_delta(**kwargs, delta=1e-6)
    by_r = epsilon_delta(**kwargs, R=by_delta.R)
    assert by_r.epsilon == pytest.approx(by_delta.epsilon, rel=1e-15)
    assert by_r.delta == pytest.approx(1e-6, rel=1e-12)


def test_calibrate_round_trip_pinned_graph() -> None:
    gamma = calibrate(
        ring(5), target_epsilon=0.1674830949495072, delta=1e-5, p=1.0, q=2.0, sensitivity=1.0
    )
    assert gamma == pytest.approx(1e3, rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"q": 1.0}, "q > 1"),
        ({"p": 0.5}, r"p in \(1/2, q - 1/2\)"),
        ({"p": 1.6}, r"p in \(1/2, q - 1/2\) = \(0.5, 1.5\)"),
        ({"gamma": 0.0}, "gamma must be finite and > 0, got 0.0"),
        ({"gamma": float("nan")}, "gamma"),
        ({"sensitivity": -1.0}, "sensitivity"),
        ({"mu2": 0.0}, "mu2"),
        ({"delta": 1.0}, r"delta must be in \(0, 1\), got 1.0"),
        ({"delta": None}, "exactly one of delta or R"),
        ({"R": 2.0}, "exactly one of delta or R"),
    ],
)
def test_validation(kwargs: dict, message: str) -> None:
    base = {
        "gamma": 1.0,
        "p": 1.0,
        "q": 2.0,
        "sensitivity": 1.0,
        "mu2": 1.0,
        "mu_max": 3.0,
        "delta": 1e-5,
    }
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        epsilon_delta(**base)


def test_gamma_for_epsilon_validation() -> None:
    with pytest.raises(ValueError, match="target_epsilon"):
        gamma_for_epsilon(
            target_epsilon=0.0, delta=1e-5, p=1.0, q=2.0, sensitivity=1.0, mu2=1.0, mu_max=2.0
        )


@pytest.mark.parametrize("target", [1e-163, 1e-200, 5e-324])
def test_a_target_too_small_for_float64_is_a_value_error(target: float) -> None:
    # u^2 underflows to 0 below about 1e-162 (it used to divide by zero)
    with pytest.raises(ValueError, match=rf"^target_epsilon = {target!r} needs gamma = inf, "
                                         r"outside the float range; expected a target_epsilon"):
        gamma_for_epsilon(
            target_epsilon=target, delta=1e-5, p=1.0, q=2.0, sensitivity=1.0, mu2=1.0, mu_max=2.0
        )


def test_disconnected_graph_cannot_be_accounted() -> None:
    with pytest.raises(DisconnectedGraphError):
        account(Graph(4, ((0, 1), (2, 3))), gamma=1.0, p=1.0, q=2.0, sensitivity=1.0, delta=1e-5)


def test_vq_norm() -> None:
    # (1^4 * 1 * 1 + 2^4 * 16 + 3^4 * 0) ^ (1/4) with q = 2 and delta = (1, 2, 0)
    assert vq_norm([1.0, 2.0, 0.0], 2.0) == pytest.approx((1 + 16 * 16) ** 0.25, rel=1e-15)
    assert vq_norm([0.0, 0.0], 1.5) == 0.0
    assert vq_norm([-3.0], 1.5) == pytest.approx(3.0)
    # scale-safe: fourth powers of 1e100 would overflow
    assert vq_norm([1e100], 2.0) == pytest.approx(1e100)
    with pytest.raises(ValueError, match="1-D"):
        vq_norm([[1.0]], 2.0)


params = st.fixed_dictionaries(
    {
        "q": st.floats(1.05, 5.0),
        "p_frac": st.floats(0.01, 0.99),
        "sensitivity": st.floats(1e-3, 1e3),
        "mu2": st.floats(0.05, 5.0),
        "ratio": st.floats(1.0, 20.0),
        "delta": st.floats(1e-12, 0.5),
    }
)


def unpack(d: dict) -> dict:
    q = d["q"]
    p = 0.5 + d["p_frac"] * (q - 1.0)  # inside (1/2, q - 1/2)
    return {
        "p": p,
        "q": q,
        "sensitivity": d["sensitivity"],
        "mu2": d["mu2"],
        "mu_max": d["mu2"] * d["ratio"],
    }


@settings(max_examples=150, deadline=None)
@given(params, st.floats(1e-4, 1e3))
def test_inverse_round_trip(d: dict, target: float) -> None:
    kw = unpack(d)
    gamma = gamma_for_epsilon(target_epsilon=target, delta=d["delta"], **kw)
    got = epsilon_delta(gamma=gamma, delta=d["delta"], **kw).epsilon
    assert got <= target
    assert got == pytest.approx(target, rel=1e-9)
    # smallest: a slightly smaller gamma overshoots the target
    assert epsilon_delta(gamma=gamma * (1 - 1e-6), delta=d["delta"], **kw).epsilon > target


@settings(max_examples=150, deadline=None)
@given(params, st.floats(1e-3, 1e6), st.floats(1.001, 100.0))
def test_epsilon_decreasing_in_gamma(d: dict, gamma: float, factor: float) -> None:
    kw = unpack(d)
    low = epsilon_delta(gamma=gamma, delta=d["delta"], **kw).epsilon
    high = epsilon_delta(gamma=gamma * factor, delta=d["delta"], **kw).epsilon
    assert high < low


# --------------------------------------------------------------------------- the measure


def test_convert_sensitivity_pinned() -> None:
    # e^U = 2^(m/2) e^L: the same function change has 2^(-m/2) times the coefficients
    assert convert_sensitivity(1.0, m=10, from_measure="lebesgue", to_measure="uniform") == 2**-5
    assert convert_sensitivity(3.0, m=3, from_measure="uniform", to_measure="lebesgue") == (
        pytest.approx(3.0 * 2**1.5, rel=1e-15))
    assert convert_sensitivity(0.7, m=5, from_measure="uniform", to_measure="uniform") == 0.7
    # m = 7850 (every logistic-regression parameter): 2^-3925 is below float64's range
    with pytest.raises(ValueError, match="outside the float64 range"):
        convert_sensitivity(1.0, m=7850, from_measure="lebesgue", to_measure="uniform")
    with pytest.raises(ValueError, match="to_measure must be one of"):
        convert_sensitivity(1.0, m=2, from_measure="lebesgue", to_measure="gauss")


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.floats(1e-3, 1e4), st.floats(1e-2, 1e2))
def test_uniform_run_at_gamma_is_lebesgue_run_at_2_to_m_gamma(
    m: int, gamma: float, sensitivity: float
) -> None:
    # one fixed function change, measured in each basis: the uniform basis's noise function is
    # 2^(m/2) larger, so its epsilon at gamma equals the Lebesgue one at 2^m gamma
    common = {"p": 1.0, "q": 2.0, "mu2": RING5_MU2, "mu_max": RING5_MU_MAX, "delta": 1e-5}
    s_uniform = convert_sensitivity(sensitivity, m=m, from_measure="lebesgue",
                                    to_measure="uniform")
    uniform = epsilon_delta(gamma=gamma, sensitivity=s_uniform, **common).epsilon
    lebesgue = epsilon_delta(gamma=gamma * 2.0**m, sensitivity=sensitivity, **common).epsilon
    assert uniform == pytest.approx(lebesgue, rel=1e-12)
    assert uniform < epsilon_delta(gamma=gamma, sensitivity=sensitivity, **common).epsilon


def test_protection_statement_names_coordinates_and_functions() -> None:
    text = protection_statement(selection="last-bias", m=10, K=1, N=10, sensitivity=1.0, q=2.0)
    assert text == (
        "It protects only changes of one agent's cost f_i that lie in the span of the N = 10 "
        "basis functions (polynomials of degree <= 1) of the m = 10 coordinates of 'last-bias' "
        "(the last layer's bias) with ||f_I - f_I'||_V2 <= 1 (lebesgue measure on [-1, 1]^10); "
        "any other change of f_i, such as replacing one training image, is not covered."
    )
    every = protection_statement(selection="all", m=7850, K=2, N=15701, sensitivity=0.5, q=2.0)
    assert "N = 15,701" in every and "degree <= 2" in every and "every parameter" in every
    assert "uniform measure on [-1, 1]^7850" in every


def test_privacy_cli_accounts_refreshed_masks(tmp_path: Path) -> None:
    """`efpsn privacy --refresh every:R`: the per-sample accountant, the same epsilon as the
    library gives, and an infinite one with its reason where the run gives no bound."""
    from efpsn.cli.main import main
    from efpsn.params.refresh_setting import Refresh
    from efpsn.privacy.accounting import account_refreshed
    from efpsn.topology import build_graph

    out = tmp_path / "eps.json"
    assert main(["privacy", "--algorithm", "dsgd", "--refresh", "every:1", "--iterations", "10000", "--selection", "all",
                 "--clip", "1", "--gamma", "1e6", "--batch-size", "64", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    expected = account_refreshed(
        graph=build_graph("ring", 5), gamma=1e6, p=1.0, K=1, m=7850, N=7851, num_params=7850,
        measure="uniform", refresh=Refresh(1), iterations=10000, clip=1.0, batch_size=64,
        delta=1e-5)
    assert written["epsilon"] == pytest.approx(expected.epsilon, rel=1e-12)
    assert 0 < written["epsilon"] < 1 and written["attacker"] == "neighbour"
    assert main(["privacy", "--algorithm", "dsgd", "--refresh", "every:1", "--iterations", "10000",
                 "--batch-size", "64", "--selection", "last-bias", "--json", str(out)]) == 0
    unbounded = json.loads(out.read_text())
    assert unbounded["epsilon"] == "inf" and "get no noise" in unbounded["reason"]
    assert main(["privacy", "--algorithm", "dsgd", "--refresh", "every:2", "--iterations", "100", "--selection", "all",
                 "--clip", "1", "--batch-size", "64", "--json", str(out)]) == 0
    assert "cancel" in json.loads(out.read_text())["reason"]
    # full batch (the default): the accountant needs the agent's own sample count
    assert main(["privacy", "--algorithm", "dsgd", "--refresh", "every:1", "--iterations", "100", "--selection", "all",
                 "--clip", "1"]) == 2
    assert main(["privacy", "--algorithm", "dsgd", "--refresh", "every:1", "--iterations", "100", "--selection", "all",
                 "--clip", "1", "--samples", "800", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["batch_size"] == 0
