"""The round messages this agent sent: the newest ones in memory (served to neighbours that
restart, through GetRound) and on disk, so that after a crash it can still serve the rounds a
neighbour restarted from an older checkpoint must replay (two adjacent agents crashed at
different checkpoints then both resume). Messages are kept as the bytes that were sent."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import shutil
import zlib
from pathlib import Path

import xxhash

log = logging.getLogger("agent.state")

_MAGIC = b"EFO3"  # a record checked by _check
_HEAD = len(_MAGIC) + 8 + 4 + 4  # magic, round, length, check of the data
_SPARE = "spare.log"  # a dropped segment, kept to be written over (OutboxLog)
_SEGMENT = re.compile(r"^rounds-(\d{8,})\.log$")


def _check(data: bytes) -> int:
    """A record's check: the low 32 bits of XXH3-64 (unseeded) of its data."""
    return xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF


# the check of each record format, by magic (EFO2: an earlier version's, CRC-32, still read)
_CHECKS = {_MAGIC: _check, b"EFO2": zlib.crc32}


class OutboxLog:
    """Segment files `outbox/rounds-START.log` of `segment` rounds each, holding records
    (round, serialized RoundMessage, a 32-bit check of it); segments older than the newest
    `keep` rounds are dropped. Records are not fsync'ed: they must survive the process
    (kill -9), whose page cache the kernel keeps; a torn last record (its check or length is
    off) is ignored when loading. The current segment stays open: one write per round. The
    check only finds records torn by a crash, nobody crafts them: XXH3-64's low 32 bits, 1 us
    a round's 126 KB against CRC-32's 18 us (records an earlier version wrote under CRC-32,
    magic EFO2, are still read).

    A dropped segment is not deleted but kept as the spare (`spare.log`, which loading never
    reads), and the next new segment is the spare renamed and written over from its start: a
    round's 126 KB then go into pages the kernel already holds, instead of pages allocated for
    a new file and freed with an old one (that churn was most of a round's log write: about
    60 -> 25 us per round, the CRC-32 of then included). What follows the last record written
    in a recycled segment is an older segment's records, of rounds outside this segment's
    range: loading stops at the first record that is torn, out of the segment's range or not
    after the one before it."""

    def __init__(self, folder: Path, *, keep: int, segment: int) -> None:
        self.folder = folder
        self.keep = keep
        self.segment = max(1, segment)
        self._pruned_below = -1
        self._folder_made = False
        self._fd: int | None = None
        self._fd_start = -1  # the first round of the open segment
        self._offset = 0  # where the open segment's next record goes

    def _path(self, t: int) -> Path:
        return self.folder / f"rounds-{t // self.segment * self.segment:08d}.log"

    @property
    def _spare(self) -> Path:
        return self.folder / _SPARE

    def append(self, t: int, data: bytes) -> None:
        """Record round t's message (mode 0600 in a 0700 folder)."""
        start = t // self.segment * self.segment
        if self._fd is None or start != self._fd_start:
            self._open(t, start)
        assert self._fd is not None
        head = b"".join((_MAGIC, t.to_bytes(8, "big"), len(data).to_bytes(4, "big"),
                         _check(data).to_bytes(4, "big")))
        # one record, one system call, no copy of data
        self._offset += os.pwritev(self._fd, (head, data), self._offset)
        self._prune(t)

    def _open(self, t: int, start: int) -> None:
        """Open round t's segment for writing (the previous one is closed): after its last
        intact record if it exists (a restarted agent), else the spare renamed, else new."""
        self.close()
        if not self._folder_made:  # once, not a stat per round
            self.folder.mkdir(parents=True, exist_ok=True)
            os.chmod(self.folder, 0o700)
            self._folder_made = True
        path = self._path(t)
        offset = 0
        if path.exists():
            offset = _read_records(path.read_bytes(), start, self.segment, {})
        else:
            with contextlib.suppress(FileNotFoundError):
                os.rename(self._spare, path)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        self._fd_start, self._offset = start, offset

    def close(self) -> None:
        """Close the open segment (appending opens it again)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _segments(self) -> list[tuple[int, Path]]:
        if not self.folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.folder.iterdir()
                 if (m := _SEGMENT.match(p.name))]
        return sorted(found)

    def _prune(self, newest: int) -> None:
        below = newest - self.keep
        if below // self.segment <= self._pruned_below // self.segment:
            return
        self._pruned_below = below
        for start, path in self._segments():
            if start + self.segment <= below:
                if self._spare.exists():
                    path.unlink(missing_ok=True)
                else:
                    os.rename(path, self._spare)

    def load(self) -> dict[int, bytes]:
        """Every intact record, by round (a later copy of a round wins; they are identical)."""
        out: dict[int, bytes] = {}
        for start, path in self._segments():
            try:
                blob = path.read_bytes()
            except OSError as exc:
                log.warning("skipping %s: %s", path, exc)
                continue
            _read_records(blob, start, self.segment, out)
        return dict(sorted(out.items()))

    def delete(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        self._folder_made = False


def _read_records(blob: bytes, start: int, segment: int, out: dict[int, bytes]) -> int:
    """Add the intact records of one segment (rounds [start, start + segment), increasing)
    to `out`; returns the offset after the last of them."""
    at, last = 0, start - 1
    while at + _HEAD <= len(blob) and (check := _CHECKS.get(blob[at:at + 4])) is not None:
        t = int.from_bytes(blob[at + 4:at + 12], "big")
        size = int.from_bytes(blob[at + 12:at + 16], "big")
        expected = int.from_bytes(blob[at + 16:at + _HEAD], "big")
        data = blob[at + _HEAD:at + _HEAD + size]
        if len(data) != size or check(data) != expected or not last < t < start + segment:
            break  # torn by the crash, or an older segment's record: the end of this one
        out[t] = data
        last = t
        at += _HEAD + size
    return at


class Outbox:
    """My round messages of the newest `keep` rounds, as sent (serialized RoundMessage bytes);
    with a log, also kept on disk and reloaded after a crash (`restore`)."""

    def __init__(self, keep: int, log: OutboxLog | None = None) -> None:
        self.keep = keep
        self.log = log
        self._sent: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self.produced = -1  # newest round whose message exists

    def remember(self, t: int, data: bytes) -> None:
        """Keep my round-t message (`data`: its serialized bytes, as sent)."""
        if self.log is not None and t > self.produced:
            self.log.append(t, data)
        self._keep(t, data)

    def _keep(self, t: int, data: bytes) -> None:
        self._sent[t] = data
        self.produced = max(self.produced, t)
        while len(self._sent) > self.keep:
            self._sent.popitem(last=False)

    def get(self, t: int) -> bytes | None:
        """My round-t message, if still held."""
        return self._sent.get(t)

    def restore(self) -> int:
        """Reload what the previous process sent (from the log); returns how many rounds."""
        if self.log is None:
            return 0
        restored = self.log.load()
        for t, data in restored.items():
            self._keep(t, data)
        return len(restored)

    def stop_logging(self) -> None:
        """The run is over: the log is deleted with the state; memory serves the rest."""
        if self.log is not None:
            self.log.close()
        self.log = None

    def held(self) -> str:
        return f"{min(self._sent)}..{max(self._sent)}" if self._sent else "none"
