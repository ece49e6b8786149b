"""Did the run converge? A bound on ||x_bar - x*|| / ||x*|| from what the agents already hold.

For logistic regression with the step rule's public curvature bound L (efpsn/params/step_rule.py)
and strong convexity mu = l2, gradient tracking keeps the average of the trackers equal to the
average gradient at the points z_i the agents last evaluated (z = x for plain tracking). So,
for the network objective F (its gradient the average of the perturbed ones, which equals the
unperturbed one: the masks sum to zero):

    ||z_bar - x*|| <= ||grad F(z_bar)|| / mu <= (max_i ||y_i|| + L max_i ||z_i - z_bar||) / mu,
    ||z_i - z_bar|| <= (1/n) sum_j ||z_i - z_j|| <= M max_(i,j) edge ||z_i - z_j||,
    ||x_bar - x*|| <= ||z_bar - x*|| + beta max_i ||x_i - x_i^-||,

M = max_i (1/n) sum_j dist(i, j) the graph's largest mean hop distance (`mean_distance`, public:
||z_i - z_j|| <= dist(i, j) times the largest edge gap along a shortest path), at most the
diameter D times (n - 1) / n: 1.2 on the 5-ring where D = 2. (With the fading mask
this gap term, not the tracker, is the certificate's largest term at the stop, so the tighter
factor stops a masked run earlier; the bound is as sound as with D.)

Under secure aggregation (efpsn/masks/aggregation.py) an agent never sees one neighbour's point,
only their weighted mean z_hat_i = sum_j w_ij z_j / sum_j w_ij, and its gap is ||z_i - z_hat_i||.
Those residuals are r = (I - P) z, P_ij = w_ij / sum_(k != i) w_ik off the diagonal; on the
mean-free part (I - P) is invertible, so z_i - z_bar = sum_k G_ik r_k with G = Q ((I - P) Q)^+
(Q an orthonormal basis of the vectors summing to 0), and ||z_i - z_bar|| <= S max_k ||r_k||
with S = max_i sum_k |G_ik| (`spread`, public: from the weights alone) in place of M.

With that bound B, ||x*|| >= ||x_bar|| - B gives the certificate B / (||x_bar|| - B), an
upper bound on the relative distance (infinite while B >= ||x_bar||). Every input is an
agent's own measure of its last round (efpsn.optimize.driver.progress: tracker, gap, step), the
public L, mu, beta and graph, and ||x_bar||: nobody needs x*, and nothing private is shared.

A run is reported converged when the certificate is at most TARGET; models without a public
curvature bound (LeNet, MLPs, a user's) and DSGD (no tracker) get no certificate, only the
measures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from efpsn.params.config import RunConfig

__all__ = ["TARGET", "Certificate", "Certifier", "certify", "diameter", "mean_distance",
           "spread"]

# The relative distance to x* a run must be certified within to count as converged, and where
# the stop rule (efpsn/optimize/stopping.py) ends a run (masked and unmasked runs alike).
TARGET = 1e-3


def _distances(weights: np.ndarray) -> np.ndarray:
    """Shortest-path hop counts of the graph whose edges are the nonzero off-diagonal weights
    (Floyd-Warshall). ValueError when the graph is disconnected."""
    hops = np.where(np.asarray(weights) > 0, 1.0, np.inf)
    np.fill_diagonal(hops, 0.0)
    for k in range(len(hops)):
        hops = np.minimum(hops, hops[:, [k]] + hops[[k], :])
    if not np.all(np.isfinite(hops)):
        raise ValueError("the graph is disconnected: no diameter")
    return hops


def diameter(weights: np.ndarray) -> int:
    """The longest shortest path (in hops); ValueError when disconnected."""
    return int(_distances(weights).max())


def mean_distance(weights: np.ndarray) -> float:
    """M = max_i (1/n) sum_j dist(i, j): ||z_i - z_bar|| <= M times the largest edge gap (the
    module docstring); at most the diameter times (n - 1) / n."""
    return float(_distances(weights).mean(axis=1).max())


def spread(weights: np.ndarray) -> float:
    """S = ||G||_inf: ||z_i - z_bar|| <= S max_k ||z_k - z_hat_k|| (the module docstring)."""
    w = np.array(weights, dtype=np.float64)
    np.fill_diagonal(w, 0.0)
    sums = w.sum(axis=1)
    if np.any(sums <= 0):
        raise ValueError("an agent without neighbours has no neighbour mean")
    a = np.eye(len(w)) - w / sums[:, None]
    q, _ = np.linalg.qr(np.eye(len(w)) - 1.0 / len(w))
    q = q[:, :len(w) - 1]  # an orthonormal basis of the mean-free vectors
    g = q @ np.linalg.pinv(a @ q)
    return float(np.abs(g).sum(axis=1).max())


@dataclass(frozen=True)
class Certificate:
    """The bound (None: no certificate for this model or algorithm) and a line for the user."""

    bound: float | None
    converged: bool
    line: str

    def to_json(self) -> dict[str, object]:
        """For summary.json: the bound (None: no certificate, or none finite yet), whether the
        run converged, and the line the user saw."""
        finite = self.bound is not None and math.isfinite(self.bound)
        return {"certificate": self.bound if finite else None, "converged": self.converged,
                "line": self.line}


def distance_bound(*, tracker: float, gap: float, step: float, curvature: float, l2: float,
                   hops: float, momentum: float) -> float:
    """B >= ||x_bar - x*||: (||y|| + L M gap) / mu + beta step (the module's docstring)."""
    return (tracker + curvature * hops * gap) / l2 + momentum * step


def certify(measures: Mapping[str, float], *, x_bar_norm: float, curvature: float | None,
            l2: float, hops: float, momentum: float, rounds: int, rate: float | None = None,
            fallback_rounds: int | None = None, target: float = TARGET) -> Certificate:
    """The certificate from the network's worst measures (efpsn.optimize.driver.worst: tracker, gap,
    step), ||x_bar||, the public curvature bound (None: none), mu = l2, the gap's factor `hops`
    (the graph's mean distance M, or for an aggregated gap the spread S),
    the momentum beta and the rounds run. `rate` (the step rule's contraction per round,
    1 - q) turns an uncertified bound into a rounds estimate; while there is no finite bound
    yet, the advice is `fallback_rounds` (the step rule's) or twice the rounds run."""
    tracker = measures.get("tracker", math.nan)
    gap = measures.get("gap", math.nan)  # a missing measure never counts as zero
    step = measures.get("step", math.nan) if momentum else 0.0
    if curvature is None or l2 <= 0 or not math.isfinite(tracker + gap + step):
        why = ("no public curvature bound for this model" if curvature is None or l2 <= 0
               else "no tracker (DSGD)" if math.isnan(tracker)
               else "the measures of the last round are missing or not finite")
        return Certificate(None, False, _uncertified(measures, why))
    bound = distance_bound(tracker=tracker, gap=gap, step=step, curvature=curvature, l2=l2,
                           hops=hops, momentum=momentum)
    value = bound / (x_bar_norm - bound) if bound < x_bar_norm else math.inf
    if value <= target:
        return Certificate(value, True, f"converged: ||x_bar - x*|| <= {value:.2g} ||x*|| "
                                        f"(certified after {rounds} rounds; target {target:g})")
    if math.isfinite(value) and rate is not None and 0 < rate < 1:
        advice = rounds + math.ceil(math.log(value / target) / -math.log(rate))
    else:
        advice = max(fallback_rounds or 0, 2 * rounds)
    shown = f"{value:.2g} ||x*||" if math.isfinite(value) else "nothing yet (B >= ||x_bar||)"
    return Certificate(value, False,
                       f"NOT converged: after {rounds} rounds the certificate bounds "
                       f"||x_bar - x*|| by {shown}, above the target {target:g}; raise "
                       f"--iterations to about {advice}")


def _uncertified(measures: Mapping[str, float], why: str) -> str:
    step = measures.get("relative_step", math.nan)
    gap = measures.get("relative_gap", math.nan)
    return (f"no convergence certificate ({why}): the last round moved the iterates by "
            f"{step:.2g} and neighbours disagree by {gap:.2g}, relative to ||x||")


@dataclass(frozen=True)
class Certifier:
    """certify() with one run's public numbers, derived once (Certifier.for_run)."""

    curvature: float | None
    l2: float
    hops: float  # the factor of the gap: the mean distance M, or the spread S when aggregated
    momentum: float
    rounds: int
    rate: float | None
    fallback_rounds: int | None

    @classmethod
    def for_run(cls, config: RunConfig, weights: np.ndarray, *,
                aggregate: bool = False) -> Certifier:
        """The step rule's curvature bound (logistic regression only), the L2 weight, the
        graph's mean distance M (`aggregate`: the spread S of the neighbour-mean gap), the momentum,
        the rounds and, for a constant step, the contraction per round (agt: 1 - sqrt(alpha l2); gt:
        1 - alpha l2)."""
        from efpsn.params.model_sizes import l2_weight
        from efpsn.params.schema import parse_shape
        from efpsn.params.step_rule import public_curvature, step_rule

        c = config.resolved()
        features = math.prod(parse_shape(c.input_shape))
        mu = l2_weight(c.task, c.l2)
        rate = None
        step = c.schedule.constant_step
        if step is not None and mu > 0:
            rate = 1 - math.sqrt(step * mu) if c.algorithm == "agt" else 1 - step * mu
        fade = c.refresh.fade
        if rate is not None and fade is not None:
            rate = max(rate, fade)  # the fresh part of a fading mask dies out no faster
        rule = step_rule(algorithm=c.algorithm, task=c.task, features=features, l2=c.l2,
                         weights=weights)
        return cls(curvature=public_curvature(c.task, features=features, l2=c.l2), l2=mu,
                   hops=spread(weights) if aggregate else mean_distance(weights),
                   momentum=c.momentum.value if c.algorithm == "agt" else 0.0,
                   rounds=c.iterations.total, rate=rate, fallback_rounds=rule.rounds)

    def __call__(self, measures: Mapping[str, float], *, x_bar_norm: float,
                 rounds: int | None = None) -> Certificate:
        """The certificate after `rounds` (default: the run's last)."""
        return certify(measures, x_bar_norm=x_bar_norm, curvature=self.curvature, l2=self.l2,
                       hops=self.hops, momentum=self.momentum,
                       rounds=self.rounds if rounds is None else rounds, rate=self.rate,
                       fallback_rounds=self.fallback_rounds)
