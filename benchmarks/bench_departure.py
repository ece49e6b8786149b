"""A party that leaves for good, measured: `efpsn up --data-dir D ...` with one agent killed -9
(tests/crash_hook: on reaching round T, after its checkpoint of T - 1; never restarted).
Prints the exit code, the wall time, the departure record, when the decision came after the
kill (the coordinator's log line against the victim's last log line), the stop round and the
relative distance of the remaining agents' average to the remaining folders' optimum.

    python benchmarks/bench_departure.py D --victim agent3 --at 201 -- --no-fork --holdout 0 \
        --l2 0.01 --key-bits 2048 --iterations 4000 --round-timeout 10 --refresh never
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from localnet import crash_at

from efpsn.data.folders import load_data_dir
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import average, build_problem
from efpsn.tasks.optimum import centralized_optimum

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+)")


def _last_stamp(text: str, needle: str = "") -> float | None:
    found = None
    for line in text.splitlines():
        match = _STAMP.match(line)
        if match and needle in line:
            found = datetime.strptime(match.group(1).replace(",", "."),
                                      "%Y-%m-%d %H:%M:%S.%f").timestamp()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--victim", default="agent3")
    parser.add_argument("--at", type=int, default=201)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    extra = argv[cut + 1:]  # efpsn up's own flags
    results = Path(tempfile.mkdtemp(prefix="bench-departure-"))
    command = [sys.executable, "-m", "efpsn", "up", "--data-dir", str(args.data_dir),
               "--results", str(results), "--quiet", *extra]
    env = {**os.environ, **crash_at(args.at, name=args.victim)}
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - started
    print(f"exit {done.returncode} after {wall:.1f} s; last line: "
          f"{(done.stdout.strip().splitlines() or [''])[-1]}")
    if done.returncode != 0:
        print(done.stderr[-3000:])
        return
    summary = json.loads((results / "summary.json").read_text())
    logs = results / "logs"
    killed = _last_stamp((logs / f"{args.victim}.log").read_text())
    decided = _last_stamp((logs / "coordinator.log").read_text(), "departures decided")
    if killed is not None and decided is not None:
        print(f"decision {decided - killed:.1f} s after {args.victim}'s last log line")
    survivors = summary["remaining"]
    print(json.dumps(summary["departures"]), summary["optimum_of"])
    records = [json.loads((results / n / "result.json").read_text()) for n in survivors]
    config = RunConfig.from_dict(records[0]["settings"])
    problem = build_problem(config, local=load_data_dir(config, args.data_dir, holdout=0.0))
    _, xs = load_agent_results(results, survivors)
    gone = {int(r["agent"][5:]) - 1 for r in summary["departures"]}
    x_star = centralized_optimum(problem.task, [s for i, s in enumerate(problem.shards)
                                                if i not in gone]).x
    distance = float(torch.linalg.vector_norm(average(xs) - x_star)
                     / torch.linalg.vector_norm(x_star))
    rounds = sorted({int(r["timings"]["rounds"]) for r in records})
    print(f"relative distance of the {len(xs)} others' average to their optimum: "
          f"{distance:.2e}; rounds {rounds} of {config.iterations.total}; "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
