"""Service processes on this machine: started in their own session with a log and a port file
(each its own interpreter, or forked from the fork server: efpsn/launch/forking.py), waited for
until they serve, and stopped (SIGTERM, then SIGKILL) with everything they started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["Child", "Process", "read_port", "spawn", "stop_children", "wait_port"]


class Process(Protocol):
    """What the launcher uses of a process (subprocess.Popen has it)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


@dataclass
class Child:
    """One started process: its name, the process, its log and the file it writes its port to."""

    name: str
    process: Process
    log_path: Path
    port_file: Path

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    @property
    def running(self) -> bool:
        return self.process.poll() is None


def child_files(name: str, folder: Path) -> tuple[Path, Path]:
    """FOLDER/logs/NAME.log and FOLDER/ports/NAME (a stale port file removed)."""
    log_path = folder / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port_file = folder / "ports" / name
    port_file.parent.mkdir(parents=True, exist_ok=True)
    port_file.unlink(missing_ok=True)
    return log_path, port_file


def spawn(name: str, module_args: Sequence[str], folder: Path, *,
          env: Mapping[str, str] | None = None, append_log: bool = False,
          pass_fds: Sequence[int] = ()) -> Child:
    """`python -m MODULE ARGS --port-file FOLDER/ports/NAME`, output to FOLDER/logs/NAME.log, in a
    session of its own (our Ctrl-C is handled by the caller, which then stops it), with `env` on
    top of this environment and the descriptors `pass_fds` (the lifeline:
    efpsn/process/lifeline.py)."""
    log_path, port_file = child_files(name, folder)
    with open(log_path, "ab" if append_log else "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", *module_args, "--port-file", str(port_file)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=None if env is None else {**os.environ, **env},
            pass_fds=tuple(pass_fds),
        )
    return Child(name=name, process=process, log_path=log_path, port_file=port_file)


class ExitedBeforeServing(RuntimeError):
    """The child exited before it wrote its port."""

    def __init__(self, child: Child) -> None:
        super().__init__(f"{child.name} exited with code {child.process.returncode} before "
                         f"serving:\n{child.log_tail()}")
        self.child = child


def read_port(child: Child) -> int | None:
    """The port `child` serves on if it has written it, else None (without waiting)."""
    try:
        return int(child.port_file.read_text())
    except (OSError, ValueError):
        return None


def wait_port(child: Child, timeout: float) -> int:
    """The port `child` serves on, once it wrote it (even if it has exited since: what it does
    after serving is the caller's to watch); ExitedBeforeServing if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = child.process.poll() is not None
        port = read_port(child)  # read after poll(): no exit is missed
        if port is not None:
            return port
        if exited:
            raise ExitedBeforeServing(child)
        time.sleep(0.05)
    raise TimeoutError(f"{child.name} did not start serving within {timeout:.0f}s")


def stop_children(children: Sequence[Child], *, grace: float = 5.0) -> None:
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
