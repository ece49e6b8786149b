"""Features in any units (`scale standard`): every agent standardises its features with the
network's column means and standard deviations, learned by secure summation
(efpsn/stats/column_sums.py), and logistic regression's default l2 follows the total sample count.

The steps, the same at every agent and in the simulator (so both give the same numbers):
1. after phase I, each agent publishes secure_stats.masked_vector(its training features, its
   edge seeds); the network's sum of those vectors is the totals, exactly;
2. every agent standardises its training, held-out and public test features with the totals'
   mean and standard deviation (standardise_dataset): float64, one subtraction and one division
   per value, so every machine gets the same bits;
3. with `l2` left to its default, logistic regression's (and ridge's) l2 is 1 / N_total
   (count_l2): the objective mean loss + (1 / (2 N)) ||x||^2 is scikit-learn's
   LogisticRegression(C=1) (Ridge(alpha=1)) scaled by 1 / N (scikit-learn leaves the intercept
   unpenalised; here every parameter is);
4. the step rule's public curvature bound (efpsn/params/step_rule.py) holds for standardised data,
   which each agent checks on its own standardised training part (check_second_moment).

What it discloses to every agent: the total number of training samples and every column's
global mean and variance (and how many of its cells hold a value). Opt out with public scales in
schema.json (`scale`: none, unit, div:...). Empty number cells of a table (NaN) are filled with
the global column mean at every party (standardise_dataset), before the standardisation: the
same policy everywhere, and no party's own mean leaves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import torch

from efpsn.data.images import Dataset
from efpsn.data.local import DataError, LocalData, check_second_moment
from efpsn.departure.membership import Departure
from efpsn.masks.seeds import EdgeSeeds
from efpsn.params.config import RunConfig
from efpsn.params.schema import check_standard_masks
from efpsn.stats.column_sums import Totals, decode_totals, masked_vector, sum_masked

__all__ = ["check_standardisable", "count_l2", "left_in_phase_one", "network_totals",
           "simulate_standardising", "standardise_all", "standardise_dataset",
           "standardise_local", "standardises", "with_count_l2"]


def standardises(config: RunConfig) -> bool:
    """Whether this run standardises its features with the network's statistics."""
    return config.scale.standard


def check_standardisable(config: RunConfig) -> None:
    """ValueError unless the run has what the secure sum needs: phase I's edge seeds (zero-sum
    masks refreshed or fading), or no masks at all (efpsn.params.schema.check_standard_masks)."""
    check_standard_masks(config.scale, mask=config.mask, refresh=config.refresh)


def count_l2(count: int) -> float:
    """Logistic regression's default l2 for `count` training samples in all: 1 / count, what
    scikit-learn's C = 1 means for the mean loss."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return 1.0 / count


def with_count_l2(config: RunConfig, totals: Totals) -> RunConfig:
    """The run with a linear task's l2 (logreg, ridge) from the total count when it was left to its
    default (a negative l2); otherwise unchanged. Not resolved (RunConfig.resolved applies the
    step rule with this l2)."""
    if not config.task.linear or not config.l2.default:
        return config
    return config.replace(l2=count_l2(totals.count))


def network_totals(features: Sequence[np.ndarray],
                   seeds: Sequence[EdgeSeeds] | None) -> Totals:
    """The simulator's secure sum: agent i's masked vector from features[i] and seeds[i] (None:
    a run without masks), summed as every agent sums them."""
    if seeds is not None and len(seeds) != len(features):
        raise ValueError(f"{len(features)} agents' features but {len(seeds)} agents' seeds")
    vectors = [masked_vector(x, None if seeds is None else seeds[i])
               for i, x in enumerate(features)]
    return decode_totals(sum_masked(vectors))


def standardise_dataset(data: Dataset, mean: np.ndarray, std: np.ndarray) -> Dataset:
    """(x - mean) / std per feature (float64, elementwise: the same bits everywhere); an empty
    cell (NaN) is filled with its column's mean first, so it becomes 0."""
    x = data.images.numpy().reshape(len(data), -1)
    if x.shape[1] != len(mean):
        raise ValueError(f"{data.name}: {x.shape[1]} features, the statistics have {len(mean)}")
    empty = np.isnan(x)
    if empty.any():
        x = np.where(empty, mean, x)
    z = (x - mean) / std
    return dataclasses.replace(
        data, images=torch.from_numpy(np.ascontiguousarray(z.reshape(data.images.shape))))


def standardise_local(local: LocalData, totals: Totals, *, who: str,
                      moment_bound: float | None = None) -> LocalData:
    """An agent's training, held-out and public test parts standardised with the totals; with
    `moment_bound`, the standardised training part must pass check_second_moment."""
    mean, std = totals.mean(), totals.std()
    train = standardise_dataset(local.train, mean, std)
    if moment_bound is not None:
        check_second_moment(train, bound=moment_bound,
                            fail=lambda text: DataError(f"{who}: {text}"),
                            names=lambda k: f"column {k + 1}")
    return LocalData(
        train=train,
        holdout=None if local.holdout is None else standardise_dataset(local.holdout, mean, std),
        test=None if local.test is None else standardise_dataset(local.test, mean, std),
        missing=local.missing)


def standardise_all(local: Mapping[int, LocalData], seeds: Sequence[EdgeSeeds] | None, *,
                    moment_bound: float | None, gone: Collection[int] = ()
                    ) -> tuple[dict[int, LocalData], Totals]:
    """The simulator's whole step: the secure sum over every agent's training part, then every
    agent's data standardised with the totals. `gone`: agents that left in phase I, before the
    sum (left_in_phase_one): their vectors are not summed and the remaining agents' pads hold
    no term of their edges (drop_seeds, as their neighbours drop them), so the totals are the
    remaining agents'; their data is standardised too (never used, never checked)."""
    from efpsn.departure.remask import drop_seeds

    gone = set(gone)
    order = [i for i in sorted(local) if i not in gone]
    kept = None if seeds is None else [drop_seeds(seeds[i], gone) for i in order]
    totals = network_totals([local[i].train.images.numpy() for i in order], kept)
    return ({i: standardise_local(local[i], totals, who=f"agent{i + 1}",
                                  moment_bound=None if i in gone else moment_bound)
             for i in sorted(local)}, totals)


def left_in_phase_one(departures: Iterable[Departure]) -> frozenset[int]:
    """The agents that left in phase I, before the secure sum of column statistics
    (`agentK@I[:R]`, or `agentK@0`: round 0 re-based at 0); an agent that left later was in
    the sum."""
    return frozenset(d.agent for d in departures
                     if d.phase_one or (d.round == 0 and d.rebase_round == 0))


def simulate_standardising(config: RunConfig, local: Mapping[int, LocalData], *,
                           noise_seed: int | None = None, departures: Iterable[Departure] = (),
                           ) -> tuple[RunConfig, dict[int, LocalData], Totals]:
    """The simulator's phase of a `scale standard` run, before the step rule: the edge seeds
    phase I shares (exchange_seeds_fast: the seeds the run's masks use for the same noise seed,
    the config's seed by default, as run_simulation), the secure sum, every agent's data
    standardised, and the run with l2 from the total count (not yet resolved). `departures`:
    the replayed ones; those in phase I are out of the sum (standardise_all's `gone`)."""
    from efpsn.masks.seeds import exchange_seeds_fast
    from efpsn.topology import build_graph

    check_standardisable(config)
    seeds = None
    if config.mask != "none":
        graph = build_graph(config.topology, config.agents, seed=config.seed)
        seeds = exchange_seeds_fast(graph, noise_seed=config.seed if noise_seed is None
                                    else noise_seed)
    standardised, totals = standardise_all(local, seeds, moment_bound=config.moment_bound,
                                           gone=left_in_phase_one(departures))
    return with_count_l2(config, totals), standardised, totals
