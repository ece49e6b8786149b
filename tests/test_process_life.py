"""Nothing of a run outlives `efpsn up`: SIGTERM or SIGHUP stop every process it started (fork
server, forked agents, coordinator, `--no-fork` agents) and it exits 128 + the signal saying so;
killed -9, it stops nothing itself, and its children notice (efpsn/process/lifeline.py: the pipe it
alone writes to, and for its direct children the parent-death signal) and stop.

Real processes, a long run (20,000 rounds on wine in 4 private folders: about a minute and a
half here) signalled in the middle; every process of the run, found by walking /proc from the
launcher and by the run's folder on the command lines, must be gone within 10 s. Whatever a
test started is killed at its end, also when it fails. After kill -9 the test is the orphans'
subreaper, so a failure says how each process of the run ended (exit code or signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from commands import efpsn_argv
from test_launcher import leftovers, stop

from efpsn.launch.forking import set_subreaper, subreaper
from efpsn.process.lifeline import ENV, Lifeline, launcher_gone
from efpsn.process.signals import Stopped, StopSignals, signals_held

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")]

AGENTS = [f"agent{k}" for k in range(1, 5)]
LONG = ("--iterations", "20000", "--key-bits", "512", "--allow-insecure-keys", "--quiet")
GONE_WITHIN = 10.0




def parents() -> dict[int, int]:
    """pid -> parent pid of every process now (zombies left out: they run nothing)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(entry.name)] = int(fields[1])
    return out


def descendants(pid: int) -> set[int]:
    tree, found, todo = parents(), set(), [pid]
    while todo:
        parent = todo.pop()
        children = {p for p, pp in tree.items() if pp == parent} - found
        found |= children
        todo.extend(children)
    return found


def marked(marker: str) -> set[int]:
    """Processes whose command line names `marker` (forked agents carry their fork server's,
    which names the run's folder), zombies left out."""
    alive = parents()
    return {int(line.split()[0]) for line in leftovers(marker).splitlines()} & set(alive)


def running(pids: set[int]) -> set[int]:
    return pids & set(parents())


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def label(line: bytes) -> str:
    """A process of the run by its command line: the agent it runs, else its module."""
    words = line.decode(errors="replace").split("\0")
    named = [n for n in AGENTS if any(w.endswith(f"/ports/{n}") for w in words)]
    modules = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]
    return (named or modules or words)[0]


def reap(pids: set[int], timeout: float = 5.0) -> dict[int, str]:
    """pid -> how it ended (exit code or signal), for those of `pids` that are this process's
    children, each waited for up to `timeout` seconds in all (none is left a zombie)."""
    ends, todo = {}, set(pids)
    deadline = time.monotonic() + timeout
    while todo:
        for pid in list(todo):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours (or already reaped)
                todo.discard(pid)
                continue
            if done:
                code = os.waitstatus_to_exitcode(status)
                ends[pid] = f"exit {code}" if code >= 0 else signal.Signals(-code).name
                todo.discard(pid)
        if not todo or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return ends


def wait_mid_run(run: Path, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    """Until every agent logged a phase II round (the network is training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = [run / "logs" / f"{name}.log" for name in AGENTS]
        if all(p.exists() and f"{p.stem}: round " in p.read_text(errors="replace")
               for p in logs):
            return
        assert proc.poll() is None, f"efpsn up exited with {proc.returncode} before the run"
        time.sleep(0.2)
    raise TimeoutError("the agents did not reach phase II")


def start_up(wine: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    run = tmp_path / "run"
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(efpsn_argv("up", "--data-dir", str(wine), "--results", str(run),
                                      *LONG, *extra),
                                stdout=subprocess.DEVNULL, stderr=err)
    return proc, run


def assert_all_gone(pids: set[int], marker: str, signalled: float) -> None:
    deadline = signalled + GONE_WITHIN
    while time.monotonic() < deadline and (running(pids) or marked(marker)):
        time.sleep(0.1)
    assert not running(pids) and not marked(marker), (
        f"{time.monotonic() - signalled:.1f}s after the signal still running: "
        f"{running(pids) | marked(marker)}\n{leftovers(marker)}")


@pytest.mark.process
@pytest.mark.parametrize(("sig", "fork"), [
    (signal.SIGTERM, True), (signal.SIGKILL, True), (signal.SIGTERM, False),
    (signal.SIGKILL, False), (signal.SIGHUP, True),
], ids=["sigterm-forked", "sigkill-forked", "sigterm-no-fork", "sigkill-no-fork",
        "sighup-forked"])
def test_nothing_of_a_run_outlives_efpsn_up(sig: int, fork: bool, wine: Path,
                                            tmp_path: Path) -> None:
    # prepare: a run well under way
    was = subreaper()
    assert was is not None and set_subreaper(1)  # the run's orphans become this test's children
    seen: set[int] = set()
    named: dict[int, str] = {}
    proc: subprocess.Popen | None = None
    try:
        proc, run = start_up(wine, tmp_path, *(() if fork else ("--no-fork",)))
        wait_mid_run(run, proc)
        seen = descendants(proc.pid) | marked(str(tmp_path))
        seen.discard(proc.pid)
        agents = {pid for pid in seen if b"agent" in cmdline(pid)}
        named = {pid: label(cmdline(pid)) for pid in seen}
        assert len(agents) >= 4, (seen, leftovers(str(tmp_path)))  # every agent is seen
        # execute
        proc.send_signal(sig)
        signalled = time.monotonic()
        code = proc.wait(timeout=60)
        # assert: every process of the run is gone within 10 s of the signal
        assert_all_gone(seen, str(tmp_path), signalled)
    finally:
        if proc is not None:
            stop(proc)
        kill_all(seen | marked(str(tmp_path)))
        ends = reap(seen)
        set_subreaper(was)
    err = (tmp_path / "stderr").read_text()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        # each ended in order (coordinator 0, agents 130) or by the lifeline's grace SIGKILL;
        # never by a later SIGTERM halfway through its exit, nor by a crash
        odd = {named.get(pid, pid): end for pid, end in ends.items()
               if end not in ("exit 0", "exit 130", "SIGKILL")}
        assert not odd, odd
        for name in AGENTS:  # each noticed (forked: through the pipe alone; with --no-fork
            # the parent-death signal may come first, said at once by its stop handler)
            log = (run / "logs" / f"{name}.log").read_text()
            noticed = "the launcher (efpsn up) is gone" in log
            assert noticed or (not fork and f"{name}: SIGTERM: stopping" in log), (
                f"{name}: {log[-1000:]}\nends: "
                f"{ {named.get(pid, pid): end for pid, end in ends.items()} }")
    else:
        assert code == 128 + sig, err
        name = signal.Signals(sig).name
        assert err.strip().splitlines()[-1] == (
            f"efpsn up: stopped by {name}; every process it started is stopped "
            f"(exit {128 + sig})"), err
        assert "Traceback" not in err, err


@pytest.mark.process
def test_sigterm_while_the_fork_server_loads_stops_it_at_once(wine: Path,
                                                              tmp_path: Path) -> None:
    """Stopped before any agent is forked: the fork server, still importing torch, is killed
    rather than waited for; the coordinator is stopped too."""
    proc, run = start_up(wine, tmp_path)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not any(b"agent.forkserver" in cmdline(pid) for pid in descendants(proc.pid)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        seen = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = proc.wait(timeout=60)
        assert_all_gone(seen, str(tmp_path), signalled)
    finally:
        stop(proc)
        kill_all(seen | marked(str(tmp_path)))
    assert code == 143, (tmp_path / "stderr").read_text()
    assert not (run / "logs" / "agent1.log").exists() or "round" not in (
        run / "logs" / "agent1.log").read_text()


# ------------------------------------------------------------------------ the launcher's signals


def test_a_signal_during_the_stop_waits_for_its_end_and_only_the_first_counts() -> None:
    finished, before = [], signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as stopped, StopSignals("efpsn up"):
        with signals_held():  # as the launcher's stop of its children
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one: ignored
            time.sleep(0.05)
            finished.append("stop")
        finished.append("never")
    assert finished == ["stop"]
    assert stopped.value.exit_code == 129 and str(stopped.value) == (
        "efpsn up: stopped by SIGHUP; every process it started is stopped (exit 129)")
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers are put back


# ------------------------------------------------------------------------ the lifeline alone

CHILD = """
import signal, sys, time
from efpsn.process.lifeline import hold_to_launcher
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(hold_to_launcher(grace=1.0), flush=True)
time.sleep(120)
"""


@pytest.mark.process
@pytest.mark.parametrize(("mode", "ends_by"), [("obey", -signal.SIGTERM),
                                               ("ignore", -signal.SIGKILL)])
def test_a_child_stops_when_its_lifeline_ends(mode: str, ends_by: int) -> None:
    """The pipe's end reaches a process whatever its parent: SIGTERM, then SIGKILL after the
    grace for one that ignores SIGTERM."""
    lifeline = Lifeline()
    # the launcher pid is not this child's parent: no parent-death signal, the pipe only
    env = {**os.environ, ENV: lifeline.env()[ENV].split()[0]}
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode], env=env, text=True,
                             stdout=subprocess.PIPE, pass_fds=lifeline.pass_fds)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "True"
        time.sleep(0.5)
        assert child.poll() is None  # the launcher lives: so does the child
        lifeline.close()
        started = time.monotonic()
        assert child.wait(timeout=20) == ends_by
        elapsed = time.monotonic() - started
        assert elapsed < 3.0 if mode == "obey" else 0.9 < elapsed < 10.0, elapsed
    finally:
        lifeline.close()
        stop(child)


TOLD = """
import os, signal, sys, time
from efpsn.process.lifeline import hold_to_launcher, launcher_gone
def told(signum, frame):
    print("SIGTERM", launcher_gone(), flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, told)
print(hold_to_launcher(grace=5.0), launcher_gone(), flush=True)
time.sleep(120)
"""


@pytest.mark.process
def test_a_child_knows_its_launcher_is_gone_when_its_stop_signal_comes() -> None:
    """What the agents' stop line says (efpsn.wire.net.install_stop_signals): False while the
    launcher lives, True in the handler of the SIGTERM its end brings."""
    assert not launcher_gone()  # no lifeline held here
    lifeline = Lifeline()
    env = {**os.environ, ENV: lifeline.env()[ENV].split()[0]}
    child = subprocess.Popen([sys.executable, "-c", TOLD], env=env, text=True,
                             stdout=subprocess.PIPE, pass_fds=lifeline.pass_fds)
    try:
        assert child.stdout is not None and child.stdout.readline().split() == ["True", "False"]
        lifeline.close()
        assert child.stdout.readline().split() == ["SIGTERM", "True"]
        assert child.wait(timeout=20) == 0
    finally:
        lifeline.close()
        stop(child)


@pytest.mark.process
def test_without_a_lifeline_nothing_is_watched() -> None:
    code = "from efpsn.process.lifeline import hold_to_launcher; print(hold_to_launcher())"
    for value in (None, "not-a-number", "987"):  # unset, garbage, a descriptor not open
        env = {k: v for k, v in os.environ.items() if k != ENV}
        if value is not None:
            env[ENV] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        assert out.stdout.strip() == "False", (value, out)


LAUNCHER = """
import os, subprocess, sys, time
from efpsn.process.lifeline import ENV
fd = int(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", sys.argv[2], "obey"], pass_fds=(fd,),
                         env={**os.environ, ENV: f"{fd} {os.getpid()}"})
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.process
def test_a_direct_child_gets_the_parent_death_signal() -> None:
    """The launcher's own children need not wait for the pipe: here it never ends (this test
    holds its write end), and the child still stops when its parent is killed -9."""
    lifeline = Lifeline()
    fd = lifeline.pass_fds[0]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(fd), CHILD], text=True,
                                stdout=subprocess.PIPE, pass_fds=(fd,))
    pid = 0
    try:
        assert launcher.stdout is not None
        pid = int(launcher.stdout.readline())
        deadline = time.monotonic() + 60
        while b"hold_to_launcher" not in cmdline(pid) or len(os.listdir(
                f"/proc/{pid}/task")) < 2:  # its watch thread runs: hold_to_launcher is done
            assert time.monotonic() < deadline, cmdline(pid)
            time.sleep(0.05)
        launcher.kill()
        launcher.wait(timeout=30)
        started = time.monotonic()
        while pid in parents() and time.monotonic() - started < 10:
            time.sleep(0.05)
        assert pid not in parents(), "the child outlived its parent"
        assert time.monotonic() - started < 3.0
    finally:
        stop(launcher)
        lifeline.close()
        kill_all({pid} if pid else set())
