"""Multinomial logistic regression as a Task, in closed form: loss, gradient (also clipped per
sample) and Hessian-vector products without autograd (the convex experiments' hot path)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from efpsn.data.images import IMAGE_SHAPE, NUM_CLASSES
from efpsn.params.model_sizes import DEFAULT_L2
from efpsn.tasks.features import Features
from efpsn.tasks.models import LogisticRegression
from efpsn.tasks.objective import Task, check_clip

__all__ = ["LogisticRegressionTask"]


class LogisticRegressionTask(Task):
    """Multinomial logistic regression, d -> C (784 -> 10 for MNIST); loss, gradient and Hessian
    products in closed form (no autograd): the hot path of the convex experiments.

    With Z = X W^T + b and P = softmax(Z) row-wise, Y one-hot labels, batch size B:
    f = (1/B) sum_r (logsumexp(Z_r) - Z_r[y_r]) + (l2/2)||x||^2,
    grad_W = (P - Y)^T X / B + l2 W,  grad_b = 1^T (P - Y) / B + l2 b.
    """

    name = "logreg"
    convex = True

    def __init__(self, *, l2: float = DEFAULT_L2["logreg"], shape: tuple[int, ...] = IMAGE_SHAPE,
                 classes: int = NUM_CLASSES) -> None:
        d = math.prod(shape)
        super().__init__(LogisticRegression(d, classes), l2=l2, shape=shape, classes=classes,
                         factory=lambda: LogisticRegression(d, classes))
        self._split = d * classes  # W (C, d) row-major, then b (C,)

    def init_params(self, seed: int) -> torch.Tensor:
        """Zeros for every seed: the standard start for a convex problem (f is convex, so the
        starting point does not change x*; all agents starting at 0 are at consensus)."""
        del seed
        return torch.zeros(self.num_params, dtype=torch.float64)

    def logits(self, x: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        features = images.reshape(images.shape[0], self.features)
        k = self._split
        return torch.addmm(x[k:], features, x[:k].view(self.classes, self.features).t())

    def _params(self, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Zero-copy numpy views: W (C, d), b (C,)."""
        self._check_x(x)
        x_np = x.detach().numpy()
        k = self._split
        return x_np[:k].reshape(self.classes, self.features), x_np[k:]

    def _features(self, images: torch.Tensor) -> Features:
        """A batch's features X (B, d) as they are (a zero-copy view, prepared for nothing)."""
        return Features(images.detach().reshape(images.shape[0], self.features).numpy())

    def _shifted_scores(self, x: torch.Tensor, features: Features) -> np.ndarray:
        # Z^T = W X^T + b, (10, B), minus its column max (stable softmax). numpy: at B = 64 its
        # per-call overhead is ~2.5x lower than torch's, and this is the experiments' hot path.
        weight, bias = self._params(x)
        zt = features.scores(weight)
        zt += bias[:, None]
        zt -= zt.max(axis=0)
        return zt

    def loss(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> float:
        self._check_batch(images, labels)
        zt = self._shifted_scores(x, self._features(images))
        cols = np.arange(zt.shape[1])
        picked = zt[labels.numpy(), cols].sum()
        ce = (np.log(np.exp(zt).sum(axis=0)).sum() - picked) / zt.shape[1]
        return float(ce) + float(self._regulariser(x))

    def loss_and_grad(
        self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        self._check_batch(images, labels)
        return self._loss_and_grad(x, self._features(images), labels.numpy(), clip=0.0)

    def clipped_loss_and_grad(
        self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor, *, clip: float
    ) -> tuple[float, torch.Tensor]:
        """Closed form of Task.clipped_loss_and_grad: sample r's gradient is the outer product
        (p_r - y_r)(x_r, 1), of norm ||p_r - y_r|| sqrt(||x_r||^2 + 1), scaled by
        min(1, clip / norm) before the mean."""
        self._check_batch(images, labels)
        check_clip(clip)
        return self._loss_and_grad(x, self._features(images), labels.numpy(), clip=clip)

    def fixed_batch(
        self, images: torch.Tensor, labels: torch.Tensor, *, clip: float = 0.0
    ) -> Callable[[torch.Tensor], tuple[float, torch.Tensor]]:
        """Task.fixed_batch with the features prepared once (efpsn/tasks/features.py: sparse
        rows and columns, or a contiguous X^T): the same values as loss_and_grad up to the
        rounding of the two products, and the same bits at every call and in every process."""
        batch = self._prepared(images, labels, clip)
        return lambda x: self._loss_and_grad(x, *batch, clip=clip)

    def fixed_gradient(
        self, images: torch.Tensor, labels: torch.Tensor, *, clip: float = 0.0
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """Task.fixed_gradient: fixed_batch's gradient, the same bits, without the loss (its
        logarithms, the labels' scores and ||x||^2 are skipped)."""
        batch = self._prepared(images, labels, clip)
        return lambda x: self._loss_and_grad(x, *batch, clip=clip, loss=False)[1]

    def _prepared(self, images: torch.Tensor, labels: torch.Tensor,
                  clip: float) -> tuple[Features, np.ndarray, np.ndarray]:
        """The batch's features prepared once, its labels, and where each sample's label sits
        in the flattened (C, B) scores (one 1-D gather instead of a 2-D one at every call)."""
        self._check_batch(images, labels)
        if clip > 0:
            check_clip(clip)
        flat = images.detach().reshape(images.shape[0], self.features).contiguous().numpy()
        rows = labels.numpy().copy()
        return (Features(flat, prepared=True), rows,
                rows * len(rows) + np.arange(len(rows), dtype=rows.dtype))

    def _loss_and_grad(self, x: torch.Tensor, features: Features, rows: np.ndarray,
                       at: np.ndarray | None = None, *, clip: float,
                       loss: bool = True) -> tuple[float, torch.Tensor]:
        """The loss (NaN when not `loss`) and the gradient; `at`: the labels' places in the
        flattened (C, B) scores (rows * B + column), when the caller prepared them."""
        zt = self._shifted_scores(x, features)
        batch = zt.shape[1]
        flat = zt.reshape(-1)  # a view: zt is C-contiguous
        if at is None:
            at = rows * batch + np.arange(batch)
        ce = math.nan
        if loss:
            picked = flat[at].sum()  # sum_r (z_r[y_r] - max_r)
        np.exp(zt, out=zt)
        norm = zt.sum(axis=0)
        if loss:  # lse_r - z_r[y_r] = log(norm_r) - picked_r
            ce = (np.log(norm).sum() - picked) / batch
        if clip > 0:
            zt /= norm  # softmax, then the residual P - Y
            flat[at] -= 1.0
            sizes = np.sqrt((zt * zt).sum(axis=0)) * features.norms_with_bias()
            zt *= np.minimum(1.0, clip / np.maximum(sizes, 1e-300)) / batch
        else:  # residual R^T = (softmax(Z) - Y)^T / B, in place
            norm *= batch
            zt /= norm
            flat[at] -= 1.0 / batch
        return self._assemble(x, zt, features, ce, loss=loss)

    def _assemble(self, x: torch.Tensor, residual: np.ndarray, features: Features,
                  ce: float, *, loss: bool = True) -> tuple[float, torch.Tensor]:
        """The loss and gradient from the (scaled) residual R^T: weights R^T X, biases R^T 1,
        plus the l2 term (its value only with `loss`)."""
        grad = np.empty(self.num_params, dtype=np.float64)
        k = self._split
        features.weigh(residual, out=grad[:k].reshape(self.classes, self.features))
        residual.sum(axis=1, out=grad[k:])
        value = float(ce)
        if self.l2:
            x_np = x.detach().numpy()
            grad += self.l2 * x_np
            if loss:
                value += 0.5 * self.l2 * float(x_np @ x_np)
        return value, torch.from_numpy(grad)

    def hessian_vector_product(
        self, x: torch.Tensor, v: torch.Tensor, images: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """Closed form: with D = X V_W^T + v_b and P = softmax(Z) (rows = samples),
        J = P * D - P * rowsum(P * D) and H v = (J^T X / B, 1^T J / B) + l2 v."""
        self._check_batch(images, labels)  # the Hessian does not depend on the labels
        self._check_x(v)
        features = self._features(images)
        zt = self._shifted_scores(x, features)
        batch = zt.shape[1]
        np.exp(zt, out=zt)
        zt /= zt.sum(axis=0)  # P^T
        v_np = v.detach().numpy()
        k = self._split
        direction = features.scores(v_np[:k].reshape(self.classes, self.features))
        direction += v_np[k:, None]
        direction *= zt  # (P * D)^T
        jac = direction - zt * direction.sum(axis=0)
        out = np.empty(self.num_params, dtype=np.float64)
        features.weigh(jac, out=out[:k].reshape(self.classes, self.features))
        jac.sum(axis=1, out=out[k:])
        out /= batch
        if self.l2:
            out += self.l2 * v_np
        return torch.from_numpy(out)
