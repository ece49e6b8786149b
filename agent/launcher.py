"""`efpsn up`: a coordinator and n agents as separate local processes, watched to the end."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.status import fetch_statuses
from efpsn.cli_common import format_metrics, write_json
from efpsn.cli_services import check_key_policy, config_to_args
from efpsn.config import RunConfig
from efpsn.wire.tls import TlsConfig, generate_certificates


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    port_file: Path

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def _spawn(name: str, args: list[str], folder: Path) -> Child:
    log_path = folder / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port_file = folder / "ports" / name
    port_file.parent.mkdir(parents=True, exist_ok=True)
    port_file.unlink(missing_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            # `python -m coordinator ...` / `python -m agent ...`: each service's own entry point
            [sys.executable, "-m", *args, "--port-file", str(port_file)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # our Ctrl-C is handled here, then we stop them ourselves
        )
    return Child(name=name, process=process, log_path=log_path, port_file=port_file)


def _wait_port(child: Child, timeout: float, *, problem: Future[Any] | None = None) -> int:
    """The port `child` serves on, once it wrote it; a failed build of the public problem (a bad
    run parameter) is reported as soon as it is known."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if problem is not None and problem.done():
            _raise_problem_error(problem)
        if child.process.poll() is not None:
            raise RuntimeError(
                f"{child.name} exited with code {child.process.returncode} before serving:\n"
                f"{child.log_tail()}"
            )
        try:
            return int(child.port_file.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise TimeoutError(f"{child.name} did not start serving within {timeout:.0f}s")


def stop_children(children: list[Child], *, grace: float = 5.0) -> None:
    """SIGTERM every child still running, then SIGKILL what is left after `grace` seconds."""
    for c in children:
        if c.process.poll() is None:
            try:
                os.killpg(c.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for c in children:
        try:
            c.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(c.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            c.process.wait()


def launch_local_network(
    config: RunConfig,
    *,
    results: Path | None = None,
    host: str = "127.0.0.1",
    quiet: bool = False,
    insecure: bool = False,
    checkpoint_every: int | None = None,
    insecure_noise_seed: int | None = None,
    debug_expose_mask: bool = False,
    allow_insecure_keys: bool = False,
    start_timeout: float = 120.0,
) -> dict[str, Any]:
    """Run a whole network locally; return the summary (also written to RESULTS/summary.json).

    Mutual TLS by default: a fresh CA and one certificate per process go to RESULTS/tls
    (insecure=True runs plaintext). The coordinator may exit once every agent is assigned."""
    from tqdm import tqdm

    check_key_policy(config, allow_insecure_keys=allow_insecure_keys)
    started, started_at = time.perf_counter(), time.time()
    # The launcher needs the public problem only for the summary, so it builds it while the
    # network starts (each agent builds its own); a bad parameter still stops everything with
    # this error, not a child's log.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="efpsn-up-problem")
    problem_future = pool.submit(_public_problem, config)
    folder = results or Path("results") / time.strftime("run-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"agent{i + 1}" for i in range(config.agents)]
    run_args = config_to_args(config)
    tls_args: list[str] = ["--insecure"]
    monitor: dict[str, TlsConfig] | None = None
    if not insecure:
        tls_dir = folder / "tls"
        generate_certificates(tls_dir, ["coordinator", *names],
                              ips=sorted({"127.0.0.1", host}), overwrite=True)
        tls_args = ["--tls-dir", str(tls_dir)]
        # status polling as each agent's operator: its own certificate (loss and accuracy are
        # shown to nobody else)
        monitor = {name: TlsConfig.from_dir(tls_dir, name) for name in names}
    agent_args = list(tls_args)
    if checkpoint_every is not None:
        agent_args += ["--checkpoint-every", str(checkpoint_every),
                       "--keep-rounds", str(max(128, 2 * checkpoint_every + 3))]
    debug: list[str] = []
    if insecure_noise_seed is not None:
        debug += ["--insecure-noise-seed", str(insecure_noise_seed)]
    if debug_expose_mask:
        debug.append("--debug-expose-mask")
    if allow_insecure_keys:
        debug.append("--allow-insecure-keys")
        run_args.append("--allow-insecure-keys")

    children: list[Child] = []
    bar = None
    try:
        coordinator = _spawn(
            "coordinator", ["coordinator", "--listen", f"{host}:0", *tls_args, *run_args], folder
        )
        children.append(coordinator)
        coord_port = _wait_port(coordinator, start_timeout, problem=problem_future)
        agents = [
            _spawn(name, ["agent", "--name", name, "--listen", f"{host}:0",
                          "--coordinator", f"{host}:{coord_port}",
                          "--results", str(folder), *agent_args, *debug], folder)
            for name in names
        ]
        children += agents
        addresses = {a.name: f"{host}:{_wait_port(a, start_timeout, problem=problem_future)}"
                     for a in agents}
        print(f"efpsn up: coordinator on {host}:{coord_port}; {config.agents} agents "
              f"({config.topology}); {'PLAINTEXT' if insecure else 'mutual TLS'}; "
              f"results in {folder}", flush=True)
        bar = tqdm(total=config.iterations, disable=quiet, unit="round", desc="network")
        assigned: set[str] = set()
        while any(a.process.poll() is None for a in agents):
            failed = [a for a in agents if a.process.poll() not in (None, 0)]
            if problem_future.done() or failed:
                _raise_problem_error(problem_future)
            if failed:
                f = failed[0]
                raise RuntimeError(
                    f"{f.name} failed (exit {f.process.returncode}):\n{f.log_tail()}"
                )
            # After bootstrap the agents no longer need the coordinator.
            if coordinator.process.poll() not in (None, 0) and assigned != set(names):
                raise RuntimeError(f"coordinator failed:\n{coordinator.log_tail()}")
            running = {a.name: addresses[a.name] for a in agents if a.process.poll() is None}
            statuses = asyncio.run(fetch_statuses(running, tls=monitor))
            assigned |= {n for n, s in statuses.items() if s.run_id}
            if statuses:
                rounds = min(s.round for s in statuses.values())
                bar.update(max(0, rounds - bar.n))
                losses = [s.loss for s in statuses.values() if not math.isnan(s.loss)]
                accs = [s.accuracy for s in statuses.values() if not math.isnan(s.accuracy)]
                if losses:
                    bar.set_postfix(loss=f"{statistics.fmean(losses):.4f}",
                                    acc=f"{statistics.fmean(accs):.3f}")
            time.sleep(0.5)
        failed = [a for a in agents if a.process.returncode != 0]
        if failed:
            _raise_problem_error(problem_future)
            f = failed[0]
            raise RuntimeError(f"{f.name} failed (exit {f.process.returncode}):\n{f.log_tail()}")
        bar.update(config.iterations - bar.n)
        bar.close()
        bar = None
        problem, x_star = problem_future.result()
        summary = summarize(problem, folder, names, x_star=x_star)
        summary["wall_seconds"] = time.perf_counter() - started
        summary["timings"] = network_timings(summary["agents"], started_at=started_at)
        coordinator_rss = peak_rss_mb_of(coordinator.process.pid)
        if coordinator_rss is not None:
            summary["timings"]["coordinator_peak_rss_mb"] = coordinator_rss
        write_json(folder / "summary.json", summary)
        for line in summary["problems"]:
            print(f"efpsn up: {line}", file=sys.stderr)
        print("final: " + format_metrics(summary["final"]))
        print(f"wall time {summary['wall_seconds']:.1f}s; summary in {folder / 'summary.json'}")
        return summary
    finally:
        if bar is not None:
            bar.close()
        stop_children(children)
        pool.shutdown(wait=True, cancel_futures=True)


def _public_problem(config: RunConfig) -> tuple[Any, Any]:
    """The public problem and, for logistic regression, x* (both for the summary)."""
    from efpsn.problem import build_problem
    from efpsn.runtime import configure_threads

    configure_threads()
    problem = build_problem(config)
    if problem.config.task != "logreg":
        return problem, None
    from efpsn.tasks import centralized_optimum

    return problem, centralized_optimum(problem.task, problem.shards).x


def _raise_problem_error(future: Future[Any]) -> None:
    """If the public problem could not be built, that error (a bad run parameter) is the one to
    report: every agent fails on it too."""
    if future.done() or future.running():
        error = future.exception()  # waits for a build under way (the agents failed on it?)
        if error is not None:
            raise error


def peak_rss_mb_of(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of a running process in MB; None where /proc has none."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def network_timings(agents: dict[str, Any], *, started_at: float) -> dict[str, float]:
    """Start-up (from launch to the last agent's first round), phase I and phase II (slowest
    agent) from what the agents recorded."""
    timings = [a["timings"] for a in agents.values()]
    out = {
        "phase1_seconds": max(t.get("phase1_seconds", 0.0) for t in timings),
        "phase2_seconds": max(t.get("phase2_seconds", 0.0) for t in timings),
    }
    if all("peak_rss_mb" in t for t in timings):
        out["agent_peak_rss_mb"] = max(t["peak_rss_mb"] for t in timings)
    if all("phase2_started_at" in t for t in timings):
        out["startup_seconds"] = max(t["phase2_started_at"] for t in timings) - started_at
    return out


def load_agent_results(folder: Path, names: list[str]) -> tuple[list[dict], list[Any]]:
    """Each agent's result.json and final iterate (model.npy, read without pickle) as tensors."""
    import numpy as np
    import torch

    results, xs = [], []
    for name in names:
        sub = folder / name
        results.append(json.loads((sub / "result.json").read_text()))
        xs.append(torch.from_numpy(np.load(sub / "model.npy", allow_pickle=False)))
    return results, xs


def check_results(results: list[dict], *, iterations: int) -> list[str]:
    """What is wrong with the agents' results as one run (empty: nothing): every agent must
    report the same run and have finished its last round."""
    problems = []
    runs = sorted({str(r.get("run_id")) for r in results})
    if len(runs) != 1:
        problems.append(f"the agents report different runs: {', '.join(runs)}")
    for r in results:
        done = r.get("final", {}).get("round")
        if done != iterations:
            problems.append(f"{r.get('name')} stopped at round {done} of {iterations}")
    return problems


def summarize(problem: Any, folder: Path, names: list[str], *, x_star: Any = None
              ) -> dict[str, Any]:
    """Network-level metrics of the agents' final iterates (same function as the simulator);
    x_star: the centralized optimum, for the deviation ||x_bar - x*|| (None: not reported)."""
    from efpsn.metrics import evaluate

    results, xs = load_agent_results(folder, names)
    final = evaluate(problem, xs, x_star=x_star)
    problems = check_results(results, iterations=problem.config.iterations)
    return {
        "ok": not problems,
        "problems": problems,
        "settings": problem.config.to_dict(),
        "run_id": results[0]["run_id"],
        "final": final,
        "agents": {r["name"]: {"final": r["final"], "timings": r["timings"]} for r in results},
    }
