"""Theorem 4.1 as pure functions: (gamma, graph, ...) -> (epsilon, delta) and its inverse.

What epsilon is about (the adjacency of Theorem 4.1). Two cost profiles are adjacent when they
differ only in one agent's function, f_I versus f_I', and f_I - f_I' lies in V_q: the span of the
run's orthonormal basis e_1..e_N (polynomials of degree <= K in the m selected parameters x_S),
with ||f_I - f_I'||_{V_q} = (sum_k k^(2q) delta_k^4)^(1/4), delta = the coefficients of
f_I - f_I' in that basis. ``sensitivity`` is a bound on this norm. A change of f_I outside V_q
(replacing one training image changes f_I in every parameter, and not polynomially) is not
covered at all.

Measure. The basis is orthonormal for a measure on [-1, 1]^m, and so are delta and the norm:
the Lebesgue measure (the paper's; the default of the last-bias, random and indices selections)
or the uniform probability measure 2^-m dx (the default of "all" and "random:M", where the
Lebesgue basis's factor 2^(-m/2) underflows float64). The uniform basis functions are
e_k^U = 2^(m/2) e_k^L, so for one and the same function change delta^U = 2^(-m/2) delta^L and

    ||f_I - f_I'||_{V_q, uniform} = 2^(-m/2) ||f_I - f_I'||_{V_q, Lebesgue},   A^U = 2^-m A^L.

The theorem itself is unchanged: give it the sensitivity in the run's measure. For a fixed
function change, a uniform-measure run at gamma has the epsilon of a Lebesgue-measure run at
2^m gamma (its noise function is 2^(m/2) times larger). ``convert_sensitivity`` converts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import zeta

from efpsn.topology import Graph, laplacian_spectrum

if TYPE_CHECKING:
    from efpsn.perturbation.selection import Selection

__all__ = [
    "PrivacyResult",
    "account",
    "calibrate",
    "convert_sensitivity",
    "epsilon_delta",
    "gamma_for_epsilon",
    "protection_statement",
    "vq_norm",
]

MEASURES = ("lebesgue", "uniform")

_SELECTION_WORDS = {
    "last-bias": "the last layer's bias",
    "all": "every parameter of the model",
    "random": "parameters drawn at random with the public seed",
    "random:M": "parameters drawn at random with the public seed",
    "indices": "the parameters at the given indices",
}


def convert_sensitivity(sensitivity: float, *, m: int, from_measure: str, to_measure: str) -> float:
    """||f_I - f_I'||_{V_q} in one measure's basis -> the same function change in the other's.

    uniform = 2^(-m/2) * Lebesgue (e^U = 2^(m/2) e^L, so the coefficients shrink by 2^(-m/2)).
    Computed in the log domain, so that m in the thousands raises instead of giving 0 or inf.
    """
    _check_finite_positive("sensitivity", sensitivity)
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    for name, value in (("from_measure", from_measure), ("to_measure", to_measure)):
        if value not in MEASURES:
            raise ValueError(f"{name} must be one of {MEASURES}, got {value!r}")
    if from_measure == to_measure:
        return float(sensitivity)
    sign = -1.0 if to_measure == "uniform" else 1.0
    log2 = math.log2(sensitivity) + sign * m / 2.0
    if log2 < -1022 or log2 >= 1024:
        raise ValueError(
            f"sensitivity {sensitivity!r} in the {from_measure} basis is 2^{log2:.1f} in the "
            f"{to_measure} basis (m = {m}), outside the float64 range"
        )
    return float(2.0**log2)


def protection_statement(
    *, selection: str | Selection, m: int, K: int, N: int, sensitivity: float, q: float
) -> str:
    """One sentence: which coordinates and which changes of f_i Theorem 4.1's epsilon covers."""
    from efpsn.perturbation.selection import parse_selection

    parsed = parse_selection(selection)
    body = str(parsed).split("@")[0]
    return (
        f"It protects only changes of one agent's cost f_i that lie in the span of the "
        f"N = {N:,} basis functions (polynomials of degree <= {K}) of the m = {m:,} coordinates "
        f"of '{body}' ({_SELECTION_WORDS[parsed.kind]}) with ||f_I - f_I'||_V{q:g} <= "
        f"{sensitivity:g} ({parsed.measure} measure on [-1, 1]^{m}); any other change of f_i, "
        f"such as replacing one training image, is not covered."
    )


@dataclass(frozen=True)
class PrivacyResult:
    """(epsilon, delta)-DP of EFPSN by Theorem 4.1, with every input that produced it."""

    epsilon: float
    delta: float
    R: float
    A: float
    gamma: float
    p: float
    q: float
    sensitivity: float
    mu2: float
    mu_max: float

    def __str__(self) -> str:
        return (
            f"(epsilon={self.epsilon:.6g}, delta={self.delta:.3g})-DP at gamma={self.gamma:g} "
            f"(p={self.p:g}, q={self.q:g}, ||f_I - f_I'||_Vq={self.sensitivity:g}, "
            f"mu2={self.mu2:.4g}, mu_max={self.mu_max:.4g}, R={self.R:.4g})"
        )


def vq_norm(delta_coeffs: Sequence[float] | np.ndarray, q: float) -> float:
    """||f||_{V_q} = (sum_k k^(2q) delta_k^4)^(1/4), k = 1..N, delta = Phi^-1(f) (0-based array)."""
    d = np.asarray(delta_coeffs, dtype=np.float64)
    if d.ndim != 1:
        raise ValueError(f"expected a 1-D coefficient vector, got shape {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("coefficients must be finite")
    _check_finite_positive("q", q)
    k = np.arange(1, d.size + 1, dtype=np.float64)
    # Factor out the largest |delta| so the fourth powers neither overflow nor underflow.
    scale = float(np.max(np.abs(d))) if d.size else 0.0
    if scale == 0.0:
        return 0.0
    return scale * float(np.sum(k ** (2.0 * q) * (d / scale) ** 4)) ** 0.25


def _check_finite_positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def _check_common(*, p: float, q: float, sensitivity: float, mu2: float, mu_max: float) -> None:
    _check_finite_positive("q", q)
    if q <= 1:
        raise ValueError(f"Theorem 4.1 needs q > 1, got q = {q!r}")
    if not isinstance(p, (int, float, np.floating, np.integer)) or not math.isfinite(p):
        raise ValueError(f"p must be a finite real number, got {p!r}")
    if not 0.5 < p < q - 0.5:
        raise ValueError(
            f"Theorem 4.1 needs p in (1/2, q - 1/2) = (0.5, {q - 0.5:g}), got p = {p!r}"
        )
    _check_finite_positive("sensitivity (||f_I - f_I'||_Vq)", sensitivity)
    _check_finite_positive("mu2 (algebraic connectivity; 0 means a disconnected graph)", mu2)
    _check_finite_positive("mu_max", mu_max)
    if mu_max < mu2:
        raise ValueError(f"mu_max must be >= mu2, got mu_max = {mu_max!r} < mu2 = {mu2!r}")


def _zeta_factor(p: float, q: float) -> float:
    # sqrt(zeta(2(q - p))): the sum over k of (sigma_k^2-normalised) k^-2(q-p) from the V_q norm;
    # finite because p < q - 1/2 makes the argument exceed 1.
    return math.sqrt(float(zeta(2.0 * (q - p))))


def _delta_to_R(delta: float) -> float:
    if not isinstance(delta, (int, float, np.floating)) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    # delta = exp(-R^2 / 2)  <=>  R = sqrt(2 ln(1/delta)).
    return math.sqrt(-2.0 * math.log(delta))


def epsilon_delta(
    *,
    gamma: float,
    p: float,
    q: float,
    sensitivity: float,
    mu2: float,
    mu_max: float,
    delta: float | None = None,
    R: float | None = None,
) -> PrivacyResult:
    """Theorem 4.1: epsilon = (1/mu2)(A/4 + R sqrt(mu_max A / 2)), delta = exp(-R^2/2).

    A = (1/gamma) sqrt(zeta(2(q - p))) ||f_I - f_I'||_{V_q}^2. Give exactly one of delta or R.
    """
    _check_finite_positive("gamma", gamma)
    _check_common(p=p, q=q, sensitivity=sensitivity, mu2=mu2, mu_max=mu_max)
    if (delta is None) == (R is None):
        raise ValueError(f"give exactly one of delta or R, got delta={delta!r}, R={R!r}")
    if R is None:
        assert delta is not None
        R = _delta_to_R(delta)
    else:
        _check_finite_positive("R", R)
        delta = math.exp(-R * R / 2.0)
    A = _zeta_factor(p, q) * sensitivity**2 / gamma
    epsilon = (A / 4.0 + R * math.sqrt(mu_max * A / 2.0)) / mu2
    return PrivacyResult(
        epsilon=epsilon,
        delta=float(delta),
        R=float(R),
        A=A,
        gamma=float(gamma),
        p=float(p),
        q=float(q),
        sensitivity=float(sensitivity),
        mu2=float(mu2),
        mu_max=float(mu_max),
    )


def gamma_for_epsilon(
    *,
    target_epsilon: float,
    delta: float,
    p: float,
    q: float,
    sensitivity: float,
    mu2: float,
    mu_max: float,
) -> float:
    """The smallest gamma with epsilon_delta(gamma, ...).epsilon <= target_epsilon at this delta.

    epsilon is increasing in A and A is proportional to 1/gamma, so solve for equality. With
    u = sqrt(A), b = R sqrt(mu_max / 2), c = mu2 * target: u^2/4 + b u - c = 0, whose positive
    root is u = 2(sqrt(b^2 + c) - b) = 2c / (sqrt(b^2 + c) + b) (the latter without cancellation).
    Then gamma = sqrt(zeta(2(q - p))) sensitivity^2 / u^2, nudged up by ulps if rounding left
    epsilon a hair above the target.
    """
    _check_finite_positive("target_epsilon", target_epsilon)
    _check_common(p=p, q=q, sensitivity=sensitivity, mu2=mu2, mu_max=mu_max)
    R = _delta_to_R(delta)
    b = R * math.sqrt(mu_max / 2.0)
    c = mu2 * target_epsilon
    u = 2.0 * c / (math.sqrt(b * b + c) + b)
    u_squared = u * u  # 0.0 when the target is so small that u^2 underflows: gamma is then inf
    gamma = _zeta_factor(p, q) * sensitivity**2 / u_squared if u_squared > 0 else math.inf
    if not math.isfinite(gamma) or gamma <= 0:
        raise ValueError(
            f"target_epsilon = {target_epsilon!r} needs gamma = {gamma!r}, outside the float "
            "range; expected a target_epsilon whose gamma is a finite float64 (a larger one)"
        )
    for _ in range(64):
        got = epsilon_delta(
            gamma=gamma, p=p, q=q, sensitivity=sensitivity, mu2=mu2, mu_max=mu_max, delta=delta
        ).epsilon
        if got <= target_epsilon:
            return gamma
        gamma = math.nextafter(gamma, math.inf)
    raise AssertionError(  # pragma: no cover - a few ulps always suffice
        f"round trip failed: gamma = {gamma!r} gives epsilon = {got!r} > {target_epsilon!r}"
    )


def account(
    graph: Graph,
    *,
    gamma: float,
    p: float,
    q: float,
    sensitivity: float,
    delta: float | None = None,
    R: float | None = None,
) -> PrivacyResult:
    """epsilon_delta with mu2 and mu_max taken from the graph's combinatorial Laplacian."""
    mu2, mu_max = _spectrum(graph)
    return epsilon_delta(
        gamma=gamma, p=p, q=q, sensitivity=sensitivity, mu2=mu2, mu_max=mu_max, delta=delta, R=R
    )


def calibrate(
    graph: Graph,
    *,
    target_epsilon: float,
    delta: float,
    p: float,
    q: float,
    sensitivity: float,
) -> float:
    """gamma_for_epsilon with mu2 and mu_max taken from the graph's combinatorial Laplacian."""
    mu2, mu_max = _spectrum(graph)
    return gamma_for_epsilon(
        target_epsilon=target_epsilon,
        delta=delta,
        p=p,
        q=q,
        sensitivity=sensitivity,
        mu2=mu2,
        mu_max=mu_max,
    )


def _spectrum(graph: Graph) -> tuple[float, float]:
    if not graph.is_connected():
        graph.require_connected()  # raises DisconnectedGraphError naming the components
    return laplacian_spectrum(graph)
