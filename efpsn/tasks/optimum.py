"""The centralized optimum x* of F(x) = (1/n) sum_i f_i(x) for convex tasks, to high precision."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from efpsn.data.images import Dataset
from efpsn.tasks.objective import Task

__all__ = ["Optimum", "centralized_optimum", "clear_optimum_cache", "global_loss_and_grad"]


@dataclass(frozen=True, eq=False)
class Optimum:
    """Result of `centralized_optimum`: x* and how well it was solved."""

    x: torch.Tensor  # flat float64 minimiser of F
    grad_norm: float  # ||grad F(x)||_2 at x
    loss: float  # F(x)
    lbfgs_iterations: int
    newton_steps: int
    seconds: float  # wall time of the solve (0 work when served from the cache)


def _check_shards(shards: Sequence[Dataset]) -> list[Dataset]:
    shards = list(shards)
    if not shards:
        raise ValueError("need at least one shard, got none")
    for i, shard in enumerate(shards):
        if not isinstance(shard, Dataset):
            raise TypeError(f"shard {i} must be a Dataset, got {type(shard).__name__}")
        if len(shard) == 0:
            raise ValueError(f"shard {i} ({shard.name!r}) is empty")
    return shards


def global_loss_and_grad(
    task: Task, x: torch.Tensor, shards: Sequence[Dataset]
) -> tuple[float, torch.Tensor]:
    """F(x) = (1/n) sum_i f_i(x) and its gradient; f_i is the full-batch local objective of
    shard i, L2 term included (so F carries the same L2 term). Shards weigh equally."""
    shards = _check_shards(shards)
    total = 0.0
    grad = torch.zeros(task.num_params, dtype=torch.float64)
    for shard in shards:
        value, g = task.loss_and_grad(x, shard.images, shard.labels)
        total += value
        grad += g
    return total / len(shards), grad / len(shards)


def _global_hvp(
    task: Task, x: torch.Tensor, v: torch.Tensor, shards: list[Dataset]
) -> torch.Tensor:
    out = torch.zeros(task.num_params, dtype=torch.float64)
    for shard in shards:
        out += task.hessian_vector_product(x, v, shard.images, shard.labels)
    return out / len(shards)


def _cache_key(task: Task, shards: list[Dataset], tol: float) -> str:
    digest = hashlib.sha256()
    digest.update(
        f"{type(task).__qualname__}|{task.name}|{task.l2!r}|{tol!r}|{len(shards)}".encode()
    )
    for shard in shards:
        digest.update(f"|{tuple(shard.images.shape)}|".encode())
        digest.update(shard.images.contiguous().numpy().tobytes())
        digest.update(shard.labels.contiguous().numpy().tobytes())
    return digest.hexdigest()


_CACHE: dict[str, Optimum] = {}


@contextlib.contextmanager
def _blas_threads(limit: int | None) -> Iterator[None]:
    """Cap numpy's BLAS threads for the duration (threadpoolctl, when installed).

    The matrices here are thin (10 x 784 x 800): a second BLAS thread gains little, and when the
    cores are shared OpenBLAS's spinning threads make the solve 20-30x slower (measured 4 s with
    one thread, 90-130 s with two, on a 2-core machine with a load of 4).
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn (mlxtend)
        threadpool_limits = None
    if limit is None or threadpool_limits is None:
        yield
        return
    with threadpool_limits(limits=limit, user_api="blas"):
        yield


def clear_optimum_cache() -> None:
    """Forget every cached optimum (the cache lives in memory only)."""
    _CACHE.clear()


def _copy(result: Optimum) -> Optimum:
    return Optimum(
        x=result.x.clone(),
        grad_norm=result.grad_norm,
        loss=result.loss,
        lbfgs_iterations=result.lbfgs_iterations,
        newton_steps=result.newton_steps,
        seconds=result.seconds,
    )


def centralized_optimum(
    task: Task,
    shards: Sequence[Dataset],
    *,
    tol: float = 1e-12,
    lbfgs_tol: float = 1e-7,
    max_lbfgs_iterations: int = 20_000,
    max_newton_steps: int = 30,
    blas_threads: int | None = 1,
) -> Optimum:
    """x* = argmin F(x), F(x) = (1/n) sum_i f_i(x), for a convex task (logistic regression).

    Two stages, all float64: L-BFGS-B from x = 0 until ||grad F||_inf <= max(tol, lbfgs_tol),
    then inexact Newton steps (CG on closed-form Hessian-vector products) until
    ||grad F||_2 <= tol, which converge quadratically near x*. A step is taken in full when it
    reduces ||grad F||, else halved up to 20 times; the loop also stops when no step helps
    (the float64 floor, ~1e-14 on MNIST). The result, with the gradient norm actually
    reached, is cached in memory by a SHA-256 of (task, l2, shards' bytes, tol).
    `blas_threads` caps numpy's BLAS threads during the solve (None leaves them alone).
    """
    if not getattr(task, "convex", False):
        raise ValueError(
            f"centralized_optimum needs a convex task (logreg), got {task.name!r}: "
            "a non-convex objective has no unique x*"
        )
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    shards = _check_shards(shards)
    key = _cache_key(task, shards, tol)
    if key in _CACHE:
        return _copy(_CACHE[key])

    started = time.perf_counter()
    with _blas_threads(blas_threads):
        x, value, grad_norm, lbfgs_iterations, newton_steps = _solve(
            task,
            shards,
            tol=tol,
            lbfgs_tol=lbfgs_tol,
            max_lbfgs_iterations=max_lbfgs_iterations,
            max_newton_steps=max_newton_steps,
        )
    result = Optimum(
        x=x,
        grad_norm=grad_norm,
        loss=value,
        lbfgs_iterations=lbfgs_iterations,
        newton_steps=newton_steps,
        seconds=time.perf_counter() - started,
    )
    _CACHE[key] = result
    return _copy(result)


def _solve(
    task: Task,
    shards: list[Dataset],
    *,
    tol: float,
    lbfgs_tol: float,
    max_lbfgs_iterations: int,
    max_newton_steps: int,
) -> tuple[torch.Tensor, float, float, int, int]:
    """L-BFGS-B then inexact Newton; returns (x, F(x), ||grad F(x)||, L-BFGS its, Newton steps)."""
    # imported here: agents import efpsn.tasks but never solve for x*, and scipy.optimize
    # costs each of them about 0.2 s of CPU at start-up
    from scipy.optimize import minimize
    from scipy.sparse.linalg import LinearOperator, cg

    def fun(x_np: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = global_loss_and_grad(task, torch.from_numpy(x_np), shards)
        return value, grad.numpy()

    x0 = torch.zeros(task.num_params, dtype=torch.float64).numpy()
    lbfgs = minimize(
        fun,
        x0,
        jac=True,
        method="L-BFGS-B",
        options={
            "maxiter": max_lbfgs_iterations,
            "maxfun": 2 * max_lbfgs_iterations,
            "gtol": max(tol, lbfgs_tol),
            "ftol": 0.0,
            "maxcor": 30,
        },
    )
    x = torch.from_numpy(np.array(lbfgs.x, dtype=np.float64))
    value, grad = global_loss_and_grad(task, x, shards)
    grad_norm = float(torch.linalg.vector_norm(grad))

    size = task.num_params
    newton_steps = 0
    while grad_norm > tol and newton_steps < max_newton_steps:
        x_now = x

        def matvec(v: np.ndarray, x_now: torch.Tensor = x_now) -> np.ndarray:
            v_t = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64).reshape(-1))
            return _global_hvp(task, x_now, v_t, shards).numpy()

        hessian = LinearOperator((size, size), matvec=matvec, dtype=np.float64)
        # Solve H d = -g to a relative residual well below the one we want from the step.
        direction, _ = cg(hessian, -grad.numpy(), rtol=min(1e-3, grad_norm) * 1e-2, maxiter=2000)
        step = torch.from_numpy(direction)
        improved = False
        for _ in range(21):
            candidate = x + step
            c_value, c_grad = global_loss_and_grad(task, candidate, shards)
            c_norm = float(torch.linalg.vector_norm(c_grad))
            if c_norm < grad_norm:
                x, value, grad, grad_norm = candidate, c_value, c_grad, c_norm
                improved = True
                break
            step = step * 0.5
        newton_steps += 1
        if not improved:
            break
    return x, value, grad_norm, int(lbfgs.nit), newton_steps
