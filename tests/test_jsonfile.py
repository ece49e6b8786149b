"""efpsn/jsonfile.py: strict JSON written atomically, private files never wider than asked, and
state files fsync'ed (file and folder) when a restart reads them."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import pytest

from efpsn.jsonfile import read_json, read_run_json, write_json


def test_non_finite_numbers_round_trip_as_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "a" / "r.json"
    write_json(path, {"x": [1.5, math.inf], "y": {"z": -math.inf}})
    assert "Infinity" not in path.read_text()
    back = read_json(path)
    assert back["x"] == [1.5, math.inf] and back["y"]["z"] == -math.inf
    assert not list(path.parent.glob("*.part"))


def test_a_private_file_has_its_mode_and_replaces_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_json(path, {"v": 1}, mode=0o600)
    write_json(path, {"v": 2}, mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_json(path) == {"v": 2}


@pytest.mark.parametrize("sync", [False, True])
def test_sync_fsyncs_the_file_and_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             sync: bool) -> None:
    synced: list[bool] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_json(tmp_path / "d.json", {"v": 1}, mode=0o600, sync=sync)
    assert synced == ([False, True] if sync else [])


def test_a_run_state_file_is_read_only_for_its_own_run_and_format(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json(path, {"format": 2, "run_id": "run-a", "v": 1})
    assert read_run_json(path, fmt=2, run_id="run-a")["v"] == 1
    with pytest.raises(ValueError, match="belongs to run 'run-a', not 'run-b'"):
        read_run_json(path, fmt=2, run_id="run-b")
    with pytest.raises(ValueError, match="belongs to run"):
        read_run_json(path, fmt=3, run_id="run-a")  # another format of the same name
