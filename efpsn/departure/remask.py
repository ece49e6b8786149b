"""The masks after a departure: each neighbour of the departed agent drops the terms it shares
with it, and the ends of a new edge add the terms of fresh phase I seeds, so the remaining
masks sum to zero exactly again (in integers), every round.

Every zero-sum mask here is a sum of per-edge terms, + at one end and - at the other:
- seeded masks (FadingMask, the default, and RefreshedMask, `every:R`): agent i's mask is a
  function of its EdgeSeeds, one (s_ij, s_ji) pair per neighbour. Dropping neighbour d means
  rebuilding the mask from the seeds without d's pair (`drop_seeds`, `reseeded`): exactly the
  old integers minus the edge's stream, in the fixed part and in every round's fresh part;
- the paper's fixed mask (`--refresh never`): numerator_i = sum_j (z_ij - z_ji) over the shares
  phase I exchanged (`PairShares`): i drew z_ij itself and holds z_ji's ciphertext under its own
  key, so it subtracts (z_id - z_di), integers it could always read.

Neither step uses anything the neighbour did not hold before: it forgets terms, it learns none.

New edges: both ends draw fresh seeds (or shares) and exchange them under Paillier as in phase I.
A noise seed (simulations and tests only, never private) draws them from
`rejoin_generator(noise_seed, agent, epoch)`, domain-separated from phase I's generator, so a
networked run can be compared with the simulator.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from efpsn.crypto import paillier
from efpsn.masks.factory import seeded_mask
from efpsn.masks.fading import FadingMask
from efpsn.masks.network import checked_neighbours
from efpsn.masks.refresh import FixedMask, MaskProvider, RefreshedMask
from efpsn.masks.seeds import EdgeSeeds, SeedExchange, draw_seeds
from efpsn.masks.zero_sum import MaskCoefficients, NoiseSpec, draw_shares, noise_generator
from efpsn.topology import Graph

__all__ = [
    "PairShares",
    "add_seeds",
    "draw_pair_shares",
    "drop_seeds",
    "exchange_new_edge_seeds",
    "new_edge_seeds",
    "new_edge_shares",
    "part_totals",
    "rejoin_generator",
    "reseeded",
]

_REJOIN_DOMAIN = 0x72656A6F  # "rejo": new edges' draws never repeat phase I's


def rejoin_generator(noise_seed: int | None, agent: int, epoch: int) -> np.random.Generator:
    """Agent i's private source for the new edges of re-base `epoch` (1, 2, ...): the OS when
    noise_seed is None (production), else reproducible and NOT private."""
    if noise_seed is None:
        return np.random.default_rng(secrets.randbits(128))
    return np.random.default_rng([noise_seed, agent, _REJOIN_DOMAIN, epoch])


def _new_neighbours(edges: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for a, b in edges:
        out.setdefault(a, []).append(b)
        out.setdefault(b, []).append(a)
    return {i: sorted(js) for i, js in sorted(out.items())}


def drop_seeds(seeds: EdgeSeeds, gone: Iterable[int]) -> EdgeSeeds:
    """The agent's seeds without the pairs it shares with the agents in `gone`."""
    gone = set(gone)
    return EdgeSeeds(agent=seeds.agent,
                     sent=tuple((j, s) for j, s in seeds.sent if j not in gone),
                     received=tuple((j, s) for j, s in seeds.received if j not in gone))


def add_seeds(seeds: EdgeSeeds, new: Mapping[int, tuple[bytes, bytes]]) -> EdgeSeeds:
    """The agent's seeds with the new edges' pairs, new[j] = (s_ij, s_ji)."""
    clash = sorted(set(new) & set(seeds.neighbours))
    if clash:
        raise ValueError(f"agent{seeds.agent + 1} already shares seeds with {clash}")
    return EdgeSeeds(agent=seeds.agent,
                     sent=seeds.sent + tuple((j, new[j][0]) for j in new),
                     received=seeds.received + tuple((j, new[j][1]) for j in new))


def new_edge_seeds(edges: Sequence[tuple[int, int]], *, noise_seed: int | None,
                   epoch: int) -> dict[int, dict[int, tuple[bytes, bytes]]]:
    """What phase I on the new edges yields, without encryption: agent i's pair (s_ij, s_ji)
    for each new neighbour j, i drawing its seeds as SeedExchange draws them (new neighbours
    ascending) from rejoin_generator(noise_seed, i, epoch)."""
    nbrs = _new_neighbours(edges)
    drawn = {i: draw_seeds(js, rejoin_generator(noise_seed, i, epoch)) for i, js in nbrs.items()}
    return {i: {j: (drawn[i][j], drawn[j][i]) for j in js} for i, js in nbrs.items()}


def exchange_new_edge_seeds(
    edges: Sequence[tuple[int, int]],
    keypairs: Mapping[int, tuple[paillier.PublicKey, paillier.PrivateKey]],
    *,
    noise_seed: int | None,
    epoch: int,
    allow_insecure: bool = False,
) -> dict[int, dict[int, tuple[bytes, bytes]]]:
    """Phase I on the new edges by real Paillier between in-process SeedExchanges (the ends'
    phase I key pairs, keypairs[i]): what new_edge_seeds computes, encrypted. The networked
    agents run the same SeedExchange per new edge, with rejoin_generator's draws."""
    nbrs = _new_neighbours(edges)
    ends = {i: SeedExchange(agent=i, neighbours=js, keypair=keypairs[i],
                            rng=None if noise_seed is None else rejoin_generator(noise_seed, i,
                                                                                 epoch),
                            allow_insecure=allow_insecure)
            for i, js in nbrs.items()}
    keys = {i: end.public_key for i, end in ends.items()}
    sent = {i: end.outgoing(keys) for i, end in ends.items()}
    out = {}
    for i, end in ends.items():
        seeds = end.finish({j: sent[j][i] for j in nbrs[i]})
        received = dict(seeds.received)
        out[i] = {j: (s, received[j]) for j, s in seeds.sent}
    return out


def reseeded(provider: MaskProvider, seeds: EdgeSeeds, *, since: int = 0) -> MaskProvider:
    """A seeded mask of the same kind, spec, refresh and shared NoiseBlocks, from other seeds.
    A fading mask's kept edges fade from where they did; its new ones from round `since` (a
    join's round: the newcomer's first rounds get a fresh part of full size; a departure's
    re-base keeps 0)."""
    if not isinstance(provider, FadingMask | RefreshedMask):
        raise TypeError(f"only seeded masks are rebuilt from seeds, got {type(provider).__name__}")
    # a refreshed mask's NoiseBlocks are shared (the simulator's agents); a fading one's are its own
    blocks = provider.blocks if isinstance(provider, RefreshedMask) else None
    starts = ({j: provider.starts.get(j, since) for j in seeds.neighbours}
              if isinstance(provider, FadingMask) else None)
    return seeded_mask(seeds, spec=provider.spec, refresh=provider.refresh, blocks=blocks,
                       starts=starts)


@dataclass(frozen=True)
class PairShares:
    """Agent i's phase I shares of the paper's fixed mask: sent[j] = z_ij (drawn by i) and
    received[j] = z_ji (j's ciphertext under i's key), per neighbour j. Secret, like EdgeSeeds."""

    agent: int
    sent: dict[int, tuple[int, ...]] = field(repr=False)
    received: dict[int, tuple[int, ...]] = field(repr=False)
    precision: int

    @property
    def neighbours(self) -> tuple[int, ...]:
        return tuple(sorted(self.sent))

    def numerators(self, count: int) -> tuple[int, ...]:
        """sum_j (z_ij - z_ji) per coefficient, as exact ints (zeros without neighbours)."""
        out = [0] * count
        for j in self.neighbours:
            for k in range(count):
                out[k] += self.sent[j][k] - self.received[j][k]
        return tuple(out)

    def mask(self, count: int) -> FixedMask:
        return FixedMask(MaskCoefficients(self.numerators(count), self.precision))

    def without(self, gone: Iterable[int]) -> PairShares:
        gone = set(gone)
        return PairShares(agent=self.agent, precision=self.precision,
                          sent={j: z for j, z in self.sent.items() if j not in gone},
                          received={j: z for j, z in self.received.items() if j not in gone})

    def plus(self, new: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> PairShares:
        clash = sorted(set(new) & set(self.sent))
        if clash:
            raise ValueError(f"agent{self.agent + 1} already shares terms with {clash}")
        return PairShares(agent=self.agent, precision=self.precision,
                          sent={**self.sent, **{j: s for j, (s, _) in new.items()}},
                          received={**self.received, **{j: r for j, (_, r) in new.items()}})


def draw_pair_shares(graph: Graph, spec: NoiseSpec, *,
                     noise_seed: int | None) -> list[PairShares]:
    """Every agent's phase I shares, drawn as zero_sum_masks_fast and the Paillier Maskers
    draw them (noise_generator(noise_seed, i), draw_shares over the neighbours ascending)."""
    if noise_seed is None:
        raise ValueError("the simulator redraws phase I's shares from a noise seed; give one")
    nbrs = checked_neighbours(graph, None)
    shares = [draw_shares(noise_generator(noise_seed, i), spec, nbrs[i]) for i in range(graph.n)]
    return [PairShares(agent=i, precision=spec.precision,
                       sent={j: tuple(shares[i][j]) for j in nbrs[i]},
                       received={j: tuple(shares[j][i]) for j in nbrs[i]})
            for i in range(graph.n)]


def new_edge_shares(edges: Sequence[tuple[int, int]], spec: NoiseSpec, *,
                    noise_seed: int | None, epoch: int,
                    ) -> dict[int, dict[int, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """The paper's protocol on the new edges: agent i's (z_ij, z_ji) per new neighbour j."""
    nbrs = _new_neighbours(edges)
    drawn = {i: draw_shares(rejoin_generator(noise_seed, i, epoch), spec, js)
             for i, js in nbrs.items()}
    return {i: {j: (tuple(drawn[i][j]), tuple(drawn[j][i])) for j in js}
            for i, js in nbrs.items()}


def integer_parts(provider: MaskProvider, t: int) -> dict[str, np.ndarray]:
    """The integer vectors of round t's mask that must each sum to zero over the agents, by
    name (an agent without a join's edges has no vector of that join: zero)."""
    if isinstance(provider, FadingMask):
        return provider.integer_groups(t)
    if isinstance(provider, RefreshedMask):
        return {"numerators": provider.numerators(t)}
    return {"numerators": np.array(provider.coefficients(t).numerators, dtype=object)}


def part_totals(providers: Iterable[MaskProvider], t: int, *,
                exact: bool = True) -> dict[str, np.ndarray]:
    """Each named integer part of round t's masks summed over these agents: as Python integers
    (`exact`), or in the parts' own dtype (int64: the simulator's check every round, whose
    masks are built so that their sums stay in range)."""
    totals: dict[str, np.ndarray] = {}
    for provider in providers:
        for name, part in integer_parts(provider, t).items():
            part = part.astype(object) if exact else part
            if name in totals:
                totals[name] += part
            else:
                totals[name] = part.copy()
    return totals


def sums_to_zero(providers: Iterable[MaskProvider], t: int, *, exact: bool = True) -> bool:
    """Whether round t's masks of these agents sum to zero exactly, part by part (integers;
    `exact`: as part_totals)."""
    return not any(bool(np.any(total != 0))
                   for total in part_totals(providers, t, exact=exact).values())
