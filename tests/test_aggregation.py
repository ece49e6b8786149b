"""Secure neighbourhood aggregation (efpsn/masks/aggregation.py, efpsn/optimize/channels.py): pinned
fixed-point integers, exact zero-sum masks at every receiver, the round trip, and the mass it
keeps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import Aggregate, StepContext, mix
from efpsn.masks.aggregation import (
    agree_seeds,
    decode,
    dequantise,
    encode,
    generate_private_key,
    mask_stream,
    public_key_bytes,
    quantise,
    sum_words,
    unprotected,
)
from efpsn.optimize.certificate import diameter, spread
from efpsn.optimize.channels import AggregateChannel, ClearChannel, simulated_channels
from efpsn.topology import build_graph, metropolis_weights


def _topology(spec: str, n: int) -> tuple[dict[int, tuple[int, ...]], np.ndarray]:
    graph = build_graph(spec, n)
    return {i: graph.neighbours(i) for i in range(n)}, metropolis_weights(graph)


def _seeds(neighbours: dict[int, tuple[int, ...]], run_id: bytes = b"run"):
    keys = {i: generate_private_key() for i in neighbours}
    public = {i: public_key_bytes(k) for i, k in keys.items()}
    return {i: agree_seeds(i, keys[i], public, neighbours, run_id=run_id) for i in neighbours}


def test_quantise_pinned_integers() -> None:
    # prepare: values whose weighted fixed point is known by hand (bits 4: units of 1/16)
    values = np.array([1.0, -0.5, 2.0**-7, 3.0 / 32, 5.0 / 32])
    # execute
    q = quantise(values, 0.5, bits=4)
    # assert: 0.5 * [1, -0.5, 2^-7, 3/32, 5/32] * 16 = [8, -4, 1/16, 0.75, 1.25], rint half even
    assert q.tolist() == [8, -4, 0, 1, 1]
    assert dequantise(q, bits=4).tolist() == [0.5, -0.25, 0.0, 0.0625, 0.0625]


def test_quantise_refuses_what_int64_cannot_sum() -> None:
    with pytest.raises(ValueError, match="does not fit the fixed point"):
        quantise(np.array([2.0**30]), 1.0, bits=36, fan_in=2)
    with pytest.raises(ValueError, match="does not fit"):
        quantise(np.array([np.nan]), 1.0)


def test_pair_seeds_agree_with_opposite_signs() -> None:
    neighbours, _ = _topology("complete", 5)
    seeds = _seeds(neighbours)
    for i in neighbours:
        for j, pairs in seeds[i].items():
            assert sorted(p.other for p in pairs) == sorted(set(neighbours[j]) - {i})
            for p in pairs:
                mirror = [s for s in seeds[p.other][j] if s.other == i]
                assert len(mirror) == 1
                assert mirror[0].seed == p.seed and mirror[0].sign == -p.sign
    # a seed is tied to its receiver: the same pair has another seed for another receiver
    assert seeds[0][2][0].seed != seeds[0][3][0].seed


def test_seeds_depend_on_the_run_id() -> None:
    neighbours, _ = _topology("ring", 4)
    keys = {i: generate_private_key() for i in neighbours}
    public = {i: public_key_bytes(k) for i, k in keys.items()}
    a = agree_seeds(0, keys[0], public, neighbours, run_id=b"a")
    b = agree_seeds(0, keys[0], public, neighbours, run_id=b"b")
    assert a[1][0].seed != b[1][0].seed


@pytest.mark.parametrize("spec,n", [("ring", 4), ("complete", 5), ("grid", 6), ("path", 4)])
def test_masks_cancel_exactly_at_every_receiver_every_round(spec: str, n: int) -> None:
    # prepare: random messages, every sender's fixed point for every receiver
    neighbours, _ = _topology(spec, n)
    seeds = _seeds(neighbours)
    rng = np.random.default_rng(0)
    for t in (0, 1, 7, 2**40):
        for j, nb in neighbours.items():
            q = {i: quantise(rng.normal(scale=1e3, size=11), 0.25, fan_in=len(nb)) for i in nb}
            # execute
            sent = [encode(q[i], seeds[i][j], t) for i in nb]
            masks = [(s.view(np.int64) - q[i]) for s, i in zip(sent, nb, strict=True)]
            # assert: the masks sum to 0 mod 2^64, so the sum is exactly the sum of the q's
            assert not np.any(sum_words([m.view(np.uint64) for m in masks]))
            assert np.array_equal(sum_words(sent), sum(q.values()))
            assert np.array_equal(decode(sent), dequantise(sum(q.values())))
            if len(nb) >= 2:  # each vector alone looks nothing like the message
                assert all(np.count_nonzero(m) == m.size for m in masks)


def test_masks_change_every_round() -> None:
    seed = bytes(range(32))
    assert not np.array_equal(mask_stream(seed, 3, 8), mask_stream(seed, 4, 8))
    assert np.array_equal(mask_stream(seed, 3, 8), mask_stream(seed, 3, 16)[:8])


def test_degree_one_receivers_are_named() -> None:
    neighbours, _ = _topology("path", 4)
    assert unprotected(neighbours) == [(1, 0), (2, 3)]
    assert unprotected(_topology("ring", 4)[0]) == []


def _contexts(spec: str, n: int) -> tuple[list[StepContext], np.ndarray]:
    graph = build_graph(spec, n)
    w = metropolis_weights(graph)
    ctxs = [StepContext(agent=i, weights={j: float(w[i, j]) for j in (*graph.neighbours(i), i)},
                        lr=0.1, oracle=lambda x, t: x) for i in range(n)]
    return ctxs, w


@pytest.mark.parametrize("name", ["agt", "gt", "dsgd"])
def test_channel_mixes_what_clear_mixes_and_keeps_the_total(name: str) -> None:
    # prepare: every agent's message, sealed for its neighbours and opened at each receiver
    algorithm = make_algorithm(name, momentum=0.5 if name == "agt" else 0.0)
    ctxs, w = _contexts("grid", 6)
    channels = simulated_channels("aggregate", algorithm=algorithm, contexts=ctxs, weights=w)
    rng = np.random.default_rng(1)
    outbox = [{k: torch.from_numpy(rng.normal(size=5) * 100) for k in algorithm.message_keys}
              for _ in ctxs]
    sent = {c.agent: channels[c.agent].seal(outbox[c.agent], 9, c.neighbours) for c in ctxs}
    for key in algorithm.message_keys:
        # execute
        mixed, clear = [], []
        for c in ctxs:
            inbox = channels[c.agent].open({j: sent[j][c.agent] for j in c.neighbours}, 9)
            assert isinstance(inbox, Aggregate)
            m = algorithm.mixing(c)
            mixed.append(mix(key, outbox[c.agent], inbox, m))
            clear.append(mix(key, outbox[c.agent], {j: outbox[j] for j in c.neighbours}, m))
        # assert: each mix within the rounding 2^-37 per neighbour, sent and received, of the
        # clear one (degree <= 4 here),
        # and the network's total exactly the messages' total (up to float64 rounding)
        for a, b in zip(mixed, clear, strict=True):
            assert torch.max(torch.abs(a - b)) <= 8 * 2.0**-37 + 1e-12
        total = sum(m[key] for m in outbox)
        assert torch.max(torch.abs(sum(mixed) - total)) <= 1e-12 * float(total.abs().max())


def test_an_aggregate_holds_no_single_message() -> None:
    agg = Aggregate(neighbours=(1, 2), sums={"x": torch.zeros(2)})
    assert sorted(agg) == [1, 2] and len(agg) == 2
    with pytest.raises(KeyError, match="no single neighbour"):
        agg[1]


def test_clear_channel_passes_messages() -> None:
    msg = {"x": torch.ones(2)}
    ch = ClearChannel()
    assert ch.open(ch.seal(msg, 0, (1, 2)), 0) == {1: msg, 2: msg}


def test_channel_refuses_a_missing_neighbour() -> None:
    algorithm = make_algorithm("gt")
    ctxs, w = _contexts("ring", 4)
    channels = simulated_channels("aggregate", algorithm=algorithm, contexts=ctxs, weights=w)
    assert isinstance(channels[0], AggregateChannel)
    sealed = channels[1].seal({"x": torch.ones(3), "y": torch.ones(3)}, 0, (0,))
    with pytest.raises(ValueError, match="expected"):
        channels[0].open(sealed, 0)


@pytest.mark.parametrize("spec,n", [("ring", 5), ("path", 5), ("star", 5), ("complete", 4),
                                    ("grid", 9)])
def test_spread_bounds_the_distance_to_the_mean(spec: str, n: int) -> None:
    # prepare: random points; each agent's residual to its neighbours' weighted mean
    _, w = _topology(spec, n)
    s = spread(w)
    rng = np.random.default_rng(2)
    off = w - np.diag(np.diag(w))
    for _ in range(200):
        z = rng.normal(size=(n, 3)) * rng.exponential(size=(n, 1))
        hat = off @ z / off.sum(axis=1, keepdims=True)
        r = np.linalg.norm(z - hat, axis=1).max()
        # assert
        assert np.linalg.norm(z - z.mean(axis=0), axis=1).max() <= s * r * (1 + 1e-9)
    assert s >= 1.0 and diameter(w) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("gamma", ["1", "1e6"])
def test_aggregated_wine_run_is_as_exact_as_the_unmasked_one(tmp_path, gamma: str) -> None:
    # prepare: wine in 4 private folders; the defaults (every parameter, fading masks), every
    # round of the step rule (no early stop), messages in the clear and aggregated
    import json

    from efpsn.cli.main import main
    from efpsn.data.folders import split_data

    split_data(source="sklearn:wine", agents=4, partition_spec="iid", out=tmp_path / "wine")

    def run(*extra: str, stop: str = "never") -> dict:
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}.json"
        assert main(["simulate", "--data-dir", str(tmp_path / "wine"), "--agents", "4",
                     "--holdout", "0", "--quiet", "--stop-every", stop, "--gamma", gamma,
                     "--json", str(out), *extra]) == 0
        return json.loads(out.read_text())

    # execute
    unmasked = run("--mask", "none")
    aggregated = run("--messages", "aggregate")
    stopped = run("--messages", "aggregate", stop="auto")
    # assert: the run is masked and refreshed, ends within 1.1x of unmasked + 1e-6, and the
    # certificate (from the aggregated gap and the spread S) says converged
    assert aggregated["settings"]["refresh"].startswith("fading")
    assert aggregated["final"]["round"] == unmasked["final"]["round"]
    assert (aggregated["final"]["relative_deviation"]
            <= 1.1 * unmasked["final"]["relative_deviation"] + 1e-6)
    assert aggregated["convergence"]["converged"]
    # the stop rule on the aggregated gap ends the run early, and its certificate is a bound
    assert stopped["final"]["round"] < aggregated["final"]["round"]
    assert stopped["convergence"]["converged"]
    for result in (aggregated, stopped):
        assert result["convergence"]["certificate"] >= result["final"]["relative_deviation"]


def test_the_privacy_line_names_messages_sent_unmasked() -> None:
    from efpsn.params.config import RunConfig
    from efpsn.privacy.modes import privacy_statement

    config = RunConfig(agents=4, topology="path").resolved()
    line = privacy_statement(config, build_graph("path", 4), with_epsilon=False,
                             messages="aggregate").line()
    assert "messages aggregated per receiver" in line
    assert "sent unmasked to a receiver with one neighbour: agent2 to agent1, agent3 to agent4" \
        in line
    ring = privacy_statement(config, build_graph("ring", 4), with_epsilon=False,
                             messages="aggregate").line()
    assert "messages aggregated" in ring and "sent unmasked" not in ring
    assert "aggregated" not in privacy_statement(config, build_graph("ring", 4),
                                                 with_epsilon=False).line()
