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

Under secure aggregation (`messages="aggregate"`, efpsn/optimize/channels.py) no neighbour sees
agent 0's message: a curious neighbour a (the lowest-numbered neighbour of agent 0) sees only, each
round, the weighted sum of its neighbours' messages. Its view (`aggregate_view`) is then, still
generously: the aggregate's point p_t = sum_i w_ai z_i / sum_i w_ai (what it really sees), the
weighted sum of its neighbours' masked gradients sum_i w_ai g_i(z_i, t) (granted outright, as
above: it only sees their trackers' aggregate), minus w_ak grad f_k(p_t) for every other
neighbour k (it is granted their data, the public data its prior comes from, but not their
points), divided by w_a0: agent 0's masked gradient as far as the neighbour can isolate it,
paired with the only point it has. With `others="pooled"` the neighbour knows only the pooled
public data (everyone's but agent 0's, not who holds what) and subtracts w_ak times the pooled
data's mean gradient instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from efpsn.data.images import Dataset
from efpsn.data.local import LocalData
from efpsn.departure.joins import Join
from efpsn.params.config import RunConfig
from efpsn.params.values import StopEvery
from efpsn.problem import LocalObjective, Problem, build_problem
from efpsn.simulator import run_simulation
from efpsn.topology import Graph, build_graph

__all__ = ["RoundView", "aggregate_view", "graph_after", "one_sample_problem", "record_view",
           "stride_rounds"]


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
    """An agent's objective, keeping (t, x, masked gradient) of the rounds `keep` accepts
    (`calls` None: none), with a degree-2 mask's gradient A_i x added when `quadratic` is a
    matrix (efpsn/experiments/quadratic_mask.py)."""

    keep: Callable[[int], bool]
    calls: list[tuple[int, np.ndarray, np.ndarray]] | None
    quadratic: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, t: int) -> torch.Tensor:
        grad = super().__call__(x, t)
        if self.quadratic is not None:
            grad = grad + self.quadratic @ x
        if self.calls is not None and self.keep(t):
            self.calls.append((t, x.detach().numpy().copy(), grad.detach().numpy().copy()))
        return grad


@dataclass(eq=False)
class _WatchedProblem(Problem):
    """The problem, with the oracles of the agents `watch` recorded (`calls`: agent 0's)."""

    keep: Callable[[int], bool] = lambda t: True
    calls: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    watch: tuple[int, ...] = (0,)
    watched: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = field(default_factory=dict)
    quadratic: tuple[np.ndarray, ...] = ()  # A_i per agent, or () for none

    def objective(self, i: int, masks: object) -> LocalObjective:
        base = super().objective(i, masks)  # type: ignore[arg-type]
        if i not in self.watch and not self.quadratic:
            return base
        recorder = _RecordingObjective(task=base.task, shard=base.shard,
                                       perturbation=base.perturbation, sampler=base.sampler,
                                       clip=base.clip)
        recorder.keep = self.keep
        recorder.calls = None
        if self.quadratic:
            recorder.quadratic = torch.from_numpy(self.quadratic[i])
        if i in self.watch:
            recorder.calls = self.calls if i == 0 else self.watched.setdefault(i, [])
            self.watched[i] = recorder.calls
        return recorder


def graph_after(problem: Problem, join: int) -> Graph:
    """The graph agent 0 has neighbours in: the run's, or after its join every seat's."""
    c = problem.config
    return problem.graph if not join else build_graph(c.topology, c.agents, seed=c.seed)


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


def record_view(problem: Problem, *, noise_seed: int, pairs: int = 400,
                messages: str = "clear", others: str = "data",
                quadratic: tuple[np.ndarray, ...] = (), stopped_at: int | None = None,
                join: int = 0) -> RoundView:
    """Run the simulation of the problem's settings (its messages in the clear or aggregated;
    `quadratic`: a degree-2 mask's A_i added to every agent's oracle) and return what a curious
    neighbour of agent 0 gets: agent 0's kept oracle calls, or under aggregation the
    neighbour's `aggregate_view`. `stopped_at`: the run keeps its stop rule (and its consensus
    tails, efpsn/params/tail.py), which ends it at this round (a first run of the same settings).
    `join` > 0: agent 0's seat starts empty (the problem's config names it late) and agent 0
    joins at that round (efpsn/departure/joins.py), so its calls start there; the attacker then
    gets every round it takes part in, however long the join makes the run."""
    config = problem.config
    horizon = config.iterations.total if stopped_at is None else stopped_at
    if join and messages == "aggregate":
        raise ValueError("a joining agent 0 is attacked with its messages in the clear")
    attacker = min(graph_after(problem, join).neighbours(0))
    watch = (0, *problem.graph.neighbours(attacker)) if messages == "aggregate" else (0,)
    watched = _WatchedProblem(**{f.name: getattr(problem, f.name)
                                 for f in dataclasses.fields(Problem)},
                              keep=(lambda t: True) if join else stride_rounds(horizon, pairs=pairs),
                              watch=tuple(set(watch)),
                              quadratic=quadratic)
    # every round of the step rule's (no early stop at the certificate's target): the attacker
    # sees the longest run the settings allow, and the view's rounds are the ones planned
    stop = {} if stopped_at is not None else {"stop_every": StopEvery(None)}
    ended = run_simulation(config.replace(eval_every=max(1, horizon), **stop), problem=watched,
                           noise_seed=noise_seed, messages=messages,
                           joins=(Join(0, join),) if join else ())
    if join:  # the members' step rule and the join's extension set the length: every round kept
        horizon = int(ended.timings["rounds"])
    if ended.timings["rounds"] != horizon:
        raise RuntimeError(f"the watched run ended at {ended.timings['rounds']}, not {horizon}")
    if messages == "aggregate":
        return aggregate_view(problem, attacker, watched.watched, horizon=horizon,
                              others=others)
    calls = watched.calls
    return RoundView(rounds=np.array([c[0] for c in calls], dtype=np.int64),
                     points=np.stack([c[1] for c in calls]),
                     grads=np.stack([c[2] for c in calls]), horizon=horizon)


def aggregate_view(problem: Problem, attacker: int,
                   calls: Mapping[int, list[tuple[int, np.ndarray, np.ndarray]]], *,
                   horizon: int, others: str = "data") -> RoundView:
    """The curious neighbour's view of agent 0 under aggregation (module docstring), from the
    recorded oracle calls of the attacker's neighbours (the same rounds at each)."""
    from efpsn.algorithms import make_algorithm
    from efpsn.algorithms.base import StepContext

    c = problem.config
    ctx = StepContext(agent=attacker, weights=problem.agent_weights(attacker), lr=0.0,
                      oracle=lambda x, t: x)
    w = make_algorithm(c.algorithm, momentum=c.resolved().momentum.value).mixing(ctx).weights
    nbrs = sorted(problem.graph.neighbours(attacker))
    rounds = np.array([call[0] for call in calls[0]], dtype=np.int64)
    if any([call[0] for call in calls[i]] != rounds.tolist() for i in nbrs):
        raise RuntimeError("the watched agents' oracle calls are not of the same rounds")
    total = sum(w[i] for i in nbrs)
    points = sum(w[i] * np.stack([call[1] for call in calls[i]]) for i in nbrs) / total
    grads = sum(w[i] * np.stack([call[2] for call in calls[i]]) for i in nbrs)
    if others not in ("data", "pooled"):
        raise ValueError(f"others must be 'data' or 'pooled', got {others!r}")
    pooled = [s for i, s in enumerate(problem.shards) if i != 0 and s is not None]
    public = (torch.cat([s.images for s in pooled]), torch.cat([s.labels for s in pooled]))
    for k in nbrs:
        if k == 0:
            continue
        shard = problem.shards[k]
        assert shard is not None
        images, labels = (shard.images, shard.labels) if others == "data" else public
        for r, p in enumerate(points):
            _, g = problem.task.loss_and_grad(torch.from_numpy(p), images, labels)
            grads[r] -= w[k] * g.numpy()
    return RoundView(rounds=rounds, points=np.asarray(points), grads=np.asarray(grads) / w[0],
                     horizon=horizon)
