"""Scale: full Fashion-MNIST split over n private agent folders, a networked run per n and graph.

    python benchmarks/bench_scale.py [--agents 5,20,50] [--topologies ring,erdos-renyi]
        [--iterations 200] [--data idx:/usr/share/datasets/fashion-mnist] [--json OUT]

Needs the 60,000 Fashion-MNIST training images as IDX files (Debian: `apt-get install
dataset-fashion-mnist`, which installs /usr/share/datasets/fashion-mnist). For every n it runs
`efpsn data split --partition iid` once, then for every topology `efpsn up --data-dir` (logreg,
DSGD, batch 64, zero-sum masks, 2048-bit keys to keep phase I short on 2 cores), and prints a
Markdown table: wall time, median seconds per round, median phase I time, median and largest
peak resident memory per agent process, and the accuracy of the average model (on the agents'
held-out parts; on the public test set with --test-set, which every agent then also loads).
"erdos-renyi" means edge probability 2 ln(n) / n (sparse, connected with high probability; the
graph is redrawn from the public seed until connected).
Numbers depend on the machine and its load: all n share the same cores.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from efpsn.data.folders import read_schema, split_data
from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.process.runtime import configure_threads

FASHION = "idx:/usr/share/datasets/fashion-mnist"


def run_one(data_dir: Path, *, agents: int, topology: str, iterations: int,
            key_bits: int) -> dict:
    schema = read_schema(data_dir)
    config = RunConfig(
        agents=agents, topology=topology, data="local", iterations=iterations,
        eval_every=iterations, key_bits=key_bits, algorithm="dsgd", batch_size=64,
        schedule="constant:0.05",
        round_timeout_seconds=600.0, **schema,  # type: ignore[arg-type]
    )
    with tempfile.TemporaryDirectory(prefix="efpsn-scale-") as tmp:
        start = time.perf_counter()
        summary = launch_local_network(config, results=Path(tmp), data_dir=data_dir, quiet=True,
                                       start_timeout=600.0)
        wall = time.perf_counter() - start
        names = [f"agent{i + 1}" for i in range(agents)]
        results, _ = load_agent_results(Path(tmp), names)
    timings = [r["timings"] for r in results]
    rss = [t["max_rss_mb"] for t in timings]
    return {
        "agents": agents, "topology": topology, "iterations": iterations,
        "wall_seconds": wall,
        "seconds_per_round": statistics.median(t["seconds_per_round"] for t in timings),
        "phase1_seconds": statistics.median(t["phase1_seconds"] for t in timings),
        "rss_mb_median": statistics.median(rss), "rss_mb_max": max(rss),
        "accuracy": summary["final"]["accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="5,20,50")
    parser.add_argument("--topologies", default="ring,erdos-renyi")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--data", default=FASHION)
    parser.add_argument("--test-set", action="store_true",
                        help="give every agent the public 10,000-image test set (default: none; "
                             "each agent evaluates on its own held-out part)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    configure_threads()
    rows = []
    with tempfile.TemporaryDirectory(prefix="efpsn-scale-data-") as tmp:
        for n in (int(v) for v in args.agents.split(",")):
            folder = Path(tmp) / f"n{n}"
            split_data(source=args.data, agents=n, partition_spec="iid", out=folder)
            if not args.test_set:  # each agent then holds only its own data (and its holdout)
                (folder / "test.npz").unlink()
            for topology in args.topologies.split(","):
                if topology == "erdos-renyi":  # connected with high probability, sparse
                    topology = f"erdos-renyi:{min(1.0, 2 * math.log(n) / n):.3f}"
                row = run_one(folder, agents=n, topology=topology, iterations=args.iterations,
                              key_bits=args.key_bits)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| agents | topology | wall (s) | s/round | phase I (s) | RSS/agent median (MB) "
          "| RSS/agent max (MB) | accuracy |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['agents']} | {r['topology']} | {r['wall_seconds']:.0f} | "
              f"{r['seconds_per_round']:.3f} | {r['phase1_seconds']:.1f} | "
              f"{r['rss_mb_median']:.0f} | {r['rss_mb_max']:.0f} | {r['accuracy']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
