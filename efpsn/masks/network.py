"""Every agent's masks at once, for the simulator and the reference tests: the zero-sum masks by
the real Paillier protocol between in-process Maskers or by the fast path that yields the same
integers, and the baselines (independent noise, none)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from efpsn.crypto import paillier
from efpsn.crypto.encoding import SlotLayout
from efpsn.masks.zero_sum import (
    GraphLike,
    MaskCoefficients,
    Masker,
    NoiseSpec,
    draw_shares,
    independent_mask,
    sorted_neighbours,
)

__all__ = ["checked_neighbours", "independent_masks", "no_masks", "zero_sum_masks",
           "zero_sum_masks_fast"]


def checked_neighbours(graph: GraphLike, n_rngs: int | None) -> list[tuple[int, ...]]:
    """Every agent's sorted neighbours, after checking the graph is undirected and in range."""
    n = graph.n
    if n_rngs is not None and n_rngs != n:
        raise ValueError(f"need one rng per agent: graph has {n} agents, got {n_rngs} rngs")
    nbrs = [sorted_neighbours(graph.neighbours(i), agent=i) for i in range(n)]
    for i, row in enumerate(nbrs):
        for j in row:
            if j >= n:
                raise ValueError(f"agent {i} has neighbour {j} outside 0..{n - 1}")
            if i not in nbrs[j]:
                raise ValueError(f"graph is not undirected: {j} is a neighbour of {i} but not back")
    return nbrs


def zero_sum_masks_fast(
    rngs: Sequence[np.random.Generator], graph: GraphLike, spec: NoiseSpec
) -> list[MaskCoefficients]:
    """The integers the Paillier protocol produces from the same per-agent rngs, unencrypted.

    numerator_ik = sum_{j in N_i} z_ijk - sum_{j in N_i} z_jik; each z_ijk appears once with +
    (at i) and once with - (at j), so sum_i numerator_ik == 0 exactly. Consumes the rngs exactly
    as Masker.outgoing does.
    """
    nbrs = checked_neighbours(graph, len(rngs))
    shares = [draw_shares(rngs[i], spec, nbrs[i]) for i in range(graph.n)]
    out = []
    for i in range(graph.n):
        numerators = []
        for k in range(spec.num_coefficients):
            sent = sum(shares[i][j][k] for j in nbrs[i])
            received = sum(shares[j][i][k] for j in nbrs[i])
            numerators.append(sent - received)
        out.append(MaskCoefficients(tuple(numerators), spec.precision))
    return out


def zero_sum_masks(
    rngs: Sequence[np.random.Generator],
    graph: GraphLike,
    spec: NoiseSpec,
    *,
    layout: SlotLayout | None,
    key_bits: int = paillier.DEFAULT_KEY_BITS,
    keypairs: Sequence[tuple[paillier.PublicKey, paillier.PrivateKey]] | None = None,
    allow_insecure: bool = False,
) -> list[MaskCoefficients]:
    """Run the full Paillier phase I between in-process Maskers (reference for tests/benchmarks)."""
    nbrs = checked_neighbours(graph, len(rngs))
    if keypairs is not None and len(keypairs) != graph.n:
        raise ValueError(f"need one key pair per agent ({graph.n}), got {len(keypairs)}")
    maskers = [
        Masker(
            agent=i, neighbours=nbrs[i], spec=spec, rng=rngs[i], layout=layout,
            key_bits=None if keypairs is not None else key_bits,
            keypair=None if keypairs is None else keypairs[i], allow_insecure=allow_insecure,
        )
        for i in range(graph.n)
    ]
    keys = {i: m.public_key for i, m in enumerate(maskers)}
    sent = [m.outgoing(keys) for m in maskers]
    return [m.finish({j: sent[j][i] for j in nbrs[i]}) for i, m in enumerate(maskers)]


def independent_masks(
    rngs: Sequence[np.random.Generator], graph: GraphLike, spec: NoiseSpec
) -> list[MaskCoefficients]:
    """Non-zero-sum baseline (Nozari et al. 2016): eta_ik ~ N(0, 2 deg(i) sigma_k^2), independent.

    The variance matches EFPSN's eta_bar_ik (diagonal of 2 sigma_k^2 L). One
    rng.standard_normal(N) call per agent, k ascending, encoded with encode_fixed like the shares.
    """
    nbrs = checked_neighbours(graph, len(rngs))
    return [independent_mask(rngs[i], degree=len(nbrs[i]), spec=spec) for i in range(graph.n)]


def no_masks(graph: GraphLike, spec: NoiseSpec) -> list[MaskCoefficients]:
    """All-zero coefficients (mask mode `none`)."""
    zero = MaskCoefficients((0,) * spec.num_coefficients, spec.precision)
    return [zero] * graph.n
