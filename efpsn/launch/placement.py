"""Which CPUs each of `efpsn up`'s agents runs on: the launcher's own CPUs
(os.sched_getaffinity) shared out among its agents, each agent's set applied in its process
right after the fork, before gRPC or torch start a thread (a thread inherits its creator's CPUs).

An agent runs a main thread, grpc.aio's poller and gRPC's EventEngine threads: a round wakes
them some twenty times, and an unplaced agent's threads wander across the machine's CPUs, each
wake-up on another CPU an interrupt between CPUs (dear in a virtual machine). Kept on one CPU
(or on its own few, with fewer agents than CPUs), an agent's threads hand work to each other
there; with blocks, so do most ring neighbours (a message between them need not wake a thread
on the other CPU).

    blocks  (default) agents in m consecutive blocks, one CPU each (ring neighbours mostly on
            one CPU): n = 5, m = 2 puts agents 1-3 on the first CPU, 4-5 on the second
    spread  agent k on CPU k mod m (ring neighbours on different CPUs): m CPUs, n >= m agents
    none    no placement: the kernel moves every thread where it likes

On 2 cores under load the main job's CPU per agent per round was 0.97x unplaced with blocks
(median of 12 alternating pairs) and 1.04x with spread (6 pairs), phase II 1.00x and 1.29x.

With fewer agents than CPUs both give each agent its own consecutive share of the CPUs; with one
CPU (or none known) nothing is placed. Containers (compose, swarm) and `efpsn agent` started by
hand are never placed."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable

from efpsn.process.runtime import CPUS_ENV

__all__ = ["DEFAULT_PLACEMENT", "PLACEMENTS", "assign_cpus", "cpus_env", "launcher_cpus"]

PLACEMENTS = ("blocks", "spread", "none")
DEFAULT_PLACEMENT = "blocks"  # measured on the main job: docs/RESULTS.md, "Local agents placed on CPUs"


def assign_cpus(mode: str, agents: int, cpus: Iterable[int]) -> list[frozenset[int] | None]:
    """The CPUs of each of `agents` agents (index order) under `mode`, from the set `cpus`; None
    for an agent left unplaced (mode none, or a set of at most one CPU)."""
    if mode not in PLACEMENTS:
        raise ValueError(f"CPU placement must be one of {', '.join(PLACEMENTS)}, got {mode!r}")
    if agents < 0:
        raise ValueError(f"the number of agents must be >= 0, got {agents}")
    ordered = sorted(set(cpus))
    m = len(ordered)
    if mode == "none" or m <= 1:
        return [None] * agents
    if agents <= m:  # each agent its own CPUs: consecutive shares, the first ones larger
        return [frozenset(ordered[k * m // agents:(k + 1) * m // agents])
                for k in range(agents)]
    if mode == "spread":
        return [frozenset({ordered[k % m]}) for k in range(agents)]
    # blocks: consecutive agents on one CPU, the first blocks one agent larger
    size, extra = divmod(agents, m)
    out: list[frozenset[int] | None] = []
    for j, cpu in enumerate(ordered):
        out += [frozenset({cpu})] * (size + (1 if j < extra else 0))
    return out


def launcher_cpus() -> frozenset[int]:
    """The CPUs this process may run on (empty where the system does not say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return frozenset()


def cpus_env(cpus: Collection[int] | None) -> dict[str, str]:
    """The variable that places a `python -m agent` started as its own interpreter (--no-fork)
    on `cpus` (efpsn.process.runtime.place_from_environment); nothing for None."""
    return {} if not cpus else {CPUS_ENV: ",".join(str(c) for c in sorted(cpus))}
