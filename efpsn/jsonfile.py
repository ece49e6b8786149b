"""Strict JSON files: non-finite floats as strings and back, written atomically (results,
summaries, experiment records)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    """Replace non-finite floats with strings so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def json_numbers(value: Any) -> Any:
    """json_safe's inverse: its strings for non-finite floats back to floats."""
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_numbers(v) for v in value]
    return value


def read_json(path: str | os.PathLike[str]) -> Any:
    """A file write_json wrote, with its non-finite numbers back as floats."""
    return json_numbers(json.loads(Path(path).read_text()))


def read_run_json(path: str | os.PathLike[str], *, fmt: int | str, run_id: str) -> Any:
    """A state file of one run (an agent's departures, new edges, per-edge terms): read_json's
    payload, ValueError when its "format" is not `fmt` or it belongs to another run."""
    payload = read_json(path)
    if payload.get("format") != fmt or payload.get("run_id") != run_id:
        raise ValueError(f"it belongs to run {payload.get('run_id')!r}, not {run_id!r}")
    return payload


def write_json(path: str | os.PathLike[str], payload: Any, *, mode: int | None = None,
               sync: bool = False) -> None:
    """Write strict JSON atomically (temp file then rename): a crash never leaves half a file.
    With `mode` (e.g. 0o600 for private results) the file never exists with wider rights; with
    `sync` (state a restart reads) the file and its folder are fsync'ed before and after the
    rename, so a power loss leaves the old file or the new one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    text = json.dumps(json_safe(payload), indent=2, allow_nan=False) + "\n"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, target)
    if sync:
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
