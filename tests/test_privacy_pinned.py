"""Privacy accounting pinned down: every refusal by type and message, each boundary of Theorem
4.1's conditions from both sides, and the caller's choices (R, the measure) honoured."""

from __future__ import annotations

import math

import numpy as np
import pytest

from efpsn.privacy import theorem
from efpsn.privacy.theorem import (
    PrivacyResult,
    account,
    convert_sensitivity,
    epsilon_delta,
    protection_statement,
    vq_norm,
)
from efpsn.topology import DisconnectedGraphError, Graph, ring

BASE = {"gamma": 10.0, "p": 1.0, "q": 2.0, "sensitivity": 1.0, "mu2": 1.0, "mu_max": 3.0,
        "delta": 1e-5}


def refusal(error: type[Exception], call: object, **kwargs: object) -> str:
    with pytest.raises(error) as info:
        call(**kwargs)  # type: ignore[operator]
    return str(info.value)


def convert(m: object, *, to_measure: str = "uniform") -> float:
    return convert_sensitivity(4.0, m=m, from_measure="lebesgue",  # type: ignore[arg-type]
                               to_measure=to_measure)


@pytest.mark.parametrize("m", [0, -1, -10, 2.5, 1.0, True, "3", None])
def test_convert_sensitivity_refuses_any_m_but_a_positive_integer(m: object) -> None:
    assert refusal(ValueError, convert, m=m) == f"m must be a positive integer, got {m!r}"


def test_convert_sensitivity_takes_numpy_integers_and_m_equal_one() -> None:
    assert convert(1) == 2.0**1.5  # 4 / sqrt(2)
    assert convert(np.int64(4)) == 1.0
    assert convert(np.int32(2), to_measure="lebesgue") == 4.0  # the same measure: unchanged
    assert convert_sensitivity(1.0, m=2, from_measure="uniform", to_measure="lebesgue") == 2.0
    assert refusal(ValueError, convert_sensitivity, sensitivity=1.0, m=2,
                   from_measure="gauss", to_measure="uniform") == (
        "from_measure must be one of ('lebesgue', 'uniform'), got 'gauss'")
    assert refusal(ValueError, convert_sensitivity, sensitivity=0.0, m=2,
                   from_measure="uniform", to_measure="uniform") == (
        "sensitivity must be finite and > 0, got 0.0")


def test_convert_sensitivity_stays_inside_float64_at_both_ends() -> None:
    # 2^-1022 is the smallest normal float64, 2^1023 the largest power of two
    assert convert_sensitivity(1.0, m=2044, from_measure="lebesgue",
                               to_measure="uniform") == 2.0**-1022
    assert refusal(ValueError, convert_sensitivity, sensitivity=1.0, m=2046,
                   from_measure="lebesgue", to_measure="uniform") == (
        "sensitivity 1.0 in the lebesgue basis is 2^-1023.0 in the uniform basis (m = 2046), "
        "outside the float64 range")
    assert convert_sensitivity(1.0, m=2046, from_measure="uniform",
                               to_measure="lebesgue") == 2.0**1023
    assert refusal(ValueError, convert_sensitivity, sensitivity=1.0, m=2048,
                   from_measure="uniform", to_measure="lebesgue") == (
        "sensitivity 1.0 in the uniform basis is 2^1024.0 in the lebesgue basis (m = 2048), "
        "outside the float64 range")


def test_account_honours_the_callers_R() -> None:
    by_r = account(ring(5), gamma=1e3, p=1.0, q=2.0, sensitivity=1.0, R=3.0)
    assert by_r.R == 3.0 and by_r.delta == math.exp(-4.5)
    direct = epsilon_delta(gamma=1e3, p=1.0, q=2.0, sensitivity=1.0, mu2=by_r.mu2,
                           mu_max=by_r.mu_max, R=3.0)
    assert by_r == direct
    assert account(ring(5), gamma=1e3, p=1.0, q=2.0, sensitivity=1.0, R=4.0).epsilon > (
        by_r.epsilon)


def test_p_must_lie_strictly_inside_half_and_q_minus_half() -> None:
    inside = epsilon_delta(**{**BASE, "p": math.nextafter(1.5, 0.0)})
    assert inside.p < 1.5
    for p in (1.5, 0.5):
        assert refusal(ValueError, epsilon_delta, **{**BASE, "p": p}) == (
            f"Theorem 4.1 needs p in (1/2, q - 1/2) = (0.5, 1.5), got p = {p!r}")
    assert epsilon_delta(**{**BASE, "p": math.nextafter(0.5, 1.0)}).p > 0.5
    for p in (float("nan"), float("inf"), "1"):
        assert refusal(ValueError, epsilon_delta, **{**BASE, "p": p}) == (
            f"p must be a finite real number, got {p!r}")
    assert refusal(ValueError, epsilon_delta, **{**BASE, "q": 1.0}) == (
        "Theorem 4.1 needs q > 1, got q = 1.0")
    assert epsilon_delta(**{**BASE, "q": 1.25, "p": 0.6}).q == 1.25


def test_every_positive_input_is_refused_by_name() -> None:
    names = {"gamma": "gamma", "sensitivity": "sensitivity (||f_I - f_I'||_Vq)",
             "mu2": "mu2 (algebraic connectivity; 0 means a disconnected graph)",
             "mu_max": "mu_max", "q": "q"}
    for key, name in names.items():
        assert refusal(ValueError, epsilon_delta, **{**BASE, key: -1.0}) == (
            f"{name} must be finite and > 0, got -1.0")
        assert refusal(TypeError, epsilon_delta, **{**BASE, key: True}) == (
            f"{name} must be a real number, got True")
    assert refusal(ValueError, epsilon_delta, **{**BASE, "delta": None, "R": 0.0}) == (
        "R must be finite and > 0, got 0.0")
    assert refusal(ValueError, epsilon_delta, **{**BASE, "mu_max": 0.5}) == (
        "mu_max must be >= mu2, got mu_max = 0.5 < mu2 = 1.0")
    assert epsilon_delta(**{**BASE, "mu_max": 1.0}).mu_max == 1.0
    assert refusal(ValueError, epsilon_delta, **{**BASE, "delta": None}) == (
        "give exactly one of delta or R, got delta=None, R=None")
    for delta in (0.0, 1.0, "0.1"):
        assert refusal(ValueError, epsilon_delta, **{**BASE, "delta": delta}) == (
            f"delta must be in (0, 1), got {delta!r}")
    assert refusal(ValueError, vq_norm, delta_coeffs=[1.0, math.inf], q=2.0) == (
        "coefficients must be finite")
    assert refusal(ValueError, vq_norm, delta_coeffs=[[1.0]], q=2.0) == (
        "expected a 1-D coefficient vector, got shape (1, 1)")
    assert refusal(ValueError, vq_norm, delta_coeffs=[1.0], q=0.0) == (
        "q must be finite and > 0, got 0.0")
    assert vq_norm([], 2.0) == 0.0


def test_the_result_carries_and_prints_every_input() -> None:
    result = epsilon_delta(gamma=8.0, p=0.75, q=1.5, sensitivity=2.0, mu2=0.5, mu_max=4.0,
                           delta=1e-3)
    assert (result.gamma, result.p, result.q, result.sensitivity, result.mu2, result.mu_max) == (
        8.0, 0.75, 1.5, 2.0, 0.5, 4.0)
    assert all(isinstance(getattr(result, f), float) for f in PrivacyResult.__dataclass_fields__)
    # A = sqrt(zeta(2 (q - p))) s^2 / gamma = sqrt(zeta(1.5)) / 2; R = sqrt(2 ln 1000)
    A = math.sqrt(2.612375348685488) * 4.0 / 8.0
    R = math.sqrt(2 * math.log(1000.0))
    assert result.A == pytest.approx(A, rel=1e-13)
    assert result.R == pytest.approx(R, rel=1e-15)
    assert result.epsilon == pytest.approx((A / 4 + R * math.sqrt(4.0 * A / 2)) / 0.5, rel=1e-13)
    assert str(result) == (
        f"(epsilon={result.epsilon:.6g}, delta=0.001)-DP at gamma=8 (p=0.75, q=1.5, "
        f"||f_I - f_I'||_Vq=2, mu2=0.5, mu_max=4, R={R:.4g})")


def test_calibrate_passes_every_input_on() -> None:
    graph = ring(6)
    kwargs = {"delta": 1e-4, "p": 0.8, "q": 1.7, "sensitivity": 3.0}
    gamma = theorem.calibrate(graph, target_epsilon=2.0, **kwargs)
    result = account(graph, gamma=gamma, **kwargs)
    assert result.epsilon <= 2.0 and result.epsilon == pytest.approx(2.0, rel=1e-12)
    assert refusal(ValueError, theorem.gamma_for_epsilon, target_epsilon=1e-160, mu2=1.0,
                   mu_max=3.0,
                   **kwargs).startswith("target_epsilon = 1e-160 needs gamma = inf")
    assert refusal(ValueError, theorem.calibrate, graph=graph, target_epsilon=0.0, **kwargs) == (
        "target_epsilon must be finite and > 0, got 0.0")
    with pytest.raises(DisconnectedGraphError, match="2 components"):
        theorem.calibrate(Graph(4, ((0, 1), (2, 3))), target_epsilon=1.0, **kwargs)


@pytest.mark.parametrize(("selection", "body", "words", "measure"), [
    ("last-bias@uniform", "last-bias", "the last layer's bias", "uniform"),
    ("random:7 @lebesgue", "random:7", "parameters drawn at random with the public seed",
     "lebesgue"),
    ("indices:1,2", "indices:1,2", "the parameters at the given indices", "lebesgue"),
    ("random", "random", "parameters drawn at random with the public seed", "lebesgue"),
])
def test_the_protection_statement_names_the_selection_and_its_measure(
    selection: str, body: str, words: str, measure: str
) -> None:
    text = protection_statement(selection=selection, m=2, K=3, N=9, sensitivity=0.25, q=1.5)
    assert text == (
        f"It protects only changes of one agent's cost f_i that lie in the span of the N = 9 "
        f"basis functions (polynomials of degree <= 3) of the m = 2 coordinates of '{body}' "
        f"({words}) with ||f_I - f_I'||_V1.5 <= 0.25 ({measure} measure on [-1, 1]^2); any "
        f"other change of f_i, such as replacing one training image, is not covered.")
