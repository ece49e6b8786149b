"""The default mask (efpsn/masks/fading.py): a fixed zero-sum part and a fresh zero-sum part every
round that fades at a public rate. Exactly zero-sum in integers every round, the same integers at
both ends of an edge, fresh noise in every two rounds' difference while it lasts, nothing left of it
at the end, the same bits on every machine (pinned), and the refresh grammar that names it."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.masks.fading import FadingMask, binomial_noise, edge_seed, fade, fresh_scales
from efpsn.masks.refresh import RefreshedMask
from efpsn.masks.seeds import exchange_seeds_fast
from efpsn.masks.zero_sum import NoiseSpec
from efpsn.params.config import RunConfig
from efpsn.params.refresh_setting import Refresh
from efpsn.params.step_rule import MINI_BATCH_FADE_FLOOR, StepRule, fading_rate
from efpsn.topology import Graph, build_graph

SPEC = NoiseSpec(gamma=1e6, p=1.0, precision=6, num_coefficients=50)
FIVE = Graph(n=5, edges=((0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (0, 2)))
RATE = Refresh.parse("fading:0.9")


def masks(graph: Graph, *, noise_seed: int = 3, spec: NoiseSpec = SPEC,
          refresh: Refresh = RATE) -> list[FadingMask]:
    return [FadingMask(seeds=s, spec=spec, refresh=refresh)
            for s in exchange_seeds_fast(graph, noise_seed=noise_seed)]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 9), extra=st.integers(0, 6), noise_seed=st.integers(0, 2**16),
       rounds=st.lists(st.integers(0, 400), min_size=1, max_size=6))
def test_masks_sum_to_zero_in_integers_every_round(n: int, extra: int, noise_seed: int,
                                                   rounds: list[int]) -> None:
    graph = build_graph("ring", n) if extra == 0 else build_graph(
        f"erdos-renyi:{min(1.0, 0.2 + extra / 10)}", n, seed=noise_seed)
    agents = masks(graph, noise_seed=noise_seed)
    assert not np.any(sum(m.fixed for m in agents))
    for t in rounds:
        assert len({m.exponent(t) for m in agents}) == 1  # a public denominator
        assert not np.any(sum(m.fresh(t)[0] for m in agents)), t


def test_both_ends_of_an_edge_derive_the_same_fresh_integers() -> None:
    seeds = exchange_seeds_fast(Graph(n=2, edges=((0, 1),)), noise_seed=5)
    low, high = (FadingMask(seeds=s, spec=SPEC, refresh=RATE) for s in seeds)
    assert low.edges[0][1] == high.edges[0][1] and (low.edges[0][0], high.edges[0][0]) == (1, -1)
    a, b = dict(seeds[0].sent)[1], dict(seeds[1].sent)[0]
    assert low.edges[0][1] == edge_seed(a, b) != edge_seed(b, a)  # lower agent's seed first
    for t in (0, 1, 17, 900):
        assert np.array_equal(low.fresh(t)[0], -high.fresh(t)[0])


def test_the_fixed_part_is_period_zero_of_the_refreshed_streams() -> None:
    # the same integers `every:R` gives for its first period: one phase I serves both modes
    seeds = exchange_seeds_fast(FIVE, noise_seed=9)
    for s in seeds:
        fading = FadingMask(seeds=s, spec=SPEC, refresh=RATE)
        every = RefreshedMask(seeds=s, spec=SPEC, refresh=Refresh(4))
        assert np.array_equal(fading.fixed, every.numerators(0))
        # round 0: one denominator, so the exact coefficients exist; later ones need two
        assert fading.coefficients(0).numerators == tuple((fading.fixed + fading.fresh(0)[0])
                                                           .tolist())
        with pytest.raises(ValueError, match="use integer_parts"):
            fading.coefficients(30)


def test_two_rounds_differ_by_fresh_noise_that_fades_but_never_rounds_away() -> None:
    agent = masks(FIVE)[0]
    scale = agent.values(0) - agent.fixed / 1e6
    diffs = [float(np.abs(agent.values(t + 1) - agent.values(t)).mean()) for t in (0, 20, 40)]
    # the difference's size follows the rate (0.9^20 = 0.12 per 20 rounds)
    assert diffs[0] > 0 and 0.03 < diffs[1] / diffs[0] < 0.5 and diffs[2] < diffs[1]
    # scale: the fresh part at round 0 is as large as the fixed part (both 2 deg c_k^2)
    ratio = np.std(scale) / np.std(agent.fixed / 1e6)
    assert 0.4 < ratio < 2.5, ratio
    # late rounds: at 0.9^200 = 7e-10 most old-style integers trunc(fade * w) would be 0;
    # the exponent k(t) keeps the fresh part's 40-odd bits, so every coefficient still moves
    t = 200
    fresh, exponent = agent.fresh(t)
    assert exponent > 25 and np.abs(fresh).max() > 2**30
    moved = np.abs(agent.values(t + 1) - agent.values(t)) / 0.9**t
    assert np.count_nonzero(moved) >= 0.9 * len(moved)
    assert 0.1 < float(np.median(moved) / np.abs(scale).mean()) < 10


def test_fade_is_binary_powering_close_to_pow() -> None:
    assert fade(0.9, 0) == 1.0 and fade(0.9, 1) == 0.9 and fade(0.5, 10) == 2.0**-10
    for t in (3, 100, 1234):
        assert fade(0.987, t) == pytest.approx(0.987**t, rel=1e-12)
    with pytest.raises(ValueError, match="round must be an int >= 0"):
        fade(0.9, -1)


def test_pinned_stream_and_scales() -> None:
    # the same bits on every machine: ChaCha20 (key, nonce "efpf" || t) and popcounts
    seed = bytes(range(32))
    assert binomial_noise(seed, 7, 8).tolist() == [-5, 7, 8, -2, 6, 1, 6, -3]
    assert hashlib.sha256(binomial_noise(seed, 123456, 1000).tobytes()).hexdigest() == (
        "ec6e3a4d132ab7ebcddb387a9f31c1d8e050b3c6bf364f42acef7661abd7aa9d")
    noise = binomial_noise(seed, 0, 20_000)
    assert abs(noise.mean()) < 0.1 and 15 < noise.var() < 17 and np.abs(noise).max() <= 32
    assert fresh_scales(SPEC)[0] == pytest.approx(1e9 * math.sqrt(2) / 4)
    with pytest.raises(ValueError, match="round must be an int"):
        binomial_noise(seed, 2**64, 4)


@pytest.mark.slow
def test_refusals() -> None:
    seeds = exchange_seeds_fast(FIVE, noise_seed=1)[0]
    with pytest.raises(ValueError, match="needs a resolved 'fading:RHO'"):
        FadingMask(seeds=seeds, spec=SPEC, refresh=Refresh.parse("fading"))
    with pytest.raises(ValueError, match="needs a resolved"):
        FadingMask(seeds=seeds, spec=SPEC, refresh=Refresh(1))
    with pytest.raises(TypeError, match="seeds must be EdgeSeeds"):
        FadingMask(seeds=(), spec=SPEC, refresh=RATE)
    huge = NoiseSpec(gamma=1e17, p=1.0, precision=6, num_coefficients=2)
    with pytest.raises(ValueError, match="could overflow int64"):
        FadingMask(seeds=exchange_seeds_fast(build_graph("complete", 900), noise_seed=1)[0],
                   spec=huge, refresh=RATE)


def test_the_refresh_grammar_names_fading() -> None:
    assert Refresh.parse("fading").fade_auto and str(Refresh.parse(" fading ")) == "fading"
    rate = Refresh.parse("fading:0.99")
    assert rate.fade == 0.99 and rate.every == 1 and rate.fading and not rate.accumulates
    assert str(rate) == "fading:0.99" and Refresh.parse(str(rate)) == rate
    assert Refresh.parse("every:3").accumulates and not Refresh.parse("never").refreshed
    for bad in ("fading:1", "fading:0", "fading:", "fading:x", "fading:-0.5", "fading:nan"):
        with pytest.raises(ValueError, match="'fading:RHO' with 0 < RHO < 1"):
            Refresh.parse(bad)
    with pytest.raises(ValueError, match="changes every round"):
        Refresh(2, fade=0.5)
    # a floor: the third field, written only when it is not 0
    floored = Refresh.parse("fading:0.99:1e-3")
    assert (floored.fade, floored.floor) == (0.99, 1e-3) and str(floored) == "fading:0.99:0.001"
    assert Refresh.parse(str(floored)) == floored and Refresh.parse("fading:0.99:0") == rate
    for bad in ("fading:0.99:", "fading:0.99:1", "fading:0.99:-1e-3", "fading:0.99:x",
                "fading::1e-3", "fading:0.99:1e-3:2", "fading:0.99:inf"):
        with pytest.raises(ValueError, match="'fading:RHO:FLOOR' with 0 <= FLOOR < 1"):
            Refresh.parse(bad)
    with pytest.raises(ValueError, match="comes with its rate"):
        Refresh(1, fade_auto=True, floor=1e-3)
    with pytest.raises(ValueError, match=r"floor must lie in \[0, 1\)"):
        Refresh(1, fade=0.9, floor=math.nan)


def test_a_floored_fresh_part_stops_shrinking_at_its_floor_and_still_sums_to_zero() -> None:
    # prepare: the same seeds, without a floor and with 1e-3 (0.9^t passes it near round 66)
    floored = masks(FIVE, refresh=Refresh.parse("fading:0.9:1e-3"))
    plain = masks(FIVE)
    # execute / assert: equal before the floor; after it the fresh part keeps its size while
    # the plain one fades on; both integer parts sum to zero over the agents in every round
    for t in (0, 10, 60):
        assert np.array_equal(floored[0].values(t), plain[0].values(t)), t
    assert floored[0].faded(65) > 1e-3 and floored[0].faded(70) == floored[0].faded(400) == 1e-3
    late = [float(np.abs(floored[0].values(t + 1) - floored[0].values(t)).mean())
            for t in (100, 400)]
    early = float(np.abs(floored[0].values(1) - floored[0].values(0)).mean())
    assert 0.5 < late[1] / late[0] < 2 and 3e-4 < late[0] / early < 3e-3
    for t in (0, 66, 67, 100, 400):
        assert len({m.exponent(t) for m in floored}) == 1  # a public denominator
        assert not np.any(sum(m.fresh(t)[0] for m in floored)), t


def test_the_rate_is_the_algorithm_s_own_never_faster() -> None:
    rule = StepRule(step=0.01, momentum=0.9, rounds=1000, curvature=10.0, mixing=0.95)
    # agt: 1 - sqrt(step mu) = 0.99 is slower than the mixing 0.95
    assert fading_rate(rule, algorithm="agt", step=0.01, mu=0.01, rounds=1000) == 0.99
    # a slow mixing dominates
    assert fading_rate(rule, algorithm="gt", step=0.5, mu=0.1, rounds=1000) == 0.95
    # no contraction rate (DSGD): fade to 1e-9 over the rounds, rounded up
    dsgd = fading_rate(rule, algorithm="dsgd", step=None, mu=0.01, rounds=1000)
    assert dsgd >= 1e-9 ** (1 / 1000) and dsgd**1000 == pytest.approx(1e-9, rel=1e-3)
    odd = fading_rate(StepRule(step=0.01, momentum=0.0, rounds=1, curvature=1.0),
                      algorithm="agt", step=0.01234567, mu=1.0, rounds=1)
    assert odd >= 1 - math.sqrt(0.01234567) and len(repr(1 - odd)) < 20


def test_the_defaults_resolve_to_every_parameter_and_a_fading_rate() -> None:
    config = RunConfig()
    assert (str(config.selection), str(config.refresh)) == ("all", "fading")
    resolved = config.resolved()
    rate = resolved.refresh.fade
    step = resolved.schedule.lr
    assert rate is not None and rate >= 1 - math.sqrt(step * 1e-2)
    assert rate ** resolved.iterations.total < 1e-8  # the fresh part is gone by the last round
    assert resolved.refresh.floor == 0.0  # full batch: nothing stays
    # masks that are not zero-sum have nothing to fade; `every:R` is refused with trackers
    assert not RunConfig(mask="none").refresh.refreshed
    assert not RunConfig.preset("paper").refresh.refreshed
    with pytest.raises(ValueError, match="never converge"):
        RunConfig(refresh="every:2")
    assert RunConfig(refresh="every:2", algorithm="dsgd").refresh == Refresh.parse("every:2")
    # a floor keeps fresh noise to the end: refused where the run is to end at x* (full batch)
    for task, batch in (("logreg", "auto"), ("lenet", "full")):
        with pytest.raises(ValueError, match="would never end at x\\*"):
            RunConfig(task=task, batch_size=batch, refresh="fading:0.99:1e-3")
    assert RunConfig(task="lenet", refresh="fading:0.99:1e-3").refresh.floor == 1e-3
    # the step rule's floor follows the batches, whatever the model
    for task, batch, floor in (("logreg", "64", MINI_BATCH_FADE_FLOOR), ("lenet", "full", 0.0),
                               ("lenet", "auto", MINI_BATCH_FADE_FLOOR)):
        assert RunConfig(task=task, batch_size=batch).resolved().refresh.floor == floor


def test_values_summed_as_floats_equal_the_integer_path_bit_for_bit() -> None:
    """values() adds the edges' truncated terms as float64 (exact below 2^53) instead of as
    int64: the same bytes as the integers' conversion, every round, in rounds where the fade's
    exponent k(t) is 0 and where it is not, and fresh() still gives the integers."""
    graph = build_graph("ring", 5, seed=0)
    fast = masks(graph, noise_seed=7)
    slow = masks(graph, noise_seed=7)
    for mask in slow:
        mask._float_exact = False
    assert all(m._float_exact for m in fast)
    rounds = [0, 1, 2, 3, 50, 400, 3000, 3001]
    assert any(fast[0].exponent(t) for t in rounds) and not fast[0].exponent(0)
    for t in rounds:
        for a, b in zip(fast, slow, strict=True):
            va, vb = a.values(t), b.values(t)
            assert va.tobytes() == vb.tobytes() and va is not a.values(t)
            assert np.array_equal(a.fresh(t)[0], b.fresh(t)[0])
            integers, k = b.fresh(t)
            assert np.array_equal(a._fresh_values(t)[0], integers.astype(np.float64))
            assert a._fresh_values(t)[1] == k


def _joined(graph: Graph, joiner: int, at: int) -> list[FadingMask]:
    """The masks after `joiner` came in at round `at`: its edges fade from `at` (a join's),
    the others' from 0 (efpsn.departure.remask.reseeded, efpsn.masks.factory.mask_of)."""
    return [FadingMask(seeds=s, spec=SPEC, refresh=RATE,
                       starts={j: at for j in s.neighbours if joiner in (s.agent, j)})
            for s in exchange_seeds_fast(graph, noise_seed=11)]


@settings(max_examples=15, deadline=None)
@given(at=st.integers(1, 300), rounds=st.lists(st.integers(0, 600), min_size=1, max_size=5))
def test_a_joins_edges_sum_to_zero_over_their_own_denominator(at: int, rounds: list[int]) -> None:
    from efpsn.departure.remask import part_totals, sums_to_zero

    agents = _joined(FIVE, joiner=3, at=at)
    for t in rounds:
        totals = part_totals(agents, t)
        assert set(totals) == {"fixed", "fresh", f"fresh from round {at}"}
        assert sums_to_zero(agents, t) and sums_to_zero(agents, t, exact=False), t
        assert abs(sum(m.values(t) for m in agents)).max() < 1e-6  # the floats too, nearly


def test_a_joiner_is_masked_at_its_join_as_a_starter_is_at_round_zero() -> None:
    """Without its own start, a party joining at round 200 would get a fresh part faded by
    0.9^200 (about 1e-9): its first rounds' differences were then bare (with wine's rate, a
    many-round regression recovered a private row to 0.011 of its norm for a join at round
    200, 1.7e-5 at round 500; docs/RESULTS.md, 'A party that joins')."""
    at = 200
    joined, started = _joined(FIVE, joiner=3, at=at), masks(FIVE, noise_seed=11)
    # the joiner's edges' fresh part at `at` is round 0's size; its differences carry it
    lead = float(np.std(started[3].values(0) - started[3].values(1)))
    own = float(np.std(joined[3].values(at) - joined[3].values(at + 1)))
    assert 0.5 < own / lead < 2.0
    # a member's phase I edges have faded meanwhile, the join's edges have not
    member = joined[2]  # neighbour of 3 in FIVE, with phase I edges to 1
    ((_, _, k),) = member.later_parts(at)
    assert k == 0 and member.exponent(at) > 20
    # and the joiner's part fades from `at` at the run's rate, as phase I's does from 0
    assert joined[3].later_parts(at + 50)[0][2] == started[3].exponent(50)
