"""Phase I masking: pinned draws, exact zero-sum over real Paillier, covariance 2 sigma_k^2 L."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efpsn.crypto import paillier
from efpsn.crypto.encoding import SlotLayout
from efpsn.masks.network import independent_masks, no_masks, zero_sum_masks, zero_sum_masks_fast
from efpsn.masks.zero_sum import (
    MaskCoefficients,
    Masker,
    MaskingStateError,
    NoiseSpec,
    draw_shares,
    independent_mask,
)
from efpsn.topology import Graph

MAX_AGENTS = 7


@cache
def key_pool(bits: int) -> tuple[tuple[paillier.PublicKey, paillier.PrivateKey], ...]:
    """One insecure key pair per agent, generated once per session (tests only)."""
    return tuple(paillier.generate_keypair(bits, allow_insecure=True) for _ in range(MAX_AGENTS))


@cache
def keys_2048() -> tuple[tuple[paillier.PublicKey, paillier.PrivateKey], ...]:
    return tuple(paillier.generate_keypair(2048) for _ in range(3))


def rngs_for(seed: int, n: int) -> list[np.random.Generator]:
    return [np.random.default_rng([seed, i]) for i in range(n)]


def numerator_sums(masks: list[MaskCoefficients]) -> list[int]:
    return [sum(column) for column in zip(*(m.numerators for m in masks), strict=True)]


# Ring 0-1-2-3-4-0 plus the chord 0-2: degrees (3, 2, 3, 2, 2), not vertex-transitive.
FIVE = Graph(n=5, edges=((0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (0, 2)))
PATH3 = Graph(n=3, edges=((0, 1), (1, 2)))


# --------------------------------------------------------------------------- NoiseSpec and draws


def test_noise_spec_sigma2_is_one_based() -> None:
    spec = NoiseSpec(gamma=2.0, p=1.0, precision=3, num_coefficients=4)
    np.testing.assert_array_equal(spec.sigma2(), [2.0, 1.0, 2.0 / 3.0, 0.5])
    spec = NoiseSpec(gamma=1e3, p=2, precision=0, num_coefficients=3)
    assert spec.p == 2.0 and isinstance(spec.p, float)
    np.testing.assert_allclose(spec.sigma2(), [1e3, 250.0, 1e3 / 9], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"gamma": 0.0}, ValueError, "gamma must be finite and > 0, got 0.0"),
        ({"gamma": float("inf")}, ValueError, "gamma must be finite"),
        ({"p": -1.0}, ValueError, "p must be finite and > 0"),
        ({"precision": -1}, ValueError, "precision must be >= 0, got -1"),
        ({"precision": 2.0}, TypeError, "precision must be an int"),
        ({"num_coefficients": 0}, ValueError, "num_coefficients must be >= 1, got 0"),
        ({"gamma": "1"}, TypeError, "gamma must be a real number"),
    ],
)
def test_noise_spec_validation(kwargs: dict, error: type, message: str) -> None:
    base = {"gamma": 1.0, "p": 1.0, "precision": 3, "num_coefficients": 2}
    with pytest.raises(error, match=message):
        NoiseSpec(**{**base, **kwargs})


def test_noise_spec_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        NoiseSpec(1.0, 1.0, 3, 2)  # type: ignore[misc]


def test_draw_shares_regression_vector() -> None:
    # default_rng(0).standard_normal((2, 2)) = [[0.12573022, -0.13210486],
    #                                           [0.64042265,  0.10490012]]
    # row 0 -> neighbour 1, row 1 -> neighbour 3; column k-1 scaled by sigma_k = 1/sqrt(k):
    # floor(1000 * [0.12573, -0.13210/sqrt 2]) = [125, -94]; [640, floor(74.17)] = [640, 74].
    spec = NoiseSpec(gamma=1.0, p=1.0, precision=3, num_coefficients=2)
    shares = draw_shares(np.random.default_rng(0), spec, [3, 1])
    assert shares == {1: [125, -94], 3: [640, 74]}
    assert list(shares) == [1, 3]
    with pytest.raises(ValueError, match="distinct"):
        draw_shares(np.random.default_rng(0), spec, [1, 1])


def test_mask_coefficients_values() -> None:
    mask = MaskCoefficients((1500, -101, 0), 3)
    assert mask.values().tolist() == [1.5, -0.101, 0.0]
    assert mask.num_coefficients == 3
    with pytest.raises(TypeError, match=r"numerators\[1\] must be an int"):
        MaskCoefficients((1, 2.0), 3)  # type: ignore[arg-type]


def test_fast_path_regression_vector() -> None:
    # Path 0-1-2, N = 1, gamma = 1, P = 2; shares z_ij from rng [seed, i] in neighbour order.
    spec = NoiseSpec(gamma=1.0, p=1.0, precision=2, num_coefficients=1)
    shares = [draw_shares(r, spec, PATH3.neighbours(i)) for i, r in enumerate(rngs_for(7, 3))]
    masks = zero_sum_masks_fast(rngs_for(7, 3), PATH3, spec)
    z01, z10, z12, z21 = shares[0][1][0], shares[1][0][0], shares[1][2][0], shares[2][1][0]
    assert [m.numerators for m in masks] == [
        (z01 - z10,), (z10 + z12 - z01 - z21,), (z21 - z12,),
    ]
    assert numerator_sums(masks) == [0]


# --------------------------------------------------------------------------- protocol == fast path


@st.composite
def connected_graphs(draw: st.DrawFn) -> Graph:
    n = draw(st.integers(2, MAX_AGENTS))
    order = draw(st.permutations(range(n)))
    edges = {tuple(sorted((order[a], order[a + 1]))) for a in range(n - 1)}  # spanning path
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges |= set(draw(st.lists(st.sampled_from(pairs), max_size=len(pairs))))
    return Graph(n=n, edges=tuple(sorted(edges)))


@pytest.mark.slow
@given(
    graph=connected_graphs(),
    precision=st.integers(0, 12),
    gamma=st.floats(1e-3, 1e6),
    p=st.floats(0.5, 3.0),
    num_coefficients=st.integers(1, 20),
    packed=st.booleans(),
    key_bits=st.sampled_from([256, 512]),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_paillier_protocol_is_exactly_zero_sum_and_matches_fast_path(
    graph: Graph, precision: int, gamma: float, p: float, num_coefficients: int, packed: bool,
    key_bits: int, seed: int,
) -> None:
    spec = NoiseSpec(gamma=gamma, p=p, precision=precision, num_coefficients=num_coefficients)
    layout = (
        SlotLayout.plan(
            precision=precision, gamma=gamma, max_terms=graph.max_degree, key_bits=key_bits
        )
        if packed else None
    )
    masks = zero_sum_masks(
        rngs_for(seed, graph.n), graph, spec, layout=layout,
        keypairs=key_pool(key_bits)[: graph.n], allow_insecure=True,
    )
    assert numerator_sums(masks) == [0] * num_coefficients
    assert masks == zero_sum_masks_fast(rngs_for(seed, graph.n), graph, spec)


@pytest.mark.parametrize("packed", [True, False])
def test_zero_sum_with_real_2048_bit_keys(packed: bool) -> None:
    spec = NoiseSpec(gamma=1e3, p=1.0, precision=8, num_coefficients=5)
    layout = SlotLayout.plan(precision=8, gamma=1e3, max_terms=2, key_bits=2048) if packed else None
    maskers = [
        Masker(agent=i, neighbours=PATH3.neighbours(i), spec=spec, rng=rng, layout=layout,
               key_bits=2048, keypair=keys_2048()[i])
        for i, rng in enumerate(rngs_for(11, 3))
    ]
    keys = {i: m.public_key for i, m in enumerate(maskers)}
    sent = [m.outgoing(keys) for m in maskers]
    masks = [m.finish({j: sent[j][i] for j in PATH3.neighbours(i)}) for i, m in enumerate(maskers)]
    assert numerator_sums(masks) == [0] * 5
    assert masks == zero_sum_masks_fast(rngs_for(11, 3), PATH3, spec)
    per_edge = 1 if packed else 5
    assert [m.encryptions for m in maskers] == [per_edge, 2 * per_edge, per_edge]
    assert [m.decryptions for m in maskers] == [per_edge] * 3
    assert all(len(cs) == per_edge for out in sent for cs in out.values())


def test_generated_keys_and_isolated_agent() -> None:
    spec = NoiseSpec(gamma=1.0, p=1.0, precision=4, num_coefficients=3)
    # The masker generates its own (insecure, small) key when none is given.
    masks = zero_sum_masks(rngs_for(3, 2), Graph(n=2, edges=((0, 1),)), spec, layout=None,
                           key_bits=256, allow_insecure=True)
    assert numerator_sums(masks) == [0, 0, 0]
    assert masks[0].numerators == tuple(-z for z in masks[1].numerators)
    lonely = Masker(agent=0, neighbours=(), spec=spec, rng=np.random.default_rng(0), layout=None,
                    key_bits=256, allow_insecure=True)
    assert lonely.outgoing({}) == {}
    assert lonely.finish({}).numerators == (0, 0, 0)


# --------------------------------------------------------------------------- Masker validation


def make_masker(agent: int = 1, *, layout: SlotLayout | None = None,
                spec: NoiseSpec | None = None) -> Masker:
    spec = spec or NoiseSpec(gamma=1.0, p=1.0, precision=3, num_coefficients=3)
    return Masker(agent=agent, neighbours=PATH3.neighbours(agent), spec=spec,
                  rng=np.random.default_rng(agent), layout=layout,
                  keypair=key_pool(512)[agent], allow_insecure=True)


def test_masker_state_machine_and_input_validation() -> None:
    masker = make_masker(1)
    keys = {i: key_pool(512)[i][0] for i in range(3)}
    with pytest.raises(MaskingStateError, match="call outgoing\\(\\) before finish\\(\\)"):
        masker.finish({})
    with pytest.raises(ValueError, match=r"missing \[2\]"):
        masker.outgoing({0: keys[0]})
    sent = masker.outgoing(keys)
    assert masker.outgoing(keys) == sent  # retransmission: same ciphertexts, no new draws
    with pytest.raises(MaskingStateError, match="different neighbour keys"):
        masker.outgoing({0: keys[0], 2: keys[1]})
    # Ciphertexts for agent 1, as its neighbours would produce them.
    own = masker.public_key
    good = {j: [paillier.encrypt(own, 5) for _ in range(3)] for j in (0, 2)}
    n2 = own.nsquare
    with pytest.raises(ValueError, match=r"missing \[2\], unexpected \[\]"):
        masker.finish({0: good[0]})
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \[3\]"):
        masker.finish({**good, 3: good[0]})
    with pytest.raises(ValueError, match="expects 3 ciphertexts from neighbour 2, got 2"):
        masker.finish({0: good[0], 2: good[2][:2]})
    with pytest.raises(ValueError, match="ciphertext 1 from neighbour 0: .*0 < c < n\\^2"):
        masker.finish({0: [good[0][0], n2, good[0][2]], 2: good[2]})
    with pytest.raises(ValueError, match="ciphertext 0 from neighbour 2: .*gcd"):
        masker.finish({0: good[0], 2: [own.n, *good[2][1:]]})
    result = masker.finish(good)
    shares_sent = [sum(col) for col in zip(*draw_shares(np.random.default_rng(1),
                                                        masker.spec, (0, 2)).values(),
                                            strict=True)]
    assert result.numerators == tuple(s - 10 for s in shares_sent)
    with pytest.raises(MaskingStateError, match="already called"):
        masker.finish(good)


def test_masker_refuses_insecure_keys_and_layout_misfits() -> None:
    spec = NoiseSpec(gamma=1.0, p=1.0, precision=3, num_coefficients=3)
    with pytest.raises(ValueError, match="at least 2048 are required"):
        Masker(agent=0, neighbours=(1,), spec=spec, rng=np.random.default_rng(0), layout=None,
               keypair=key_pool(512)[0])
    secure = Masker(agent=0, neighbours=(1,), spec=spec, rng=np.random.default_rng(0),
                    layout=None, keypair=keys_2048()[0])
    with pytest.raises(ValueError, match="512 bits; at least 2048"):
        secure.outgoing({1: key_pool(512)[1][0]})
    with pytest.raises(ValueError, match="key_bits=1024 but the given key pair has 512 bits"):
        Masker(agent=0, neighbours=(1,), spec=spec, rng=np.random.default_rng(0), layout=None,
               key_bits=1024, keypair=key_pool(512)[0], allow_insecure=True)
    small = SlotLayout.plan(precision=3, gamma=1.0, max_terms=1, key_bits=512)
    with pytest.raises(ValueError, match="2 neighbours but the layout sums at most max_terms=1"):
        make_masker(1, layout=small)
    big = SlotLayout.plan(precision=3, gamma=1.0, max_terms=2, key_bits=2048)
    with pytest.raises(ValueError, match="512-bit key cannot hold the layout's"):
        make_masker(1, layout=big)
    with pytest.raises(ValueError, match="lists itself"):
        Masker(agent=0, neighbours=(0, 1), spec=spec, rng=np.random.default_rng(0), layout=None,
               keypair=key_pool(512)[0], allow_insecure=True)
    with pytest.raises(TypeError, match="rng must be a numpy Generator"):
        Masker(agent=0, neighbours=(1,), spec=spec, rng=np.random.RandomState(0),  # type: ignore[arg-type]
               layout=None, keypair=key_pool(512)[0], allow_insecure=True)


def test_independent_mask_regression_vector() -> None:
    # default_rng(0).standard_normal(2) = [0.12573022, -0.13210486]; variance 2 * 3 * sigma_k^2
    # with sigma^2 = (1, 1/2): floor(1000 * [0.12573 * sqrt 6, -0.13210 * sqrt 3]) = [307, -229].
    spec = NoiseSpec(gamma=1.0, p=1.0, precision=3, num_coefficients=2)
    mask = independent_mask(np.random.default_rng(0), degree=3, spec=spec)
    assert mask.numerators == (307, -229)
    masks = independent_masks(rngs_for(1, 3), PATH3, spec)
    assert masks[1] == independent_mask(np.random.default_rng([1, 1]), degree=2, spec=spec)
    assert independent_mask(np.random.default_rng(0), degree=0, spec=spec).numerators == (0, 0)
    with pytest.raises(ValueError, match="degree must be a non-negative int"):
        independent_mask(np.random.default_rng(0), degree=-1, spec=spec)


def test_graph_validation_in_fast_paths() -> None:
    class OneWay:
        n = 2

        def neighbours(self, i: int) -> tuple[int, ...]:
            return (1,) if i == 0 else ()

    spec = NoiseSpec(gamma=1.0, p=1.0, precision=3, num_coefficients=2)
    with pytest.raises(ValueError, match="not undirected"):
        zero_sum_masks_fast(rngs_for(0, 2), OneWay(), spec)
    with pytest.raises(ValueError, match="graph has 3 agents, got 2 rngs"):
        zero_sum_masks_fast(rngs_for(0, 2), PATH3, spec)
    assert [m.numerators for m in no_masks(PATH3, spec)] == [(0, 0)] * 3


# --------------------------------------------------------------------------- statistics

DRAWS = 4000
STAT_SPEC = NoiseSpec(gamma=2.0, p=1.0, precision=6, num_coefficients=2)


@cache
def sampled(mode: str) -> np.ndarray:
    """(DRAWS, N, n) samples of eta_bar_k for FIVE, each draw with fresh per-agent rngs."""
    make = zero_sum_masks_fast if mode == "zero-sum" else independent_masks
    out = np.empty((DRAWS, STAT_SPEC.num_coefficients, FIVE.n))
    for d in range(DRAWS):
        masks = make(rngs_for(1_000_000 + d, FIVE.n), FIVE, STAT_SPEC)
        if mode == "zero-sum":
            assert numerator_sums(masks) == [0, 0]
        out[d] = np.stack([m.values() for m in masks], axis=1)
    return out


def covariance_tolerance(sigma: np.ndarray, draws: int, z: float = 5.0) -> np.ndarray:
    """z standard errors of the zero-mean sample covariance S = X^T X / M of Gaussian data.

    Var(S_ab) = (Sigma_aa Sigma_bb + Sigma_ab^2) / M; with 2 * 25 entries checked at z = 5 the
    chance of a false alarm is below 50 * 6e-7 (and the seeds are fixed, so it is deterministic).
    Flooring to 10^-6 changes each share by < 1e-6, far below these tolerances (~0.1).
    """
    d = np.diag(sigma)
    return z * np.sqrt((np.outer(d, d) + sigma**2) / draws)


def test_zero_sum_covariance_is_two_sigma2_laplacian() -> None:
    samples = sampled("zero-sum")
    laplacian = FIVE.laplacian()
    np.testing.assert_array_equal(
        laplacian,
        np.array([[3, -1, -1, 0, -1], [-1, 2, -1, 0, 0], [-1, -1, 3, -1, 0],
                  [0, 0, -1, 2, -1], [-1, 0, 0, -1, 2]], dtype=float),
    )
    for k, sigma2 in enumerate(STAT_SPEC.sigma2()):
        x = samples[:, k, :]
        expected = 2 * sigma2 * laplacian
        empirical = x.T @ x / DRAWS
        assert np.all(np.abs(empirical - expected) <= covariance_tolerance(expected, DRAWS))
        mean_tol = 5 * np.sqrt(np.diag(expected) / DRAWS)
        assert np.all(np.abs(x.mean(axis=0)) <= mean_tol)
        # Exactly zero-sum (up to the float rounding of each value).
        assert np.max(np.abs(x.sum(axis=1))) < 1e-9


def test_independent_masks_variance_is_two_deg_sigma2() -> None:
    samples = sampled("independent")
    degrees = np.array([len(FIVE.neighbours(i)) for i in range(FIVE.n)], dtype=float)
    for k, sigma2 in enumerate(STAT_SPEC.sigma2()):
        x = samples[:, k, :]
        expected = np.diag(2 * degrees * sigma2)
        empirical = x.T @ x / DRAWS
        assert np.all(np.abs(empirical - expected) <= covariance_tolerance(expected, DRAWS))
        # Not zero-sum: the sum over agents has variance 2 * sum(deg) * sigma_k^2.
        assert np.std(x.sum(axis=1)) > 0.5 * math.sqrt(2 * degrees.sum() * sigma2)


def test_neighbours_gone_in_phase_one_add_up_and_decryptions_are_counted() -> None:
    masker = make_masker(1)  # neighbours 0 and 2 on the path
    keys = {i: key_pool(512)[i][0] for i in range(3)}
    ends = {j: make_masker(j) for j in (0, 2)}
    with pytest.raises(MaskingStateError, match=r"^agent 1: edge_terms\(\) needs finish\(\) "
                                                r"first$"):
        masker.edge_terms(0)
    masker.drop([7])  # not a neighbour: nothing to drop
    assert masker.departed == frozenset() and masker.neighbours == (0, 2)
    masker.drop([2])
    masker.drop([9])  # a later report keeps the earlier departure
    assert masker.departed == frozenset({2}) and masker.neighbours == (0,)
    sent = masker.outgoing(keys)
    assert list(sent) == [0]
    ends[0].outgoing(keys)
    ends[0].drop([])
    before = masker.decryptions
    masker.finish({0: ends[0].outgoing(keys)[1]})
    assert masker.decryptions > before >= 0
    after = masker.decryptions
    mine, theirs = masker.edge_terms(0)
    assert len(mine) == len(theirs) == 3 and masker.decryptions > after
