"""The outbox log (agent/outbox.py, OutboxLog): what a restarted agent reloads is exactly its
newest rounds as sent, also when the log recycles a dropped segment (written over from its
start, its older records still behind the new ones) and when the last record was torn."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from agent.outbox import Outbox, OutboxLog

SEGMENT, KEEP = 5, 8


def _data(t: int) -> bytes:
    """Round t's message; sizes differ, so a recycled segment's old records do not line up."""
    return bytes([t % 251]) * (100 + 37 * (t % 7))


def _log(folder: Path) -> OutboxLog:
    return OutboxLog(folder / "outbox", keep=KEEP, segment=SEGMENT)


def _append(log: OutboxLog, rounds: range) -> None:
    for t in rounds:
        log.append(t, _data(t))


def test_reload_gives_the_newest_rounds_through_recycled_segments(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _append(log, range(43))
    log.close()
    names = sorted(p.name for p in (tmp_path / "outbox").iterdir())
    # the segments of the newest KEEP rounds (the spare became segment 40)
    assert names == ["rounds-00000030.log", "rounds-00000035.log", "rounds-00000040.log"]
    _append(log, range(43, 44))  # round 35 leaves the newest KEEP: segment 30 is the spare
    assert max(p.name for p in (tmp_path / "outbox").iterdir()) == "spare.log"
    loaded = log.load()
    assert list(loaded) == list(range(35, 44))  # no stale record of a recycled segment
    assert all(loaded[t] == _data(t) for t in loaded)
    # the spare was recycled: a segment file is written over, not created anew each time
    size = (tmp_path / "outbox" / "rounds-00000040.log").stat().st_size
    assert size > sum(len(_data(t)) + 20 for t in range(40, 43))  # old records behind


def test_a_torn_record_ends_the_segment_and_is_written_over_after_a_restart(
        tmp_path: Path) -> None:
    log = _log(tmp_path)
    _append(log, range(24))
    log.close()
    path = tmp_path / "outbox" / "rounds-00000020.log"
    intact = sum(20 + len(_data(t)) for t in range(20, 23))
    with open(path, "r+b") as f:  # round 23's record torn half-way (kill -9 in its write)
        f.truncate(intact + 30)
    assert list(log.load()) == list(range(15, 23))
    restarted = _log(tmp_path)  # a new process: round 23 again, after the intact records
    _append(restarted, range(23, 26))
    restarted.close()
    loaded = restarted.load()
    assert list(loaded) == list(range(15, 26))
    assert all(loaded[t] == _data(t) for t in loaded)
    assert path.stat().st_size == intact + sum(20 + len(_data(t)) for t in range(23, 25))


def test_outbox_restores_what_the_log_kept(tmp_path: Path) -> None:
    outbox = Outbox(KEEP, _log(tmp_path))
    for t in range(31):
        outbox.remember(t, _data(t))
    outbox.stop_logging()
    again = Outbox(KEEP, _log(tmp_path))
    assert again.restore() == 11  # rounds 20..30: the segment of the oldest kept round on
    assert again.held() == f"{31 - KEEP}..30" and again.produced == 30
    assert all(again.get(t) == _data(t) for t in range(31 - KEEP, 31))
    assert oct(os.stat(tmp_path / "outbox").st_mode & 0o777) == "0o700"
    for p in (tmp_path / "outbox").iterdir():
        assert oct(p.stat().st_mode & 0o777) == "0o600", p


def test_a_recycled_segments_older_records_are_not_loaded(tmp_path: Path) -> None:
    """Records of one size line up: behind the new records, the old segment's are intact."""
    log = _log(tmp_path)
    for t in range(17):  # round 13 drops segment 0 (the spare); round 15 recycles it
        log.append(t, bytes([t]) * 64)
    log.close()
    recycled = tmp_path / "outbox" / "rounds-00000015.log"
    assert recycled.stat().st_size == 5 * (20 + 64)  # rounds 15, 16, then old 2, 3, 4
    assert list(log.load()) == list(range(5, 17))


def test_a_changed_byte_ends_the_segment_and_earlier_crc_records_still_load(
        tmp_path: Path) -> None:
    """A record whose data changed (its length intact) fails its check; a segment an earlier
    version wrote (records under magic EFO2, checked by CRC-32) loads, and a restarted agent
    appends its own records after it."""
    folder = tmp_path / "outbox"
    folder.mkdir(mode=0o700)
    old = b"".join(b"EFO2" + t.to_bytes(8, "big") + len(_data(t)).to_bytes(4, "big")
                   + zlib.crc32(_data(t)).to_bytes(4, "big") + _data(t) for t in range(3))
    (folder / "rounds-00000000.log").write_bytes(old)
    log = _log(tmp_path)
    assert list(log.load()) == [0, 1, 2]
    _append(log, range(3, 5))  # written after the old records, as this version writes them
    log.close()
    blob = (folder / "rounds-00000000.log").read_bytes()
    assert blob.count(b"EFO2") == 3 and blob.count(b"EFO3") == 2
    assert log.load() == {t: _data(t) for t in range(5)}
    at = len(old) + 20 + len(_data(3)) + 20 + 5  # a byte of round 4's data
    (folder / "rounds-00000000.log").write_bytes(blob[:at] + bytes([blob[at] ^ 1])
                                                 + blob[at + 1:])
    assert list(log.load()) == [0, 1, 2, 3]
