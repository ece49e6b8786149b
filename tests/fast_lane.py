"""The fast lane (`bash scripts/test.sh --fast`): every test that starts no process or container
and is not a long computation.

A test that starts one is marked `process` (module-level `pytestmark` or per test; the `docker`
and `netns` tests count as such); a test that computes for long without one (a whole experiment,
a sweep: more than about 5 s) is marked `slow`. The fast lane deselects both
(`-m "not process and not slow"`); the full suite runs everything. With
EFPSN_FAST_LANE=1, which the fast lane sets, starting a process anyway fails the test with a
line naming the marker: the lane cannot quietly grow slow, and a test marked by mistake shows
up as one that never starts a process in the full run. Tests that serve agents in-process on
loopback ports (tests/harness.py) start no process and stay in the lane.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

ENVIRONMENT = "EFPSN_FAST_LANE"
# markers whose tests need processes of their own (an engine, hosts in namespaces)
PROCESS_MARKERS = ("process", "docker", "netns")


def active() -> bool:
    return os.environ.get(ENVIRONMENT, "") not in ("", "0")


def mark_process_tests(items: list[pytest.Item]) -> None:
    """`docker` and `netns` tests start processes too: mark them `process`."""
    for item in items:
        if any(item.get_closest_marker(m) for m in PROCESS_MARKERS[1:]) \
                and item.get_closest_marker("process") is None:
            item.add_marker(pytest.mark.process)


def _refuse(what: str) -> Callable[..., NoReturn]:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(
            f"the fast lane ({ENVIRONMENT}=1) starts no process, but this test called {what}: "
            "mark it @pytest.mark.process (or its module: pytestmark = pytest.mark.process)")
    return refuse


def forbid_processes() -> None:
    """Make every way this interpreter starts a process raise (the fast lane's guard)."""
    subprocess.Popen._execute_child = _refuse("subprocess.Popen")  # type: ignore[method-assign]
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv",
                 "spawnve", "spawnvp", "spawnvpe", "execv", "execve"):
        if hasattr(os, name):
            setattr(os, name, _refuse(f"os.{name}"))
