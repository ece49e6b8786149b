"""Files flushed to disk before anyone relies on them: the agent's state folder's writes."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_new", "write_private"]


def fsync_dir(folder: Path) -> None:
    """Flush `folder`'s entries (a file created or renamed in it), where the system allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes) -> None:
    """Atomically replace `path` with `data`, mode 0600, flushed to disk."""
    tmp = path.with_name(f".{path.name}.part")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_new(path: Path, data: bytes) -> None:
    """Create `path` (mode 0600; it must not exist) with `data`, flushed to disk. For files in
    a fresh folder that is renamed into place once complete: no rename of their own."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
