"""A batch's features X (B, d) and the two products of the logistic gradient, W X^T and R^T X,
with X kept in the layouts the products want when the batch is used at every call.

Why: at B x d = 800 x 784 and 10 classes, OpenBLAS spends as long packing X into its blocks
as multiplying (perf on the main job's agent: dgemm_incopy/itcopy 9.9% of the CPU, the kernel
8.7%), and it packs X at every call. A full batch is the same X at every round, so it is
prepared once:

- mostly zeros (density <= SPARSE_DENSITY, e.g. MNIST's pixels, 81% zeros): X and X^T as
  compressed sparse rows (torch, MKL's sparse BLAS): both products touch the non-zeros only
  (0.2 ms each at 800 x 784 and 19% density against 0.43 and 0.63 ms dense, one thread);
- otherwise: X^T kept contiguous too, so R^T X reads it in the order the GEMM packs fastest
  (0.45 against 0.63 ms).

Every output row is one sequence of additions in a fixed order, whatever the number of
threads, so the prepared products give the same bits at every call and in every process (the
simulator and the agents share them through efpsn/problem.py's LocalObjective); they differ
from the unprepared products only by rounding.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

__all__ = ["SPARSE_DENSITY", "Features"]

# At or below this share of non-zeros, the sparse products win (measured at 800 x 784, one
# thread: sparse 0.22 ms at 20%, 0.33 at 30%, 0.45 at 40%; dense 0.43-0.45 at any density).
SPARSE_DENSITY = 0.3


class Features:
    """X (B, d) float64 and its products: `scores(W)` = W X^T (C, B), `weigh(R, out)` puts
    R X (C, d) into `out`. Unprepared: plain numpy products on X as given (a per-call batch).
    Prepared: X copied into the layouts above, once."""

    def __init__(self, features: np.ndarray, *, prepared: bool = False) -> None:
        if features.ndim != 2 or features.dtype != np.float64:
            raise ValueError(f"features must be a 2-D float64 array, got {features.ndim} "
                             f"dimensions of {features.dtype}")
        self.dense = features
        self.sparse = False
        self._rows: torch.Tensor | None = None  # X as CSR (B, d)
        self._cols: torch.Tensor | None = None  # X^T as CSR (d, B)
        self._transposed: np.ndarray | None = None  # X^T, contiguous
        self._norms: np.ndarray | None = None
        if not prepared:
            return
        density = np.count_nonzero(features) / max(1, features.size)
        if density <= SPARSE_DENSITY:
            self._rows, self._cols = _csr(features), _csr(features.T)
            self.sparse = True
        else:
            self._transposed = np.ascontiguousarray(features.T)

    def scores(self, weight: np.ndarray) -> np.ndarray:
        """W X^T, (C, B) C-contiguous (a new array, free to change in place)."""
        if self._rows is None:
            return weight @ self.dense.T
        product = torch.sparse.mm(self._rows, torch.from_numpy(np.ascontiguousarray(weight.T)))
        return np.ascontiguousarray(product.numpy().T)

    def weigh(self, residual: np.ndarray, *, out: np.ndarray) -> None:
        """R X into `out` (C, d), for R (C, B)."""
        if self._cols is not None:
            product = torch.sparse.mm(self._cols,
                                      torch.from_numpy(np.ascontiguousarray(residual.T)))
            out[...] = product.numpy().T
        elif self._transposed is not None:
            np.matmul(residual, self._transposed.T, out=out)
        else:
            np.matmul(residual, self.dense, out=out)

    def norms_with_bias(self) -> np.ndarray:
        """sqrt(||x_r||^2 + 1) of every sample r (the norm of (x_r, 1)), computed once."""
        if self._norms is None:
            self._norms = np.sqrt((self.dense * self.dense).sum(axis=1) + 1.0)
        return self._norms


def _csr(matrix: np.ndarray) -> torch.Tensor:
    """`matrix` as a torch CSR tensor, with int32 row and column indices when they fit: MKL's
    sparse product then reads 12 bytes a non-zero instead of 16 (800 x 784 at 19%: 0.20 against
    0.22 ms for W X^T, 0.21 against 0.29 ms for R^T X, with the five agents' features evicting
    each other from the caches), in the same order, so the same bits (tests/test_features.py)."""
    with warnings.catch_warnings():  # torch calls its sparse CSR support a beta
        warnings.simplefilter("ignore", UserWarning)
        full = torch.from_numpy(np.ascontiguousarray(matrix)).to_sparse_csr()
        if full.values().numel() >= 2**31 or max(full.shape) >= 2**31:
            return full
        return torch.sparse_csr_tensor(full.crow_indices().to(torch.int32),
                                       full.col_indices().to(torch.int32), full.values(),
                                       full.shape)
