"""Phase I with seeds (one ciphertext per neighbour) beside the paper's packed protocol, same run.

    python benchmarks/bench_phase1_seeds.py [--key-bits 3072] [--degree 2] [--json OUT]

For one agent with `degree` neighbours and N = 7,851 coefficients (every logistic-regression
parameter, K = 1): the packed Paillier protocol of efpsn.masks.zero_sum (bench_phase1.run_agent) and
efpsn.masks.seeds.SeedExchange, each timed from outgoing() to finish() (draw, encrypt for every
neighbour, validate, decrypt), plus, for the seeds, the first period's mask derived from them.
CPU seconds of this process (the protocol is single-threaded); the load is printed.
"""

from __future__ import annotations

import argparse
import json
import time

import bench_phase1  # this folder's phase I benchmark (scripts run with it on sys.path)

from efpsn.crypto import paillier
from efpsn.crypto.encoding import SlotLayout
from efpsn.masks.refresh import RefreshedMask
from efpsn.masks.seeds import SeedExchange
from efpsn.masks.zero_sum import NoiseSpec
from efpsn.params.refresh_setting import Refresh
from efpsn.process.runtime import machine_load


def seeds_agent(*, degree: int, keypairs: list, spec: NoiseSpec) -> dict[str, float]:
    """Agent 0 with neighbours 1..degree: outgoing() and finish() timed, the rest not."""
    neighbours = tuple(range(1, degree + 1))
    agent = SeedExchange(agent=0, neighbours=neighbours, keypair=keypairs[0])
    incoming = {}
    for j in neighbours:
        other = SeedExchange(agent=j, neighbours=(0,), keypair=keypairs[j])
        incoming[j] = other.outgoing({0: agent.public_key})[0]
    keys = {j: keypairs[j][0] for j in neighbours}
    start = time.process_time()
    agent.outgoing(keys)
    outgoing_s = time.process_time() - start
    start = time.process_time()
    seeds = agent.finish(incoming)
    finish_s = time.process_time() - start
    start = time.process_time()
    RefreshedMask(seeds=seeds, spec=spec, refresh=Refresh(1)).coefficients(0)
    first_mask_s = time.process_time() - start
    return {"encryptions": agent.encryptions, "decryptions": agent.decryptions,
            "outgoing_s": outgoing_s, "finish_s": finish_s, "total_s": outgoing_s + finish_s,
            "first_mask_s": first_mask_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key-bits", type=int, default=3072)
    parser.add_argument("--degree", type=int, default=2)
    parser.add_argument("--num-coefficients", type=int, default=bench_phase1.LOGREG_N)
    parser.add_argument("--reps", type=int, default=3, help="seed runs (the minimum is shown)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    print(f"before: {machine_load()}")
    keypairs = [paillier.generate_keypair(args.key_bits) for _ in range(args.degree + 1)]
    powmod_s = bench_phase1.powmod_seconds(keypairs[1][0], reps=20)
    spec = NoiseSpec(gamma=bench_phase1.DEFAULT_GAMMA, p=bench_phase1.DEFAULT_P,
                     precision=bench_phase1.DEFAULT_PRECISION,
                     num_coefficients=args.num_coefficients)
    seed_runs = [seeds_agent(degree=args.degree, keypairs=keypairs, spec=spec)
                 for _ in range(args.reps)]
    seeds = min(seed_runs, key=lambda r: r["total_s"])
    layout = SlotLayout.plan(precision=spec.precision, gamma=spec.gamma, max_terms=args.degree,
                             key_bits=args.key_bits)
    masker, out_s, fin_s = bench_phase1.run_agent(spec=spec, degree=args.degree, layout=layout,
                                                  keypairs=keypairs, seed=1)
    packed = {"encryptions": masker.encryptions, "decryptions": masker.decryptions,
              "outgoing_s": out_s, "finish_s": fin_s, "total_s": out_s + fin_s}
    print(f"phase I per agent, N = {args.num_coefficients}, {args.degree} neighbours, "
          f"{args.key_bits}-bit keys (one gmpy2.powmod {1e3 * powmod_s:.1f} ms), CPU seconds")
    print(f"{'protocol':>10} {'enc':>5} {'dec':>5} {'out s':>8} {'fin s':>8} {'total s':>8}")
    for name, row in (("packed", packed), ("seeds", seeds)):
        print(f"{name:>10} {row['encryptions']:>5} {row['decryptions']:>5} "
              f"{row['outgoing_s']:>8.3f} {row['finish_s']:>8.3f} {row['total_s']:>8.3f}")
    print(f"seeds / packed: {seeds['total_s'] / packed['total_s']:.4f}; the seeds' first "
          f"period's mask (4 streams derived once more per period): "
          f"{1e3 * seeds['first_mask_s']:.2f} ms")
    print(f"after: {machine_load()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"packed": packed, "seeds": seeds, "seed_runs": seed_runs,
                       "powmod_s": powmod_s, "load": machine_load(), "args": vars(args)}, fh,
                      indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
