"""Process titles: each service of a run shows in `ps` and `top` as `efpsn NAME RUN`."""

from __future__ import annotations

import setproctitle

__all__ = ["set_title", "title_of"]


def title_of(name: str, run: str) -> str:
    """`efpsn NAME RUN`: the service (agent2, coordinator) and its run (the results folder
    `efpsn up` gave it, or the run id), so the processes of two runs can be told apart."""
    return f"efpsn {name} {run}".strip()


def set_title(name: str, run: str) -> None:
    """Make this process's title (its command line in `ps`, `pgrep -f`) `efpsn NAME RUN`."""
    setproctitle.setproctitle(title_of(name, run))
