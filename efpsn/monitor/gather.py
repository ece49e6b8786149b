"""Every agent's progress in one view, reached three ways: a local run's results folder (the
addresses and credentials `efpsn up` wrote), the coordinator (its roster), or one agent (and,
through the neighbours it names, every agent it is connected to). Names, rounds and times
only: private figures come only from an agent to its own operator (its GetStatus decides)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from efpsn.launch.record import read_network_record
from efpsn.wire.status_client import AgentStatus, RunView, fetch_run_view, fetch_status
from efpsn.wire.tls import CA_CERT, TlsConfig, TlsError

__all__ = ["AgentRow", "RunProgress", "from_agent", "from_coordinator", "from_results",
           "own_credentials"]

TIMEOUT = 2.0  # seconds one agent has to answer


@dataclass(frozen=True)
class AgentRow:
    """One agent: where it serves, what it said (None: it did not answer) and, for a local
    run, its process id and whether that process still exists."""

    name: str
    address: str
    status: AgentStatus | None
    pid: int | None = None
    alive: bool | None = None


@dataclass(frozen=True)
class RunProgress:
    """The agents of one run (by name), what the coordinator said (None: not asked or gone),
    and where the view comes from."""

    source: str
    rows: list[AgentRow]
    run: RunView | None = None
    problems: list[str] = field(default_factory=list)


def own_credentials(tls_dir: str | os.PathLike[str], name: str | None) -> TlsConfig:
    """The caller's own certificate in `tls_dir` (NAME.pem, NAME.key and ca.pem): NAME given,
    or the folder's only key. TlsError saying which names it holds otherwise."""
    folder = Path(tls_dir)
    if name is None:
        keys = sorted(p.stem for p in folder.glob("*.key") if p.stem != "ca"
                      and (folder / f"{p.stem}.pem").exists())
        if len(keys) != 1:
            raise TlsError(f"{folder} holds the keys of {', '.join(keys) or 'nobody'}: say whose "
                           "certificate to present with --tls-name NAME")
        name = keys[0]
    if not (folder / CA_CERT).exists():
        raise TlsError(f"{folder} has no {CA_CERT}: give the folder with the run's CA "
                       "certificate and your own NAME.pem and NAME.key")
    return TlsConfig.from_dir(folder, name)


def _alive(pid: int | None) -> bool | None:
    if not pid:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _statuses(addresses: Mapping[str, str], tls: Mapping[str, TlsConfig | None]
                    ) -> dict[str, AgentStatus | None]:
    found = await asyncio.gather(*(fetch_status(n, a, tls=tls[n], timeout=TIMEOUT)
                                   for n, a in addresses.items()))
    return dict(zip(addresses, found, strict=True))


async def from_results(folder: Path) -> RunProgress:
    """A local run (`efpsn up --results FOLDER`): each agent asked as its own operator (its own
    certificate in FOLDER/tls), so its private figures show too."""
    record = read_network_record(folder)
    tls_dir = folder / "tls"
    names = sorted(record.agents, key=_natural)
    tls = {n: TlsConfig.from_dir(tls_dir, n) if record.tls else None for n in names}
    addresses = {n: record.agents[n][0] for n in names}
    statuses = await _statuses(addresses, tls)
    run, problems = None, []
    if record.coordinator is not None:
        try:
            run = await fetch_run_view(record.coordinator[0], timeout=TIMEOUT, tls=(
                TlsConfig.from_dir(tls_dir, "coordinator") if record.tls else None))
        except ConnectionError as exc:
            problems.append(str(exc))
    rows = [AgentRow(n, addresses[n], statuses[n], pid=record.agents[n][1],
                     alive=_alive(record.agents[n][1])) for n in names]
    return RunProgress(source=f"local run in {folder}", rows=rows, run=run, problems=problems)


async def from_coordinator(address: str, *, tls: TlsConfig | None,
                           name: str = "coordinator") -> RunProgress:
    """A run on several hosts, through its coordinator (while it serves): its roster, then
    every agent, all with the caller's own certificate `tls`."""
    run = await fetch_run_view(address, tls=tls, name=name, timeout=TIMEOUT)
    if not run.addresses:
        why = ("the coordinator tells names and addresses only to the run's parties and its "
               "operator" if run.registered else "no agent has registered yet")
        problem = f"{run.registered} of {run.expected} agents registered; {why}"
        return RunProgress(source=f"coordinator {address}", rows=[], run=run, problems=[problem])
    statuses = await _statuses(run.addresses, dict.fromkeys(run.addresses, tls))
    rows = [AgentRow(n, a, statuses[n]) for n, a in sorted(run.addresses.items(),
                                                            key=lambda kv: _natural(kv[0]))]
    return RunProgress(source=f"coordinator {address}", rows=rows, run=run)


async def from_agent(name: str, address: str, *, tls: TlsConfig | None,
                     limit: int = 1000) -> RunProgress:
    """A run through one of its agents: it, then every agent reached through the neighbours
    each one names (a party's certificate sees the names; an outsider's only that agent)."""
    addresses, statuses = {name: address}, {}
    todo = [name]
    while todo and len(statuses) < limit:
        found = await _statuses({n: addresses[n] for n in todo}, dict.fromkeys(todo, tls))
        statuses.update(found)
        todo = []
        for status in found.values():
            for view in status.neighbours if status is not None else ():
                if view.name not in addresses:
                    addresses[view.name] = view.address
                    todo.append(view.name)
    rows = [AgentRow(n, addresses[n], statuses.get(n)) for n in sorted(addresses, key=_natural)]
    return RunProgress(source=f"agent {name} at {address}", rows=rows)


def _natural(name: str) -> tuple[str, int]:
    """agent2 before agent10."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1
