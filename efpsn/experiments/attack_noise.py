"""Agent 1's perturbation round by round in the attack experiment: the paper's fixed mask, or a
mask refreshed every R rounds from edge seeds (efpsn/masks/seeds.py, efpsn/masks/refresh.py), with
the very integers a network with the same noise seed would use; and which rounds each attacker
sees."""

from __future__ import annotations

import numpy as np

from efpsn.experiments.idlg import agent1_perturbation
from efpsn.masks.factory import seeded_mask
from efpsn.masks.fading import FadingMask
from efpsn.masks.refresh import RefreshedMask
from efpsn.masks.seeds import exchange_seeds_fast
from efpsn.masks.zero_sum import NoiseSpec
from efpsn.params.refresh_setting import Refresh
from efpsn.perturbation.function import FunctionalPerturbation
from efpsn.problem import Problem

__all__ = ["Agent1Noise", "attacker_rounds"]


class Agent1Noise:
    """grad Phi(eta_bar_1(t)) of agent 1 (index 0) at noise level gamma, for any round t.

    `problem` is the perturbation setting (efpsn.experiments.idlg.perturbation_problem). With
    refresh "never" every round has phase I's fixed mask (the fast path of the zero-sum
    protocol, as before); with "every:R", round t has the mask of period floor(t / R) derived
    from agent 1's edge seeds, drawn by exchange_seeds_fast with `noise_seed` (the simulator's
    and the network's test hook). gamma 0 means no perturbation.
    """

    def __init__(self, problem: Problem, *, gamma: float, noise_seed: int,
                 refresh: Refresh) -> None:
        self.problem, self.gamma, self.refresh = problem, float(gamma), refresh
        self._fixed: FunctionalPerturbation | None = None
        self._mask: RefreshedMask | FadingMask | None = None
        self._means: dict[tuple[int, int], FunctionalPerturbation] = {}
        self._template: FunctionalPerturbation | None = None
        if gamma == 0:
            return
        if not refresh.refreshed:
            self._fixed = agent1_perturbation(problem, gamma, noise_seed)
            return
        c = problem.config
        spec = NoiseSpec(gamma=gamma, p=c.p, precision=c.precision, num_coefficients=problem.N)
        seeds = exchange_seeds_fast(problem.graph, noise_seed=noise_seed)[0]
        if refresh.fading and refresh.fade is None:  # the rate the run's algorithm would give
            refresh = c.replace(mask="zero-sum", refresh="fading").resolved().refresh
            self.refresh = refresh
        self._mask = seeded_mask(seeds, spec=spec, refresh=refresh)

    def _perturbation(self, eta: np.ndarray) -> FunctionalPerturbation:
        if self._template is None:
            self._template = FunctionalPerturbation(system=self.problem.system,
                                                    indices=self.problem.indices, eta=eta)
            return self._template
        return self._template.with_eta(eta)

    def perturbation(self, t: int) -> FunctionalPerturbation | None:
        """Agent 1's perturbation in round t (None without noise)."""
        if self._mask is None:
            return self._fixed
        return self._perturbation(self._mask.values(t))

    def mean_perturbation(self, first: int, count: int) -> FunctionalPerturbation | None:
        """The perturbation whose gradient is the mean of rounds first..first+count-1's.

        Exact for K = 1, where grad Phi(eta) is linear in eta and constant in x: the mean of the
        rounds' gradients is the gradient of the mean eta (each period weighted by its rounds).
        """
        if count < 1:
            raise ValueError(f"count must be >= 1 round, got {count}")
        if self._mask is None:
            return self._fixed
        if self.problem.system.max_degree > 1:
            raise ValueError("mean_perturbation is the mean gradient only for K = 1")
        if (first, count) in self._means:
            return self._means[first, count]
        total = np.zeros(self.problem.system.size, dtype=np.float64)
        t, end = first, first + count
        while t < end:
            every = self.refresh.every
            assert every is not None
            stop = min(end, (self.refresh.period(t) + 1) * every)  # end of t's period
            total += (stop - t) * self._mask.values(t)
            t = stop
        self._means[first, count] = self._perturbation(total / count)
        return self._means[first, count]


def attacker_rounds(first: int, *, refresh: Refresh, count: int, gap: int) -> list[int]:
    """The `count` rounds a multi-round attacker combines, starting at `first`.

    The refresh period R is public, so against refreshed masks the attacker takes its rounds
    inside first's period when they fit there, `gap` apart or as far apart as the period allows.
    When they do not fit (R = 1, or a period too short), and against the fixed mask, they are
    `gap` apart: fresh noise cancels nowhere, and far-apart rounds differ most in the gradient.
    """
    if count < 2 or gap < 1 or first < 0:
        raise ValueError(f"need count >= 2, gap >= 1, first >= 0; got {count}, {gap}, {first}")
    spacing = gap
    if refresh.refreshed:
        every = refresh.every
        assert every is not None
        left = every - first % every  # rounds first..first+left-1 share first's period
        if left - 1 >= count - 1:
            spacing = min(gap, (left - 1) // (count - 1))
    return [first + r * spacing for r in range(count)]

