"""Ridge regression as a Task (a numeric target), in closed form: squared loss + l2, its
gradient (also clipped per sample), Hessian-vector products and R^2, without autograd."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from efpsn.data.images import Dataset
from efpsn.params.model_sizes import DEFAULT_L2
from efpsn.tasks.models import LinearRegression
from efpsn.tasks.objective import Task, check_clip

__all__ = ["RidgeTask", "half_squared_error", "r_squared"]


def half_squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean_r (y_hat_r - y_r)^2 / 2 of a (B, 1) output and (B,) targets: ridge's loss (its
    name goes into the model fingerprint)."""
    return 0.5 * torch.mean((outputs.reshape(-1) - targets) ** 2)


def r_squared(predicted: np.ndarray, targets: np.ndarray) -> float:
    """1 - sum (y - y_hat)^2 / sum (y - mean y)^2, scikit-learn's r2_score; NaN when the
    targets do not vary (nothing to explain)."""
    y = np.asarray(targets, dtype=np.float64)
    total = float(np.sum((y - y.mean()) ** 2))
    if total == 0.0:
        return math.nan
    return 1.0 - float(np.sum((y - np.asarray(predicted, dtype=np.float64)) ** 2)) / total


class RidgeTask(Task):
    """Linear regression d -> 1 with the squared loss and an l2 term, in closed form.

    With r = X w + b - y the residuals of a batch of B samples:
    f = (1 / (2B)) ||r||^2 + (l2/2) ||x||^2,  grad_w = X^T r / B + l2 w,  grad_b = 1^T r / B + l2 b,
    and the Hessian is [X 1]^T [X 1] / B + l2 I, whatever the point: f is l2-strongly convex
    with curvature at most lambda_max(E[x~ x~^T]) + l2 (efpsn/params/step_rule.py).
    `accuracy` is R^2 (score_name), the labels float64 targets.
    """

    name = "ridge"
    convex = True
    score_name = "R^2"
    label_dtype = torch.float64

    def __init__(self, *, l2: float = DEFAULT_L2["ridge"], shape: tuple[int, ...] = (1,),
                 classes: int = 1) -> None:
        if classes != 1:
            raise ValueError(f"task ridge predicts one number per sample, got classes {classes}")
        d = math.prod(shape)
        super().__init__(LinearRegression(d), l2=l2, shape=shape, classes=1,
                         factory=lambda: LinearRegression(d), loss=half_squared_error)

    def init_params(self, seed: int) -> torch.Tensor:
        """Zeros for every seed (f is convex: the start does not change x*)."""
        del seed
        return torch.zeros(self.num_params, dtype=torch.float64)

    def logits(self, x: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """The predictions (B, 1)."""
        self._check_x(x)
        features = images.reshape(images.shape[0], self.features)
        d = self.features
        return torch.addmm(x[d:], features, x[:d].view(1, d).t())

    def _flat(self, images: torch.Tensor) -> np.ndarray:
        return images.detach().reshape(images.shape[0], self.features).numpy()

    def _residual(self, x: torch.Tensor, flat: np.ndarray, targets: np.ndarray) -> np.ndarray:
        self._check_x(x)
        x_np = x.detach().numpy()
        d = self.features
        return flat @ x_np[:d] + x_np[d] - targets

    def _value_and_grad(self, x: torch.Tensor, flat: np.ndarray, targets: np.ndarray, *,
                        clip: float = 0.0, loss: bool = True) -> tuple[float, torch.Tensor]:
        resid = self._residual(x, flat, targets)
        batch = len(resid)
        value = 0.5 * float(resid @ resid) / batch if loss else math.nan
        weights = resid / batch
        if clip > 0:  # sample r's gradient r (x_r, 1) has norm |r| sqrt(||x_r||^2 + 1)
            sizes = np.abs(resid) * np.sqrt(np.einsum("ij,ij->i", flat, flat) + 1.0)
            weights = weights * np.minimum(1.0, clip / np.maximum(sizes, 1e-300))
        grad = np.empty(self.num_params, dtype=np.float64)
        grad[:self.features] = weights @ flat
        grad[self.features] = weights.sum()
        if self.l2:
            x_np = x.detach().numpy()
            grad += self.l2 * x_np
            if loss:
                value += 0.5 * self.l2 * float(x_np @ x_np)
        return value, torch.from_numpy(grad)

    def loss(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> float:
        self._check_batch(images, labels)
        resid = self._residual(x, self._flat(images), labels.numpy())
        x_np = x.detach().numpy()
        return 0.5 * float(resid @ resid) / len(resid) + 0.5 * self.l2 * float(x_np @ x_np)

    def loss_and_grad(
        self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        self._check_batch(images, labels)
        return self._value_and_grad(x, self._flat(images), labels.numpy())

    def clipped_loss_and_grad(
        self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor, *, clip: float
    ) -> tuple[float, torch.Tensor]:
        """Closed form of Task.clipped_loss_and_grad: each sample's gradient r (x_r, 1) scaled
        by min(1, clip / (|r| sqrt(||x_r||^2 + 1))) before the mean."""
        self._check_batch(images, labels)
        check_clip(clip)
        return self._value_and_grad(x, self._flat(images), labels.numpy(), clip=clip)

    def fixed_batch(
        self, images: torch.Tensor, labels: torch.Tensor, *, clip: float = 0.0
    ) -> Callable[[torch.Tensor], tuple[float, torch.Tensor]]:
        """Task.fixed_batch with X made contiguous once: the same bits at every call and in
        every process."""
        flat, targets = self._prepared(images, labels, clip)
        return lambda x: self._value_and_grad(x, flat, targets, clip=clip)

    def fixed_gradient(
        self, images: torch.Tensor, labels: torch.Tensor, *, clip: float = 0.0
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """fixed_batch's gradient, the same bits, without the loss."""
        flat, targets = self._prepared(images, labels, clip)
        return lambda x: self._value_and_grad(x, flat, targets, clip=clip, loss=False)[1]

    def _prepared(self, images: torch.Tensor, labels: torch.Tensor,
                  clip: float) -> tuple[np.ndarray, np.ndarray]:
        self._check_batch(images, labels)
        if clip > 0:
            check_clip(clip)
        flat = np.ascontiguousarray(self._flat(images))
        return flat, labels.numpy().copy()

    def hessian_vector_product(
        self, x: torch.Tensor, v: torch.Tensor, images: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """([X 1]^T [X 1] v) / B + l2 v (independent of x and of the labels)."""
        self._check_batch(images, labels)
        self._check_x(x)
        self._check_x(v)
        flat = self._flat(images)
        v_np = v.detach().numpy()
        d = self.features
        direction = flat @ v_np[:d] + v_np[d]
        out = np.empty(self.num_params, dtype=np.float64)
        out[:d] = direction @ flat
        out[d] = direction.sum()
        out /= len(flat)
        if self.l2:
            out += self.l2 * v_np
        return torch.from_numpy(out)

    def predict(self, x: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """The predicted numbers (float64, one per sample)."""
        with torch.no_grad():
            return self.logits(x, images).reshape(-1)

    def accuracy(self, x: torch.Tensor, dataset: Dataset) -> float:
        """R^2 of `x` on `dataset` (score_name): 1 is a perfect fit, 0 the targets' mean."""
        if len(dataset) == 0:
            raise ValueError(f"cannot measure R^2 on the empty dataset {dataset.name!r}")
        return r_squared(self.predict(x, dataset.images).numpy(), dataset.labels.numpy())
