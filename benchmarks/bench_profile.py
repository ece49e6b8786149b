"""Where an agent's CPU goes in a round: real agents under py-spy, stage by stage.

    python benchmarks/bench_profile.py [--agents 5] [--rounds 10000] [--window 15]
        [--profiled 5] [--rate 50] [--key-bits 2048] [--data-dir D] [--json OUT]

Runs `efpsn up --preset paper` (logistic regression, DSGD, batch 64, the paper's schedule;
mutual TLS), or with `--data-dir D` the defaults on private folders (`efpsn up --data-dir D`
and nothing else: agt, full batch, fading masks, the stop rule; the agents are D's; --rounds
forces a count, else the step rule's, stopped by the certificate) as a separate process and, once
every agent is past round 200, measures two windows of `--window` seconds on the running agents:
  1. unprofiled: each agent's CPU (/proc/PID/stat) and rounds (GetStatus) over the window;
  2. profiled: `py-spy record --nonblocking` on `--profiled` agents (agent1, agent2, ...), with
     each thread's CPU from /proc/PID/task; profile_stages.py sorts every sample into a stage.
Prints, per agent per round, the CPU of each stage (receive and decode, checks and digests,
the step, encode and send, outbox log, checkpoint, evaluation, round bookkeeping, the event
loop, gRPC's internals and its own threads), beside reference lines measured in this same run:
the step and the gradient alone (the same objective, in this process), a checkpoint alone (its
CPU, which the profile cannot tell from its waits on the disk), and a bare grpc.aio
client stream with the same 63 KB message (benchmarks/bench_transport.py; CPU of both ends per
message, times the agent's degree: what its messages cost gRPC with nothing of ours), and the
whole run's CPU per agent per round from summary.json. The machine's load is printed before and
after.

Why py-spy: it samples from outside the process, so the agent runs its own code unchanged
(cProfile and yappi instrument every Python call, which inflates Python-heavy stages against
numpy and gRPC's C code), and a sample's stack holds the coroutines the event loop is running,
so asyncio is seen as it runs. --nonblocking: it reads the stacks without stopping the agent.
(--native, which sees inside C code, must stop the process for every sample; stopping it
interrupts system calls and skews the samples towards them: it showed sendmsg as half of all
gRPC's work where `perf record` on the same agent finds all kernel time at a fifth of the
process's CPU.) C code is charged to the Python function that called it: numpy and BLAS to
the step, hashlib to the digests, gRPC's Cython calls to gRPC. The profiled window's CPU per
round is printed beside the unprofiled one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import bench_transport  # this folder's transport benchmark (scripts run with it on sys.path)
import profile_stages
import torch

from agent.options import AgentOptions
from agent.state import StateStore
from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import StepContext
from efpsn.data.folders import inspect_data_dir, load_data_dir
from efpsn.flags.arguments import add_run_arguments, config_from_args
from efpsn.flags.parser import add_data_dir_arguments
from efpsn.optimize.driver import RoundDriver
from efpsn.params.config import RunConfig
from efpsn.params.schedules import make_schedule
from efpsn.problem import build_problem
from efpsn.process.runtime import configure_threads, machine_load
from efpsn.simulator import make_mask_providers
from efpsn.wire.rounds import encode_round
from efpsn.wire.status_client import StatusPoller
from efpsn.wire.tls import TlsConfig, generate_certificates

TICK = os.sysconf("SC_CLK_TCK")
PY_SPY = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}"
                      f"{os.environ.get('PATH', '')}") or "py-spy"
WARM_UP_ROUND = 200
T = TypeVar("T")


def cpu_seconds(path: str) -> float:
    """utime + stime of a /proc .../stat file, in seconds."""
    fields = Path(path).read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run_delay_seconds(pid: int) -> float:
    """Time the process's threads spent runnable, waiting for a core (/proc schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def thread_cpu(pid: int) -> dict[int, float]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = cpu_seconds(str(task / "stat"))
        except (OSError, ValueError):
            pass
    return out


def agent_pids(folder: Path, names: list[str]) -> dict[str, int]:
    """The agents' process ids, found by their standard output (FOLDER/logs/NAME.log)."""
    logs = {str((folder / "logs" / f"{n}.log").resolve()): n for n in names}
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            target = os.readlink(proc / "fd" / "1")
        except OSError:
            continue
        if target in logs and (proc / "task").is_dir():
            out[logs[target]] = int(proc.name)
    return out


class Watch:
    """The agents' rounds (GetStatus, as each agent's operator) and their CPU (/proc)."""

    def __init__(self, folder: Path, names: list[str]) -> None:
        self.folder, self.names = folder, names
        self.runner = asyncio.Runner()  # one loop: the poller's channels stay open
        self.poller = StatusPoller({n: TlsConfig.from_dir(folder / "tls", n) for n in names})
        self.addresses = {n: f"127.0.0.1:{int((folder / 'ports' / n).read_text())}"
                          for n in names}

    def rounds(self) -> dict[str, int]:
        statuses = self.runner.run(self.poller.poll(self.addresses))
        return {n: s.round for n, s in statuses.items()}

    def close(self) -> None:
        self.runner.run(self.poller.close())
        self.runner.close()


def wait_for(condition: Callable[[], T], timeout: float, what: str) -> T:
    """condition()'s first true value, polled every half second; TimeoutError after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"no {what} within {timeout:.0f}s")


def run_config(args: argparse.Namespace) -> tuple[RunConfig, dict | None]:
    """The profiled run's configuration (resolved) and, with --data-dir, the agents' data."""
    if args.data_dir is None:
        return RunConfig.preset("paper", agents=args.agents, iterations=args.rounds or 10_000,
                                key_bits=args.key_bits or 2048), None
    flags = argparse.ArgumentParser()
    add_run_arguments(flags)
    add_data_dir_arguments(flags)  # the schema's shape, classes and scale, as `efpsn up` reads them
    argv = ["--data-dir", str(args.data_dir), "--agents", str(args.agents)] + (
        ["--key-bits", str(args.key_bits)] if args.key_bits else [])
    if args.rounds:
        argv += ["--iterations", str(args.rounds)]
    config = config_from_args(flags.parse_args(argv), resolve=False)
    local = load_data_dir(config, Path(args.data_dir))
    return config.resolved(), local


def reference_lines(config: RunConfig, calls: int = 2000,
                    local: dict | None = None) -> dict[str, float]:
    """CPU ms of agent 0's step (gradient and mixing) and of its gradient alone, in this
    process, with the run's objective and a real zero-sum mask (fading, for the defaults)."""
    problem = build_problem(config, local=local)
    providers = make_mask_providers(problem, noise_seed=0)
    schedule = make_schedule(config.schedule, iterations=config.iterations.total)
    oracle = problem.objective(0, providers[0])
    ctx = StepContext(agent=0, weights=problem.agent_weights(0), lr=schedule(0), oracle=oracle)
    x = torch.linspace(-0.01, 0.01, problem.task.num_params, dtype=torch.float64)
    start = time.process_time()
    for t in range(calls):
        oracle(x, t)
    gradient = (time.process_time() - start) * 1e3 / calls
    algorithm = make_algorithm(config.algorithm, momentum=config.momentum.value)
    driver = RoundDriver(algorithm=algorithm, context=ctx,
                         schedule=schedule, iterations=10**9, eval_every=10**9, x0=x)
    inbox = {j: {k: x + 1e-6 * j for k in algorithm.message_keys}
             for j in problem.graph.neighbours(0)}
    start = time.process_time()
    for _ in range(calls):
        driver.step(inbox)
    step = (time.process_time() - start) * 1e3 / calls
    return {"gradient_ms": gradient, "step_ms": step, "checkpoint_ms": checkpoint_ms(x),
            "degree": len(problem.graph.neighbours(0)), "keys": list(algorithm.message_keys)}


def checkpoint_ms(x: torch.Tensor, calls: int = 100) -> float:
    """CPU ms of one checkpoint of `x` (an agent's StateStore, fsyncs included), in this
    process: what the profile cannot tell from the checkpoint's waits on the disk."""
    history = [{"round": float(t), "accuracy": 0.5, "loss": 1.0} for t in range(0, 10_000, 100)]
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-checkpoint-") as tmp:
        store = StateStore(Path(tmp))
        start = time.process_time()
        for t in range(calls):
            store.save_checkpoint(run_id="bench", round_=t, tensors={"x": x}, history=history)
        return (time.process_time() - start) * 1e3 / calls


def bare_stream_ms(messages: int = 2000, keys: tuple[str, ...] = ("x",)) -> tuple[float, float]:
    """CPU ms (both ends) per round message (63 KB a tensor of `keys`) on bare grpc.aio with
    mutual TLS: a client stream within one process, and a bidirectional stream (an empty reply
    a message) between two."""
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-bare-") as tmp:
        tls = Path(tmp) / "tls"
        generate_certificates(tls, ["agent1", "agent2"])
        x = torch.linspace(-1, 1, 7850, dtype=torch.float64)
        payload = encode_round({k: x for k in keys}, run_id="bench", sender="agent2", round_=1)
        in_process, _ = asyncio.run(bench_transport.bare_grpc(tls, payload, messages,
                                                              stream="client"))
        between, _ = asyncio.run(bench_transport.bare_grpc_processes(tls, payload, messages))
    return in_process, between


def profile_window(watch: Watch, pids: dict[str, int], profiled: list[str], *, window: float,
                   rate: int, folder: Path) -> dict:
    """One window on the running agents: CPU and rounds of all, py-spy on `profiled`."""
    outputs = {n: folder / f"pyspy-{n}.txt" for n in profiled}
    spies = [subprocess.Popen(
        [PY_SPY, "record", "--pid", str(pids[n]), "--nonblocking", "--threads", "--format", "raw",
         "--rate", str(rate), "--duration", str(int(window)), "--output", str(outputs[n])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in profiled]
    before = measure(watch, pids)
    for spy in spies:
        spy.wait()
    after = measure(watch, pids)
    out = window_figures(before, after)
    stages: dict[str, float] = {}
    for n in profiled:
        if not outputs[n].exists():
            continue
        samples = profile_stages.busy_samples(outputs[n].read_text().splitlines())
        threads = {tid: after["threads"][n].get(tid, 0.0) - before["threads"][n].get(tid, 0.0)
                   for tid in after["threads"][n]}
        split = profile_stages.split_cpu(samples, threads, after["cpu"][n] - before["cpu"][n])
        rounds = max(1, after["rounds"][n] - before["rounds"][n])
        for stage, cpu in split.items():
            stages[stage] = stages.get(stage, 0.0) + cpu * 1e3 / rounds / len(profiled)
    out["stages_ms"] = stages
    lines = [line for n in profiled if outputs[n].exists()
             for line in outputs[n].read_text().splitlines()]
    out["top_frames"] = profile_stages.top_frames(lines)
    return out


def measure(watch: Watch, pids: dict[str, int]) -> dict:
    rounds = watch.rounds()
    return {"time": time.perf_counter(), "rounds": rounds,
            "cpu": {n: cpu_seconds(f"/proc/{p}/stat") for n, p in pids.items()},
            "delay": {n: run_delay_seconds(p) for n, p in pids.items()},
            "threads": {n: thread_cpu(p) for n, p in pids.items()}}


def window_figures(before: dict, after: dict) -> dict:
    per_round, delays = [], []
    for n in before["cpu"]:
        rounds = after["rounds"].get(n, 0) - before["rounds"].get(n, 0)
        if rounds > 0:
            per_round.append((after["cpu"][n] - before["cpu"][n]) * 1e3 / rounds)
            delays.append((after["delay"][n] - before["delay"][n]) * 1e3 / rounds)
    seconds = after["time"] - before["time"]
    done = [after["rounds"][n] - before["rounds"][n] for n in before["rounds"]
            if n in after["rounds"]]
    return {"cpu_ms_per_agent_round": statistics.fmean(per_round) if per_round else float("nan"),
            "waiting_for_a_core_ms_per_agent_round":
                statistics.fmean(delays) if delays else float("nan"),
            "seconds_per_round": seconds / max(1, min(done, default=1))}


def run(args: argparse.Namespace) -> dict:
    config, local = run_config(args)
    if args.data_dir is None:
        what = ["--preset", "paper", "--agents", str(args.agents), "--iterations",
                str(config.iterations.total), "--key-bits", str(config.key_bits)]
    else:
        what = ["--data-dir", str(args.data_dir)] + (
            ["--iterations", str(args.rounds)] if args.rounds else []) + (
            ["--key-bits", str(args.key_bits)] if args.key_bits else [])
    names = [f"agent{i + 1}" for i in range(args.agents)]
    profiled = names[:args.profiled]
    out: dict = {"agents": args.agents, "rounds": config.iterations.total,
                 "settings": "the paper's logistic regression" if args.data_dir is None else
                 f"the defaults on {args.data_dir} (agt, full batch, fading masks)",
                 "goal_ms": 1.2 if args.data_dir is None else 1.5, "load_before": machine_load()}
    print(f"machine: {out['load_before']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-profile-") as tmp:
        folder = Path(tmp) / "run"
        up = subprocess.Popen(
            [sys.executable, "-m", "efpsn", "up", *what, "--quiet", "--results", str(folder)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(lambda: all((folder / "ports" / n).exists() for n in names), 300,
                     "agent ports")
            watch = Watch(folder, names)
            pids = wait_for(lambda: (p := agent_pids(folder, names)) and len(p) == len(names)
                            and p, 60, "agent processes")
            wait_for(lambda: (r := watch.rounds()) and len(r) == len(names)
                     and min(r.values()) >= WARM_UP_ROUND, 600, f"round {WARM_UP_ROUND}")
            before = measure(watch, pids)
            time.sleep(args.window)
            out["unprofiled"] = window_figures(before, measure(watch, pids))
            out["profiled"] = profile_window(watch, pids, profiled, window=args.window,
                                             rate=args.rate, folder=Path(tmp))
            watch.close()
            log, _ = up.communicate(timeout=3600)
        finally:
            if up.poll() is None:  # SIGINT: `efpsn up` stops its processes as on Ctrl-C
                up.send_signal(signal.SIGINT)
                up.wait()
        if up.returncode != 0:
            raise RuntimeError(f"efpsn up failed:\n{log[-3000:]}")
        summary = json.loads((folder / "summary.json").read_text())
    out["run"] = summary["timings"]
    out["reference"] = reference_lines(config, local=local)
    out["bare_stream_ms_per_message"], out["bare_processes_ms_per_message"] = bare_stream_ms(
        keys=tuple(out["reference"]["keys"]))
    out["load_after"] = machine_load()
    return out


def report(out: dict, *, detail: bool) -> None:
    n, ref = out["agents"], out["reference"]
    stages = out["profiled"]["stages_ms"]
    total = sum(stages.values())
    print(f"\nCPU per agent per round, {n} agents (ring), {out['settings']} "
          f"(profiled window):")
    print(f"  {'stage':<30} {'ms':>7} {'share':>6}")
    for stage in profile_stages.STAGES:
        if stage in stages:
            print(f"  {stage:<30} {stages[stage]:>7.3f} {stages[stage] / total:>6.1%}")
    print(f"  {'total':<30} {total:>7.3f}")
    if detail:
        print("\nmost sampled inside each stage (innermost project function | leaf frame):")
        for stage, rows in out["profiled"]["top_frames"].items():
            print(f"  {stage}: " + "; ".join(f"{where} {count}" for where, count in rows))
    bare = out["bare_stream_ms_per_message"] * ref["degree"]
    run_cpu = out["run"]["agents_cpu_seconds_per_round"] * 1e3 / n
    print("\nreference lines (this run):")
    print(f"  the step alone (gradient and mixing):           {ref['step_ms']:.3f} ms")
    print(f"  the gradient alone:                             {ref['gradient_ms']:.3f} ms")
    every = AgentOptions.checkpoint_every
    print(f"  a checkpoint alone (every {every} rounds):            "
          f"{ref['checkpoint_ms'] / every:.3f} ms per round ({ref['checkpoint_ms']:.2f} ms each)")
    between = out["bare_processes_ms_per_message"] * ref["degree"]
    size = f"{63 * len(ref['keys'])} KB"
    print(f"  bare gRPC client stream, {ref['degree']} x {size} each way:   {bare:.3f} ms "
          f"({out['bare_stream_ms_per_message']:.3f} ms per message, both ends, one process)")
    print(f"  bare gRPC between two processes, the same:      {between:.3f} ms "
          f"({out['bare_processes_ms_per_message']:.3f} ms per message and its empty reply)")
    print(f"  unprofiled window:                              "
          f"{out['unprofiled']['cpu_ms_per_agent_round']:.3f} ms per agent per round, "
          f"{out['unprofiled']['seconds_per_round'] * 1e3:.2f} ms per round")
    print(f"  profiled window (/proc):                        "
          f"{out['profiled']['cpu_ms_per_agent_round']:.3f} ms per agent per round; runnable "
          f"but waiting for a core {out['profiled']['waiting_for_a_core_ms_per_agent_round']:.3f} ms")
    print(f"  whole run (summary.json, agents_cpu_seconds_per_round / n): {run_cpu:.3f} ms "
          f"(goal {out['goal_ms']} ms: {run_cpu / out['goal_ms']:.2f}x)")
    print(f"  beyond the step and bare gRPC between processes: "
          f"{out['unprofiled']['cpu_ms_per_agent_round'] - ref['step_ms'] - between:.3f} ms")
    print(f"\nmachine: {out['load_before']} before; {out['load_after']} after")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds (default: 10,000 for the paper; the defaults' own)")
    parser.add_argument("--data-dir", default=None,
                        help="profile the defaults on these private folders (efpsn data split)")
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--profiled", type=int, default=5, help="agents under py-spy")
    parser.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    parser.add_argument("--key-bits", type=int, default=None,
                        help="Paillier key bits (default: 2048 for the paper; the defaults' own)")
    parser.add_argument("--detail", action="store_true",
                        help="also the most sampled functions inside each stage")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.data_dir is not None:
        args.agents = inspect_data_dir(args.data_dir).agents
    configure_threads()
    out = run(args)
    report(out, detail=args.detail)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
