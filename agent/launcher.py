"""`efpsn up`: a coordinator and n agents as separate local processes, watched to the end."""

from __future__ import annotations

import asyncio
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

from agent.status import StatusPoller
from agent.summary import (
    format_reports,
    network_timings,
    summarize,
    summarize_reports,
)
from efpsn.cli_common import format_metrics, write_json
from efpsn.cli_services import check_key_policy, config_to_args
from efpsn.config import LOCAL_DATA, RunConfig
from efpsn.runtime import peak_rss_mb
from efpsn.wire.records import Phase
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


def _wait_port(child: Child, timeout: float, *, problem: ProblemBuild | None = None) -> int:
    """The port `child` serves on, once it wrote it (even if it has exited since: what it does
    after serving is the caller's to watch); if it exits first, a bad run parameter (the public
    problem cannot be built) is the error reported, else its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = child.process.poll() is not None
        try:
            return int(child.port_file.read_text())  # read after poll(): no exit is missed
        except (OSError, ValueError):
            pass
        if exited:
            if problem is not None:
                problem.raise_error()
            raise RuntimeError(
                f"{child.name} exited with code {child.process.returncode} before serving:\n"
                f"{child.log_tail()}"
            )
        time.sleep(0.05)
    raise TimeoutError(f"{child.name} did not start serving within {timeout:.0f}s")


def _first_cause(agents: list[Child], failed: list[Child], *, settle: float = 3.0) -> Child:
    """The agent that failed first: when one agent cannot take part the coordinator cancels
    the run and the others exit too, naming it; report the one whose error is its own."""
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline and any(a.process.poll() is None for a in agents):
        time.sleep(0.1)
    failed = [a for a in agents if a.process.poll() not in (None, 0)] or failed
    own = [a for a in failed if "the run is cancelled" not in a.log_tail(1)]
    return (own or failed)[0]


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
    data_dir: Path | None = None,
    holdout: float = 0.2,
    label_column: str = "label",
) -> dict[str, Any]:
    """Run a whole network locally; return the summary (also written to RESULTS/summary.json).

    Mutual TLS by default: a fresh CA and one certificate per process go to RESULTS/tls
    (insecure=True runs plaintext). The coordinator may exit once every agent is assigned.
    With `data_dir` (config.data "local"), agent K reads only DATA_DIR/agentK/train.npz (and
    the public DATA_DIR/test.npz); this process never reads the private files."""
    from tqdm import tqdm

    check_key_policy(config, allow_insecure_keys=allow_insecure_keys)
    local_mode = config.data == LOCAL_DATA
    if local_mode != (data_dir is not None):
        raise ValueError("efpsn up: give --data-dir DIR for local data (and only then)")
    started, started_at = time.perf_counter(), time.time()
    # The launcher needs the public problem only for the summary (no private data is read
    # here): built once the agents are past their start-up (below); a bad parameter still
    # stops everything with this error, not a child's log.
    build = ProblemBuild(config, local=local_mode)
    folder = results or Path("results") / time.strftime("run-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"agent{i + 1}" for i in range(config.agents)]
    run_args = config_to_args(config)
    test_path = data_dir / "test.npz" if data_dir is not None else None
    if test_path is not None and not test_path.is_file():
        test_path = None
    data_args: dict[str, list[str]] = {name: [] for name in names}
    if data_dir is not None:
        for name in names:
            data_args[name] = ["--data", str(data_dir / name / "train.npz"), "--holdout",
                               repr(holdout), "--label-column", label_column]
            if test_path is not None:
                data_args[name] += ["--test-data", str(test_path)]
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
    # one event loop for the whole run, so the poller's channels stay open between polls
    runner = asyncio.Runner()
    poller = StatusPoller(monitor)
    bar = None
    try:
        coordinator = _spawn(
            "coordinator", ["coordinator", "--listen", f"{host}:0", *tls_args, *run_args], folder
        )
        children.append(coordinator)
        # The agents start with the coordinator, not after it: each reads the coordinator's
        # port from its port file once its own imports (torch) are done.
        agents = [
            _spawn(name, ["agent", "--name", name, "--listen", f"{host}:0",
                          "--coordinator", f"{host}:0",
                          "--coordinator-port-file", str(coordinator.port_file),
                          "--results", str(folder), *agent_args, *data_args[name], *debug],
                   folder)
            for name in names
        ]
        children += agents
        coord_port = _wait_port(coordinator, start_timeout, problem=build)
        addresses = {a.name: f"{host}:{_wait_port(a, start_timeout, problem=build)}"
                     for a in agents}
        print(f"efpsn up: coordinator on {host}:{coord_port}; {config.agents} agents "
              f"({config.topology}); {'PLAINTEXT' if insecure else 'mutual TLS'}; "
              f"results in {folder}", flush=True)
        bar = tqdm(total=config.iterations, disable=quiet, unit="round", desc="network")
        assigned: set[str] = set()
        while any(a.process.poll() is None for a in agents):
            failed = [a for a in agents if a.process.poll() not in (None, 0)]
            if failed:
                build.raise_error()
                f = _first_cause(agents, failed)
                raise RuntimeError(
                    f"{f.name} failed (exit {f.process.returncode}):\n{f.log_tail()}"
                )
            # After bootstrap the agents no longer need the coordinator.
            if coordinator.process.poll() not in (None, 0) and assigned != set(names):
                raise RuntimeError(f"coordinator failed:\n{coordinator.log_tail()}")
            running = {a.name: addresses[a.name] for a in agents if a.process.poll() is None}
            statuses = runner.run(poller.poll(running))
            assigned |= {n for n, s in statuses.items() if s.run_id}
            if assigned == set(names) and all(s.phase >= Phase.OPTIMIZE
                                              for s in statuses.values()):
                build.start()  # every agent is in phase II: start-up is over
            if statuses:
                rounds = min(s.round for s in statuses.values())
                bar.update(max(0, rounds - bar.n))
                losses = [s.loss for s in statuses.values() if not math.isnan(s.loss)]
                accs = [s.accuracy for s in statuses.values() if not math.isnan(s.accuracy)]
                shown = {}
                if losses:
                    shown["loss"] = f"{statistics.fmean(losses):.4f}"
                if accs:  # agent-local data: public-test accuracy only (or nothing)
                    shown["acc"] = f"{statistics.fmean(accs):.3f}"
                if shown:
                    bar.set_postfix(**shown)
            time.sleep(0.5)
        failed = [a for a in agents if a.process.returncode != 0]
        if failed:
            build.raise_error()
            f = failed[0]
            raise RuntimeError(f"{f.name} failed (exit {f.process.returncode}):\n{f.log_tail()}")
        bar.update(config.iterations - bar.n)
        bar.close()
        bar = None
        problem, x_star = build.result()
        if local_mode:
            summary = summarize_reports(problem, folder, names, test_path=test_path)
        else:
            summary = summarize(problem, folder, names, x_star=x_star)
        summary["wall_seconds"] = time.perf_counter() - started
        summary["timings"] = network_timings(summary["agents"], started_at=started_at)
        coordinator_rss = peak_rss_mb(coordinator.process.pid)
        if coordinator_rss is not None:
            summary["timings"]["coordinator_peak_rss_mb"] = coordinator_rss
        write_json(folder / "summary.json", summary)
        for line in summary["problems"]:
            print(f"efpsn up: {line}", file=sys.stderr)
        print("final: " + (format_reports(summary["final"], public_test=test_path is not None)
                           if local_mode
                           else format_metrics(summary["final"])))
        print(f"wall time {summary['wall_seconds']:.1f}s; summary in {folder / 'summary.json'}")
        return summary
    finally:
        if bar is not None:
            bar.close()
        stop_children(children)
        runner.run(poller.close())
        runner.close()
        build.shutdown()


def _public_problem(config: RunConfig, *, local: bool) -> tuple[Any, Any]:
    """The public problem and, for logistic regression on public data, x* (for the summary).
    With agent-local data only the public part (schema, model, basis) exists here."""
    from efpsn.problem import build_problem
    from efpsn.runtime import configure_threads

    configure_threads()
    problem = build_problem(config, local={} if local else None)
    if local or problem.config.task != "logreg":
        return problem, None
    from efpsn.tasks import centralized_optimum

    return problem, centralized_optimum(problem.task, problem.shards).x


class ProblemBuild:
    """The public problem and x* for the summary, built in a thread of the launcher once the
    agents are in phase II (start()), or when first needed.

    Not earlier: on a small machine the build (torch, the data set, x*) would take CPU from the
    agents' start-up, which is the network's critical path, and nice cannot lower a thread
    below the agents when the kernel groups CPU time by session (autogroup; the agents run in
    sessions of their own)."""

    def __init__(self, config: RunConfig, *, local: bool) -> None:
        self._config, self._local = config, local
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="efpsn-up-problem")
        self._future: Future[tuple[Any, Any]] | None = None

    def start(self) -> Future[tuple[Any, Any]]:
        if self._future is None:
            self._future = self._pool.submit(_public_problem, self._config, local=self._local)
        return self._future

    def result(self) -> tuple[Any, Any]:
        return self.start().result()

    def raise_error(self) -> None:
        """Called when a child failed: if the public problem cannot be built (a bad run
        parameter, which every agent fails on too), raise that error, the one to report."""
        error = self.start().exception()  # waits for the build
        if error is not None:
            raise error

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
