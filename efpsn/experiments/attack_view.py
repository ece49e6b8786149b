"""What a curious neighbour sees of agent 0 over a whole run: the points at which agent 0 asks
its masked gradient oracle and the masked gradients it releases, round by round.

The run is a real simulation (efpsn/simulator.py) of the attacked settings, whatever their
refresh and selection: agent 0's oracle is wrapped so that every call (round t, point x, masked
gradient g) is kept. The points are agent 0's iterates or, for agt, the extrapolated point it
computes from them (x + beta (x - x_prev)), so the attacker who sees agent 0's iterates in the
clear knows them; the gradients are granted to the attacker outright (the strongest neighbour:
the paper's threat model, every round). Nothing here knows how a refresh mode draws its masks:
the simulator's own mask providers do (efpsn.simulator.make_mask_providers), so a new refresh
mode is attacked without a change here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from efpsn.config import RunConfig
from efpsn.problem import LocalObjective, Problem, build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks import Dataset
from efpsn.tasks.local import LocalData

__all__ = ["RoundView", "one_sample_problem", "record_view", "stride_rounds"]


@dataclass(frozen=True, eq=False)
class RoundView:
    """Agent 0's kept oracle calls: rounds (T,), points (T, d), masked gradients (T, d), in call
    order, and the run's length (`horizon`: the last round is horizon)."""

    rounds: np.ndarray
    points: np.ndarray
    grads: np.ndarray
    horizon: int

    def pairs(self, *, first_round: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Indices (a, b) of non-overlapping consecutive calls (rounds t, t + 1) with
        t >= first_round: the differences an attacker takes (a fixed K = 1 mask cancels)."""
        a, b, used = [], [], -1
        for i in range(len(self.rounds) - 1):
            if (i > used and self.rounds[i + 1] == self.rounds[i] + 1
                    and self.rounds[i] >= first_round):
                a.append(i)
                b.append(i + 1)
                used = i + 1
        return np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)


class _RecordingObjective(LocalObjective):
    """Agent 0's objective, keeping (t, x, masked gradient) of the rounds `keep` accepts."""

    keep: Callable[[int], bool]
    calls: list[tuple[int, np.ndarray, np.ndarray]]

    def __call__(self, x: torch.Tensor, t: int) -> torch.Tensor:
        grad = super().__call__(x, t)
        if self.keep(t):
            self.calls.append((t, x.detach().numpy().copy(), grad.detach().numpy().copy()))
        return grad


@dataclass(eq=False)
class _WatchedProblem(Problem):
    """The problem, with agent 0's oracle recorded."""

    keep: Callable[[int], bool] = lambda t: True
    calls: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)

    def objective(self, i: int, masks: object) -> LocalObjective:
        base = super().objective(i, masks)  # type: ignore[arg-type]
        if i != 0:
            return base
        recorder = _RecordingObjective(task=base.task, shard=base.shard,
                                       perturbation=base.perturbation, sampler=base.sampler,
                                       clip=base.clip)
        recorder.keep, recorder.calls = self.keep, self.calls
        return recorder


def stride_rounds(horizon: int, *, pairs: int) -> Callable[[int], bool]:
    """Keep about `pairs` pairs (t, t + 1) spread evenly over the run, plus as many again in its
    last 10% (where a decaying mask part is smallest); every round when that is all of them."""
    if 2 * pairs >= horizon + 1:
        return lambda t: True
    late = int(0.9 * horizon)
    step = max(2, horizon // pairs)
    late_step = max(2, (horizon - late) // pairs)
    return lambda t: (t % step in (0, 1)) or (t >= late and (t - late) % late_step in (0, 1))


def one_sample_problem(config: RunConfig, *, sample: Dataset, others: list[Dataset],
                       test: Dataset | None = None) -> Problem:
    """The run's problem with agent 0 holding the one `sample` and agent k the k-th of
    `others` (config.agents must be 1 + len(others); data 'local')."""
    if len(sample) != 1 or config.agents != 1 + len(others):
        raise ValueError(f"need one sample and agents - 1 = {config.agents - 1} other "
                         f"shards, got {len(sample)} and {len(others)}")
    local: Mapping[int, LocalData] = {
        i: LocalData(train=d, holdout=None, test=test)
        for i, d in enumerate([sample, *others])}
    return build_problem(config.replace(data="local"), local=local)


def record_view(problem: Problem, *, noise_seed: int, pairs: int = 400) -> RoundView:
    """Run the simulation of the problem's settings and return agent 0's kept oracle calls."""
    config = problem.config
    horizon = config.iterations.total
    watched = _WatchedProblem(**{f.name: getattr(problem, f.name)
                                 for f in dataclasses.fields(Problem)},
                              keep=stride_rounds(horizon, pairs=pairs))
    # every round of the step rule's (no early stop at the certificate's target): the attacker
    # sees the longest run the settings allow, and the view's rounds are the ones planned
    run_simulation(config.replace(eval_every=max(1, horizon), stop_every=0), problem=watched,
                   noise_seed=noise_seed)
    calls = watched.calls
    return RoundView(rounds=np.array([c[0] for c in calls], dtype=np.int64),
                     points=np.stack([c[1] for c in calls]),
                     grads=np.stack([c[2] for c in calls]), horizon=horizon)
