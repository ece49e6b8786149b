"""Network-level metrics of a set of local iterates: loss, accuracy, consensus, optimality."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from efpsn.problem import Problem, average


def evaluate(
    problem: Problem, xs: Sequence[torch.Tensor], *, x_star: torch.Tensor | None = None,
    agents: Sequence[int] | None = None,
) -> dict[str, float]:
    """Metrics of the paper's figures, all on the TRUE (unmasked) local functions.

    loss:        (1/n) sum_i f_i(x_i)
    grad_norm2:  ||(1/n) sum_i grad f_i(x_i)||^2          (non-convex figure)
    consensus:   (1/n) sum_i ||x_i - x_bar||^2
    accuracy:    test accuracy of x_bar (agent-local data without a public test set: its
                 mean accuracy on the agents' held-out parts)
    deviation:   ||x_bar - x*|| and its relative version   (convex figure; when x* is known)

    `agents` names whose iterates xs are (default 0..n-1): after a departure, the remaining
    agents', each on its own shard (n is then how many remain).
    """
    n = len(xs)
    x_bar = average(xs)
    losses = []
    grad_sum = torch.zeros_like(x_bar)
    owners = range(n) if agents is None else agents
    if len(owners) != n:
        raise ValueError(f"{n} iterates for {len(owners)} agents")
    for i, x in zip(owners, xs, strict=True):
        shard = problem.shard(i)
        loss, grad = problem.task.loss_and_grad(x, shard.images, shard.labels)
        losses.append(float(loss))
        grad_sum = grad_sum + grad
    out = {
        "loss": sum(losses) / n,
        "grad_norm2": float(torch.sum((grad_sum / n) ** 2)),
        "consensus": float(sum(torch.sum((x - x_bar) ** 2) for x in xs) / n),
        "accuracy": math.nan,
    }
    if problem.test is not None:
        out["accuracy"] = float(problem.task.accuracy(x_bar, problem.test))
    held = [h for i, h in enumerate(problem.holdouts) if h is not None and i in owners]
    if held:  # agent-local data: mean accuracy of x_bar on the agents' held-out parts
        out["holdout_accuracy"] = sum(problem.task.accuracy(x_bar, h) for h in held) / len(held)
        if problem.test is None:
            out["accuracy"] = out["holdout_accuracy"]
    if x_star is not None:
        dev = float(torch.linalg.vector_norm(x_bar - x_star))
        out["deviation"] = dev
        out["relative_deviation"] = dev / max(float(torch.linalg.vector_norm(x_star)), 1e-300)
    for key, value in out.items():
        if not math.isfinite(value):
            out[key] = float("nan") if math.isnan(value) else value
    return out
