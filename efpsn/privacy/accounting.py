"""Sample-level differential privacy of refreshed masks against curious parties, by dp-accounting.

Model. Every round agent i releases, in the worst case (the attacker recovers it exactly), its
perturbed gradient: the mean of B per-sample gradients, each clipped to norm C, plus the
gradient of its perturbation Phi(eta_bar_i(t)). With K = 1 and a selection that covers every
parameter (N = m + 1 = d + 1, all affine functions), that gradient is sum_k eta_bar_ik grad e_k,
whose coordinate v is c * eta_bar_i,k(v) with c = sqrt(3) (uniform measure: e = sqrt(3) x_v) or
sqrt(3) 2^(-m/2) (Lebesgue): independent Gaussian coordinates. eta_bar_ik = sum_j (z(s_ij) -
z(s_ji)) / 10^P has one N(0, sigma_k^2) term per seed; what an attacker cannot cancel are the
terms of the seeds it does not hold:

- "neighbour": one curious neighbour j holds s_ij and s_ji; 2 (deg(i) - 1) terms remain (none
  when deg(i) = 1: epsilon infinite);
- "eavesdropper": sees every message, holds no seed: all 2 deg(i) terms;
- "neighbours": all of i's neighbours together hold every seed: nothing remains.

The noise is then N(0, diag(s_v^2)), s_v^2 = c^2 streams gamma / k(v)^p, and one replaced
sample moves the clipped batch mean by at most 2C/B in L2 norm (replace-one adjacency). Whitening
shows the round is at least as private as the Gaussian mechanism with noise multiplier
z = min_v s_v / (2C/B) = c sqrt(streams gamma / N^p) / (2C/B) (the worst direction is the
coordinate with the smallest variance, k = N). The rounds are composed with dp-accounting's RDP
accountant (adaptive composition; no subsampling amplification is claimed: the batches are a
public function of (seed, agent, round), efpsn/tasks/batches.py). A sample sits in at most one
batch per epoch of floor(n_i / B) rounds, so with the agent's sample count n_i only
ceil(T / floor(n_i / B)) rounds are composed; without it, all T.

Where the model gives no bound, epsilon is infinite and `reason` says why: a fixed mask or one
refreshed every R > 1 rounds (the same noise in two rounds of a period cancels in their
difference: K = 1 makes it a constant), selected coordinates that leave parameters unperturbed,
basis functions missing for some coordinates, no clipping, no uncancelled seed.

Idealisations: the noise is treated as continuous Gaussian; the fixed-point floor at 10^-P and
the 2^-52 grid of the polar method's uniforms are ignored (as float noise is in DP-SGD).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

from efpsn.params.refresh_setting import Refresh

__all__ = [
    "ATTACKERS",
    "RefreshedPrivacy",
    "account_refreshed",
    "compose_gaussian",
    "gamma_for_refreshed_epsilon",
    "gradient_noise_scale",
    "uncancelled_streams",
]

ATTACKERS = ("neighbour", "eavesdropper", "neighbours")


class DegreeGraph(Protocol):
    """What the accountant needs from efpsn.topology.Graph."""

    n: int

    def degree(self, i: int) -> int: ...


@dataclass(frozen=True)
class RefreshedPrivacy:
    """The accountant's answer for the worst agent of the graph (largest epsilon)."""

    epsilon: float
    delta: float
    attacker: str
    refresh: str
    iterations: int
    compositions: int  # rounds composed per sample
    noise_multiplier: float  # per round, worst agent (0 when nothing is left uncancelled)
    worst_agent: int  # 0-based
    per_agent: tuple[float, ...]
    reason: str  # why epsilon is infinite ("" when the model gives a bound)
    statement: str

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["per_agent"] = list(self.per_agent)
        return out


def gradient_noise_scale(*, measure: str, m: int) -> float:
    """|d e_k / d x_v| of K = 1's basis function x_v: sqrt(3), times 2^(-m/2) for Lebesgue."""
    if measure == "uniform":
        return math.sqrt(3.0)
    if measure == "lebesgue":
        return math.sqrt(3.0) * 2.0 ** (-m / 2.0)  # 0.0 once it underflows (m > ~2,100)
    raise ValueError(f"measure must be 'uniform' or 'lebesgue', got {measure!r}")


def uncancelled_streams(degree: int, attacker: str) -> int:
    """How many N(0, sigma_k^2) seed streams of an agent of this degree the attacker lacks."""
    if attacker not in ATTACKERS:
        raise ValueError(f"attacker must be one of {ATTACKERS}, got {attacker!r}")
    if attacker == "neighbour":
        return 2 * max(degree - 1, 0)
    return 2 * degree if attacker == "eavesdropper" else 0


def compose_gaussian(*, noise_multiplier: float, count: int, delta: float) -> float:
    """epsilon of `count` adaptively composed Gaussian mechanisms of this noise multiplier
    (sensitivity 1), at delta, by dp-accounting's RDP accountant."""
    if count == 0:
        return 0.0
    if noise_multiplier <= 0.0:
        return math.inf
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(noise_multiplier), count))
    return float(accountant.get_epsilon(delta))


def _positive(name: str, value: object, *, integral: bool = False) -> None:
    kind = numbers.Integral if integral else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {'an int' if integral else 'a number'}, got "
                        f"{type(value).__name__}")
    if not (math.isfinite(float(value)) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def _why_unbounded(*, refresh: Refresh, K: int, m: int, N: int, num_params: int,
                   clip: float | None) -> str:
    if K != 1:
        raise ValueError(f"the accountant models K = 1 (affine perturbations) only, got K = {K}")
    if not refresh.refreshed:
        return ("the mask is fixed for the whole run: its gradient is the same constant every "
                "round (K = 1) and cancels in the difference of two rounds")
    if refresh.fading:
        return ("the fresh noise fades (refresh fading): the last rounds' differences carry "
                "almost none of it, so composing the rounds gives no per-sample bound; its "
                "protection is measured by attacks instead (docs/RESULTS.md)")
    if refresh.every is not None and refresh.every > 1:
        return (f"the noise repeats within a refresh period of {refresh.every} rounds: with "
                "K = 1 it cancels in the difference of two rounds of one period")
    if m < num_params:
        return (f"the selection perturbs {m} of the model's {num_params} parameters; the other "
                f"{num_params - m} get no noise")
    if N < m + 1:
        return (f"N = {N} basis functions cannot give each of the m = {m} coordinates its own "
                "x_v (K = 1 needs N = m + 1): some coordinates get no noise")
    if clip is None:
        return "per-sample gradients are not clipped: one sample can move the gradient anywhere"
    return ""


def account_refreshed(
    *,
    graph: DegreeGraph,
    gamma: float,
    p: float,
    K: int,
    m: int,
    N: int,
    num_params: int,
    measure: str,
    refresh: Refresh,
    iterations: int,
    clip: float | None,
    batch_size: int | None,
    delta: float,
    attacker: str = "neighbour",
    samples: int | None = None,
) -> RefreshedPrivacy:
    """epsilon at delta for each training sample of every agent, worst agent reported.

    gamma, p: the noise (sigma_k^2 = gamma / k^p); K, m, N, measure: the basis and selection
    (m perturbed of the model's num_params); refresh; iterations T; clip C (None: not clipped);
    batch_size B (None: full batch, which needs `samples`); samples: the agent's own sample
    count n_i (optional; it only lowers the rounds composed, see the module docstring; private,
    so only its own operator can give it); attacker: one of ATTACKERS.
    """
    _positive("gamma", gamma)
    _positive("p", p)
    for name, value in (("K", K), ("m", m), ("N", N), ("num_params", num_params),
                        ("iterations", iterations)):
        _positive(name, value, integral=True)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if not isinstance(refresh, Refresh):
        raise TypeError(f"refresh must be a Refresh, got {type(refresh).__name__}")
    if clip is not None:
        _positive("clip", clip)
    if samples is not None:
        _positive("samples", samples, integral=True)
    if batch_size is None:
        if samples is None:
            raise ValueError("full batch (batch_size None) needs the agent's sample count")
        batch_size = samples
    _positive("batch_size", batch_size, integral=True)
    if samples is not None and batch_size > samples:
        raise ValueError(f"batch_size {batch_size} exceeds the {samples} samples")
    scale = gradient_noise_scale(measure=measure, m=m)
    compositions = iterations if samples is None else min(
        iterations, -(-iterations // (samples // batch_size)))
    reason = _why_unbounded(refresh=refresh, K=K, m=m, N=N, num_params=num_params, clip=clip)
    per_agent, multipliers = [], []
    for i in range(graph.n):
        streams = uncancelled_streams(graph.degree(i), attacker)
        multiplier = 0.0
        if not reason and streams:
            sensitivity = 2.0 * float(clip) / batch_size  # type: ignore[arg-type]
            multiplier = scale * math.sqrt(streams * gamma / float(N) ** p) / sensitivity
        multipliers.append(multiplier)
        per_agent.append(math.inf if reason else compose_gaussian(
            noise_multiplier=multiplier, count=compositions, delta=delta))
    worst = max(range(graph.n), key=lambda i: (per_agent[i], -multipliers[i]))
    if not reason and multipliers[worst] == 0.0:
        if attacker == "neighbours":
            reason = "together they hold every seed of an agent's noise and cancel it"
        elif uncancelled_streams(graph.degree(worst), attacker) == 0:
            reason = (f"agent {worst + 1} has a single neighbour, which holds both seeds of its "
                      "noise and cancels it")
        else:
            reason = (f"the {measure} basis scales the noise by 2^(-m/2), which underflows at "
                      f"m = {m}")
    result = RefreshedPrivacy(
        epsilon=per_agent[worst], delta=delta, attacker=attacker, refresh=str(refresh),
        iterations=iterations, compositions=compositions, noise_multiplier=multipliers[worst],
        worst_agent=worst, per_agent=tuple(per_agent), reason=reason, statement="")
    return _with_statement(result, clip=clip, batch_size=batch_size)


_WHO = {
    "neighbour": "any single curious neighbour (it holds the two seeds it shares with the agent)",
    "eavesdropper": "an eavesdropper who sees every message but holds no seed",
    "neighbours": "the coalition of all of an agent's neighbours",
}


def _with_statement(result: RefreshedPrivacy, *, clip: float | None,
                    batch_size: int) -> RefreshedPrivacy:
    breaks = ("It is broken by the coalition of all of an agent's neighbours, which holds every "
              "seed of its noise (for an agent with one neighbour, that neighbour alone).")
    if result.reason:
        text = (f"No differential privacy against {_WHO[result.attacker]}: {result.reason}. "
                + ("" if result.attacker == "neighbours" else breaks))
    else:
        text = (f"Each training sample of every agent is ({result.epsilon:.4g}, "
                f"{result.delta:g})-differentially private over {result.iterations} rounds "
                f"(replace-one, per-sample gradients clipped to {clip:g}, batches of "
                f"{batch_size}, {result.compositions} rounds composed; worst: agent "
                f"{result.worst_agent + 1}) against {_WHO[result.attacker]}, even one that "
                f"recovers every perturbed gradient the agent releases. {breaks}")
    return RefreshedPrivacy(**{**result.to_dict(), "per_agent": result.per_agent,
                               "statement": text})


def gamma_for_refreshed_epsilon(*, target_epsilon: float, **kwargs: Any) -> float:
    """The smallest gamma (to 1e-9 relative) whose account_refreshed(gamma=..., **kwargs)
    epsilon is <= target_epsilon; ValueError when no gamma gives a bound."""
    _positive("target_epsilon", target_epsilon)
    probe = account_refreshed(gamma=1.0, **kwargs)
    if probe.reason:
        raise ValueError(f"no gamma helps: {probe.reason}")
    low, high = -60.0, 60.0  # log10 gamma
    if account_refreshed(gamma=10.0**high, **kwargs).epsilon > target_epsilon:
        raise ValueError(f"even gamma = 1e{high:g} gives epsilon above {target_epsilon}")
    while high - low > 1e-10:
        mid = (low + high) / 2.0
        if account_refreshed(gamma=10.0**mid, **kwargs).epsilon <= target_epsilon:
            high = mid
        else:
            low = mid
    return 10.0**high
