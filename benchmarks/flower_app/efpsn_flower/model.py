"""Softmax regression as EFPSN's logreg task defines it, in numpy: f(x) = mean cross-entropy +
(l2 / 2) ||x||^2 over the weights (classes x features, row-major) and the biases, pixels / 255;
an agent's training rows are its train.npz less the holdout EFPSN draws (the same rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HOLDOUT_STREAM = 0x401D  # efpsn.data.local.split_holdout's seed stream: [seed, 0x401D]


def load_rows(path: str | Path, *, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of an .npz as EFPSN reads it: X / 255 flattened to float64, y int64; with a
    holdout > 0, only the training part (EFPSN's permutation of the public seed)."""
    with np.load(path) as data:
        x = data["X"].reshape(len(data["y"]), -1).astype(np.float64) / 255.0
        y = data["y"].astype(np.int64)
    if holdout > 0:
        perm = np.random.default_rng([seed, HOLDOUT_STREAM]).permutation(len(y))
        keep = perm[round(holdout * len(y)):]
        x, y = x[keep], y[keep]
    return x, y


def logits(w: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    return x @ w.T + b


def gradient(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray,
             l2: float) -> tuple[np.ndarray, np.ndarray]:
    """The mini-batch gradient of mean cross-entropy + (l2 / 2) ||(w, b)||^2."""
    z = logits(w, b, x)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return p.T @ x + l2 * w, p.sum(axis=0) + l2 * b


def local_sgd(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray, *, epochs: int,
              batch: int, lr: float, l2: float, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray]:
    """`epochs` passes of mini-batch SGD over (x, y), a fresh shuffle per epoch."""
    w, b = w.copy(), b.copy()
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y) - batch + 1, batch):
            rows = order[start:start + batch]
            gw, gb = gradient(w, b, x[rows], y[rows], l2)
            w -= lr * gw
            b -= lr * gb
    return w, b


def accuracy(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits(w, b, x), axis=1) == y))
