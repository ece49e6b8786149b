"""Shared test setup: one torch thread per process (see efpsn.process.runtime), and the fixtures the
tests share: `processes` (service processes started, waited for and always stopped),
`in_process_agents` (agents of a run built from public constructors: tests/harness.py), and the
Docker tests' session fixtures (tests/docker_fixtures.py), with the tests that use them run
last."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from docker_fixtures import docker_engine, efpsn_images  # noqa: F401  (session fixtures)
from harness import assigned_agents

from efpsn.launch.processes import Child, spawn, stop_children, wait_port
from efpsn.process.runtime import configure_threads

configure_threads()


class Processes:
    """Service processes of one test: `start` one (`python -m ARGS`, its log and port file in
    the test's folder), `port` waits until it serves; every one is stopped at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.children: dict[str, Child] = {}

    def start(self, name: str, args: Sequence[str], *,
              env: Mapping[str, str] | None = None) -> Child:
        self.children[name] = spawn(name, args, self.folder, env=env)
        return self.children[name]

    def port(self, name: str, timeout: float = 60.0) -> int:
        return wait_port(self.children[name], timeout)

    def stop(self) -> None:
        stop_children(list(self.children.values()), grace=10.0)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def in_process_agents():
    """`async with in_process_agents(folder, config, run_id=..., names=..., serve=...,
    round_=...) as agents:` (tests/harness.py)."""
    return assigned_agents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the `docker` tests last, one after the other: their engine and images are built once
    per session and removed at its end, so nothing else runs while they exist."""
    items.sort(key=lambda item: item.get_closest_marker("docker") is not None)
