"""Phase II cost: simulator seconds per round, and the networked agents against it, same run.

    python benchmarks/bench_rounds.py [--rounds 500] [--network] [--paper] [--json OUT]

    python benchmarks/bench_rounds.py --scaling 5,10,20 [--rounds 300]

    python benchmarks/bench_rounds.py --network --scaling 5,20 --defaults

Prints, for 5 agents on a ring:
  * simulator seconds per round (logreg and LeNet, DSGD batch 64 and GT full batch);
  * with --network: a real 5-agent gRPC network on loopback (logreg, DSGD, batch 64) and its ratio
    to the simulator measured in the same run, plus each agent's phase I wall time;
  * with --network, also the transport micro-benchmark (bench_transport.py: a round message
    through the agents' transport against bare grpc.aio and raw TCP, same run);
  * with --paper: the paper's whole 10,000-step convex run over the network: seconds of rounds,
    start-up and wall time, and the ratio to the simulator's rounds measured in the same run;
  * with --scaling N1,N2,...: a table of networks of those sizes (ring): seconds per round of the
    network and of the simulator (same run), their ratio, start-up (launch to the last agent's
    first round), phase I, an agent's memory (PSS, median; and its peak RSS, which counts the
    pages it shares with the other agents in full), the coordinator's peak RSS, and the agents'
    CPU per agent per round. Every run uses the paper's settings (--preset paper: DSGD, batch
    64), or with --defaults the project's defaults (agt, full local batch, the automatic step)
    for --rounds rounds: then the network's ratio is to the simulator running those settings.
Numbers depend on the machine and its load (printed before and after); the ratio is the figure to
compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_transport  # this folder's transport benchmark (scripts run with it on sys.path)

from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.process.runtime import configure_threads, machine_load
from efpsn.simulator import run_simulation


def simulator_seconds_per_round(config: RunConfig) -> float:
    problem = build_problem(config)
    result = run_simulation(config, problem=problem)
    return result.timings["seconds_per_round"]


def network_run(config: RunConfig, *, key_bits: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-") as tmp:
        cfg = config.replace(key_bits=key_bits)
        start = time.perf_counter()
        summary = launch_local_network(cfg, results=Path(tmp), quiet=True)
        wall = time.perf_counter() - start
        names = [f"agent{i + 1}" for i in range(cfg.agents)]
        results, _ = load_agent_results(Path(tmp), names)
    timings = [r["timings"] for r in results]
    network = summary.get("timings", {})
    return {
        "wall_seconds": wall,
        "startup_seconds": network.get("startup_seconds", float("nan")),
        "phase2_seconds": network.get("phase2_seconds", float("nan")),
        "agents_cpu_seconds_per_round": network.get("agents_cpu_seconds_per_round",
                                                    float("nan")),
        "agent_peak_rss_mb": network.get("agent_peak_rss_mb", float("nan")),
        "agent_pss_mb_median": network.get("agent_pss_mb_median", float("nan")),
        "coordinator_peak_rss_mb": network.get("coordinator_peak_rss_mb", float("nan")),
        "seconds_per_round": statistics.median(t["seconds_per_round"] for t in timings),
        "phase1_seconds": [round(t["phase1_seconds"], 3) for t in timings],
        "keygen_seconds": [round(t.get("keygen_seconds", 0.0), 3) for t in timings],
        "key_wait_seconds": [round(t.get("key_wait_seconds", 0.0), 3) for t in timings],
        "accuracy": summary["final"]["accuracy"],
    }


def settings(*, defaults: bool, **changes: Any) -> RunConfig:
    """The paper's settings (DSGD, batch 64, its schedule and basis) or, with `defaults`, the
    project's defaults, with `changes` on top."""
    return RunConfig(**changes) if defaults else RunConfig.preset("paper", **changes)


def scaling_table(sizes: list[int], *, rounds: int, key_bits: int,
                  defaults: bool) -> list[dict]:
    """Network vs simulator for each size n (ring, logreg), in one run."""
    rows = []
    header = (f"{'n':>3} {'net s/round':>12} {'sim s/round':>12} {'ratio':>6} {'start-up s':>10} "
              f"{'phase I s':>9} {'agent PSS MB':>12} {'agent RSS MB':>12} {'coord. MB':>9} "
              f"{'CPU ms/agent/round':>18}")
    print("\n" + header)
    for n in sizes:
        cfg = settings(defaults=defaults, agents=n, iterations=rounds, eval_every=rounds)
        sim = simulator_seconds_per_round(cfg)
        net = network_run(cfg, key_bits=key_bits)
        row = {"agents": n, "simulator_seconds_per_round": sim, **net,
               "ratio_to_simulator": net["seconds_per_round"] / sim}
        rows.append(row)
        print(f"{n:>3} {net['seconds_per_round']:>12.5f} {sim:>12.5f} "
              f"{row['ratio_to_simulator']:>6.2f} {net['startup_seconds']:>10.1f} "
              f"{max(net['phase1_seconds']):>9.2f} {net['agent_pss_mb_median']:>12.0f} "
              f"{net['agent_peak_rss_mb']:>12.0f} {net['coordinator_peak_rss_mb']:>9.0f} "
              f"{net['agents_cpu_seconds_per_round'] * 1e3 / n:>18.2f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--network", action="store_true", help="also time a real gRPC network")
    parser.add_argument("--paper", action="store_true",
                        help="time the paper's 10,000-step convex run over the network")
    parser.add_argument("--key-bits", type=int, default=3072)
    parser.add_argument("--scaling", default=None, metavar="N1,N2,...",
                        help="also a table of networks of these sizes (e.g. 5,10,20)")
    parser.add_argument("--defaults", action="store_true",
                        help="network and scaling runs with the defaults (agt, full batch), "
                             "not the paper's DSGD with batch 64")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    configure_threads()
    print(f"machine: {machine_load()}")
    # the paper's settings (DSGD, batch 64, its schedule and basis), whatever the defaults are
    base = RunConfig.preset("paper", iterations=args.rounds, eval_every=args.rounds)
    out: dict = {"rounds": args.rounds, "simulator": {}, "load_before": machine_load(),
                 "settings": "defaults" if args.defaults else "paper"}
    cases = {
        "logreg dsgd b64": base,
        "logreg gt full": base.replace(algorithm="gt", batch_size=0, schedule="constant:0.05"),
        "lenet dsgd b64": base.replace(task="lenet", iterations=max(20, args.rounds // 5),
                                       eval_every=max(20, args.rounds // 5)),
    }
    print(f"{'case':<18} {'s/round (simulator)':>20}")
    for name, cfg in cases.items():
        spr = simulator_seconds_per_round(cfg)
        out["simulator"][name] = spr
        print(f"{name:<18} {spr:>20.5f}")
    if args.network:
        chosen = settings(defaults=args.defaults, iterations=args.rounds, eval_every=args.rounds)
        what = "agt, full batch (defaults)" if args.defaults else "dsgd, batch 64"
        if args.defaults:
            out["simulator"][f"logreg {what}"] = simulator_seconds_per_round(chosen)
        sim = out["simulator"][f"logreg {what}" if args.defaults else "logreg dsgd b64"]
        net = network_run(chosen, key_bits=args.key_bits)
        ratio = net["seconds_per_round"] / sim
        out["network"] = {**net, "ratio_to_simulator": ratio, "simulator_seconds_per_round": sim}
        print(f"\nnetwork (5 agents, logreg, {what}, {args.key_bits}-bit keys)")
        print(f"  seconds per round (median over agents): {net['seconds_per_round']:.5f}")
        print(f"  simulator, same settings, this run:      {sim:.5f}")
        print(f"  ratio to the simulator in this run:      {ratio:.2f}x (goal 3x)")
        print(f"  CPU per round, all agents together (ms):  "
              f"{net['agents_cpu_seconds_per_round'] * 1e3:.2f} "
              f"({net['agents_cpu_seconds_per_round'] * 1e3 / 5:.2f} per agent; goal 1.2)")
        print(f"  memory per agent (PSS, median, MB):        {net['agent_pss_mb_median']:.0f}")
        print(f"  phase I wall time per agent (s):         {net['phase1_seconds']}")
        print(f"  of which waiting for its own key (s):     {net['key_wait_seconds']}")
        print(f"  key generation, during start-up (s):      {net['keygen_seconds']}")
        print(f"  whole run wall time incl. start-up (s):  {net['wall_seconds']:.1f}")
    if args.paper:
        paper_config = RunConfig.preset("paper")  # 10,000 steps, batch 64
        sim_paper = simulator_seconds_per_round(paper_config)
        paper = network_run(paper_config, key_bits=args.key_bits)
        out["paper_network"] = {**paper, "simulator_seconds_per_round": sim_paper}
        print(f"\npaper's convex run over the network (10,000 rounds): rounds (phase II) "
              f"{paper['phase2_seconds']:.1f}s, {paper['seconds_per_round']:.5f} s/round "
              f"({paper['seconds_per_round'] / sim_paper:.2f}x the simulator's "
              f"{sim_paper:.5f}, {sim_paper * paper_config.iterations.total:.1f}s of rounds, this run); "
              f"start-up {paper['startup_seconds']:.1f}s; wall {paper['wall_seconds']:.1f}s; "
              f"agents' CPU {paper['agents_cpu_seconds_per_round'] * 1e3:.2f} ms per round; "
              f"accuracy {paper['accuracy']:.4f}")
    if args.network:
        print("\nper-message cost of the transport (benchmarks/bench_transport.py):")
        out["transport"] = asyncio.run(bench_transport.measure_all(messages=2000,
                                                                   insecure=False))
    if args.scaling:
        sizes = [int(n) for n in args.scaling.split(",") if n.strip()]
        out["scaling"] = scaling_table(sizes, rounds=args.rounds, key_bits=args.key_bits,
                                       defaults=args.defaults)
    out["load_after"] = machine_load()
    print(f"machine: {out['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
