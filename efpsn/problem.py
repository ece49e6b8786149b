"""The deterministic part of a run: graph, weights, data shards, basis, objectives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from efpsn.crypto.encoding import SlotLayout
from efpsn.data.images import Dataset, load_data, partition
from efpsn.data.local import LocalData
from efpsn.masks.refresh import FixedMask, MaskProvider
from efpsn.masks.zero_sum import MaskCoefficients, NoiseSpec
from efpsn.params.checks import LOCAL_DATA
from efpsn.params.config import RunConfig
from efpsn.params.schema import parse_shape
from efpsn.perturbation.basis import OrthonormalSystem
from efpsn.perturbation.function import FunctionalPerturbation, select_indices
from efpsn.perturbation.monomials import (
    MAX_CANDIDATES,
    Monomials,
    choose_monomials,
    count_monomials,
    power_monomials,
)
from efpsn.tasks.batches import BatchSampler
from efpsn.tasks.catalog import make_task
from efpsn.tasks.objective import Task
from efpsn.topology import Graph, graph_over, metropolis_weights


class MaskedPerturbation:
    """Phi(eta_bar_i(t)) of round t: the perturbation of the mask a MaskProvider gives for the
    round (efpsn/masks/refresh.py), built once per refresh period (once for a fixed mask)."""

    def __init__(self, *, system: OrthonormalSystem, indices: np.ndarray,
                 masks: MaskProvider) -> None:
        self.system, self.indices, self.masks = system, indices, masks
        self._period: int | None = None
        self._current: FunctionalPerturbation | None = None
        self._template: FunctionalPerturbation | None = None

    def at(self, t: int) -> FunctionalPerturbation | None:
        """The perturbation of round t (None when its mask is all zero)."""
        period = self.masks.refresh.period(t)
        if period != self._period:
            values = self.masks.values(t)
            if not np.any(values):
                self._current = None
            elif self._template is None:
                self._template = FunctionalPerturbation(system=self.system,
                                                        indices=self.indices, eta=values)
                self._current = self._template
            else:  # the same system and indices, the new period's coefficients (kept
                # without a copy from a provider whose values are a new array at every call)
                self._current = self._template.with_eta(
                    values, owned=getattr(self.masks, "new_values", False))
            self._period = period
        return self._current


class LocalObjective:
    """Agent i's masked objective f_hat_i = f_i + Phi(eta_bar_i(t))(x_S), as a gradient oracle:
    the mask is round t's (fixed, or refreshed every R rounds); with `clip` > 0 every sample's
    gradient is clipped to that norm before the batch mean."""

    def __init__(
        self,
        *,
        task: Task,
        shard: Dataset,
        perturbation: MaskedPerturbation,
        sampler: BatchSampler,
        clip: float = 0.0,
    ) -> None:
        self.task = task
        self.shard = shard
        self.perturbation = perturbation
        self.sampler = sampler
        self.clip = clip
        # full batch: every round reads the whole shard in order, so the task prepares it
        # once (the logistic task keeps the features in the layouts its products want, and
        # skips the loss, which only the evaluation reads)
        self._full = (task.fixed_gradient(shard.images.contiguous(), shard.labels, clip=clip)
                      if sampler.full_batch else None)

    def __call__(self, x: torch.Tensor, t: int) -> torch.Tensor:
        """The masked mini-batch gradient for round t (the oracle the algorithms call)."""
        if self._full is not None:
            grad = self._full(x)  # a new tensor (Task.fixed_gradient): the mask adds in place
            perturbation = self.perturbation.at(t)
            return grad if perturbation is None else perturbation.add_gradient_(grad, x)
        images, labels = self.shard.batch(self.sampler.indices(t))
        if self.clip > 0:
            _, grad = self.task.clipped_loss_and_grad(x, images, labels, clip=self.clip)
        else:
            _, grad = self.task.loss_and_grad(x, images, labels)
        perturbation = self.perturbation.at(t)
        if perturbation is not None:
            grad = perturbation.add_gradient(grad, x)
        return grad

    def loss_and_grad(self, x: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The true (unmasked) full-batch local loss and gradient: for metrics only."""
        return self.task.loss_and_grad(x, self.shard.images, self.shard.labels)


@dataclass
class Problem:
    """The run's public part (from the RunConfig) and the data this process holds.

    Shards by index of a public data set (the paper's mode): every shard and the test set.
    Agent-local data (config.data == "local"): only the shards this process was given (an
    agent: its own, the others None; the simulator: all), their local held-out parts, and the
    public test set if one was given.
    """

    config: RunConfig
    graph: Graph
    weights: np.ndarray
    task: Task
    shards: list[Dataset | None]
    test: Dataset | None
    system: OrthonormalSystem
    indices: np.ndarray
    holdouts: list[Dataset | None] = field(default_factory=list)
    # the agents in the run on `graph` (every seat but the late ones at the start; a party that
    # joins later: the members from its join on); () = every agent
    members: tuple[int, ...] = ()

    @property
    def n(self) -> int:
        return self.graph.n

    @property
    def m(self) -> int:
        """How many parameters the perturbation acts on (the config's m, or derived)."""
        return self.system.m

    @property
    def N(self) -> int:
        """How many basis functions, i.e. noise coefficients per agent (the config's N, or
        derived: 1 + K m)."""
        return self.system.size

    @cached_property
    def noise_spec(self) -> NoiseSpec:
        c = self.config
        return NoiseSpec(gamma=c.gamma, p=c.p, precision=c.precision, num_coefficients=self.N)

    @cached_property
    def layout(self) -> SlotLayout | None:
        """The packing layout every agent uses (None when packing is off)."""
        c = self.config
        if not c.packed:
            return None
        return SlotLayout.plan(
            precision=c.precision, gamma=c.gamma, max_terms=self.graph.max_degree,
            key_bits=c.key_bits,
        )

    @property
    def member_weights(self) -> np.ndarray:
        """The Metropolis matrix of the members (what the stop rule and the certificate need:
        the seats that join later are no part of it yet)."""
        members = list(self.members)
        if not members or len(members) == self.n:
            return self.weights
        return self.weights[np.ix_(members, members)]

    def agent_weights(self, i: int) -> dict[int, float]:
        """w_ij for j in N_i and w_ii, as exact floats from the Metropolis matrix."""
        return {j: float(self.weights[i, j]) for j in (i, *self.graph.neighbours(i))}

    def initial_params(self) -> torch.Tensor:
        """x_i^0, the same at every agent (a function of the public seed)."""
        return self.task.init_params(self.config.seed)

    def perturbation(self, mask: MaskCoefficients) -> FunctionalPerturbation | None:
        """Phi(eta_bar) of a fixed mask (None when it is all zero)."""
        return MaskedPerturbation(system=self.system, indices=self.indices,
                                  masks=FixedMask(mask)).at(0)

    def shard(self, i: int) -> Dataset:
        """Agent i's training data (a ValueError when this process does not hold it)."""
        shard = self.shards[i]
        if shard is None:
            raise ValueError(f"this process does not hold agent {i}'s data")
        return shard

    def objective(self, i: int, masks: MaskProvider | MaskCoefficients) -> LocalObjective:
        """Agent i's masked objective: its shard, its batches, and its mask of every round
        (a fixed MaskCoefficients, or a MaskProvider such as a RefreshedMask)."""
        c = self.config
        shard = self.shard(i)
        sampler = BatchSampler(len(shard.labels), batch_size=c.batch_size.size, seed=c.seed,
                               agent=i)
        provider = FixedMask(masks) if isinstance(masks, MaskCoefficients) else masks
        return LocalObjective(
            task=self.task, shard=shard, sampler=sampler, clip=c.clip,
            perturbation=MaskedPerturbation(system=self.system, indices=self.indices,
                                            masks=provider),
        )


def basis_monomials(*, m: int, K: int, N: int, seed: int) -> Monomials:
    """The run's monomials: the constant and N - 1 drawn from every monomial of degree <= K
    (seeded), or, when there are more than MAX_CANDIDATES of those (e.g. every parameter with
    K = 2), every coordinate's powers up to K (N = 1 + K m; RunConfig checks it)."""
    if count_monomials(m=m, K=K) <= MAX_CANDIDATES:
        return choose_monomials(m=m, K=K, N=N, seed=seed)
    return power_monomials(m=m, K=K)


def build_task(config: RunConfig) -> Task:
    """The run's model and loss for its data schema (initial parameters from the public seed)."""
    c = config
    return make_task(c.task, l2=c.l2.or_none(), shape=parse_shape(c.input_shape),
                     classes=c.classes)


def build_problem(
    config: RunConfig,
    *,
    data: tuple[Dataset, Dataset] | None = None,
    local: Mapping[int, LocalData] | None = None,
    task: Task | None = None,
) -> Problem:
    """Validate the config against the graph/task/basis and build the problem.

    `local` (agent index -> LocalData) is required for config.data == "local" and unused
    otherwise. Every check that can fail (disconnected graph, bad selection, basis too large)
    fails here, before any agent starts phase I.
    """
    c = config.resolved()  # the step rule's numbers where they were asked for
    # the topology over the agents present at the start (seats that join later: isolated)
    graph = graph_over(c.topology, c.starting_members, agents=c.agents, seed=c.seed)
    task = task if task is not None else build_task(c)
    last_bias = task.last_bias_indices()
    m, n_functions = c.basis_counts(num_params=task.num_params, last_bias=len(last_bias))
    if m is None or n_functions is None:
        raise ValueError(f"selection {str(c.selection)!r} does not fix how many parameters to "
                         "perturb: give m")
    indices = select_indices(c.selection, num_params=task.num_params, m=m, last_bias=last_bias,
                             seed=c.basis_seed)
    # The measure comes from the public selection spec (e.g. "all" -> uniform), so every agent
    # derives the same basis without a further run parameter.
    system = OrthonormalSystem.from_monomials(
        basis_monomials(m=m, K=c.K, N=n_functions, seed=c.basis_seed),
        measure=c.selection.measure,
    )
    holdouts: list[Dataset | None] = []
    if c.data == LOCAL_DATA:
        if local is None:
            raise ValueError("data 'local': every agent reads its own data (efpsn agent --data "
                             "PATH; efpsn simulate/up --data-dir DIR)")
        if any(not 0 <= i < c.agents for i in local):
            raise ValueError(f"local data for agents {sorted(local)}, expected 0..{c.agents - 1}")
        shards: list[Dataset | None] = [local[i].train if i in local else None
                                        for i in range(c.agents)]
        holdouts = [local[i].holdout if i in local else None for i in range(c.agents)]
        tests = [d.test for d in local.values() if d.test is not None]
        test: Dataset | None = tests[0] if tests else None
    else:
        train, test = data if data is not None else load_data(
            c.data, test_fraction=c.test_fraction, seed=c.seed
        )
        shards = list(partition(train, c.agents, mode=c.partition, seed=c.seed))
    problem = Problem(
        config=c, graph=graph, weights=metropolis_weights(graph), task=task, shards=shards,
        test=test, system=system, indices=indices, holdouts=holdouts,
        members=c.starting_members,
    )
    _ = problem.layout  # refuse overflow-prone packing parameters now
    return problem


def average(xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """x_bar = (1/n) sum_i x_i, summed in agent order."""
    total = xs[0].clone()
    for x in xs[1:]:
        total = total + x
    return total / len(xs)
