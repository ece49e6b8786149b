"""Masks per round: the fixed mask of the paper, or one refreshed every R rounds from edge seeds.

The per-round driver asks a MaskProvider for round t's coefficients. `FixedMask` returns phase
I's mask every round (`--refresh never`, the paper). `RefreshedMask` derives period
floor(t / R)'s numerators sum_j (z(s_ij) - z(s_ji)) from the agent's EdgeSeeds
(efpsn/masks/seeds.py) and caches the current period; its `NoiseBlocks` derive the streams several
periods at a time when N is small (one pass instead of one call per stream and period) and can be
shared by the agents of one process (the simulator), so that each edge's stream is derived once.
Every agent uses the same public R and NoiseSpec, so in every period each z(s_ij) appears once with
+ (at i) and once with - (at j): the masks sum to zero exactly, every round.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from efpsn.masks.keystream import MAX_PERIOD, exact_bound, period_noise_block
from efpsn.masks.seeds import EdgeSeeds
from efpsn.masks.zero_sum import MaskCoefficients, NoiseSpec
from efpsn.params.refresh_setting import Refresh

__all__ = [
    "FixedMask",
    "MaskProvider",
    "NoiseBlocks",
    "RefreshedMask",
    "check_seeded_mask",
    "refreshed_numerators",
]


class MaskProvider(Protocol):
    """What the per-round driver asks: round t's mask coefficients eta_bar_i(t), as exact
    integers or as float64 values, and how often they change."""

    refresh: Refresh

    def coefficients(self, t: int) -> MaskCoefficients: ...

    def values(self, t: int) -> np.ndarray: ...


class FixedMask:
    """Phase I's mask for every round (`--refresh never`)."""

    def __init__(self, mask: MaskCoefficients) -> None:
        if not isinstance(mask, MaskCoefficients):
            raise TypeError(f"mask must be MaskCoefficients, got {type(mask).__name__}")
        self.mask = mask
        self.refresh = Refresh(None)

    def coefficients(self, t: int) -> MaskCoefficients:
        self.refresh.period(t)  # validates t
        return self.mask

    def values(self, t: int) -> np.ndarray:
        return self.coefficients(t).values()


BLOCK_ELEMENTS = 4096
"""A block of periods holds about this many noise integers per seed (at most 64 periods, at
least one): small N gets many periods per pass, N in the thousands one."""


class NoiseBlocks:
    """z(s, period) of edge seeds s, derived for a block of consecutive periods at once (blocks
    start at multiples of `periods`) and kept for the current block only."""

    def __init__(self, spec: NoiseSpec, *, periods: int | None = None) -> None:
        if not isinstance(spec, NoiseSpec):
            raise TypeError(f"spec must be a NoiseSpec, got {type(spec).__name__}")
        if periods is None:
            periods = max(1, min(64, BLOCK_ELEMENTS // spec.num_coefficients))
        if isinstance(periods, bool) or not isinstance(periods, numbers.Integral) or periods < 1:
            raise ValueError(f"periods must be an int >= 1, got {periods!r}")
        self.spec, self.periods = spec, int(periods)
        self._first: int | None = None
        self._rows: dict[bytes, np.ndarray] = {}

    def noise(self, seeds: Sequence[bytes], period: int) -> np.ndarray:
        """(len(seeds), N) int64: row r is z(seeds[r], period) (keystream.period_noise)."""
        if not seeds:
            return np.zeros((0, self.spec.num_coefficients), dtype=np.int64)
        first = period - period % self.periods
        if first != self._first:
            self._first, self._rows = first, {}
        missing = [s for s in dict.fromkeys(seeds) if s not in self._rows]
        if missing:
            count = min(self.periods, MAX_PERIOD - first + 1)
            self._rows.update(zip(missing, period_noise_block(missing, first, count, self.spec),
                                  strict=True))
        return np.stack([self._rows[s][period - first] for s in seeds])


def check_seeded_mask(seeds: EdgeSeeds, spec: NoiseSpec, blocks: NoiseBlocks | None, *,
                      streams_per_neighbour: int) -> None:
    """The checks every mask derived from edge seeds makes: the types, that its integers stay
    exact when summed (streams_per_neighbour deg(i) max|z| < 2^63), and that shared blocks
    derive its own NoiseSpec."""
    if not isinstance(seeds, EdgeSeeds):
        raise TypeError(f"seeds must be EdgeSeeds, got {type(seeds).__name__}")
    if not isinstance(spec, NoiseSpec):
        raise TypeError(f"spec must be a NoiseSpec, got {type(spec).__name__}")
    terms = streams_per_neighbour * len(seeds.neighbours)
    if terms * exact_bound(spec) >= 2**63:
        raise ValueError(f"agent {seeds.agent}: {terms} noise streams of up to "
                         f"{exact_bound(spec)} could overflow int64; lower P or gamma")
    if blocks is not None and blocks.spec != spec:
        raise ValueError("blocks must derive the mask's own NoiseSpec")


class RefreshedMask:
    """Agent i's mask of round t from its edge seeds, new every `refresh.every` rounds.

    coefficients(t) derives period floor(t / R) once and caches it (the driver asks every
    round, mostly for the same period). Raises ValueError when the spec or the degree could
    leave the exact integer range (|z| < 2^52 per stream, 2 deg(i) max|z| < 2^63 summed).
    """

    def __init__(self, *, seeds: EdgeSeeds, spec: NoiseSpec, refresh: Refresh,
                 blocks: NoiseBlocks | None = None) -> None:
        check_seeded_mask(seeds, spec, blocks, streams_per_neighbour=2)
        if not isinstance(refresh, Refresh) or not refresh.refreshed:
            raise ValueError(f"RefreshedMask needs refresh 'every:R', got {refresh} "
                             "(the fixed mask is FixedMask)")
        self.seeds, self.spec, self.refresh = seeds, spec, refresh
        self.blocks = NoiseBlocks(spec) if blocks is None else blocks
        self._sent = [seed for _, seed in seeds.sent]
        self._streams = self._sent + [seed for _, seed in seeds.received]
        self._period: int | None = None
        self._numerators = np.zeros(0, dtype=np.int64)
        self._mask: MaskCoefficients | None = None

    def numerators(self, t: int) -> np.ndarray:
        """Round t's numerators as int64 (a read-only view of the cached period)."""
        period = self.refresh.period(t)
        if period != self._period:
            rows = self.blocks.noise(self._streams, period)
            sent = len(self._sent)
            numerators = rows[:sent].sum(axis=0) - rows[sent:].sum(axis=0)  # exact in int64
            numerators.setflags(write=False)
            self._period, self._numerators, self._mask = period, numerators, None
        return self._numerators

    def coefficients(self, t: int) -> MaskCoefficients:
        numerators = self.numerators(t)
        if self._mask is None:
            self._mask = MaskCoefficients(tuple(numerators.tolist()), self.spec.precision)
        return self._mask

    def values(self, t: int) -> np.ndarray:
        """Round t's eta_bar_i = numerators / 10^P as float64: the same correctly rounded
        values as MaskCoefficients.values(), vectorised (|numerators| < 2^53 are exact floats)."""
        return self.numerators(t).astype(np.float64) / float(10**self.spec.precision)


def refreshed_numerators(
    seeds: Sequence[EdgeSeeds], spec: NoiseSpec, period: int
) -> np.ndarray:
    """Every agent's numerators of one period, (n, N) int64: the fast path of the simulator
    and the tests (row i = seeds[i].numerators(period, spec))."""
    return np.stack([s.numerators(period, spec) for s in seeds])
