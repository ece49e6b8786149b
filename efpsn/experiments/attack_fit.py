"""Attackers that use many rounds of one agent's released gradients (efpsn/experiments/
attack_view.py) against a softmax regression, whose single-sample gradient is linear in the
sample once the iterate and the residual are known:

    grad_W = (p - y) x^T,  grad_b = p - y,  p = softmax(W x + b)    (plus l2 * iterate, public)

or a ridge regression (LinearModel.link "identity", one output): the same with p = w.x + b and
y the sample's target, so everything below holds with the prediction in place of softmax's.

A K = 1 mask's gradient is a constant vector, so the difference of two consecutive rounds removes
the fixed part of any mask; what is left is d_t = (p_{t+1} - p_t) x^T (+ the bias part) plus
the difference of the rounds' fresh parts, if any. The label cancels in d_t.

- `svd_estimate` ("all rounds"; "late" on the last 10% of rounds): stack the weight blocks of
  the differences, reshaped (classes, features), and take the top right singular vector: the
  direction of x exactly when the differences are noise-free (each is rank one with right factor
  x). Sign and scale are fitted to the differences through the model.
- `map_estimate` ("regression"): the model-aware fit. Minimises
      sum_t sum_j (d_tj - m_tj(x))^2 / s_tj  +  (x - mu)^T (Sigma + delta I)^(-1) (x - mu)
  over x, with the prior mean mu and covariance Sigma from public data (the other parties'), and
  noise variances s_tj = a_t b_j (one scale per round, one per coordinate) re-estimated from the
  residuals (iteratively reweighted): the attacker learns from what it sees how noisy each round
  and each coordinate is, whatever the refresh mode. Started from mu and from the SVD estimate;
  the lower objective wins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from efpsn.experiments.attack_view import RoundView

__all__ = ["Differences", "Levels", "LinearModel", "Prior", "differences", "levels", "map_estimate",
           "profiled_svd_estimate", "svd_estimate"]


@dataclass(frozen=True)
class LinearModel:
    """A linear model's public shape: W (classes, features) row-major, then b; `link`:
    "softmax" (logistic regression's probabilities) or "identity" (ridge's one number)."""

    classes: int
    features: int
    l2: float
    link: str = "softmax"

    def outputs(self, scores: torch.Tensor) -> torch.Tensor:
        """What the gradient's residual is made of: softmax over the last axis, or the
        scores as they are (ridge)."""
        return scores if self.link == "identity" else torch.softmax(scores, dim=-1)

    def split(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(..., d) -> weight block (..., classes, features), bias block (..., classes)."""
        k = self.classes * self.features
        lead = v.shape[:-1]
        return v[..., :k].reshape(*lead, self.classes, self.features), v[..., k:]


@dataclass(frozen=True)
class Prior:
    """Gaussian prior on the sample from public data: mean (f,), covariance (f, f)."""

    mean: np.ndarray
    cov: np.ndarray

    @classmethod
    def from_data(cls, features: np.ndarray) -> Prior:
        x = np.asarray(features, dtype=np.float64).reshape(len(features), -1)
        return cls(mean=x.mean(axis=0), cov=np.atleast_2d(np.cov(x, rowvar=False)))

    def precision(self, *, shrink: float = 1e-3) -> np.ndarray:
        f = len(self.mean)
        delta = shrink * max(float(np.trace(self.cov)) / f, 1e-12)
        return np.linalg.inv(self.cov + delta * np.eye(f))


@dataclass(frozen=True)
class Differences:
    """Released gradients (minus the public l2 term) differenced over pairs of rounds."""

    before: np.ndarray  # (P, d) the earlier round's point
    after: np.ndarray  # (P, d) the later round's point
    delta: np.ndarray  # (P, d) g_after - g_before


@dataclass(frozen=True)
class Levels:
    """Released gradients (minus the public l2 term) of every kept round, undifferenced."""

    points: np.ndarray  # (T, d)
    grads: np.ndarray  # (T, d)
    linear: bool = False  # profile out A z + c (a degree-2 mask's gradient), not only c


def levels(view: RoundView, model: LinearModel, *, late: bool = False,
           linear: bool = False) -> Levels:
    """The view's kept rounds (only those in the last 10% when `late`); `linear`: the fit
    profiles out any fixed linear function of the point (a degree-2 mask's A_0 z + c)."""
    keep = view.rounds >= (int(0.9 * view.horizon) if late else 0)
    if keep.sum() < 2:
        raise ValueError("fewer than two rounds to fit")
    return Levels(points=view.points[keep],
                  grads=view.grads[keep] - model.l2 * view.points[keep], linear=linear)


def differences(view: RoundView, model: LinearModel, *, late: bool = False) -> Differences:
    """The view's non-overlapping consecutive pairs (only those in the last 10% when `late`)."""
    first = int(0.9 * view.horizon) if late else 0
    a, b = view.pairs(first_round=first)
    if len(a) == 0:
        raise ValueError(f"no consecutive rounds at or after round {first} in the view")
    clean = view.grads - model.l2 * view.points
    return Differences(before=view.points[a], after=view.points[b], delta=clean[b] - clean[a])


def _predict(model: LinearModel, diffs: Differences, x: torch.Tensor) -> torch.Tensor:
    """m(x): (P, d) the differences the model predicts for sample x (any label)."""
    probs = []
    for points in (diffs.before, diffs.after):
        weight, bias = model.split(torch.from_numpy(points))
        probs.append(model.outputs(weight @ x + bias))
    change = probs[1] - probs[0]  # (P, C)
    grad_w = change[:, :, None] * x[None, None, :]
    return torch.cat([grad_w.reshape(len(change), -1), change], dim=1)


def _fit_scale(model: LinearModel, diffs: Differences, direction: np.ndarray,
               weights: np.ndarray) -> np.ndarray:
    """s * direction with the sign and scale s that best explain the differences."""
    target = torch.from_numpy(diffs.delta)
    w = torch.from_numpy(weights)[:, None]
    v = torch.from_numpy(direction)

    def loss(s: float) -> float:
        return float((w * (target - _predict(model, diffs, s * v)) ** 2).sum())

    grid = [sign * 10.0 ** e for sign in (1.0, -1.0) for e in np.linspace(-3, 3, 25)]
    best, width = min(grid, key=loss), 0.25
    for _ in range(40):  # refine around the best point in log scale, halving the bracket
        best = min((best * 10.0 ** e for e in (-width, 0.0, width)), key=loss)
        width /= 2
    return np.asarray(best * direction)


def svd_estimate(model: LinearModel, diffs: Differences) -> np.ndarray:
    """Top right singular vector of the stacked (classes, features) weight differences, each
    pair normalised to unit norm (a noisy pair does not outweigh the rest), scaled by the
    model."""
    weight, _ = model.split(diffs.delta)
    norms = np.linalg.norm(diffs.delta, axis=1)
    norms = np.where(norms > 0, norms, 1.0)
    stacked = (weight / norms[:, None, None]).reshape(-1, model.features)
    _, _, vt = np.linalg.svd(stacked, full_matrices=False)
    return _fit_scale(model, diffs, vt[0], 1.0 / norms ** 2)


def _variances(residual: np.ndarray, floor: float) -> np.ndarray:
    """Separable noise variances a_t b_j fitted to squared residuals (two alternations)."""
    sq = residual ** 2 + floor
    rows = sq.mean(axis=1)
    for _ in range(2):
        cols = (sq / rows[:, None]).mean(axis=0)
        rows = (sq / cols[None, :]).mean(axis=1)
    return rows[:, None] * cols[None, :]


def _levels(model: LinearModel, points: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """softmax(W_t x + b_t) (x, 1) per round: the gradient's part that varies with the round
    (the label's part -y (x, 1) is the same every round)."""
    weight, bias = model.split(torch.from_numpy(points))
    probs = model.outputs(weight @ x + bias)  # (T, C)
    grad_w = probs[:, :, None] * x[None, None, :]
    return torch.cat([grad_w.reshape(len(probs), -1), probs], dim=1)


def _residual(model: LinearModel, data: Differences | Levels, x: torch.Tensor,
              rows: torch.Tensor) -> torch.Tensor:
    """What the noise must explain if the sample is x: differences minus the model's; or levels
    minus the model's, minus the constant (a K = 1 mask's fixed part, and the label's) fitted
    with the rounds' weights 1 / rows."""
    if isinstance(data, Differences):
        return torch.from_numpy(data.delta) - _predict(model, data, x)
    resid = torch.from_numpy(data.grads) - _levels(model, data.points, x)
    weights = (1.0 / rows)[:, None]
    if not data.linear:
        return resid - (weights * resid).sum(dim=0) / weights.sum()
    # weighted least squares of every coordinate on (z_t, 1): minus its fit
    design = torch.cat([torch.from_numpy(data.points),
                        torch.ones(len(data.points), 1, dtype=torch.float64)], dim=1)
    gram = design.T @ (weights * design)
    ridge = 1e-10 * torch.trace(gram) / len(gram) * torch.eye(len(gram), dtype=torch.float64)
    coef = torch.linalg.solve(gram + ridge, design.T @ (weights * resid))
    return resid - design @ coef


def map_estimate(model: LinearModel, data: Differences | Levels, prior: Prior, *,
                 passes: int = 3, steps: int = 50, start: np.ndarray | None = None,
                 variances: np.ndarray | None = None) -> np.ndarray:
    """The MAP fit of the sample (module docstring), `passes` reweightings of L-BFGS."""
    mu = torch.from_numpy(prior.mean)
    precision = torch.from_numpy(prior.precision())
    observed = data.delta if isinstance(data, Differences) else data.grads
    floor = 1e-24 * float(np.mean(observed ** 2)) + 1e-300
    fixed = variances is not None
    if variances is None:  # first pass: all of it could be noise
        variances = _variances(_residual(model, data, mu, torch.ones(len(observed))).numpy(),
                               floor)
    starts = [prior.mean] + ([] if start is None else [start])
    best_x = prior.mean  # passes = 0: the prior mean
    for _ in range(passes):
        inv = torch.from_numpy(1.0 / variances)
        rows = torch.from_numpy(variances.mean(axis=1))
        at_mean = _residual(model, data, mu, rows)
        scale = float((inv * at_mean ** 2).sum()) + len(prior.mean)  # the objective at mu

        def objective(x: torch.Tensor, inv: torch.Tensor = inv, rows: torch.Tensor = rows,
                      scale: float = scale) -> torch.Tensor:
            resid = _residual(model, data, x, rows)
            gap = x - mu
            return ((inv * resid ** 2).sum() + gap @ precision @ gap) / scale

        _, best_x = lbfgs_from(objective, starts, steps=steps, history=50,
                               tolerance_grad=1e-14, tolerance_change=1e-16)
        starts = [best_x]
        if not fixed:
            variances = _variances(
                _residual(model, data, torch.from_numpy(best_x), rows).detach().numpy(), floor)
    return best_x


def profiled_svd_estimate(model: LinearModel, data: Levels) -> np.ndarray:
    """Against a degree-2 mask: the released gradient is r_t (x, 1)^T + A z_t + c (+ noise),
    r_t = softmax(W_t x + b_t) - e_y. Projecting every coordinate's rounds off (z_t, 1) removes
    A z_t + c and leaves (Pi R) (x, 1)^T per class block: rank one with right factor (x, 1),
    whose last entry fixes the scale. Exact when noise-free and r_t is not linear in z_t."""
    design = np.concatenate([data.points, np.ones((len(data.points), 1))], axis=1)
    coef, *_ = np.linalg.lstsq(design, data.grads, rcond=None)
    resid = data.grads - design @ coef
    weight, bias = model.split(resid)
    stacked = np.concatenate([weight, bias[:, :, None]], axis=2).reshape(-1, model.features + 1)
    _, _, vt = np.linalg.svd(stacked, full_matrices=False)
    top = vt[0]
    if top[-1] == 0.0:
        raise ValueError("the profiled direction has no bias part: no scale")
    return np.asarray(top[:-1] / top[-1])


def lbfgs_from(objective: Callable[[torch.Tensor], torch.Tensor], starts: Sequence[np.ndarray],
               *, steps: int, history: int, tolerance_grad: float, tolerance_change: float
               ) -> tuple[float, np.ndarray]:
    """The lowest (objective value, x) that L-BFGS (strong Wolfe line search, float64) reaches
    from each of `starts`; (inf, the first start) if none is finite."""
    best, best_x = np.inf, np.asarray(starts[0])
    for x0 in starts:
        x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([x], lr=1.0, max_iter=steps, history_size=history,
                                line_search_fn="strong_wolfe", tolerance_grad=tolerance_grad,
                                tolerance_change=tolerance_change)

        def closure(x: torch.Tensor = x, opt: torch.optim.Optimizer = opt) -> torch.Tensor:
            opt.zero_grad()
            value = objective(x)
            value.backward()
            return value

        opt.step(closure)
        value = float(objective(x.detach()))
        if value < best:
            best, best_x = value, x.detach().numpy().copy()
    return best, best_x
