"""`efpsn up` (agent/launcher.py) on the paths a user hits: a finished run (default results
folder, summary.json, printed metrics), an agent dying mid-run, the coordinator dying before
assignment, a child that never serves, Ctrl-C, and the SIGKILL after the grace period.

Runs are short (a few rounds, 512-bit test keys through the hidden --allow-insecure-keys) and
every test checks that nothing it started is left running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from commands import efpsn_argv
from localnet import crash_at

from efpsn.launch.processes import Child, stop_children, wait_port
from efpsn.launch.summary import check_results, format_metrics

pytestmark = pytest.mark.timeout(300)

NAMES = [f"agent{i}" for i in range(1, 6)]
FAST = ("--key-bits", "512", "--allow-insecure-keys", "--quiet", "--insecure-noise-seed", "3")




def leftovers(marker: str) -> str:
    """Processes whose command line mentions `marker` (a test's own temporary folder)."""
    out = subprocess.run(["pgrep", "-af", "--", marker], check=False, capture_output=True, text=True)
    return "\n".join(line for line in out.stdout.splitlines() if "pgrep" not in line)


def wait_file(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text()
            if text.strip():
                return text
        except OSError:
            pass
        assert proc.poll() is None, f"exited with {proc.returncode} while waiting for {path}"
        time.sleep(0.01)
    raise TimeoutError(path)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


# ------------------------------------------------------------------------ a run that finishes


@pytest.mark.process
def test_up_writes_a_default_results_folder_and_prints_its_metrics(tmp_path: Path) -> None:
    # prepare: no --results, so the run goes to ./results/run-TIME of the working directory
    # execute (the paper's phase I, unpacked Paillier, --no-packed: one ciphertext per
    # coefficient and neighbour, on the last layer's biases with a fixed mask)
    out = subprocess.run(
        efpsn_argv("up", "--iterations", "4", "--eval-every", "2", "--no-packed", "--refresh", "never",
              "--selection", "last-bias", *FAST),
        cwd=tmp_path, check=False, capture_output=True, text=True, timeout=280,
    )
    # assert
    assert out.returncode == 0, out.stderr[-3000:]
    runs = list((tmp_path / "results").iterdir())
    assert len(runs) == 1 and re.fullmatch(r"run-\d{8}-\d{6}", runs[0].name), runs
    folder = Path("results") / runs[0].name
    lines = out.stdout.splitlines()
    assert lines[0].startswith("efpsn up: coordinator on 127.0.0.1:")
    assert lines[0].endswith(f"5 agents (ring); mutual TLS; results in {folder}")
    summary = json.loads((tmp_path / folder / "summary.json").read_text())
    assert summary["ok"] is True and summary["problems"] == []
    assert lines[1] == "final: " + format_metrics(summary["final"])  # printed = written
    assert re.fullmatch(rf"wall time [\d.]+s; summary in {re.escape(str(folder / 'summary.json'))}"
                        rf"; picture {re.escape(str(folder / 'training.png'))}", lines[2]), lines[2]
    assert (tmp_path / folder / "training.png").stat().st_size > 20_000  # the run's picture
    # what the run protects, then the last line: the convergence certificate, after 4 rounds
    # not converged, with advice
    assert lines[3] == summary["privacy"]["line"] and lines[3].startswith("privacy: "), lines
    assert lines[4] == summary["convergence"]["line"] and len(lines) == 5, lines
    assert lines[4].startswith("NOT converged") and "--iterations" in lines[4], lines[4]
    assert sorted(summary["agents"]) == NAMES and summary["settings"]["packed"] is False
    # timings: every figure the benchmarks and the README read from summary.json is there
    timings = summary["timings"]
    wall = float(lines[2].split()[2].rstrip("s;"))
    assert 0 < timings["startup_seconds"] < wall, timings
    assert 0 < timings["phase1_seconds"] and 0 < timings["phase2_seconds"] < wall, timings
    assert 0 < timings["agents_cpu_seconds_per_round"] < 5 * timings["phase2_seconds"], timings
    assert timings["agent_peak_rss_mb"] > 100 and 0 < timings["coordinator_peak_rss_mb"] < 150
    # forked from one fork server: each agent's proportional share is below what it holds
    assert 0 < timings["agent_pss_mb_median"] < timings["agent_peak_rss_mb"], timings
    assert timings["agents_pss_mb_total"] >= 5 * min(
        summary["agents"][n]["timings"]["pss_mb"] for n in NAMES)
    for name in NAMES:
        result = json.loads((tmp_path / folder / name / "result.json").read_text())
        assert result["final"]["round"] == 4 and result["run_id"] == summary["run_id"]
        # unpacked: N = 11 encryptions per neighbour (2 on a ring) and N decryptions (the basis
        # of the 10 last-layer biases: every affine function)
        assert result["timings"]["encryptions"] == 22 and result["timings"]["decryptions"] == 11
    assert leftovers(str(tmp_path)) == ""


def test_check_results_names_what_is_wrong() -> None:
    good = [{"name": n, "run_id": "r1", "final": {"round": 10}} for n in NAMES]
    assert check_results(good, iterations=10) == []
    bad = [dict(r) for r in good]
    bad[1] = {**bad[1], "run_id": "r2"}
    bad[3] = {**bad[3], "final": {"round": 7}}
    assert check_results(bad, iterations=10) == [
        "the agents report different runs: r1, r2", "agent4 stopped at round 7 of 10"]
    # a departure in the stop's last window: each agent ends at the stop or the check round
    window = [{**r, "final": {"round": t}} for r, t in zip(good, (10, 10, 8, 8, 9),
                                                            strict=False)]
    assert check_results(window, iterations=20, early=True, ends={10, 8}) == [
        "agent5 stopped at round 9, neither of [8, 10]"]


# ------------------------------------------------------------------------ runs that fail


@pytest.mark.process
def test_agent_dying_mid_run_stops_the_network_with_its_log(tmp_path: Path) -> None:
    # prepare: agent3 kills itself (SIGKILL) at round 2 of 400 (tests/crash_hook), with
    # departures off (--departure-deadline 0; on, the others finish without it:
    # tests/test_departure_network.py)
    env = {**os.environ, **crash_at(2, name="agent3")}
    started = time.monotonic()
    # execute
    out = subprocess.run(
        efpsn_argv("up", "--iterations", "400", "--results", str(tmp_path), "--departure-deadline",
              "0", *FAST),
        env=env, check=False, capture_output=True, text=True, timeout=280,
    )
    # assert: agent3 named at once, with what follows; then one error naming agent3 and its
    # exit, the others stopped by the launcher
    assert out.returncode == 2, out.stderr[-3000:]
    said = [line for line in out.stderr.replace("\r", "\n").splitlines()
            if line.startswith("efpsn up: agent3")]
    assert len(said) == 1 and re.fullmatch(
        # the phase and round as last polled (every half second): agent3 dies at round 2, often
        # before a poll saw phase II, sometimes before one saw phase I
        r"efpsn up: agent3 \(pid \d+\) was killed by SIGKILL( at round [0-2]| before it "
        r"reported phase I or II|, last seen in phase I); departures are off "
        r"\(--departure-deadline 0\): the run stops, every other process is stopped",
        said[0]), out.stderr[-3000:]
    error = out.stderr[out.stderr.index("efpsn: error: "):]
    assert error.startswith("efpsn: error: agent3: exited with code -9 without recording "
                            "why"), out.stderr[-3000:]
    assert "agent3 is agent index 2" in out.stderr  # the tail of agent3's log comes with it
    assert leftovers(str(tmp_path)) == ""
    for name in ("agent1", "agent2", "agent4", "agent5"):
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        assert "interrupted" in log.splitlines()[-1], log[-1000:]  # SIGTERM, not a timeout
    assert not (tmp_path / "summary.json").exists()
    assert time.monotonic() - started < 250


@pytest.mark.process
def test_coordinator_dying_before_assignment_fails_the_launch(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        efpsn_argv("up", "--iterations", "4", "--results", str(tmp_path), *FAST),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        # the coordinator is killed once it serves (its port file exists) and the agents are
        # started (their logs exist), long before an agent can have imported torch and registered
        wait_file(tmp_path / "ports" / "coordinator", proc)
        deadline = time.monotonic() + 120
        while not (tmp_path / "logs" / "agent5.log").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.005)
        pid = int(leftovers(f"efpsn coordinator {tmp_path}").split()[0])  # its process title
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=240)
    finally:
        stop(proc)
    assert proc.returncode == 2, err[-3000:]
    assert err.startswith("efpsn: error: the coordinator failed (exit -9):"), err[-3000:]
    assert leftovers(str(tmp_path)) == ""
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.process
def test_child_exiting_before_serving_is_reported_with_its_log(tmp_path: Path) -> None:
    # a --host this machine does not have: the coordinator cannot bind and exits
    out = subprocess.run(
        efpsn_argv("up", "--iterations", "4", "--host", "192.0.2.1", "--results", str(tmp_path),
              *FAST),
        check=False, capture_output=True, text=True, timeout=280,
    )
    assert out.returncode == 2
    first = out.stderr.splitlines()[0]
    assert first == "efpsn: error: coordinator exited with code 2 before serving:", out.stderr
    assert "python -m coordinator: error: could not listen on 192.0.2.1:0" in out.stderr
    assert leftovers(str(tmp_path)) == ""
    # the agents start with the coordinator, but none gets past waiting for its port
    assert not any((tmp_path / n).exists() for n in NAMES)


@pytest.mark.process
def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    stdout = tmp_path / "stdout"
    with open(stdout, "w") as sink:
        proc = subprocess.Popen(
            efpsn_argv("up", "--iterations", "100000", "--eval-every", "100000", "--results",
                  str(tmp_path / "run"), *FAST),
            stdout=sink, stderr=subprocess.PIPE, text=True,
        )
    try:
        wait_file(stdout, proc, timeout=240)  # every process serves: the run is under way
        time.sleep(1.0)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - started
    finally:
        stop(proc)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == (
        "efpsn up: stopped by SIGINT; every process it started is stopped (exit 130)"), err
    assert leftovers(str(tmp_path)) == ""
    assert elapsed < 30  # SIGTERM, 5 s of grace, then SIGKILL at the latest
    for name in NAMES:
        log = (tmp_path / "run" / "logs" / f"{name}.log").read_text()
        assert log.splitlines()[-1] == "python -m agent: interrupted", log[-1000:]


# ------------------------------------------------------------------------ children, directly


def _child(tmp_path: Path, code: str) -> Child:
    log_path = tmp_path / "child.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-c", code], stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return Child(name="child", process=process, log_path=log_path,
                 port_file=tmp_path / "child.port")


@pytest.mark.process
def test_child_that_never_serves_times_out(tmp_path: Path) -> None:
    child = _child(tmp_path, "import time; time.sleep(60)")
    try:
        with pytest.raises(TimeoutError, match="child did not start serving within 1s"):
            wait_port(child, timeout=1.0)
    finally:
        stop_children([child], grace=0.1)
    assert child.process.returncode == -signal.SIGTERM


@pytest.mark.process
def test_stop_children_sigkills_what_ignores_sigterm(tmp_path: Path) -> None:
    code = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    stubborn = _child(tmp_path, code)
    deadline = time.monotonic() + 60
    while "ready" not in stubborn.log_tail():
        assert time.monotonic() < deadline and stubborn.process.poll() is None
        time.sleep(0.05)
    started = time.monotonic()
    stop_children([stubborn], grace=1.0)
    assert stubborn.process.returncode == -signal.SIGKILL
    assert 0.9 < time.monotonic() - started < 20
