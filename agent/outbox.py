"""The round messages this agent sent: the newest ones in memory (served to neighbours that
restart, through GetRound) and on disk, so that after a crash it can still serve the rounds a
neighbour restarted from an older checkpoint must replay (two adjacent agents crashed at
different checkpoints then both resume). Messages are kept as the bytes that were sent."""

from __future__ import annotations

import collections
import logging
import os
import re
import shutil
import zlib
from pathlib import Path

log = logging.getLogger("agent.state")

_MAGIC = b"EFO2"
_HEAD = len(_MAGIC) + 8 + 4 + 4  # magic, round, length, CRC-32 of the data
_SEGMENT = re.compile(r"^rounds-(\d{8,})\.log$")


class OutboxLog:
    """Append-only segment files `outbox/rounds-START.log` of `segment` rounds each, holding
    records (round, serialized RoundMessage, CRC-32); segments older than the newest `keep`
    rounds are deleted. Records are not fsync'ed: they must survive the process (kill -9),
    whose page cache the kernel keeps; a torn last record (its CRC-32 or length is off) is
    ignored when loading. The current segment stays open: one write per round."""

    def __init__(self, folder: Path, *, keep: int, segment: int) -> None:
        self.folder = folder
        self.keep = keep
        self.segment = max(1, segment)
        self._pruned_below = -1
        self._folder_made = False
        self._fd: int | None = None
        self._fd_start = -1  # the first round of the open segment

    def _path(self, t: int) -> Path:
        return self.folder / f"rounds-{t // self.segment * self.segment:08d}.log"

    def append(self, t: int, data: bytes) -> None:
        """Record round t's message (mode 0600 in a 0700 folder)."""
        start = t // self.segment * self.segment
        if self._fd is None or start != self._fd_start:
            self._open(t, start)
        assert self._fd is not None
        head = b"".join((_MAGIC, t.to_bytes(8, "big"), len(data).to_bytes(4, "big"),
                         zlib.crc32(data).to_bytes(4, "big")))
        os.writev(self._fd, (head, data))  # one record, one system call, no copy of data
        self._prune(t)

    def _open(self, t: int, start: int) -> None:
        """Open round t's segment for appending (the previous one is closed)."""
        self.close()
        if not self._folder_made:  # once, not a stat per round
            self.folder.mkdir(parents=True, exist_ok=True)
            os.chmod(self.folder, 0o700)
            self._folder_made = True
        self._fd = os.open(self._path(t), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._fd_start = start

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
                path.unlink(missing_ok=True)

    def load(self) -> dict[int, bytes]:
        """Every intact record, by round (a later copy of a round wins; they are identical)."""
        out: dict[int, bytes] = {}
        for _, path in self._segments():
            try:
                blob = path.read_bytes()
            except OSError as exc:
                log.warning("skipping %s: %s", path, exc)
                continue
            at = 0
            while at + _HEAD <= len(blob) and blob[at:at + 4] == _MAGIC:
                t = int.from_bytes(blob[at + 4:at + 12], "big")
                size = int.from_bytes(blob[at + 12:at + 16], "big")
                crc = int.from_bytes(blob[at + 16:at + _HEAD], "big")
                data = blob[at + _HEAD:at + _HEAD + size]
                if len(data) != size or zlib.crc32(data) != crc:
                    break  # torn by the crash: everything after it is unusable
                out[t] = data
                at += _HEAD + size
        return dict(sorted(out.items()))

    def delete(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        self._folder_made = False


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
