"""Files flushed to disk before anyone relies on them: the agent's state folder's writes."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

__all__ = ["fsync_dir", "write_all", "write_private"]


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


def write_all(folder: Path, files: Sequence[tuple[str, bytes]]) -> None:
    """Create each (name, bytes) of `files` in `folder` (mode 0600; none may exist), every one
    flushed to disk when this returns. For a fresh folder that is renamed into place once
    complete: no renames of their own.

    The files are written first, then fsync'ed all at once by a pool of threads: the file
    system commits concurrent fsyncs together (ext4's journal: one commit for all), where one
    after the other each waited for a commit of its own (a checkpoint's 11 files: 40-60 ms one
    by one, 2-5 ms at once, measured here at load 10)."""
    fds: list[int] = []
    try:
        for name, data in files:
            fds.append(os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            view = memoryview(data)
            while view:
                view = view[os.write(fds[-1], view):]
        if len(fds) == 1:
            os.fsync(fds[0])
        else:
            pool = _fsync_pool()
            flushing = [pool.submit(os.fsync, fd) for fd in fds]
            wait(flushing)  # every one ended before any file is closed
            for each in flushing:
                each.result()  # the first error is raised here
    finally:
        for fd in fds:
            os.close(fd)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _fsync_pool() -> ThreadPoolExecutor:
    """The threads that flush a folder's files at once, started on first use (never in a
    process that forks agents: it writes no checkpoint)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="fsync")
        return _POOL
