"""Phase I cost per agent (encryptions, decryptions, seconds) against the raw gmpy2.powmod floor."""

from __future__ import annotations

import argparse
import json
import math
import platform
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import gmpy2  # only for the raw powmod floor; the protocol itself goes through efpsn.crypto.paillier
import numpy as np

from efpsn.crypto import paillier
from efpsn.crypto.encoding import SlotLayout
from efpsn.masks.zero_sum import Masker, NoiseSpec

# The two settings the brief asks for: the paper's experiments ((K, m, N) = (1, 10, 10)) and
# masking every coefficient of the 784 -> 10 logistic regression (7,850 weights and biases + the
# constant basis function, K = 1: N = 7,851).
PAPER_N = 10
LOGREG_N = 7851
# K = 2 with the squares of all 7,850 coordinates added (monomials.power_monomials): N = 2d + 1.
LOGREG_SQUARES_N = 2 * 7850 + 1
DEFAULT_GAMMA = 1e3
DEFAULT_P = 1.0
DEFAULT_PRECISION = 6  # efpsn.params.config.RunConfig's default

# Phase I is single-threaded; CPU time of this process is its cost and, unlike wall time, is not
# inflated when other jobs share the cores. --clock wall switches every measurement to wall time.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


@dataclass
class Row:
    """One measured (or extrapolated) phase-I configuration for a single agent."""

    key_bits: int
    num_coefficients: int
    degree: int
    mode: str  # "packed" or "unpacked"
    slots: int  # coefficients per plaintext (1 when unpacked)
    encryptions: int
    decryptions: int
    outgoing_s: float  # draw + encode + pack + encrypt for every neighbour
    finish_s: float  # validate + homomorphic sums + decrypt + unpack
    total_s: float
    powmod_floor_s: float  # encryptions * one gmpy2.powmod(r, n, n^2)
    ratio: float  # total_s / powmod_floor_s
    extrapolated: bool
    note: str


def powmod_seconds(public_key: paillier.PublicKey, *, reps: int) -> float:
    """Mean seconds of one gmpy2.powmod(r, n, n^2) (the obfuscator r^n, the cost of encryption)."""
    n, nsquare = gmpy2.mpz(public_key.n), gmpy2.mpz(public_key.nsquare)
    rs = [gmpy2.mpz(secrets.randbelow(public_key.n - 1) + 1) for _ in range(reps)]
    start = clock()
    for r in rs:
        gmpy2.powmod(r, n, nsquare)
    return (clock() - start) / reps


def run_agent(
    *,
    spec: NoiseSpec,
    degree: int,
    layout: SlotLayout | None,
    keypairs: Sequence[tuple[paillier.PublicKey, paillier.PrivateKey]],
    seed: int,
) -> tuple[Masker, float, float]:
    """Agent 0 with neighbours 1..degree: time its outgoing() and finish(), nothing else.

    The neighbours' ciphertexts for agent 0 are produced beforehand by real Maskers (untimed).
    """
    neighbours = tuple(range(1, degree + 1))
    agent = Masker(agent=0, neighbours=neighbours, spec=spec, rng=np.random.default_rng([seed, 0]),
                   layout=layout, keypair=keypairs[0])
    incoming = {}
    for j in neighbours:
        other = Masker(agent=j, neighbours=(0,), spec=spec, rng=np.random.default_rng([seed, j]),
                       layout=layout, keypair=keypairs[j])
        incoming[j] = other.outgoing({0: agent.public_key})[0]
    keys = {j: keypairs[j][0] for j in neighbours}
    start = clock()
    agent.outgoing(keys)
    outgoing_s = clock() - start
    start = clock()
    agent.finish(incoming)
    finish_s = clock() - start
    return agent, outgoing_s, finish_s


def measure(
    *,
    key_bits: int,
    num_coefficients: int,
    degree: int,
    packed: bool,
    keypairs: Sequence[tuple[paillier.PublicKey, paillier.PrivateKey]],
    powmod_s: float,
    gamma: float,
    p: float,
    precision: int,
    sample: int,
    extrapolate_above: int,
) -> Row:
    """Time one configuration, or a sample of it when unpacked and too large (then scale up)."""
    layout = (
        SlotLayout.plan(precision=precision, gamma=gamma, max_terms=degree, key_bits=key_bits)
        if packed else None
    )
    full_encryptions = degree * (layout.num_plaintexts(num_coefficients) if layout
                                 else num_coefficients)
    extrapolated = not packed and full_encryptions > extrapolate_above
    run_n = math.ceil(sample / degree) if extrapolated else num_coefficients
    spec = NoiseSpec(gamma=gamma, p=p, precision=precision, num_coefficients=run_n)
    agent, outgoing_s, finish_s = run_agent(
        spec=spec, degree=degree, layout=layout, keypairs=keypairs, seed=num_coefficients
    )
    encryptions, decryptions = agent.encryptions, agent.decryptions
    note = ""
    if extrapolated:
        # Unpacked cost is linear in N: deg encryptions and 1 decryption per coefficient.
        scale = num_coefficients / run_n
        note = (f"EXTRAPOLATED from N={run_n} ({encryptions} encryptions, {decryptions} "
                f"decryptions timed) x {scale:.1f}")
        outgoing_s, finish_s = outgoing_s * scale, finish_s * scale
        encryptions, decryptions = degree * num_coefficients, num_coefficients
    assert encryptions == full_encryptions
    total = outgoing_s + finish_s
    floor = powmod_s * encryptions
    return Row(
        key_bits=key_bits, num_coefficients=num_coefficients, degree=degree,
        mode="packed" if packed else "unpacked", slots=layout.slots if layout else 1,
        encryptions=encryptions, decryptions=decryptions, outgoing_s=outgoing_s,
        finish_s=finish_s, total_s=total, powmod_floor_s=floor, ratio=total / floor,
        extrapolated=extrapolated, note=note,
    )


def format_table(rows: Sequence[Row]) -> str:
    header = (f"{'key':>5} {'N':>5} {'deg':>3} {'mode':>8} {'slots':>5} {'enc':>6} {'dec':>5} "
              f"{'out s':>9} {'fin s':>9} {'total s':>9} {'floor s':>9} {'ratio':>6}  note")
    lines = [header, "-" * len(header)]
    for r in rows:
        star = "*" if r.extrapolated else " "
        lines.append(
            f"{r.key_bits:>5} {r.num_coefficients:>5} {r.degree:>3} {r.mode:>8} {r.slots:>5} "
            f"{r.encryptions:>6} {r.decryptions:>5} {r.outgoing_s:>9.3f} {r.finish_s:>9.3f} "
            f"{r.total_s:>8.3f}{star} {r.powmod_floor_s:>9.3f} {r.ratio:>6.2f}  {r.note}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="2048-bit keys only (default: 2048 and 3072)")
    parser.add_argument("--key-bits", type=int, nargs="+", default=None,
                        help="key sizes to run (overrides --quick's choice)")
    parser.add_argument("--gamma", type=float, default=DEFAULT_GAMMA)
    parser.add_argument("--p", type=float, default=DEFAULT_P)
    parser.add_argument("--precision", type=int, default=DEFAULT_PRECISION)
    parser.add_argument("--sample", type=int, default=200,
                        help="encryptions timed when an unpacked run is extrapolated (>= 200)")
    parser.add_argument("--extrapolate-above", type=int, default=2000,
                        help="unpacked runs with more encryptions than this are extrapolated")
    parser.add_argument("--powmod-reps", type=int, default=50)
    parser.add_argument("--json", metavar="FILE", help="also write the rows and settings as JSON")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: this process's CPU time (default); wall: elapsed time")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.sample < 200:
        parser.error(f"--sample must be >= 200 encryptions, got {args.sample}")
    key_sizes = args.key_bits or ([2048] if args.quick else [2048, 3072])
    cases = [(PAPER_N, 2), (PAPER_N, 4), (LOGREG_N, 2), (LOGREG_N, 4), (LOGREG_SQUARES_N, 2),
             (LOGREG_SQUARES_N, 4)]
    max_degree = max(d for _, d in cases)

    print(f"phase I per agent: gamma={args.gamma:g}, p={args.p:g}, precision P={args.precision}, "
          f"sigma_k^2 = gamma / k^p (k = 1..N), tail bound 40 sigma_1 for packing")
    print(f"clock: {args.clock} seconds; python {platform.python_version()}, "
          f"gmpy2 {gmpy2.version()}, {platform.machine()}")
    rows: list[Row] = []
    keygen: dict[int, float] = {}
    powmods: dict[int, float] = {}
    for bits in key_sizes:
        start = clock()
        keypairs = [paillier.generate_keypair(bits) for _ in range(max_degree + 1)]
        keygen[bits] = (clock() - start) / len(keypairs)
        powmods[bits] = powmod_seconds(keypairs[1][0], reps=args.powmod_reps)
        print(f"{bits}-bit keys: key generation {keygen[bits]:.3f} s each; one gmpy2.powmod(r, n, "
              f"n^2) {1e3 * powmods[bits]:.3f} ms", flush=True)
        for num_coefficients, degree in cases:
            for packed in (True, False):
                row = measure(
                    key_bits=bits, num_coefficients=num_coefficients, degree=degree,
                    packed=packed, keypairs=keypairs, powmod_s=powmods[bits], gamma=args.gamma,
                    p=args.p, precision=args.precision, sample=args.sample,
                    extrapolate_above=args.extrapolate_above,
                )
                rows.append(row)
                print(f"  N={num_coefficients} deg={degree} {row.mode}: {row.total_s:.3f} s"
                      f"{' (extrapolated)' if row.extrapolated else ''}", file=sys.stderr,
                      flush=True)
    print()
    print(format_table(rows))
    print("\nout = outgoing() (draw, encode, pack, encrypt for all neighbours); fin = finish() "
          "(validate, multiply, decrypt, unpack);\nfloor = encryptions x one raw gmpy2.powmod; "
          "ratio = total / floor. * = EXTRAPOLATED linearly from a timed sample (see note).")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({
                "settings": {"gamma": args.gamma, "p": args.p, "precision": args.precision,
                             "tail_sigmas": 40.0, "sample": args.sample, "clock": args.clock,
                             "python": platform.python_version(), "gmpy2": gmpy2.version()},
                "keygen_seconds": {str(k): v for k, v in keygen.items()},
                "powmod_seconds": {str(k): v for k, v in powmods.items()},
                "rows": [asdict(r) for r in rows],
            }, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
