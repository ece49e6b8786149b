"""The gradient-inversion attacks of the attack experiment: iDLG (Zhao et al. 2020), its adaptive
variant that drops the perturbed coordinates, and the multi-round attacker that combines one
agent's gradients at several of its iterates so that a fixed mask's gradient cancels. The
experiment around them (settings, runs, figures) is efpsn/experiments/attack.py."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection

import numpy as np
import torch
import torch.nn.functional as F

from efpsn.experiments.sweep import with_config
from efpsn.perturbation.basis import OrthonormalSystem
from efpsn.perturbation.function import FunctionalPerturbation
from efpsn.perturbation.monomials import choose_monomials, power_monomials
from efpsn.problem import Problem
from efpsn.simulator import make_masks, run_simulation
from efpsn.tasks.objective import Task

PERTURBATIONS: dict[str, str] = {
    "last-bias": "last-layer bias, K=1 (paper)",
    "all-k1": "every parameter, K=1",
    "all-k2": "every parameter, K=2 (squares added)",
}
"""The perturbation settings the attack compares (name -> label)."""
MSE_FLOOR = 1e-20  # PSNR is capped at 200 dB (float64 reconstructions can be exact)
MULTI_ROUND_INIT_SCALE = {"logreg": 0.01, "lenet": 1.0}
"""Standard deviation of the multi-round attacker's dummy image. DLG's N(0, 1) saturates the
logistic regression's softmax (784 unit-variance pixels), and then the rounds' probabilities agree
and their difference vanishes; 0.01 N(0, 1) starts in the softmax's linear range. LeNet's
sigmoids keep N(0, 1) (as the plain attacker), which also converges fastest there."""
RESTART_ABOVE = 1e-3
"""The multi-round attacker restarts once from another dummy when its normalised matching loss
ends above this (a local minimum; a converged fit ends near 1e-8 or below)."""


def sample_gradient(task: Task, x: torch.Tensor, image: torch.Tensor, label: torch.Tensor,
                    *, create_graph: bool = False) -> torch.Tensor:
    """grad_x of the task's objective on one sample (image (1,1,28,28), label (1,)), by autograd.

    With create_graph the result stays differentiable with respect to `image` (the attack needs
    the gradient of a gradient).
    """
    with torch.enable_grad():
        xr = x if x.requires_grad else x.detach().requires_grad_(True)
        value = F.cross_entropy(task.logits(xr, image), label) + 0.5 * task.l2 * (xr * xr).sum()
        (grad,) = torch.autograd.grad(value, xr, create_graph=create_graph)
    return grad


def observed_gradient(task: Task, x: torch.Tensor, image: torch.Tensor, label: torch.Tensor,
                      perturbation: FunctionalPerturbation | None) -> torch.Tensor:
    """What the attacker sees: the true single-sample gradient plus grad Phi(eta_bar_1)(x)."""
    grad = sample_gradient(task, x, image, label).detach()
    if perturbation is not None:
        grad = grad + perturbation.gradient(x)
    return grad


def infer_label(task: Task, grad: torch.Tensor) -> int:
    """iDLG: the class whose row of the last layer's weight gradient has a negative sum."""
    slices = list(task.parameter_slices().values())
    weight = grad[slices[-2]].reshape(10, -1)  # the last layer: weight, then bias
    return int(weight.sum(dim=1).argmin())


def reconstruct(
    task: Task,
    x: torch.Tensor,
    observed: torch.Tensor,
    label: int,
    *,
    seed: int,
    iterations: int,
    inner_iterations: int,
    snapshot_at: tuple[int, ...] = (),
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[int, torch.Tensor], float]:
    """L-BFGS on a dummy image ~ N(0, 1) to match `observed`; returns (image, snapshots, loss).

    `keep`: boolean mask of the gradient coordinates the attacker matches (None: all).
    """
    generator = torch.Generator().manual_seed(seed)
    dummy = torch.randn((1, 1, 28, 28), generator=generator, dtype=torch.float64)
    dummy.requires_grad_(True)
    target = observed if keep is None else observed[keep]
    labels = torch.tensor([label])
    xr = x.detach().clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([dummy], lr=1.0, max_iter=inner_iterations, history_size=100,
                                  line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        grad = sample_gradient(task, xr, dummy, labels, create_graph=True)
        diff = (grad if keep is None else grad[keep]) - target
        loss = (diff * diff).sum()
        (d_dummy,) = torch.autograd.grad(loss, dummy)
        dummy.grad = d_dummy
        return loss.detach()

    return _fit(optimizer, closure, dummy, iterations=iterations, snapshot_at=snapshot_at)


def combination_weights(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-coordinate weights w_r with sum_r w_r p_j(x_r[j]) = 0 for the perturbation's gradient.

    Two rounds: (1, -1), which cancels a constant (K = 1). Three rounds: (x_b - x_c, x_c - x_a,
    x_a - x_b) per coordinate, which cancels any gradient affine in each coordinate's own value
    (K <= 2 with one polynomial per coordinate: the power family, and K = 1). Scaled so the
    largest weight is 1.
    """
    if len(xs) == 2:
        one = torch.ones_like(xs[0])
        return [one, -one]
    if len(xs) == 3:
        a, b, c = xs
        weights = [b - c, c - a, a - b]
        scale = max(float(w.abs().max()) for w in weights)
        if scale == 0.0:
            raise ValueError("the three iterates are equal: nothing to combine")
        return [w / scale for w in weights]
    raise ValueError(f"the multi-round attacker uses 2 or 3 rounds, got {len(xs)}")


def reconstruct_multi(
    task: Task,
    xs: list[torch.Tensor],
    observed: list[torch.Tensor],
    label: int,
    *,
    seed: int,
    iterations: int,
    inner_iterations: int,
    snapshot_at: tuple[int, ...] = (),
    init_scale: float = 1.0,
) -> tuple[torch.Tensor, dict[int, torch.Tensor], float]:
    """L-BFGS on a dummy image to match sum_r w_r g^(r) (combination_weights) across rounds.

    The loss is normalised by ||sum_r w_r g^(r)||^2: the combination can be small when the
    iterates are close, and L-BFGS's absolute tolerances must not stop it early.
    """
    weights = combination_weights(xs)
    target = sum((w * g for w, g in zip(weights, observed, strict=True)),
                 torch.zeros_like(observed[0]))
    norm2 = float((target * target).sum())
    if norm2 == 0.0:
        raise ValueError("the combined observed gradient is zero: nothing to match")
    generator = torch.Generator().manual_seed(seed)
    dummy = init_scale * torch.randn((1, 1, 28, 28), generator=generator, dtype=torch.float64)
    dummy.requires_grad_(True)
    labels = torch.tensor([label])
    leaves = [x.detach().clone().requires_grad_(True) for x in xs]
    optimizer = torch.optim.LBFGS([dummy], lr=1.0, max_iter=inner_iterations, history_size=100,
                                  line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        combined = torch.zeros_like(target)
        for w, xr in zip(weights, leaves, strict=True):
            combined = combined + w * sample_gradient(task, xr, dummy, labels, create_graph=True)
        diff = combined - target
        loss = (diff * diff).sum() / norm2
        (d_dummy,) = torch.autograd.grad(loss, dummy)
        dummy.grad = d_dummy
        return loss.detach()

    return _fit(optimizer, closure, dummy, iterations=iterations, snapshot_at=snapshot_at)


def infer_label_multi(task: Task, xs: list[torch.Tensor], observed: list[torch.Tensor], *,
                      seed: int, inner_iterations: int, probe_steps: int = 2,
                      init_scale: float = 1.0) -> int:
    """The label whose short multi-round reconstruction (probe_steps L-BFGS steps) fits best.

    iDLG's sign rule needs the raw gradient, which the perturbation hides when it moves the last
    layer's weights too; the multi-round attacker instead tries all ten labels briefly. (For the
    logistic regression the label cancels in any combination whose weights sum to zero, so every
    label fits equally and the first wins; the reconstruction does not need it.)
    """
    losses = []
    for label in range(10):
        _, _, loss = reconstruct_multi(task, xs, observed, label, seed=seed,
                                       iterations=probe_steps, inner_iterations=inner_iterations,
                                       init_scale=init_scale)
        losses.append(loss if math.isfinite(loss) else math.inf)
    return int(np.argmin(losses))


def image_errors(reconstruction: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """(MSE, PSNR in dB) of the reconstruction clipped to the pixel range [0, 1]."""
    mse = float(((reconstruction.clamp(0.0, 1.0) - truth) ** 2).mean())
    return mse, 10.0 * math.log10(1.0 / max(mse, MSE_FLOOR))


def attack_point(problem: Problem, rounds: int) -> torch.Tensor:
    """Agent 1's iterate after `rounds` rounds of the noise-free run (the initial point for 0)."""
    if rounds == 0:
        return problem.initial_params()
    config = problem.config.replace(mask="none", gamma=1.0, iterations=rounds, eval_every=rounds)
    return run_simulation(config, problem=with_config(problem, config)).xs[0]


def perturbation_problem(problem: Problem, name: str) -> Problem:
    """The problem with the perturbation setting `name` (PERTURBATIONS) in place of its own.

    "last-bias": the problem itself (the paper's). "all-k1": what `--selection all --m d --N d+1`
    builds (uniform measure). "all-k2": every parameter with the power family (constant, x_v,
    x_v^2 for each v; N = 2d + 1; uniform measure), which build_problem's random monomial choice
    cannot express; the config says K = 2, N = 2d + 1 so that phase I draws N coefficients.
    """
    if name == "last-bias":
        return problem
    d = problem.task.num_params
    c = problem.config
    if name == "all-k1":
        config = c.replace(selection="all", K=1, m=d, N=d + 1)
        monomials = choose_monomials(m=d, K=1, N=d + 1, seed=c.basis_seed)
    elif name == "all-k2":
        config = c.replace(selection="all", K=2, m=d, N=2 * d + 1)
        monomials = power_monomials(m=d, K=2)
    else:
        raise ValueError(f"unknown perturbation {name!r}: expected one of {sorted(PERTURBATIONS)}")
    system = OrthonormalSystem.from_monomials(monomials, measure="uniform")
    return dataclasses.replace(problem, config=config, system=system,
                               indices=np.arange(d, dtype=np.int64))


def agent1_perturbation(problem: Problem, gamma: float, noise_seed: int
                        ) -> FunctionalPerturbation | None:
    """Agent 1's functional perturbation from the zero-sum phase I at `gamma` (None for 0)."""
    if gamma == 0:
        return None
    config = problem.config.replace(mask="zero-sum", gamma=gamma)
    derived = dataclasses.replace(problem, config=config)
    _ = derived.layout  # refuse what build_problem would refuse (e.g. an overflowing packing)
    masks = make_masks(derived, protocol="fast", noise_seed=noise_seed)
    return derived.perturbation(masks[0])


def _fit(optimizer: torch.optim.Optimizer, closure: Callable[[], torch.Tensor],
         dummy: torch.Tensor, *, iterations: int, snapshot_at: Collection[int]
         ) -> tuple[torch.Tensor, dict[int, torch.Tensor], float]:
    """Run the optimizer on the dummy image: (final dummy, snapshots by step, final loss)."""
    snapshots: dict[int, torch.Tensor] = {}
    for it in range(iterations + 1):
        if it in snapshot_at:
            snapshots[it] = dummy.detach().clone()
        if it < iterations:
            optimizer.step(closure)
    final_loss = float(closure())
    return dummy.detach().clone(), snapshots, final_loss
