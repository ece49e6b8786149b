"""Process-wide runtime settings applied by every `efpsn` command (and the test suite)."""

from __future__ import annotations

import os
from pathlib import Path


def configure_threads() -> int:
    """Use EFPSN_TORCH_THREADS torch threads (default 1) and return the number set.

    EFPSN's tensors are small (thousands of entries) and a network runs several agent processes
    per machine; with torch's default of one thread per core, idle worker threads spin and fight
    each other, which slows everything down by an order of magnitude on a busy machine
    (time `efpsn simulate` with EFPSN_TORCH_THREADS=1 and =2 next to another job to see it).
    One thread per process is both faster and fairer.
    """
    import torch

    raw = os.environ.get("EFPSN_TORCH_THREADS", "1")
    try:
        threads = int(raw)
    except ValueError:
        raise ValueError(f"EFPSN_TORCH_THREADS must be a positive integer, got {raw!r}") from None
    if threads < 1:
        raise ValueError(f"EFPSN_TORCH_THREADS must be a positive integer, got {raw!r}")
    torch.set_num_threads(threads)
    # numpy's BLAS (used by the logistic-regression gradient) too: besides speed, the number of
    # BLAS threads changes the bits of a matrix product, and the simulator and the networked
    # agents must compute bit-identical gradients.
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)
    return threads


def machine_load() -> str:
    """The machine's load, for benchmarks to print next to their figures (these machines are
    shared: a number without its load means little)."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """Peak resident memory (VmHWM) of a process in MB, from /proc; None where there is none.
    (ru_maxrss would carry a parent's peak over fork and exec.)"""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def pss_mb(pid: int | str = "self") -> float | None:
    """Proportional memory (PSS) of a process in MB, from /proc/PID/smaps_rollup: its private
    pages plus its share of every page it shares with other processes (each shared page split
    evenly among them), so the PSS of all processes adds up to the memory they use; None where
    there is none."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


CPUS_ENV = "EFPSN_AGENT_CPUS"  # "K,L,...": the CPUs `efpsn up --no-fork` gives an agent


def place_from_environment() -> frozenset[int] | None:
    """Run this process on the CPUs EFPSN_AGENT_CPUS names, if set (and take the variable out of
    the environment); return them. `python -m agent` calls it first of all, before any import
    starts a thread: every thread it starts then inherits them (efpsn/launch/placement.py)."""
    text = os.environ.pop(CPUS_ENV, "")
    if not text.strip():
        return None
    try:
        cpus = frozenset(int(c) for c in text.split(","))
    except ValueError:
        raise ValueError(f"{CPUS_ENV} must be CPU numbers separated by commas, got {text!r}"
                         ) from None
    os.sched_setaffinity(0, cpus)
    return cpus


def thread_cpus() -> list[int] | None:
    """Every CPU any thread of this process may run on (the union of their affinities), sorted;
    None where the system does not say. An agent records it in its result.json: one placed by
    `efpsn up` (efpsn/launch/placement.py) whose gRPC threads escaped its CPUs would show them."""
    cpus: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                cpus |= os.sched_getaffinity(int(tid))
            except (ProcessLookupError, ValueError):  # that thread ended meanwhile
                continue
    except (AttributeError, OSError):  # not Linux
        return None
    return sorted(cpus) or None
