"""The default step rule (`--schedule auto`): step size, momentum and number of rounds of
gradient tracking from public quantities only, so a masked run ends where the unmasked one ends.

Nothing here reads anyone's data. The inputs are the run's public parameters: the model's number
of features d, its L2 weight l2 (the strong convexity), and the mixing matrix of the public
graph. Logistic regression's smoothness is at most L = (d + 1) / 2 + l2: the softmax
cross-entropy's Hessian is at most half the largest eigenvalue of E[x~ x~^T] (x~ the features
after the public scale, with the bias's constant 1), and every agent checks on its own training
data, without telling anyone, that this eigenvalue is at most d + 1, which any data in [-1, 1]
or standardised to unit variance meets (efpsn.data.local.check_second_moment). Ridge's
squared loss has that matrix itself as its Hessian: L = d + 1 + l2.

Accelerated gradient tracking (`agt`, the default) runs on the lazy matrix W' = (I + W) / 2. For
one mode of W' (eigenvalue lam) and a curvature h in [l2, L], the iteration is linear in
(x, x_prev, alpha y) with the 3x3 matrix `companion`; alpha = c / L is stable for every mode and
every curvature up to c_max (found by bisection), and the rule takes 0.8 c_max, momentum
beta = (1 - q) / (1 + q), q = sqrt(alpha l2), and
    rounds = ceil(ln(1e9) / q + ln(1e3) / (1 - rho)),
the first term the average's rate 1 - q from a distance 1 to 1e-9, the second the slowest
disagreement mode rho of those matrices (where the zero-sum masks start, of size sqrt(gamma)
<= 1e3), capped at MAX_ROUNDS. Measured on five data sets, the rule's rounds sufficed with
margin (docs/RESULTS.md). Plain gradient tracking (`gt`) gets DIGing's margin alpha = 0.9 (1 +
lambda_min(W))^2 / (2 L); DSGD gets the paper's schedule.

Models without a public curvature bound (LeNet, MLPs, a user's model) train on mini-batches by
default (`--batch-size auto`: AUTO_MINI_BATCH samples per agent and round, a stochastic
gradient tracking): agt with Nesterov momentum 0.9 and the one-cycle step (efpsn/params/
schedules.py, OneCycle: a warm-up over the first 15% of rounds from 0.01 to the peak 0.1, then
a linear decay), for a round budget of MINI_BATCH_SAMPLES samples per agent (1,500 rounds at
batch 64; 96,000 / B at batch B: the budget is samples, so a smaller batch runs more rounds).
There is no certificate without a curvature bound, so the budget is the stop rule; its numbers
were measured on LeNet (docs/RESULTS.md, "Neural networks on mini-batches"), a guess for other
models. The fading mask's fresh part stops at a floor on any mini-batches (fading_floor): the
batches' noise never dies out, so neither may the noise that hides them. The warm-up matters
for the masks: gradient tracking's trackers carry the zero-sum masks' start, and a neural
network whose agents' iterates it drives far apart under a full step saturates and never
recovers (measured: LeNet stuck at chance). Full batch (`--batch-size
full`) keeps the former guess: a constant step of 0.05 and 2,000 rounds, without momentum. The
run's convergence report says how far it got.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from efpsn.params.model_sizes import l2_weight
from efpsn.params.schema import TaskSpec

__all__ = ["AUTO_MINI_BATCH", "MAX_ROUNDS", "MINI_BATCH_FADE_FLOOR", "MINI_BATCH_MOMENTUM",
           "MINI_BATCH_PEAK", "MINI_BATCH_SAMPLES", "NO_BOUND_ROUNDS", "NO_BOUND_STEP", "StepRule", "companion",
           "fading_floor", "fading_rate", "mini_batch_rounds", "public_curvature", "step_rule"]

NO_BOUND_STEP = 0.05  # models without a public curvature bound, full batch
NO_BOUND_ROUNDS = 2000
AUTO_MINI_BATCH = 64  # --batch-size auto for a model without a curvature bound (the paper's)
MINI_BATCH_PEAK = 0.1  # the one-cycle step's peak, with momentum MINI_BATCH_MOMENTUM (agt)
MINI_BATCH_MOMENTUM = 0.9
MINI_BATCH_SAMPLES = 128_000  # per agent: the round budget is this over the batch size
# the fading mask's fresh part never shrinks below this fraction of its start on mini-batches
MINI_BATCH_FADE_FLOOR = 1e-3
PAPER_ROUNDS = 10_000  # DSGD with the paper's schedule
# The rounds rule's disagreement term grows fast on large sparse graphs (a 100-ring: millions of
# rounds), where it is also far too pessimistic (about 12x on a 30-ring, measured): the default
# is capped, and the run's convergence report says whether the cap sufficed.
MAX_ROUNDS = 20_000
SAFETY = 0.8  # of the largest stable c
_CURVATURES = 80  # h on a geometric grid of [l2, L]
_BISECTIONS = 14


@dataclass(frozen=True)
class StepRule:
    """What the rule gives: a constant step size (None: the paper's decaying schedule; with
    `cycle`, the one-cycle schedule's peak), the momentum of accelerated tracking, the rounds,
    the public curvature bound it used, and the contraction of the slowest disagreement mode
    per round (`mixing`; None for DSGD and models without a curvature bound)."""

    step: float | None
    momentum: float
    rounds: int
    curvature: float | None
    mixing: float | None = None
    cycle: bool = False  # the step is OneCycle's peak (mini-batches without a curvature bound)


def mini_batch_rounds(batch: int) -> int:
    """The round budget of mini-batch training without a curvature bound: MINI_BATCH_SAMPLES
    samples per agent, ceil(96,000 / batch) rounds (1,500 at batch 64)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    return min(MAX_ROUNDS, -(-MINI_BATCH_SAMPLES // batch))


def fading_rate(rule: StepRule, *, algorithm: str, step: float | None, mu: float,
                rounds: int) -> float:
    """The fading mask's public rate RHO (`--refresh fading`), never faster than the algorithm
    contracts with the run's own constant `step` (None: a decaying schedule): the average's
    rate (agt 1 - sqrt(step mu), gt 1 - step mu) or the step rule's slowest disagreement mode
    (`rule.mixing`), whichever is slower; without a contraction rate (DSGD, mu = 0), the rate
    that fades the fresh part to 1e-9 of its size over the run's `rounds`. Rounded up to six
    significant digits of 1 - RHO (a public number every machine reads the same). Not faster:
    RHO^1.5 or RHO^2 would stop a masked run near the unmasked round but was measured to leak
    (efpsn/masks/fading.py)."""
    rate = None
    if step is not None and mu > 0 and algorithm in ("agt", "gt"):
        average = 1 - math.sqrt(step * mu) if algorithm == "agt" else 1 - step * mu
        if 0 < average < 1:
            rate = max(average, rule.mixing or 0.0)
    if rate is None:
        rate = 1e-9 ** (1.0 / max(1, rounds))
    digits = 10 ** (5 - math.floor(math.log10(1 - rate)))  # six significant digits of 1 - rate
    return min(1 - 1 / digits, 1 - math.floor((1 - rate) * digits) / digits)


def fading_floor(batch: int | None) -> float:
    """The fading mask's public floor for a run on batches of `batch` samples (None: full):
    MINI_BATCH_FADE_FLOOR on mini-batches, whose noise never dies out, so a fresh part that did
    would leave late rounds' difference a bare batch gradient; 0 on full batches, where the
    fresh part must die out for the run to end at x* (efpsn/masks/fading.py)."""
    return 0.0 if batch is None else MINI_BATCH_FADE_FLOOR


def public_curvature(task: TaskSpec | str, *, features: int, l2: float) -> float | None:
    """L = (d + 1) / 2 + l2 for logistic regression and L = d + 1 + l2 for ridge
    (lambda_max(E[x~ x~^T]) <= d + 1 after the public scale, which each agent checks on its own
    data; the softmax cross-entropy's Hessian is at most half of it, the squared loss's is it);
    None for models without such a bound."""
    spec = TaskSpec.of(task)
    if not spec.linear:
        return None
    factor = 1.0 if spec.regression else 0.5
    return factor * (features + 1) + l2_weight(task, l2)


def companion(lam: float, a: float, beta: float) -> np.ndarray:
    """One mode of accelerated tracking on f_i = h/2 x^2 for every i (a = alpha h, W' eigenvalue
    lam): the linear map of (x, x_prev, alpha y)."""
    row_x = np.array([lam * (1 + beta), -lam * beta, -1.0])
    dz = (1 + beta) * row_x + np.array([-(1 + 2 * beta), beta, 0.0])
    return np.array([row_x, [1.0, 0.0, 0.0], np.array([0.0, 0.0, lam]) + a * dz])


def _spectral_radius(lams: np.ndarray, hs: np.ndarray, c: float, kappa: float) -> float:
    """The largest spectral radius of `companion` over every mode lam and curvature h (one
    batched eigenvalue call)."""
    q = math.sqrt(c / kappa)
    beta = (1 - q) / (1 + q)
    mats = np.stack([companion(lam, c * h, beta) for lam in lams for h in hs])
    return float(np.max(np.abs(np.linalg.eigvals(mats))))


def nesterov_margin(eigenvalues: np.ndarray, kappa: float) -> tuple[float, float]:
    """(c_max, rho): the largest c (alpha = c / L) for which every disagreement mode of W'
    (eigenvalue < 1) is stable at every curvature h in [L / kappa, L], and the slowest of
    those modes at SAFETY c_max."""
    lams = np.unique(np.round(eigenvalues[eigenvalues < 1 - 1e-12], 12))
    hs = np.geomspace(1.0 / kappa, 1.0, _CURVATURES)
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        low, high = (mid, high) if _spectral_radius(lams, hs, mid, kappa) < 1 else (low, mid)
    return low, _spectral_radius(lams, hs, SAFETY * low, kappa)


def _rounded(value: float) -> float:
    """Six significant digits: a public number every machine writes and reads the same."""
    return float(f"{value:.6g}")


def step_rule(*, algorithm: str, task: TaskSpec | str, features: int, l2: float,
              weights: np.ndarray, batch: int | None = None) -> StepRule:
    """The default step size, momentum and rounds of `algorithm` for this model and mixing
    matrix (efpsn.topology.metropolis_weights), on mini-batches of `batch` samples (None: the
    full local data set)."""
    if algorithm == "dsgd":
        return StepRule(step=None, momentum=0.0, rounds=PAPER_ROUNDS, curvature=None)
    curvature = public_curvature(task, features=features, l2=l2)
    mu = l2_weight(task, l2)
    if batch is not None and not TaskSpec.of(task).linear:  # a neural network on batches
        return StepRule(step=MINI_BATCH_PEAK,
                        momentum=MINI_BATCH_MOMENTUM if algorithm == "agt" else 0.0,
                        rounds=mini_batch_rounds(batch), curvature=None, cycle=True)
    if curvature is None or mu <= 0:
        return StepRule(step=NO_BOUND_STEP, momentum=0.0, rounds=NO_BOUND_ROUNDS,
                        curvature=curvature)
    if algorithm == "gt":  # DIGing on W: stable for alpha h < (1 + lambda_min(W))^2 / 2
        eigenvalues = np.linalg.eigvalsh(weights)
        step = _rounded(0.9 * (1 + eigenvalues[0]) ** 2 / (2 * curvature))
        rounds = math.log(1e9) / (step * mu) + math.log(1e3) / (1 - eigenvalues[-2])
        return StepRule(step=step, momentum=0.0, rounds=min(MAX_ROUNDS, math.ceil(rounds)),
                        curvature=curvature, mixing=float(eigenvalues[-2]))
    if algorithm != "agt":
        raise ValueError(f"no step rule for algorithm {algorithm!r}")
    lazy = (np.eye(len(weights)) + weights) / 2
    c_max, rho = nesterov_margin(np.linalg.eigvalsh(lazy), curvature / mu)
    step = _rounded(SAFETY * c_max / curvature)
    q = math.sqrt(step * mu)
    momentum = _rounded((1 - q) / (1 + q))
    rounds = math.ceil(math.log(1e9) / q + math.log(1e3) / (1 - rho))
    return StepRule(step=step, momentum=momentum, rounds=min(MAX_ROUNDS, rounds),
                    curvature=curvature, mixing=rho)
