"""Shared test setup: one torch thread per process (see efpsn.process.runtime), and the fixtures the
tests share: `processes` (service processes started, waited for and always stopped),
`in_process_agents` (agents of a run built from public constructors: tests/harness.py), wine
in private folders (`wine`, `wine5`, `wine_no_test`), and the
Docker tests' session fixtures (tests/docker_fixtures.py), with the tests that use them run
last."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import fast_lane
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


def _split(tmp_path_factory: pytest.TempPathFactory, source: str, **options: object) -> Path:
    from efpsn.data.folders import split_data

    out = tmp_path_factory.mktemp(source.split(":")[-1]) / "folders"
    split_data(source=source, partition_spec="iid", out=out, **options)  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="module")
def wine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's wine in 4 private folders and a public test set, as `efpsn data split
    --data sklearn:wine --agents 4` writes them (once per test module)."""
    return _split(tmp_path_factory, "sklearn:wine", agents=4)


@pytest.fixture(scope="module")
def wine5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """wine in 5 private folders (split seed 0) and a public test set (once per test module)."""
    return _split(tmp_path_factory, "sklearn:wine", agents=5, seed=0)


@pytest.fixture(scope="module")
def wine_no_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """wine in 4 private folders and no public test set: every row trains (once per module)."""
    return _split(tmp_path_factory, "sklearn:wine", agents=4, test_fraction=0)


@pytest.fixture
def in_process_agents():
    """`async with in_process_agents(folder, config, run_id=..., names=..., serve=...,
    round_=...) as agents:` (tests/harness.py)."""
    return assigned_agents


def pytest_configure(config: pytest.Config) -> None:
    if fast_lane.active():  # tests/fast_lane.py: nothing of this session starts a process
        fast_lane.forbid_processes()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the `docker` and `netns` tests `process` (tests/fast_lane.py), and run the `docker`
    tests last, one after the other: their engine and images are built once per session and
    removed at its end, so nothing else runs while they exist."""
    fast_lane.mark_process_tests(items)
    items.sort(key=lambda item: item.get_closest_marker("docker") is not None)
