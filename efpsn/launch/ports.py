"""Ports for a local run's agents, below the kernel's ephemeral range: a resumed agent binds its
saved port again, and a port of that range, once its agent is stopped, can be taken meanwhile by
any process's outgoing connection (the resumed agents' own, dialling their neighbours, among
them); below it, only another server could hold it."""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

__all__ = ["agent_ports", "ephemeral_range"]

LOWEST = 20000  # below the ports services commonly use in the registered range
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' ports (Linux; else the IANA range)."""
    try:
        low, high = (int(v) for v in RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def _free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def agent_ports(host: str, names: list[str], *, rng: random.Random | None = None
                ) -> dict[str, int]:
    """A free port for each agent, between LOWEST and the ephemeral range, distinct; 0 (the
    kernel's choice) for all when that span is too small to pick from."""
    low, _ = ephemeral_range()
    if low - LOWEST < 100 * len(names):
        return dict.fromkeys(names, 0)
    rng = rng or random.SystemRandom()
    chosen: dict[str, int] = {}
    try:
        for name in names:
            for _ in range(200):
                port = rng.randrange(LOWEST, low)
                if port not in chosen.values() and _free(host, port):
                    chosen[name] = port
                    break
            else:
                chosen[name] = 0
    except OSError:  # not an address of this machine: the agents say so when they bind it
        return dict.fromkeys(names, 0)
    return chosen
