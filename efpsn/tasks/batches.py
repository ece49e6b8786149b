"""Mini-batch indices as a pure function of (seed, agent, round): restartable and reproducible."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["BatchSampler"]


def _check_nonnegative_int(name: str, value: object) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


class BatchSampler:
    """Sampling without replacement within epochs, identical in every process.

    Epoch e = t // batches_per_epoch shuffles the shard with
    np.random.default_rng([seed, agent, e]).permutation(num_samples); round t takes the slice
    [(t % batches_per_epoch) * b, ... + b) of it. The last incomplete batch of each epoch is
    dropped (batches_per_epoch = num_samples // b), so every batch has exactly b samples.
    `batch_size=None` means full batch: every round returns all indices 0..N-1 in order.

    Because indices(t) depends on nothing but (seed, agent, t), an agent restarted at round t
    draws the same batches as an uninterrupted run and as the in-process simulator.
    """

    def __init__(self, num_samples: int, batch_size: int | None, *, seed: int, agent: int) -> None:
        self.num_samples = _check_nonnegative_int("num_samples", num_samples)
        if self.num_samples == 0:
            raise ValueError("num_samples must be >= 1, got 0")
        if batch_size is not None:
            batch_size = _check_nonnegative_int("batch_size", batch_size)
            if not 1 <= batch_size <= self.num_samples:
                raise ValueError(
                    f"batch_size must lie in [1, num_samples={self.num_samples}] "
                    f"(or be None for full batch), got {batch_size}"
                )
        self.batch_size = batch_size
        self.seed = _check_nonnegative_int("seed", seed)
        self.agent = _check_nonnegative_int("agent", agent)
        self._all = torch.arange(self.num_samples, dtype=torch.int64)
        self._epoch = -1
        self._perm = self._all

    def __repr__(self) -> str:
        return (
            f"BatchSampler(num_samples={self.num_samples}, batch_size={self.batch_size}, "
            f"seed={self.seed}, agent={self.agent})"
        )

    @property
    def full_batch(self) -> bool:
        """True when every round uses the whole shard (batch_size=None)."""
        return self.batch_size is None

    @property
    def batches_per_epoch(self) -> int:
        """Rounds per pass over the shard (1 for full batch)."""
        if self.batch_size is None:
            return 1
        return self.num_samples // self.batch_size

    def permutation(self, epoch: int) -> torch.Tensor:
        """The shuffle of epoch `epoch` (int64 indices; shared, do not modify)."""
        epoch = _check_nonnegative_int("epoch", epoch)
        if epoch != self._epoch:  # one-entry cache; recomputing gives the same array
            rng = np.random.default_rng([self.seed, self.agent, epoch])
            self._perm = torch.from_numpy(rng.permutation(self.num_samples).astype(np.int64))
            self._epoch = epoch
        return self._perm

    def indices(self, t: int) -> torch.Tensor:
        """Sample indices (int64, a fresh tensor) of round `t` (t >= 0)."""
        t = _check_nonnegative_int("t", t)
        if self.batch_size is None:
            return self._all.clone()
        per_epoch = self.num_samples // self.batch_size
        start = (t % per_epoch) * self.batch_size
        return self.permutation(t // per_epoch)[start : start + self.batch_size].clone()
