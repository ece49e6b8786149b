"""Shared test setup: one torch thread per process (see efpsn.runtime)."""

from efpsn.runtime import configure_threads

configure_threads()
