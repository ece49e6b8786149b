"""`efpsn up`'s fork server (agent/forkserver.py; the launcher's side efpsn/launch/forking.py):
agents forked from one process that loaded torch once, each in a session of its own with its own log
and environment, adopted by the launcher, which reads their exit codes and stops them as any
child."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agent.forkserver import check_forkable
from efpsn.launch.forking import Adopted, ForkServer, can_fork_agents
from efpsn.launch.processes import stop_children

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not can_fork_agents(), reason="forking agents needs Linux")]


@pytest.mark.process
def test_forked_agents_have_their_logs_exit_codes_sessions_and_environment(
        tmp_path: Path) -> None:
    # prepare: one agent that prints its help on a terminal of 200 columns (its own variable),
    # one without its flags, one that waits (for a coordinator port file nobody writes)
    waiting = ["agent", "--name", "agent3", "--coordinator", "127.0.0.1:0",
               "--coordinator-port-file", str(tmp_path / "never"), "--insecure",
               "--results", str(tmp_path)]
    # execute
    with ForkServer(tmp_path) as server:
        helped = server.spawn("agent1", ["agent", "--help"], tmp_path, env={"COLUMNS": "200"})
        refused = server.spawn("agent2", ["agent"], tmp_path)
        waiter = server.spawn("agent3", waiting, tmp_path)
    try:
        # assert: exit codes as a separate interpreter would have them, output in each log
        assert isinstance(helped.process, Adopted)
        assert helped.process.wait(timeout=60) == 0
        usage = helped.log_path.read_text()
        assert "usage: python -m agent" in usage
        assert max(len(line) for line in usage.splitlines()) > 100  # COLUMNS=200 reached it
        assert refused.process.wait(timeout=60) == 2
        assert "the following arguments are required: --name" in refused.log_path.read_text()
        assert refused.port_file == tmp_path / "ports" / "agent2"
        pid = waiter.process.pid
        assert os.getsid(pid) == pid  # its own session: the launcher's Ctrl-C is not its
        # titled by its name and its run's folder, as `ps` shows it (forked: no command line
        # of its own otherwise)
        title = Path(f"/proc/{pid}/cmdline").read_bytes()
        deadline = time.monotonic() + 60
        while not title.startswith(b"efpsn agent3 ") and time.monotonic() < deadline:
            time.sleep(0.05)
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert title.rstrip(b"\0") == f"efpsn agent3 {tmp_path}".encode(), title
        assert waiter.process.poll() is None
    finally:
        stop_children([helped, refused, waiter], grace=10.0)
    assert waiter.process.returncode == -signal.SIGTERM
    assert not Path(f"/proc/{pid}").exists()


@pytest.mark.process
def test_only_agents_are_forked(tmp_path: Path) -> None:
    with ForkServer(tmp_path) as server, pytest.raises(ValueError, match="agents only"):
        server.spawn("coordinator", ["coordinator", "--help"], tmp_path)


def test_a_process_with_grpc_loaded_is_never_forked() -> None:
    import grpc  # noqa: F401  (this test process has it; the fork server never imports it)

    assert "grpc" in sys.modules
    with pytest.raises(RuntimeError, match="gRPC must start after the fork"):
        check_forkable()


@pytest.mark.process
def test_the_server_ending_early_is_reported_with_its_log(tmp_path: Path) -> None:
    server = ForkServer(tmp_path)
    try:
        server.process.kill()
        server.process.wait()
        with pytest.raises(RuntimeError, match="the fork server exited with code -9"):
            server.spawn("agent1", ["agent", "--help"], tmp_path)
    finally:
        server.close()


@pytest.mark.process
def test_the_preload_list_is_the_agents_imports_without_grpc() -> None:
    import subprocess

    from agent.preload import preload_modules

    modules = preload_modules()
    # the agent's core, as its source imports it (nothing hand-kept)
    for core in ("numpy", "torch", "phe", "efpsn.problem", "efpsn.crypto.paillier", "efpsn.masks.zero_sum",
                 "efpsn.optimize.driver", "efpsn.wire.serde", "efpsn.wire.rounds", "agent.cli",
                 "agent.state", "efpsn.params.values"):
        assert core in modules, core
    # never a module that starts gRPC (the server, the peers, the node), nor grpc itself
    for edge in ("grpc", "agent.node", "agent.router", "agent.peers", "efpsn.wire.net",
                 "efpsn.wire.tls", "agent.forkserver"):
        assert edge not in modules, edge
    # and importing all of it, in a fresh interpreter, loads no grpc
    code = ("import importlib, sys\n"
            f"for m in {list(modules)!r}: importlib.import_module(m)\n"
            "print('grpc' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=170)
    assert out.stdout.strip() == "False"


_COPIED_BY_COLLECTION = '''
import gc, os, re, sys
from pathlib import Path
import agent.forkserver as forkserver

def private_dirty_kb():
    smaps = Path("/proc/self/smaps_rollup").read_text()
    return int(re.search(r"Private_Dirty:\\s+(\\d+)", smaps).group(1))

def copied_by_collection():  # what a full collection in this child copies of its parent's pages
    before = private_dirty_kb()
    gc.collect()
    return private_dirty_kb() - before

held = [[i] for i in range(300_000)]  # the server's objects: ~20 MB of pages holding them
folder = Path(sys.argv[1])
pid = os.fork()  # a plain fork, the control
if pid == 0:
    (folder / "plain").write_text(str(copied_by_collection()))
    os._exit(0)
os.waitpid(pid, 0)

def run_agent(argv):
    print(copied_by_collection(), flush=True)
    return 0

forkserver._run_agent = run_agent  # the forked "agent" measures instead
pid = forkserver.fork_agent(["agent"], env={}, log=folder / "forked", append_log=False,
                            control=())
os.waitpid(pid, 0)
'''


@pytest.mark.process
def test_an_agents_full_collection_copies_none_of_the_servers_pages(tmp_path: Path) -> None:
    # prepare: a process holding 300,000 objects, as the fork server holds its modules' (issue
    # 29: an agent's first full collection, inside the run, wrote into every inherited object
    # and made ~27 MB of shared pages private); page counts, not times: load does not matter
    import subprocess

    # execute: a plain fork's child collects (the control), then an agent forked the server's
    # way does
    subprocess.run([sys.executable, "-c", _COPIED_BY_COLLECTION, str(tmp_path)], check=True,
                   timeout=170, cwd=Path(__file__).resolve().parents[1])
    plain = int((tmp_path / "plain").read_text())
    forked = int((tmp_path / "forked").read_text())
    # assert: the control copies the pages (the measure sees them), the agent does not
    assert plain > 10_000, f"a plain fork's collection copied {plain} kB only"
    assert forked < 3_000, f"the forked agent's collection copied {forked} kB (control {plain})"
