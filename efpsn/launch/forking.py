"""The launcher's side of the fork server (agent/forkserver.py, started as a process): `efpsn up`'s
agents are forked from one process that loaded the interpreter, numpy, torch and phe once, and share
those pages; once the server has forked them all it exits, and the launcher adopts them (Linux's
child subreaper), so it waits for them and reads their exit codes as for any child."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

from efpsn.launch.processes import Child, child_files

__all__ = ["Adopted", "ForkServer", "can_fork_agents", "set_subreaper", "subreaper"]

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def _prctl(option: int, value: Any) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def subreaper() -> int | None:
    """Whether this process adopts its orphaned descendants (None where that cannot be)."""
    flag = ctypes.c_int(0)
    return flag.value if _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) else None


def set_subreaper(flag: int) -> bool:
    """Adopt this process's orphaned descendants (1), or no longer (0); False where that cannot
    be (not Linux)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, flag)


def can_fork_agents() -> bool:
    """Whether agents can be forked and adopted here (Linux, with fork)."""
    return hasattr(os, "fork") and subreaper() is not None


class Adopted:
    """A process the fork server forked, this process's child once the server has exited: the
    part of subprocess.Popen the launcher uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not adopted yet: its fork server still runs
                return None
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """Forks the agents of one `efpsn up` (`with ForkServer(...) as server: server.spawn(...)`).
    Leaving the block ends the server; its agents are then this process's children."""

    def __init__(self, folder: Path, *, data: str | None = None,
                 env: Mapping[str, str] | None = None, pass_fds: Sequence[int] = ()) -> None:
        self._was_subreaper = subreaper()
        if self._was_subreaper is None or not set_subreaper(1):
            raise OSError("this system cannot adopt forked agents (Linux only)")
        self.log_path, _ = child_files("forkserver", folder)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "agent.forkserver", "--folder", str(folder),
                 *(["--data", data] if data else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                start_new_session=True,  # our Ctrl-C is for us: we end it
                env=None if env is None else {**os.environ, **env}, pass_fds=tuple(pass_fds))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and self.process.poll() is None:
            self.process.kill()  # stopped (or failed) while starting: no waiting for its imports
        self.close()

    def spawn(self, name: str, module_args: Sequence[str], folder: Path, *,
              env: Mapping[str, str] | None = None, cpus: Collection[int] | None = None
              ) -> Child:
        """What processes.spawn("agent", ...) starts, forked: `python -m agent ARGS --port-file
        FOLDER/ports/NAME`, output to FOLDER/logs/NAME.log, in a session of its own, on the CPUs
        `cpus` (None: the server's, which are this process's)."""
        if not module_args or module_args[0] != "agent":
            raise ValueError(f"the fork server starts agents only, got {list(module_args)[:1]}")
        log_path, port_file = child_files(name, folder)
        request = {"name": name, "argv": [*module_args[1:], "--port-file", str(port_file)],
                   "env": dict(env or {}), "log": str(log_path),
                   "cpus": None if cpus is None else sorted(cpus)}
        reply = self._ask(request)
        if "pid" not in reply:
            raise RuntimeError(f"the fork server could not start {name}: {reply.get('error')}")
        return Child(name=name, process=Adopted(int(reply["pid"])), log_path=log_path,
                     port_file=port_file)

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        try:
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
            line = stdout.readline()
        except (BrokenPipeError, ValueError):
            line = ""
        if not line:
            code = self.process.wait()
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"the fork server exited with code {code}:\n{tail}")
        reply = json.loads(line)
        return reply if isinstance(reply, dict) else {"error": f"bad reply {line!r}"}

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def close(self) -> None:
        """End the server (it exits at the end of its input) and adopt its agents."""
        stdin, stdout = self._pipes()
        if not stdin.closed:
            try:
                stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        stdout.close()
        set_subreaper(self._was_subreaper or 0)
