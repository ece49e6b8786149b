"""Concurrent awaits that never leave an orphan task behind (no "Task exception was never
retrieved"), and settle a task that is no longer wanted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved


async def settle(task: asyncio.Future[Any]) -> None:
    """Cancel `task` if it still runs and wait until it ended; its outcome is consumed (the
    caller has what it needs, or fails for another reason). A cancellation of the caller
    itself still propagates (asyncio.wait never swallows it)."""
    task.add_done_callback(_consume)
    if not task.done():
        task.cancel()
        await asyncio.wait({task})


async def all_or_first_error(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Await everything concurrently; on the first failure cancel the rest, wait for them to
    end, and raise that failure (asyncio.gather would leave the others running unobserved)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    if not tasks:
        return []
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        for t in tasks:
            t.add_done_callback(_consume)
            t.cancel()
        raise
    failed = [t for t in tasks if t in done and not t.cancelled() and t.exception() is not None]
    if failed:
        for t in tasks:
            await settle(t)
        raise failed[0].exception()  # type: ignore[misc]
    return [t.result() for t in tasks]


async def to_completion(awaitable: Awaitable[T]) -> T:
    """Await `awaitable` to its end even if the caller is cancelled meanwhile (again and
    again: a signalled agent is re-cancelled every second), then re-raise that cancellation.
    For clean-up that must not be cut short, e.g. stopping a server whose neighbours' streams
    take the whole grace period to end."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result
