"""The floor every exact method has: what the OUTPUT alone, x*, tells a curious
neighbour about agent 0's single sample, whatever the run's masks.

Every party ends with the exact minimiser x* of sum_i f_i (the accuracy promise), so at x*

    grad f_0(x*) = - sum_{j != 0} grad f_j(x*),
    grad f_0(x*) = ((p - e_y) x^T, p - e_y) + l2 x*,   p = softmax(W* x + b*)

for a softmax regression on one sample (x, y): rank one, so x follows from the bias block r =
p - e_y and the weight block r x^T up to nothing at all once the right side is known. What the
attacker knows of the right side is its knowledge of the other parties:

- "output only: others' data": each other party's data (who holds what), so the right side is
  exact and x = G^T r / (r^T r) in closed form (the knowledge the aggregate view grants);
- "output only: pooled data": the other parties' data pooled, not who holds what nor how much:
  it predicts their sum as (n - 1) times the pooled data's mean gradient;
- "output only: own data": only the attacker's own data and the public prior (mean and
  covariance of the other parties' data: the prior the many-round regressions use). It predicts
  each party it does not know by its own data's mean gradient, takes the per-coordinate spread
  of that prediction from its own per-sample gradients (u (u + 1) variance / shard size for u
  parties predicted), and fits x by MAP with the prior, over every label, keeping the best.

Error: ||x_hat - x|| / ||x||, as for the many-round attackers (efpsn/experiments/
attack_rounds.py), against the mean guess.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from efpsn.experiments.attack_fit import LinearModel, Prior, lbfgs_from

__all__ = ["OUTPUT_ATTACKERS", "mean_gradient", "output_estimates", "rank_one_sample",
           "sample_gradients"]

OUTPUT_ATTACKERS = ("output only: others' data", "output only: pooled data",
                    "output only: own data")


def sample_gradients(model: LinearModel, x_star: np.ndarray, features: np.ndarray,
                     labels: np.ndarray) -> np.ndarray:
    """(n, d): each sample's cross-entropy gradient at x_star (no l2 term); for ridge
    (identity link) the squared loss's, (w.x + b - y) (x, 1)."""
    weight, bias = model.split(np.asarray(x_star, dtype=np.float64))
    feats = np.asarray(features, dtype=np.float64).reshape(len(features), -1)
    logits = feats @ weight.T + bias
    if model.link == "identity":
        resid = logits - np.asarray(labels, dtype=np.float64).reshape(-1, 1)
        grad_w = resid[:, :, None] * feats[:, None, :]
        return np.concatenate([grad_w.reshape(len(feats), -1), resid], axis=1)
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    resid = probs.copy()
    resid[np.arange(len(labels)), np.asarray(labels, dtype=np.int64)] -= 1.0
    grad_w = resid[:, :, None] * feats[:, None, :]
    return np.concatenate([grad_w.reshape(len(feats), -1), resid], axis=1)


def mean_gradient(model: LinearModel, x_star: np.ndarray, features: np.ndarray,
                  labels: np.ndarray) -> np.ndarray:
    """grad f_j(x*) of a party holding (features, labels): mean cross-entropy gradient + l2 x*."""
    return sample_gradients(model, x_star, features, labels).mean(axis=0) + model.l2 * x_star


def rank_one_sample(model: LinearModel, x_star: np.ndarray, grad0: np.ndarray) -> np.ndarray:
    """x from agent 0's gradient at x*: with r the bias block and G the weight block (l2 x*
    removed), G = r x^T, so x = G^T r / (r^T r) (least squares when grad0 is noisy)."""
    weight, bias = model.split(np.asarray(grad0, dtype=np.float64) - model.l2 * x_star)
    denom = float(bias @ bias)
    if denom == 0.0:
        raise ValueError("agent 0's residual is zero at x*: the gradient carries no sample")
    return np.asarray(weight.T @ bias / denom)


def _map_fit(model: LinearModel, x_star: np.ndarray, target: np.ndarray, variance: np.ndarray,
             prior: Prior, *, steps: int) -> np.ndarray:
    """argmin over x and the label of ||(g(x, y) - target)||^2_{1/variance} + prior term."""
    weight, bias = model.split(torch.from_numpy(np.asarray(x_star, dtype=np.float64)))
    goal = torch.from_numpy(target - model.l2 * x_star)
    inv = torch.from_numpy(1.0 / variance)
    mu = torch.from_numpy(prior.mean)
    precision = torch.from_numpy(prior.precision())
    best, best_x = np.inf, prior.mean
    starts = [prior.mean]
    try:
        starts.append(rank_one_sample(model, x_star, target))
    except ValueError:
        pass
    if model.link == "identity":  # ridge: the target is unknown, the residual r free
        f = model.features

        def joint(z: torch.Tensor) -> torch.Tensor:
            x, r = z[:f], z[f:]
            pred = torch.cat([(r[:, None] * x[None, :]).reshape(-1), r])
            gap = x - mu
            return (inv * (pred - goal) ** 2).sum() + gap @ precision @ gap

        residual = float(np.asarray(target - model.l2 * x_star)[-1])
        _, z = lbfgs_from(joint, [np.append(s, residual) for s in starts], steps=steps,
                          history=20, tolerance_grad=1e-12, tolerance_change=1e-14)
        return np.asarray(z[:f])
    for label in range(model.classes):
        onehot = torch.zeros(model.classes, dtype=torch.float64)
        onehot[label] = 1.0

        def objective(x: torch.Tensor, onehot: torch.Tensor = onehot) -> torch.Tensor:
            resid = torch.softmax(weight @ x + bias, dim=0) - onehot
            pred = torch.cat([(resid[:, None] * x[None, :]).reshape(-1), resid])
            gap = x - mu
            return (inv * (pred - goal) ** 2).sum() + gap @ precision @ gap

        value, x = lbfgs_from(objective, starts, steps=steps, history=20,
                              tolerance_grad=1e-12, tolerance_change=1e-14)
        if value < best:
            best, best_x = value, x
    return np.asarray(best_x)


def output_estimates(model: LinearModel, x_star: np.ndarray, *,
                     others: Sequence[tuple[np.ndarray, np.ndarray]], attacker: int,
                     prior: Prior, steps: int = 100) -> dict[str, np.ndarray]:
    """Every output-only attacker's estimate of agent 0's sample. `others[k]` is party k + 1's
    (features, labels); `attacker` indexes `others` (the curious neighbour's own data)."""
    if not 0 <= attacker < len(others):
        raise ValueError(f"attacker must index the {len(others)} other parties, got {attacker}")
    x_star = np.asarray(x_star, dtype=np.float64)
    exact = -sum(mean_gradient(model, x_star, f, y) for f, y in others)
    pooled_x = np.concatenate([np.asarray(f).reshape(len(f), -1) for f, _ in others])
    pooled_y = np.concatenate([np.asarray(y) for _, y in others])
    pooled = -len(others) * mean_gradient(model, x_star, pooled_x, pooled_y)
    own_x, own_y = others[attacker]
    own = sample_gradients(model, x_star, own_x, own_y)
    unknown = len(others) - 1
    predicted = -(mean_gradient(model, x_star, own_x, own_y)
                  + unknown * (own.mean(axis=0) + model.l2 * x_star))
    # the prediction misses by sum_j (mean_j - mean_own) over the u unknown parties: variance
    # u var / n (their means) + u^2 var / n (the attacker's own mean, in every term)
    variance = (unknown * (unknown + 1) * own.var(axis=0) / len(own)
                + 1e-12 * float(np.mean(own ** 2)) + 1e-300)
    return {
        OUTPUT_ATTACKERS[0]: rank_one_sample(model, x_star, exact),
        OUTPUT_ATTACKERS[1]: rank_one_sample(model, x_star, pooled),
        OUTPUT_ATTACKERS[2]: _map_fit(model, x_star, predicted, variance, prior, steps=steps),
    }
