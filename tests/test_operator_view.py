"""What an operator sees of a running `efpsn up`, through real processes: `efpsn status` (the
results folder; the coordinator with another party's certificate; an outsider's certificate:
counts only), every process titled in `ps` (forked and with --no-fork), a kill -9 named on the
screen within a second with what the others do, a stopped run that says how to resume and,
started again, that it resumes, and the picture of a run (at its end, and `efpsn report` for
an older folder)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from commands import efpsn_argv

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

AGENTS = [f"agent{k}" for k in range(1, 5)]
FAST = ["--agents", "4", "--key-bits", "512", "--allow-insecure-keys", "--insecure-noise-seed",
        "3", "--eval-every", "50"]


class Screen:
    """What a process prints on stderr, line by line (progress bars' \\r as line ends), with
    the time each line came."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        pending = b""
        while chunk := proc.stderr.read1(4096):
            pending += chunk
            *done, pending = re.split(rb"[\r\n]", pending)
            now = time.monotonic()
            self.lines += [(now, line.decode(errors="replace")) for line in done if line.strip()]

    def wait_for(self, pattern: str, *, timeout: float = 60.0) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for seen in list(self.lines):
                if re.search(pattern, seen[1]):
                    return seen
            time.sleep(0.01)
        raise AssertionError(f"no line matching {pattern!r} in:\n"
                             + "\n".join(line for _, line in self.lines[-20:]))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(efpsn_argv("status", *args), capture_output=True, text=True,
                          timeout=60, check=False)


def wait_round(results: Path, round_: int, *, timeout: float = 180.0) -> dict:
    """`efpsn status --json RESULTS` once every agent is past `round_`."""
    deadline = time.monotonic() + timeout
    seen: dict = {}
    while time.monotonic() < deadline:
        if (results / "network.json").exists():
            done = status("--json", str(results))
            if done.returncode == 0:
                seen = json.loads(done.stdout)
                rounds = [a.get("round") for a in seen["agents"]]
                if len(rounds) == 4 and all(r is not None and r >= round_ for r in rounds):
                    return seen
        time.sleep(0.3)
    raise AssertionError(f"the agents did not reach round {round_}: {seen}")


def titles() -> list[str]:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A 4-agent ring well into phase II, with departures (a 3 s deadline)."""
    root = tmp_path_factory.mktemp("live")
    results = root / "run"
    proc = subprocess.Popen(
        efpsn_argv("up", "--iterations", "200000", "--results", str(results),
                   "--departure-deadline", "3", "--round-timeout", "60", *FAST),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root)
    screen = Screen(proc)
    try:
        wait_round(results, 60)
        yield {"root": root, "results": results, "proc": proc, "screen": screen}
    finally:
        stop(proc)


def test_status_of_a_results_folder_shows_all_four_with_their_rounds(live: dict) -> None:
    results = live["results"]
    done = status(str(results))
    assert done.returncode == 0, done.stderr
    head, *lines = done.stdout.splitlines()
    assert head.startswith(f"local run in {results}: run ") and "4 of 4 agents answer" in head
    ring = {"agent1": ("agent2", "agent4"), "agent2": ("agent1", "agent3"),
            "agent3": ("agent2", "agent4"), "agent4": ("agent1", "agent3")}
    for name, line in zip(AGENTS, lines, strict=True):
        a, b = ring[name]
        # as its own operator (its certificate in RESULTS/tls): its figures show too
        assert re.fullmatch(
            rf"{name}: phase II, round \d+ of 200000, about \d+ left; neighbours {a} [\d.]+ s "
            rf"ago, {b} [\d.]+ s ago; loss [\d.]+, accuracy [\d.]+", line), line
    view = json.loads(status("--json", str(results)).stdout)
    assert [a["name"] for a in view["agents"]] == AGENTS
    for agent in view["agents"]:
        assert agent["phase"] == "OPTIMIZE" and agent["round"] >= 60
        assert agent["rounds_left"] == 200000 - agent["round"]
        assert [n["name"] for n in agent["neighbours"]] == list(ring[agent["name"]])
        assert all(0 <= n["heard_seconds_ago"] < 10 for n in agent["neighbours"])
        assert agent["process_alive"] is True and agent["departed"] == []


def test_ps_names_every_agent_and_the_coordinator(live: dict) -> None:
    shown = titles()
    for name in ["coordinator", *AGENTS]:
        assert f"efpsn {name} {live['results']}" in shown, [t for t in shown if "efpsn" in t]


def test_another_partys_certificate_sees_the_whole_run(live: dict) -> None:
    results = live["results"]
    coordinator = json.loads((results / "network.json").read_text())["coordinator"]["address"]
    # agent3's operator, with agent3's own certificate only (the folder holds every key: say
    # whose), through the coordinator
    done = status("--coordinator", coordinator, "--tls-dir", str(results / "tls"),
                  "--tls-name", "agent3")
    assert done.returncode == 0, done.stderr
    head, *lines = done.stdout.splitlines()
    assert "4 of 4 agents registered" in head and "4 of 4 agents answer" in head, head
    assert [line.split(":")[0] for line in lines] == AGENTS
    for line in lines:
        assert re.search(r"phase II, round \d+ of 200000.*; neighbours agent\d [\d.]+ s ago", line)
        # private figures only for agent3, its own
        assert ("loss" in line) == line.startswith("agent3:"), line
    # through one agent (agent1, not agent3's neighbour): every agent it leads to
    agent1 = json.loads((results / "network.json").read_text())["agents"]["agent1"]["address"]
    crawled = status("--agent", f"agent1={agent1}", "--tls-dir", str(results / "tls"),
                     "--tls-name", "agent3", "--json")
    assert [a["name"] for a in json.loads(crawled.stdout)["agents"]] == AGENTS, crawled.stdout


def test_an_outsiders_certificate_sees_counts_only(live: dict) -> None:
    results, root = live["results"], live["root"]
    mine = root / "mallory"
    for step in (["request", "--name", "mallory", "--out", str(mine)],
                 ["sign", "--ca", str(results / "tls"), "--csr", str(mine / "mallory.csr"),
                  "--out", str(mine)]):
        subprocess.run(efpsn_argv("certs", *step), check=True, capture_output=True, timeout=60)
    record = json.loads((results / "network.json").read_text())
    done = status("--coordinator", record["coordinator"]["address"], "--tls-dir", str(mine))
    assert done.returncode == 1 and "4 of 4 agents registered" in done.stdout, done.stdout
    assert "agent" not in done.stdout.replace("agents", ""), done.stdout  # no name, no address
    seen = status("--agent", f"agent1={record['agents']['agent1']['address']}", "--tls-dir",
                  str(mine), "--json")
    (agent,) = json.loads(seen.stdout)["agents"]
    assert agent["phase"] == "OPTIMIZE" and agent["round"] > 0 and agent["neighbour_count"] == 2
    assert agent["neighbours"] == [] and agent["departed"] == [] and agent["waiting_for"] == []
    assert agent["loss"] is None and agent["accuracy"] is None


def test_a_killed_agent_is_named_on_the_screen_within_a_second(live: dict) -> None:
    results, screen = live["results"], live["screen"]
    pid = json.loads((results / "network.json").read_text())["agents"]["agent2"]["pid"]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    at, line = screen.wait_for(r"agent2 \(pid")
    assert at - killed < 1.0, at - killed
    assert re.fullmatch(
        rf"efpsn up: agent2 \(pid {pid}\) was killed by SIGKILL at round \d+; the others wait "
        r"for it until the departure deadline \(3 s\), then go on without it once the "
        r"coordinator declares it gone", line), line
    # and whether the run goes on without it: it does, said once the neighbours dropped it
    screen.wait_for("efpsn up: agent2 is declared gone for good: its neighbours dropped it, "
                    "the others go on without it", timeout=120)
    done = status(str(results))
    address = json.loads((results / "network.json").read_text())["agents"]["agent2"]["address"]
    line2 = next(t for t in done.stdout.splitlines() if t.startswith("agent2:"))
    assert line2 == f"agent2: not answering at {address} (its process {pid} is gone)", line2
    assert "departed agent2" in done.stdout.splitlines()[0], done.stdout


def test_a_stopped_run_says_how_to_resume_and_resumes(tmp_path: Path) -> None:
    results = tmp_path / "run"
    command = efpsn_argv("up", "--iterations", "1000", "--results", str(results),
                         "--checkpoint-every", "50", "--no-fork", *FAST)
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    screen = Screen(first)
    try:
        wait_round(results, 120)
        shown = titles()  # --no-fork: each agent its own interpreter, titled all the same
        assert all(f"efpsn {name} {results}" in shown for name in AGENTS), shown
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=60) == 130
    finally:
        stop(first)
    time.sleep(0.2)
    said = [line for _, line in screen.lines[-2:]]
    assert said == [
        f"efpsn up: to resume from the last checkpoints in {results}, run the same command again",
        "efpsn up: stopped by SIGINT; every process it started is stopped (exit 130)",
    ], screen.text()[-2000:]
    # started again with the same --results: it says it resumes, and from which round
    again = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"efpsn up: {results} holds a stopped run (agent1, agent2, agent3, agent4): its " \
           "agents resume it from their last checkpoints" in again.stdout, again.stdout
    resumed = re.search(r"efpsn up: resuming from round (\d+)", again.stderr)
    assert resumed and int(resumed.group(1)) >= 100, again.stderr[-3000:]
    # each agent from its own newest checkpoint (they may differ by one interval): the line
    # names the earliest it has seen
    for name in AGENTS:
        result = json.loads((results / name / "result.json").read_text())
        start = result["resumed_from_round"]
        assert start >= int(resumed.group(1)) and start % 50 == 0, (name, start)
        assert result["final"]["round"] == 1000
    # the picture of the run, written at its end, and `efpsn report` for it again
    picture = results / "training.png"
    assert f"picture {picture}" in again.stdout and picture.stat().st_size > 20_000
    picture.unlink()
    (results / "network.json").unlink()  # as an older results folder has it
    done = subprocess.run(efpsn_argv("report", str(results)), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"wrote {picture}", done.stderr
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 20_000
