"""Which mask an agent runs, chosen in one place: the paper's fixed mask, or a seeded one (fading
or refreshed every R rounds) from phase I's edge seeds.

Phase I ends with either exact mask coefficients (`--refresh never`: efpsn/masks/zero_sum.py) or
the edge seeds every round's noise comes from (efpsn/masks/seeds.py). The run's Refresh value
says which seeded kind: fading (`fading:RHO`, efpsn/masks/fading.py) or refreshed
(`every:R`, efpsn/masks/refresh.py). The agents, the simulator, a departure's re-seeding and
the experiments all build their masks here, so the kind never depends on who asks.
"""

from __future__ import annotations

from collections.abc import Mapping

from efpsn.masks.fading import FadingMask
from efpsn.masks.refresh import FixedMask, MaskProvider, NoiseBlocks, RefreshedMask
from efpsn.masks.seeds import EdgeSeeds
from efpsn.masks.zero_sum import MaskCoefficients, NoiseSpec
from efpsn.params.refresh_setting import Refresh

__all__ = ["SeededMask", "mask_of", "seeded_blocks", "seeded_mask"]

SeededMask = FadingMask | RefreshedMask


def seeded_blocks(spec: NoiseSpec, refresh: Refresh) -> NoiseBlocks:
    """NoiseBlocks that several agents of one process may share (each edge's stream derived
    once): one period at a time for fading masks, several for refreshed ones."""
    if not refresh.refreshed:
        raise ValueError(f"refresh {refresh} draws no seeded masks")
    return NoiseBlocks(spec, periods=1) if refresh.fading else NoiseBlocks(spec)


def seeded_mask(seeds: EdgeSeeds, *, spec: NoiseSpec, refresh: Refresh,
                blocks: NoiseBlocks | None = None,
                starts: Mapping[int, int] | None = None) -> SeededMask:
    """The mask edge seeds give under `refresh`: fading or refreshed every R rounds. `starts`:
    per neighbour, the round its edge's fresh part fades from (a join's; default 0); a
    refreshed mask draws every period afresh, whoever joined."""
    if not refresh.refreshed:
        raise ValueError(f"refresh {refresh} keeps phase I's fixed mask: it has no seeds")
    if refresh.fading:
        return FadingMask(seeds=seeds, spec=spec, refresh=refresh, blocks=blocks, starts=starts)
    return RefreshedMask(seeds=seeds, spec=spec, refresh=refresh, blocks=blocks)


def mask_of(phase_one: MaskCoefficients | EdgeSeeds, *, spec: NoiseSpec,
            refresh: Refresh, since: int = 0) -> MaskProvider:
    """An agent's mask of every round from what its phase I ended with; `since`: the round its
    edges' fresh part fades from (a party that joined then: its edges are its join's)."""
    if isinstance(phase_one, EdgeSeeds):
        starts = {j: since for j in phase_one.neighbours} if since else None
        return seeded_mask(phase_one, spec=spec, refresh=refresh, starts=starts)
    return FixedMask(phase_one)
