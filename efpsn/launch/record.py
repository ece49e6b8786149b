"""What a local run leaves for its operator's tools besides the results: RESULTS/network.json
(where the coordinator and each agent serve, their pids, TLS or not), read by `efpsn status
RESULTS`, and whether RESULTS holds a stopped run that a rerun resumes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from efpsn.jsonfile import write_json

__all__ = ["NETWORK_FILE", "NetworkRecord", "default_results", "read_network_record",
           "saved_states", "write_network_record"]

NETWORK_FILE = "network.json"


def default_results() -> Path:
    """results/run-TIME: where `efpsn up` writes a run given no --results."""
    return Path("results") / time.strftime("run-%Y%m%d-%H%M%S")


@dataclass(frozen=True)
class NetworkRecord:
    """The processes of a local run: name -> (host:port, pid), the coordinator's apart."""

    host: str
    tls: bool
    coordinator: tuple[str, int] | None
    agents: dict[str, tuple[str, int | None]]


def write_network_record(folder: Path, *, host: str, tls: bool, coordinator: tuple[str, int],
                         agents: dict[str, tuple[str, int]]) -> None:
    """RESULTS/network.json, once every process serves (addresses and pids: nothing secret)."""
    write_json(folder / NETWORK_FILE, {
        "host": host, "tls": tls,
        "coordinator": {"address": coordinator[0], "pid": coordinator[1]},
        "agents": {n: {"address": a, "pid": pid} for n, (a, pid) in agents.items()}})


def read_network_record(folder: Path) -> NetworkRecord:
    """The record of the run in `folder`; a results folder of an older efpsn (no network.json)
    gives what its port files say, on 127.0.0.1. ValueError when neither is there."""
    path = folder / NETWORK_FILE
    if path.exists():
        data = json.loads(path.read_text())
        coordinator = data.get("coordinator")
        return NetworkRecord(
            host=str(data["host"]), tls=bool(data["tls"]),
            coordinator=(str(coordinator["address"]), int(coordinator["pid"]))
            if coordinator else None,
            agents={str(n): (str(a["address"]), int(a["pid"]))
                    for n, a in data["agents"].items()})
    ports = folder / "ports"
    found = {p.name: p.read_text().strip() for p in sorted(ports.glob("*"))
             if p.is_file() and p.read_text().strip().isdigit()} if ports.is_dir() else {}
    agents = {n: (f"127.0.0.1:{port}", None) for n, port in found.items()
              if n not in ("coordinator", "forkserver")}
    if not agents:
        raise ValueError(f"{folder} is not the results folder of a running `efpsn up` (no "
                         f"{NETWORK_FILE}, no ports/): give the folder `efpsn up` printed")
    coordinator_port = found.get("coordinator")
    return NetworkRecord(host="127.0.0.1", tls=(folder / "tls" / "ca.pem").exists(),
                         coordinator=(f"127.0.0.1:{coordinator_port}", 0)
                         if coordinator_port else None, agents=agents)


def saved_states(folder: Path, names: list[str]) -> list[str]:
    """The agents of `names` whose state folder in `folder` holds an unfinished run (a rerun
    with the same --results resumes it)."""
    out = []
    for name in names:
        path = folder / name / "state" / "assignment.json"
        try:
            if not json.loads(path.read_text()).get("finished", False):
                out.append(name)
        except (OSError, ValueError, AttributeError):
            continue
    return out
