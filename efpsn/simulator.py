"""n agents in one process, driving the same phase I and phase II step code as the network."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from efpsn.algorithms import StepContext, make_algorithm
from efpsn.config import RunConfig
from efpsn.masking import MaskCoefficients, noise_generator
from efpsn.masks import independent_masks, no_masks, zero_sum_masks, zero_sum_masks_fast
from efpsn.metrics import evaluate
from efpsn.problem import Problem, build_problem
from efpsn.rounds import RoundDriver, worst
from efpsn.schedules import make_schedule

PROTOCOLS = ("fast", "paillier")


def make_masks(
    problem: Problem,
    *,
    protocol: str = "fast",
    noise_seed: int | None = None,
    allow_insecure_keys: bool = False,
) -> list[MaskCoefficients]:
    """Every agent's mask coefficients eta_bar_i for the configured mask mode.

    protocol="paillier" runs the real phase I (key generation, encryption under each neighbour's
    key, homomorphic sums, decryption) between in-process Maskers; "fast" computes the same
    integers without encryption. With the same noise seed both give identical masks.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    c, graph, spec = problem.config, problem.graph, problem.noise_spec
    rngs = [noise_generator(noise_seed, i) for i in range(graph.n)]
    if c.mask == "none":
        return no_masks(graph, spec)
    if c.mask == "independent":
        return independent_masks(rngs, graph, spec)
    if protocol == "fast":
        return zero_sum_masks_fast(rngs, graph, spec)
    return zero_sum_masks(
        rngs, graph, spec, layout=problem.layout, key_bits=c.key_bits,
        allow_insecure=allow_insecure_keys,
    )


@dataclass
class SimulationResult:
    """A finished simulation: settings, per-round history, final metrics, iterates and masks."""

    config: RunConfig
    protocol: str
    history: list[dict[str, float]]
    final: dict[str, float]
    xs: list[torch.Tensor]
    masks: list[MaskCoefficients]
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": {**self.config.to_dict(), "protocol": self.protocol},
            "history": self.history,
            "final": self.final,
            "timings": self.timings,
            # A simulation is not private: the masks are reported so users can inspect them.
            "masks": {
                "precision": self.config.precision,
                "eta_bar": [m.values().tolist() for m in self.masks],
                "numerator_sums": [
                    str(sum(col)) for col in zip(*(m.numerators for m in self.masks), strict=True)
                ],
            },
        }


def run_simulation(
    config: RunConfig,
    *,
    protocol: str = "fast",
    noise_seed: int | None = None,
    problem: Problem | None = None,
    x_star: torch.Tensor | None = None,
    allow_insecure_keys: bool = False,
    on_round: Callable[[int, dict[str, float] | None], None] | None = None,
) -> SimulationResult:
    """Run phase I then `config.iterations` synchronous phase II rounds for every agent."""
    problem = problem if problem is not None else build_problem(config)
    if noise_seed is None:
        noise_seed = config.seed  # a simulation is reproducible by default; it is not private
    t0 = time.perf_counter()
    masks = make_masks(
        problem, protocol=protocol, noise_seed=noise_seed, allow_insecure_keys=allow_insecure_keys
    )
    t_phase1 = time.perf_counter() - t0

    algorithm = make_algorithm(config.algorithm)
    schedule = make_schedule(config.schedule, iterations=config.iterations)
    n = problem.n
    x0 = problem.initial_params()
    drivers = [
        RoundDriver(algorithm=algorithm, schedule=schedule, iterations=config.iterations,
                    eval_every=config.eval_every, x0=x0,
                    context=StepContext(agent=i, weights=problem.agent_weights(i),
                                        lr=schedule(0), oracle=problem.objective(i, masks[i])))
        for i in range(n)
    ]
    history = [{"round": 0, **evaluate(problem, [d.state["x"] for d in drivers], x_star=x_star)}]
    t1 = time.perf_counter()
    for t in range(config.iterations):
        outboxes = [d.outbox for d in drivers]  # round t's messages, taken before anyone steps
        due = [d.step({j: outboxes[j] for j in problem.graph.neighbours(i)})
               for i, d in enumerate(drivers)]
        record = None
        if any(due):
            record = {"round": t + 1,
                      **evaluate(problem, [d.state["x"] for d in drivers], x_star=x_star),
                      **worst([d.measures for d in drivers])}
            history.append(record)
        if on_round is not None:
            on_round(t + 1, record)
    t_phase2 = time.perf_counter() - t1
    return SimulationResult(
        config=config,
        protocol=protocol,
        history=history,
        final=dict(history[-1]),
        xs=[d.state["x"] for d in drivers],
        masks=masks,
        timings={
            "phase1_seconds": t_phase1,
            "phase2_seconds": t_phase2,
            "seconds_per_round": t_phase2 / config.iterations,
        },
    )


def mask_sums_are_zero(masks: Sequence[MaskCoefficients]) -> bool:
    """True when sum_i numerator_ik == 0 exactly for every k (integer arithmetic)."""
    return all(sum(col) == 0 for col in zip(*(m.numerators for m in masks), strict=True))
