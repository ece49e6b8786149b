"""The calls a server is serving, so that stopping it ends them before the event loop does.

grpc.aio runs each call in two tasks of its own: one that runs the handler, and one around it
that waits for it. `server.stop(grace)` returns once gRPC's core is done with the calls, but
those tasks need a few more turns of the loop to finish. A loop that closes first (asyncio.run
returning, as an agent's or the coordinator's does once the run is over) cancels them, and gRPC
then prints "Exception not handled by _handle_exceptions in servicer method [...]" with two
tracebacks of a CancelledError into the log: noise that looks like a crash. `track` records
each handler's task per server (efpsn.wire.guard's handlers call it); `ended` waits for them.
"""

from __future__ import annotations

import asyncio
from typing import Any
from weakref import WeakKeyDictionary, WeakSet

__all__ = ["ended", "track"]

_CALLS: WeakKeyDictionary[Any, WeakSet[asyncio.Task[Any]]] = WeakKeyDictionary()


def track(server: Any) -> WeakSet[asyncio.Task[Any]]:
    """The tasks of `server`'s calls (a handler adds asyncio.current_task() to it)."""
    return _CALLS.setdefault(server, WeakSet())


async def ended(server: Any, *, timeout: float = 1.0) -> None:
    """After `server.stop(...)`: until the tasks of the calls it served have finished (at most
    `timeout` seconds), then two turns of the loop, in which gRPC's task around each ends."""
    pending = [task for task in track(server) if not task.done()]
    if pending:
        await asyncio.wait(pending, timeout=timeout)
    for _ in range(2):
        await asyncio.sleep(0)
