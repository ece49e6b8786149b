"""A party that leaves for good (efpsn/departure/: membership.py, remask.py, replay.py):
the remaining masks sum to zero exactly, the pieces of a cut graph are joined, and the rest
finish at the optimum of the remaining parties' objective."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from efpsn.algorithms.base import AgentState
from efpsn.cli.main import main
from efpsn.crypto import paillier
from efpsn.data.folders import inspect_data_dir, load_data_dir, split_data
from efpsn.departure.membership import (
    Departure,
    check_departures,
    drop_node_weights,
    parse_leave,
    rebase,
    reconfigure,
    rejoin_edges,
)
from efpsn.departure.remask import (
    add_seeds,
    draw_pair_shares,
    drop_seeds,
    exchange_new_edge_seeds,
    new_edge_seeds,
    new_edge_shares,
    reseeded,
    sums_to_zero,
)
from efpsn.masks.fading import FadingMask
from efpsn.masks.seeds import exchange_seeds_fast
from efpsn.masks.zero_sum import NoiseSpec
from efpsn.optimize.certificate import TARGET
from efpsn.optimize.stopping import StopRule
from efpsn.params.config import RunConfig
from efpsn.params.refresh_setting import Refresh
from efpsn.problem import build_problem
from efpsn.simulator import SimulationResult, run_simulation
from efpsn.tasks.optimum import centralized_optimum
from efpsn.topology import Graph, metropolis_weights, path, ring

SPEC = NoiseSpec(gamma=1e3, p=1.5, precision=6, num_coefficients=7)


# --- the pure rules -------------------------------------------------------------------------

def test_leave_flag_parses_one_based_with_a_default_rebase_round() -> None:
    assert parse_leave("agent3@200", agents=5) == Departure(agent=2, round=200, rebase_round=205)
    assert parse_leave("agent1@7:9", agents=5) == Departure(agent=0, round=7, rebase_round=9)
    assert parse_leave("agent2@0", agents=5) == Departure(agent=1, round=0, rebase_round=0)
    assert parse_leave("agent3@9+agent2+agent4", agents=5).late == (1, 3)
    assert parse_leave("agent2@0:5", agents=5).rebase_round == 5  # no round-0 message sent
    for bad in ("agent6@10", "agent0@10", "3@200", "agent3@10:10",
                "agent3@10:11+agent2", "agent3@10+agent3", "agent3@10+agent9"):
        with pytest.raises(ValueError):
            parse_leave(bad, agents=5)


def test_departures_that_would_leave_one_party_are_refused() -> None:
    leaves = [parse_leave(f"agent{i}@{10 * i}", agents=3) for i in (2, 3)]
    with pytest.raises(ValueError, match="2 of 3 agents leave: at least 2 must stay"):
        check_departures(leaves, agents=3)
    assert [d.agent for d in check_departures(leaves[::-1][:1], agents=3)] == [2]


def test_a_cut_path_is_joined_between_the_pieces_smallest_agents() -> None:
    # path 0-1-2-3-4 without 2: {0, 1} and {3, 4}, joined by 0-3
    assert rejoin_edges(path(5), {2}) == ((0, 3),)
    # ring without 1 and 3: {0, 4} and {2}, joined by 0-2
    recon = reconfigure(ring(5), {1, 3})
    assert recon.new_edges == ((0, 2),)
    assert recon.graph.edges == ((0, 2), (0, 4))
    assert recon.dropped_edges == ((0, 1), (1, 2), (2, 3), (3, 4))
    # a connected remainder needs no new edge; its weights are the induced graph's Metropolis
    recon = reconfigure(ring(5), {2})
    assert recon.new_edges == ()
    induced = metropolis_weights(Graph(4, ((0, 1), (2, 3), (0, 3))))  # 0,1,3,4 renumbered
    assert np.array_equal(recon.remaining_weights(), induced)


def test_drop_node_weights_stay_symmetric_and_doubly_stochastic() -> None:
    graph, w = ring(5), metropolis_weights(ring(5))
    rows = {i: drop_node_weights({j: float(w[i, j]) for j in (i, *graph.neighbours(i))},
                                 agent=i, gone={2})
            for i in (0, 1, 3, 4)}
    matrix = np.array([[rows[i].get(j, 0.0) for j in (0, 1, 3, 4)] for i in (0, 1, 3, 4)])
    assert np.array_equal(matrix, matrix.T)
    assert np.allclose(matrix.sum(axis=0), 1.0) and np.allclose(matrix.sum(axis=1), 1.0)
    assert rows[0] == {j: float(w[0, j]) for j in (0, 1, 4)}  # not a neighbour of 2: unchanged


def test_rebase_restarts_the_tracker_from_the_local_gradient() -> None:
    g = torch.tensor([1.0, -2.0])
    state = AgentState(t=7, tensors={"x": torch.zeros(2), "y": torch.ones(2), "g": g})
    assert torch.equal(rebase(state)["y"], g) and rebase(state).t == 7
    dsgd = AgentState(t=7, tensors={"x": torch.zeros(2)})
    assert rebase(dsgd) is dsgd


# --- the masks ------------------------------------------------------------------------------

def test_fading_masks_drop_exactly_the_departed_edge_and_still_sum_to_zero() -> None:
    """Late rounds too, where the fresh part's denominator is 10^P 2^k(t) with k > 0."""
    refresh = Refresh.parse("fading:0.9")
    seeds = exchange_seeds_fast(ring(5), noise_seed=3)
    before = [FadingMask(seeds=s, spec=SPEC, refresh=refresh) for s in seeds]
    after = {i: reseeded(before[i], drop_seeds(seeds[i], {2})) for i in (0, 1, 3, 4)}
    alone = FadingMask(seeds=drop_seeds(seeds[1], {0}), spec=SPEC, refresh=refresh)  # 1-2 only
    for t in (0, 1, 5, 40, 300):
        assert not sums_to_zero([before[i] for i in (0, 1, 3, 4)], t)  # 2's terms are missing
        assert sums_to_zero(after.values(), t)
        assert before[0].exponent(t) == after[0].exponent(t)
        assert np.array_equal(after[0].integer_parts(t)[1], before[0].integer_parts(t)[1])
        # the dropped part is agent 1's term of edge 1-2, exactly
        fixed_old, fresh_old = before[1].integer_parts(t)
        fixed_new, fresh_new = after[1].integer_parts(t)
        edge_fixed, edge_fresh = alone.integer_parts(t)
        assert np.array_equal(fixed_old - fixed_new, edge_fixed)
        assert np.array_equal(fresh_old - fresh_new, edge_fresh)


def test_new_edges_get_fresh_seeds_that_keep_the_sum_at_zero() -> None:
    refresh = Refresh.parse("fading:0.9")
    seeds = exchange_seeds_fast(path(5), noise_seed=3)
    added = new_edge_seeds(((0, 3),), noise_seed=3, epoch=1)
    assert set(added) == {0, 3} and added[0][3] == added[3][0][::-1]
    old = {s for x in seeds for _, s in x.sent}
    assert not old & {added[0][3][0], added[3][0][0]}  # never phase I's seeds again
    masks = [reseeded(FadingMask(seeds=seeds[i], spec=SPEC, refresh=refresh),
                      add_seeds(drop_seeds(seeds[i], {2}), added.get(i, {})))
             for i in (0, 1, 3, 4)]
    assert all(sums_to_zero(masks, t) for t in (0, 3, 100))


def test_new_edges_by_paillier_give_the_fast_paths_seeds() -> None:
    """The networked agents' phase I on a new edge yields the seeds the simulator uses."""
    keys = {i: paillier.generate_keypair(512, allow_insecure=True) for i in (0, 2, 3)}
    edges = ((0, 2), (0, 3))
    real = exchange_new_edge_seeds(edges, keys, noise_seed=5, epoch=2, allow_insecure=True)
    assert real == new_edge_seeds(edges, noise_seed=5, epoch=2)
    assert real != new_edge_seeds(edges, noise_seed=5, epoch=1)  # every re-base draws anew


@pytest.mark.slow
def test_a_departure_in_phase_one_starts_phase_two_without_it(wine5: Path) -> None:
    deviation, record = _run(wine5, ["agent3@0"], topology="path", iterations=2500)
    assert deviation < 1e-6
    assert record["departures"][0]["rebase_round"] == 0
    assert record["departures"][0]["new_edges"] == [["agent1", "agent4"]]


@pytest.mark.slow
@pytest.mark.parametrize("refresh", ["fading", "never"])
def test_a_death_while_sending_phase_one_shares_is_replayed_per_neighbour(
        wine5: Path, refresh: str) -> None:
    """agent3 of a path died while sending its shares: agent2 got them (it finished phase I
    and sent round 0 with agent3's terms: `+agent2`, not restarted), agent4 did not (phase I
    without it, its round 0 restarted). With every neighbour late it is the departure at
    round 0; with none, the one in phase I; in between, a run of its own that still reaches
    the four's optimum and whose masks cancel from round 1 on."""
    def xs(leave: str, iterations: int = 40) -> list:
        return _simulate(wine5, [leave], topology="path", iterations=iterations,
                         refresh=refresh).xs

    def same(a: list, b: list) -> bool:
        return all(bool((x == y).all()) for x, y in zip(a, b, strict=True))

    assert same(xs("agent3@I:5+agent2+agent4"), xs("agent3@0:5"))
    one, none = xs("agent3@I:5+agent2"), xs("agent3@I:5")
    assert not same(one, none) and not same(one, xs("agent3@0:5"))
    deviation, record = _run(wine5, ["agent3@I:5+agent2"], topology="path", iterations=2500,
                             refresh=refresh)
    assert deviation < 1e-6
    assert record["departures"][0]["late"] == ["agent2"] and record["departures"][0]["phase_one"]


def test_the_papers_fixed_mask_drops_its_shares_exactly() -> None:
    shares = draw_pair_shares(path(5), SPEC, noise_seed=4)
    n = SPEC.num_coefficients
    assert sum(np.array(s.numerators(n), dtype=object) for s in shares).tolist() == [0] * n
    fresh = new_edge_shares(((0, 3),), SPEC, noise_seed=4, epoch=1)
    left = [shares[i].without({2}).plus(fresh.get(i, {})) for i in (0, 1, 3, 4)]
    assert sums_to_zero([s.mask(n) for s in left], 0)
    one = shares[1]
    dropped = np.array(one.numerators(n), dtype=object) - np.array(
        one.without({2}).numerators(n), dtype=object)
    assert dropped.tolist() == [a - b for a, b in zip(one.sent[2], one.received[2], strict=True)]
    assert "sent=" not in repr(one) and "received=" not in repr(one)  # secret, never printed


# --- runs -----------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("digits")
    split_data(source="sklearn:digits", agents=5, partition_spec="iid", out=root, seed=0)
    return root


def _run(root: Path, leaves: list[str], *, preset: str | None = None, **changes: object
         ) -> tuple[float, dict]:
    result = _simulate(root, leaves, preset=preset, **changes)
    assert result.departures is not None
    return result.final["relative_deviation"], result.departures


def _simulate(root: Path, leaves: list[str], *, preset: str | None = None, **changes: object
              ) -> SimulationResult:
    values = {**inspect_data_dir(root).run_values(), **changes}
    config = RunConfig.preset(preset, **values) if preset else RunConfig(**values)
    local = load_data_dir(config, root, holdout=0.0)
    problem = build_problem(config, local=local)
    departures = [parse_leave(text, agents=problem.n) for text in leaves]
    gone = {d.agent for d in departures}
    x_star = centralized_optimum(problem.task, [s for i, s in enumerate(problem.shards)
                                                if i not in gone]).x
    result = run_simulation(config, problem=problem, x_star=x_star, departures=departures)
    assert result.departures is not None
    assert result.masks_sum_to_zero()
    assert result.departures["remaining_masks_sum_to_zero"] is True
    first = min(d.round for d in departures)
    skipped = sum(1 for d in departures if d.late)  # the round a late neighbour mixes d in
    # every round from the first departure to the last (the stop rule's round, or the cap)
    assert result.departures["rounds_zero_sum_checked"] == (result.timings["rounds"] - first
                                                            - skipped)
    return result


@pytest.mark.parametrize("leave", ["agent3@1", "agent3@200", "agent1@700"])
def test_one_agent_leaves_a_ring_and_the_rest_reach_their_optimum(wine5: Path,
                                                                  leave: str) -> None:
    """The defaults (agt, fading masks): the four others end within 1e-6 of their optimum."""
    deviation, record = _run(wine5, [leave], iterations=2000)
    assert deviation < 1e-6
    k = leave.split("@")[0][5:]
    assert record["optimum_of"] == ("the optimum of agents "
                                    + ",".join(str(i) for i in range(1, 6) if str(i) != k)
                                    + "'s objective")
    assert record["departures"][0]["agent"] == f"agent{k}"
    # a ring without one agent is a path: its two ends have one neighbour left, and say so
    ends = {"1": ["agent2", "agent5"], "3": ["agent2", "agent4"]}[k]
    assert record["departures"][0]["one_neighbour"] == ends


@pytest.mark.slow
@pytest.mark.parametrize("stop_every", [-1, 0])
def test_gradient_tracking_reaches_the_remaining_optimum(wine5: Path, stop_every: int) -> None:
    """The step rule's rounds (l2 0.1): the stop rule (the default, -1) ends the run at its
    certified target, re-based on the remaining graph; without it (0) the cap's rounds."""
    result = _simulate(wine5, ["agent4@300"], algorithm="gt", l2=0.1, stop_every=stop_every)
    _reaches_the_remaining_optimum(result, stop_every=stop_every)


@pytest.mark.parametrize("stop_every", [-1, 0])
def test_the_papers_preset_with_tracking_reaches_the_remaining_optimum(digits: Path,
                                                                       stop_every: int) -> None:
    """The paper's fixed mask on the last layer's ten biases, (K, N) = (1, 10), full batch."""
    result = _simulate(digits, ["agent3@200"], preset="paper", algorithm="agt",
                       schedule="auto", batch_size=0, iterations=0, momentum=-1.0,
                       stop_every=stop_every)
    _reaches_the_remaining_optimum(result, stop_every=stop_every)


def _reaches_the_remaining_optimum(result: SimulationResult, *, stop_every: int) -> None:
    deviation, rounds = result.final["relative_deviation"], result.timings["rounds"]
    if stop_every == 0:  # the step rule's rounds: exact
        assert rounds == result.config.iterations.total and deviation < 1e-6
        return
    # the stop rule stopped before the cap, at a round its certificate (of the remaining
    # graph, after the re-base) vouches for; the true distance is within it
    assert result.convergence is not None and result.convergence.converged
    assert rounds < result.config.iterations.total
    assert deviation <= result.convergence.bound <= TARGET


def test_a_late_departure_extends_the_cap_and_the_run_ends_certified(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Breast cancer in 5 dirichlet:1.0 folders, the defaults: the cap is the step rule's 1354
    rounds and the whole ring stops at 1077; agent3 leaving at 600 needs more than the 749
    left. From the re-base R the cap is R + the step rule's rounds for the remaining graph
    (StopRule.rebased), recorded, and the run stops certified under it."""
    root = tmp_path_factory.mktemp("breast")
    split_data(source="sklearn:breast_cancer", agents=5, partition_spec="dirichlet:1.0",
               out=root, test_fraction=0)
    result = _simulate(root, ["agent3@600"])
    cap = result.config.iterations.total
    assert result.departures is not None
    record = result.departures["departures"][0]
    remaining = reconfigure(ring(5), {2}).remaining_weights()
    assert record["cap"] == StopRule.rebased(result.config, remaining, origin=605, until=None,
                                             cap=cap).cap > cap
    assert cap < result.timings["rounds"] < record["cap"]
    assert result.convergence is not None and result.convergence.converged
    assert result.final["relative_deviation"] <= result.convergence.bound <= TARGET


@pytest.mark.slow
def test_two_non_adjacent_agents_leave_and_the_pieces_are_joined(wine5: Path) -> None:
    deviation, record = _run(wine5, ["agent2@100", "agent4@300"], iterations=2500)
    assert deviation < 1e-6
    assert record["remaining"] == ["agent1", "agent3", "agent5"]
    assert record["departures"][1]["new_edges"] == [["agent1", "agent3"]]


def test_a_path_cut_in_two_is_rejoined(wine5: Path) -> None:
    deviation, record = _run(wine5, ["agent3@150"], topology="path", iterations=2500)
    assert deviation < 1e-6
    assert record["departures"][0]["new_edges"] == [["agent1", "agent4"]]


def test_a_neighbour_that_used_the_last_message_drops_it_a_round_later(wine5: Path) -> None:
    """agent3 died while sending its round-200 messages: agent2 got its one, agent4 did not.
    agent2 mixes it into round 200 and drops it at 201; the re-base makes that harmless."""
    deviation, record = _run(wine5, ["agent3@200:206+agent2"], iterations=2000)
    assert deviation < 1e-6
    assert record["departures"][0]["late"] == ["agent2"]


@pytest.mark.process
def test_deciding_a_departure_needs_no_torch() -> None:
    """The coordinator (torch-free) can decide the remaining graph and the new edges."""
    code = "import sys, efpsn.departure.membership; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_without_the_rebase_the_trackers_miss_the_remaining_optimum(
        wine5: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-base is what makes it exact: trackers that keep the departed agent's share of
    the sum end elsewhere."""
    from efpsn.departure import replay

    monkeypatch.setattr(replay, "rebase", lambda state: state)
    deviation, _ = _run(wine5, ["agent3@200"], iterations=2000)
    assert deviation > 1e-3


def test_dsgd_replays_a_departure_with_zero_sum_masks(wine5: Path) -> None:
    deviation, record = _run(wine5, ["agent3@50"], algorithm="dsgd", iterations=300)
    assert np.isfinite(deviation)
    assert record["remaining"] == ["agent1", "agent2", "agent4", "agent5"]


def test_simulate_leave_names_who_left_and_what_the_model_is(wine5: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    out = tmp_path / "run.json"
    code = main(["simulate", "--data-dir", str(wine5), "--holdout", "0", "--quiet",
                 "--iterations", "300", "--leave", "agent3@40", "--json", str(out)])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("agent3 left at round 40 (re-based at round 45, agent2 has one "
                                   "neighbour left, agent4 has one neighbour left)") and
               "the optimum of agents 1,2,4,5's objective" in line for line in lines)
    doc = json.loads(out.read_text())
    assert doc["departures"][0]["agent"] == "agent3" and doc["departures"][0]["round"] == 40
    assert doc["optimum_of"] == "the optimum of agents 1,2,4,5's objective"
    code = main(["simulate", "--data-dir", str(wine5), "--quiet", "--leave", "agent9@40"])
    assert code == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.process
def test_simulate_with_a_departure_reports_the_remaining_masks_only(tmp_path) -> None:
    """The all-agents zero-sum line would say '0 periods checked' after a phase I departure;
    the departures' own line checks the remaining masks every round."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "efpsn", "simulate", "--agents", "5", "--topology", "path",
         "--iterations", "40", "--leave", "agent3@I", "--task", "logreg", "--key-bits", "512",
         "--allow-insecure-keys"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "periods checked" not in proc.stdout
    assert "left in phase I" in proc.stdout
    assert "remaining masks sum to zero exactly: True" in proc.stdout
