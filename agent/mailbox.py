"""An asyncio buffer for neighbours' accepted messages: early ones wait, a full set is collected,
missing ones are named. Whether a message is acceptable is efpsn/ledger.py's to decide."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any


class NeighbourTimeout(TimeoutError):
    """Raised when neighbours did not deliver a message before the deadline; names them."""

    def __init__(self, *, kind: str, round_: int, missing: list[str], waited: float) -> None:
        self.kind = kind
        self.round = round_
        self.missing = missing
        who = ", ".join(missing)
        super().__init__(
            f"no {kind} message for round {round_} from {who} within {waited:.1f}s "
            f"(neighbour stopped or unreachable?)"
        )


class Interrupted(Exception):
    """A waiting `collect` was interrupted (Mailbox.interrupt): the reason is the cause."""


class Mailbox:
    """Accepted payloads keyed by (kind, round, sender).

    `put` never blocks (it runs inside gRPC handlers); `collect` waits for a full set of senders
    and is woken once, when the set is complete (or it is interrupted), not by every message.
    A message that arrives before its round is buffered until collected; `discard_before` frees
    the payloads of rounds already consumed.
    """

    def __init__(self) -> None:
        self._boxes: dict[tuple[str, int], dict[str, Any]] = {}
        self._waiter: asyncio.Future[None] | None = None  # what a waiting `collect` awaits
        self._interrupt: BaseException | None = None
        self._awaited: tuple[tuple[str, int], frozenset[str]] | None = None  # what collect waits for

    @property
    def waiting_for(self) -> list[str]:
        """The senders `collect` is waiting for right now."""
        if self._awaited is None:
            return []
        key, wanted = self._awaited
        box = self._boxes.get(key, {})
        return sorted(s for s in wanted if s not in box)

    def put(self, kind: str, round_: int, sender: str, payload: Any) -> None:
        """Store an accepted message (the ledger let it in once); wake a waiting `collect` when
        this message completes what it waits for."""
        key = (kind, round_)
        box = self._boxes.setdefault(key, {})
        box[sender] = payload
        awaited = self._awaited
        if awaited is not None and awaited[0] == key and awaited[1] <= box.keys():
            self._wake()

    def has(self, kind: str, round_: int, sender: str) -> bool:
        return sender in self._boxes.get((kind, round_), {})

    def discard_before(self, kind: str, round_: int) -> None:
        """Forget delivered payloads of `kind` for rounds < round_ (bounded memory)."""
        for key in [k for k in self._boxes if k[0] == kind and k[1] < round_]:
            del self._boxes[key]

    def interrupt(self, reason: BaseException) -> None:
        """Make a `collect` that is (or will next be) waiting raise Interrupted, once: e.g. a
        stream to a neighbour broke, so messages it carried may have to be sent again before
        the neighbours can answer."""
        self._interrupt = reason
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def size(self) -> int:
        """Number of buffered payloads (for tests of bounded memory)."""
        return sum(len(box) for box in self._boxes.values())

    async def collect(
        self, kind: str, round_: int, senders: Iterable[str], *, timeout: float
    ) -> dict[str, Any]:
        """Wait until every sender delivered (kind, round_); return their payloads by sender."""
        wanted = sorted(set(senders))
        start = time.monotonic()
        deadline = start + timeout
        self._awaited = ((kind, round_), frozenset(wanted))
        try:
            while True:
                box = self._boxes.get((kind, round_), {})
                missing = [s for s in wanted if s not in box]
                if not missing:
                    return {s: box[s] for s in wanted}
                if self._interrupt is not None:
                    reason, self._interrupt = self._interrupt, None
                    raise Interrupted(str(reason) or type(reason).__name__) from reason
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NeighbourTimeout(kind=kind, round_=round_, missing=missing,
                                           waited=time.monotonic() - start)
                await self._wait(remaining)
        finally:
            self._awaited = None

    async def _wait(self, remaining: float) -> None:
        """Until a put completes what `collect` waits for, an interrupt, or `remaining` seconds:
        one future and one timer handle, no timeout context and no Event (not wait_for: on
        Python 3.11 it swallows a cancellation that lands in the same loop iteration as a
        message, so a signalled agent would run on; a cancellation here cancels the future
        and propagates)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(remaining, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _release(waiter: asyncio.Future[None]) -> None:
    """The deadline of a wait: let `collect` look again (and name who is missing)."""
    if not waiter.done():
        waiter.set_result(None)
