"""Why a local network stopped, from what the agents recorded as data (RESULTS/failures/NAME.json:
their own reason and whom they blame) and their exit codes, never from log text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from efpsn.launch.processes import Child

__all__ = ["Diagnosis", "diagnose", "failure_file"]


def failure_file(folder: Path, name: str) -> Path:
    """Where agent `name` of a local network records why it stopped (`--failure-file`)."""
    return folder / "failures" / f"{name}.json"


@dataclass(frozen=True)
class Diagnosis:
    """The agents whose own failure stopped the run (with their reasons) and the others."""

    causes: dict[str, str]  # agent -> its own one-line reason
    followers: dict[str, str]  # agent -> the agent it stopped because of
    logs: Path

    def lines(self) -> list[str]:
        """Root causes first, then who stopped because of them, then where the logs are."""
        by_reason: dict[str, list[str]] = {}
        for name, reason in sorted(self.causes.items()):
            by_reason.setdefault(reason, []).append(name)
        out = [f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()]
        by_cause: dict[str, list[str]] = {}
        for name, cause in sorted(self.followers.items()):
            by_cause.setdefault(cause, []).append(name)
        for cause, names in sorted(by_cause.items()):
            out.append(f"{', '.join(names)} stopped because {cause} did")
        out.append(f"logs: {self.logs}/")
        return out


def _own(name: str, reason: str) -> str:
    """The reason without a leading "NAME: " (the diagnosis names the agent itself)."""
    return reason[len(name) + 2:] if reason.startswith(f"{name}: ") else reason


def _record(folder: Path, name: str) -> dict[str, Any] | None:
    try:
        record = json.loads(failure_file(folder, name).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def diagnose(agents: Sequence[Child], folder: Path) -> Diagnosis:
    """Read every stopped agent's failure record: an agent that blames nobody failed on its own
    (its data, model or state); one that blames another stopped because of it. An agent that
    exited with an error but left no record (killed, crashed) is a cause, with its exit code."""
    causes: dict[str, str] = {}
    followers: dict[str, str] = {}
    for child in agents:
        code = child.process.poll()
        if code in (None, 0):
            continue
        record = _record(folder, child.name)
        if record is None:
            causes[child.name] = (f"exited with code {code} without recording why; the end of "
                                  f"its log:\n{child.log_tail(5)}")
        elif record.get("blame"):
            followers[child.name] = str(record["blame"])
        else:
            causes[child.name] = _own(child.name, str(record.get("reason", "no reason")))
    # a blamed agent that is still running or finished cleanly cannot explain anything: the
    # agents that blame it are then causes in their own right
    for name, cause in list(followers.items()):
        if cause not in causes and cause not in followers:
            record = _record(folder, name) or {}
            causes[name] = _own(name, str(record.get("reason", f"stopped because of {cause}")))
            del followers[name]
    return Diagnosis(causes=causes, followers=followers, logs=folder / "logs")
