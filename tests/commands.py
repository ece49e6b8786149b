"""What the tests that run efpsn's commands share: a command as a subprocess, and free ports."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def efpsn_argv(*args: str, module: str = "efpsn") -> list[str]:
    """The command line of `efpsn ARGS` (or `python -m MODULE ARGS`) in this interpreter."""
    return [sys.executable, "-m", module, *args]


def efpsn(*args: str, module: str = "efpsn", cwd: Path | None = None,
          env: Mapping[str, str] | None = None, timeout: float = 600.0,
          ) -> subprocess.CompletedProcess[str]:
    """Run `efpsn ARGS` to its end (bounded by `timeout`), its output captured as text."""
    return subprocess.run(efpsn_argv(*args, module=module), cwd=cwd, env=env, check=False,
                          capture_output=True, text=True, timeout=timeout)


def free_port(*, host: str = "127.0.0.1", kind: int = socket.SOCK_STREAM,
              below: int | None = None) -> int:
    """A port nothing uses on `host` now (bound, then released); `below`: one under that bound
    (Docker Swarm publishes ports below 49152 only), tried at random."""
    if below is None:
        with socket.socket(socket.AF_INET, kind) as probe:
            probe.bind((host, 0))
            return probe.getsockname()[1]
    for port in random.sample(range(20000, below), 200):
        with socket.socket(socket.AF_INET, kind) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below {below} on {host}")
