"""Cost of deriving a round's refreshed noise against a whole round of the logistic regression.

    python benchmarks/bench_noise.py [--reps 300] [--rounds 300] [--network] [--json OUT]

One agent with 2 neighbours (the 5-ring) refreshing every round derives 4 noise streams per
round (s_ij and s_ji for each neighbour), for N = 11 (every affine function of the paper's
last-layer bias, K = 1) and N = 7,851 (every logistic-regression parameter, K = 1). Measured in
the same run, in CPU time of this process (single-threaded, so other jobs on the machine do not
inflate it; the load is printed):

Micro-measurements are the lowest mean of 5 batches (other jobs only ever add to a batch).

- noise: the period's integers (RefreshedMask.numerators, a new period every call);
- refresh path: all a new period costs the round (MaskedPerturbation.at: the integers, their
  float values, Phi rebuilt from them, and its gradient), minus what a fixed mask's round costs
  for the same gradient;
- the mini-batch gradient (batch 64) at a trained-like point;
- a whole round of one agent in the simulator (5 agents, DSGD, batch 64; CPU per round / 5)
  with the mask fixed, and refreshed every round (there the agents share the streams of their
  edges, so an agent derives half of its 4);
- with --network: an agent's CPU per round in a real 5-agent gRPC network (`efpsn up`'s
  cpu_seconds_per_round, 2048-bit keys), mask fixed and refreshed every round.

The goal's ratio is the refresh path's share of an agent's whole refreshed round: in the
simulator's computation, path / (fixed round + path); in the network, path / refreshed round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from efpsn.masks.refresh import FixedMask, RefreshedMask
from efpsn.masks.seeds import exchange_seeds_fast
from efpsn.masks.zero_sum import NoiseSpec
from efpsn.params.config import RunConfig
from efpsn.params.refresh_setting import Refresh
from efpsn.problem import MaskedPerturbation, build_problem
from efpsn.process.runtime import configure_threads, machine_load
from efpsn.simulator import run_simulation
from efpsn.tasks.batches import BatchSampler

GAMMA, P, PRECISION = 1e3, 1.0, 6
SELECTIONS = {11: {"N": 11}, 7851: {"selection": "all", "m": 7850, "N": 7851}}


def per_call(fn: Callable[[int], Any], reps: int, *, batches: int = 5) -> float:
    """CPU seconds per call of fn(i), i = 1, 2, ... (each call a new index): the lowest mean of
    `batches` batches of `reps` calls, after one warm-up call at 0 (other jobs on the shared
    cores only ever add to a batch)."""
    fn(0)
    best = float("inf")
    for batch in range(batches):
        start = time.process_time()
        for i in range(1 + batch * reps, 1 + (batch + 1) * reps):
            fn(i)
        best = min(best, (time.process_time() - start) / reps)
    return best


def simulator_round(config: RunConfig) -> float:
    """CPU seconds of one agent's round in the simulator (rounds without evaluation)."""
    problem = build_problem(config)
    stamps: dict[int, float] = {}

    def on_round(t: int, record: dict[str, float] | None) -> None:
        stamps[t] = time.process_time()

    run_simulation(config, problem=problem, on_round=on_round)
    last = config.iterations.total - 1  # round `iterations` evaluates
    return (stamps[last] - stamps[1]) / (last - 1) / problem.n


def network_round(config: RunConfig) -> float:
    """CPU seconds per round of one agent (mean of 5) in a real network on loopback."""
    import bench_rounds  # this folder's round benchmark (scripts run with it on sys.path)

    run = bench_rounds.network_run(config, key_bits=2048)
    return run["agents_cpu_seconds_per_round"] / config.agents


def measure(n_coef: int, *, reps: int, rounds: int, network_rounds: int | None,
            network_reps: int = 3) -> dict[str, Any]:
    config = RunConfig.preset("paper", gamma=GAMMA, iterations=rounds, eval_every=rounds,
                              **SELECTIONS[n_coef])
    problem = build_problem(config)
    assert problem.N == n_coef, (problem.N, n_coef)
    seeds = exchange_seeds_fast(problem.graph, noise_seed=0)[0]
    spec = NoiseSpec(gamma=GAMMA, p=P, precision=PRECISION, num_coefficients=n_coef)
    x = problem.initial_params() + torch.from_numpy(
        np.random.default_rng(0).normal(0, 0.05, problem.task.num_params))
    mask = RefreshedMask(seeds=seeds, spec=spec, refresh=Refresh(1))
    noise = per_call(mask.numerators, reps)
    refreshed = MaskedPerturbation(system=problem.system, indices=problem.indices,
                                   masks=RefreshedMask(seeds=seeds, spec=spec,
                                                       refresh=Refresh(1)))
    fixed = MaskedPerturbation(system=problem.system, indices=problem.indices,
                               masks=FixedMask(refreshed.masks.coefficients(0)))
    path = per_call(lambda t: refreshed.at(t).gradient(x), reps) - per_call(
        lambda t: fixed.at(t).gradient(x), reps)
    shard = problem.shards[0]
    sampler = BatchSampler(len(shard), 64, seed=0, agent=0)

    def gradient(t: int) -> None:
        images, labels = shard.batch(sampler.indices(t))
        problem.task.loss_and_grad(x, images, labels)

    out = {"N": n_coef, "streams": 2 * len(seeds.neighbours), "noise_ms": 1e3 * noise,
           "refresh_path_ms": 1e3 * path, "gradient_ms": 1e3 * per_call(gradient, reps),
           "sim_round_fixed_ms": 1e3 * simulator_round(config),
           "sim_round_refreshed_ms": 1e3 * simulator_round(config.replace(refresh="every:1"))}
    if network_rounds:  # alternating, several times: one network run varies by +-10% here
        net = config.replace(iterations=network_rounds, eval_every=network_rounds)
        runs: dict[str, list[float]] = {"never": [], "every:1": []}
        for _ in range(network_reps):
            for refresh, seen in runs.items():
                seen.append(1e3 * network_round(net.replace(refresh=refresh)))
        out["net_round_fixed_ms"] = statistics.median(runs["never"])
        out["net_round_refreshed_ms"] = statistics.median(runs["every:1"])
        out["net_runs_ms"] = runs
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300, help="calls per micro-measurement")
    parser.add_argument("--rounds", type=int, default=300, help="rounds per simulator run")
    parser.add_argument("--network", action="store_true",
                        help="also an agent's CPU per round in a real 5-agent network")
    parser.add_argument("--network-rounds", type=int, default=1000)
    parser.add_argument("--network-reps", type=int, default=3,
                        help="network runs per setting (fixed and refreshed alternate)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    configure_threads()
    before = machine_load()
    print(f"before: {before}")
    rows = [measure(n_coef, reps=args.reps, rounds=args.rounds,
                    network_rounds=args.network_rounds if args.network else None,
                    network_reps=args.network_reps)
            for n_coef in SELECTIONS]
    print(f"CPU ms per round of one agent (4 streams: 2 neighbours, a seed each way); "
          f"{args.reps} calls per figure, simulator {args.rounds} rounds")
    print(f"{'N':>5} {'noise':>7} {'refresh':>8} {'gradient':>9} {'sim round':>10} "
          f"{'sim round':>10} {'path /':>9} {'share of':>9}")
    print(f"{'':>5} {'':>7} {'path':>8} {'batch 64':>9} {'fixed':>10} {'every:1 *':>10} "
          f"{'gradient':>9} {'round':>9}")
    for r in rows:
        share = r["refresh_path_ms"] / (r["sim_round_fixed_ms"] + r["refresh_path_ms"])
        print(f"{r['N']:>5} {r['noise_ms']:>7.3f} {r['refresh_path_ms']:>8.3f} "
              f"{r['gradient_ms']:>9.3f} {r['sim_round_fixed_ms']:>10.3f} "
              f"{r['sim_round_refreshed_ms']:>10.3f} "
              f"{r['refresh_path_ms'] / r['gradient_ms']:>9.3f} {share:>9.3f}")
    print("* the simulator's agents share their edges' streams: half of an agent's 4")
    if args.network:
        print(f"\nnetwork, {args.network_rounds} rounds: an agent's CPU per round (ms, median of "
              f"{args.network_reps} runs each, alternating), and the refresh path's share of the "
              "refreshed round")
        for r in rows:
            fixed, refreshed = r["net_round_fixed_ms"], r["net_round_refreshed_ms"]
            print(f"N = {r['N']:>5}: fixed {fixed:.3f}, every:1 {refreshed:.3f} "
                  f"(+{refreshed - fixed:.3f}); refresh path / round "
                  f"{r['refresh_path_ms'] / refreshed:.3f}; runs {r['net_runs_ms']}")
    after = machine_load()
    print(f"after: {after}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, "load_before": before, "load_after": after}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
