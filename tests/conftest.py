"""Shared test setup: one torch thread per process (see efpsn.runtime); the Docker tests' session
fixtures (tests/docker_fixtures.py), with the tests that use them run last."""

import pytest
from docker_fixtures import docker_engine, efpsn_images  # noqa: F401  (session fixtures)

from efpsn.runtime import configure_threads

configure_threads()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the `docker` tests last, one after the other: their engine and images are built once
    per session and removed at its end, so nothing else runs while they exist."""
    items.sort(key=lambda item: item.get_closest_marker("docker") is not None)
