"""An asyncio buffer for neighbours' messages: early ones wait, missing ones are named, and a
duplicate is told apart from a conflicting copy by the digest of its content."""

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


class ConflictingDuplicate(ValueError):
    """A second copy of a (kind, round, sender) message whose content differs from the first."""


class Mailbox:
    """Messages keyed by (kind, round, sender), each with the digest of its content.

    `put` never blocks (it runs inside gRPC handlers); `collect` waits for a full set of senders.
    A message that arrives before its round is buffered. A second copy of the same
    (kind, round, sender) with the same digest is a harmless retry (reported, not stored again);
    with a different digest it is a ConflictingDuplicate. Digests outlive the payloads
    (`discard_before` frees payloads, `forget_before` digests), so retries of rounds already
    consumed can still be checked.
    """

    def __init__(self) -> None:
        self._boxes: dict[tuple[str, int], dict[str, Any]] = {}
        self._digests: dict[tuple[str, int], dict[str, bytes]] = {}
        self._forgotten: dict[str, int] = {}  # kind -> rounds below it hold no digest
        self._changed = asyncio.Event()
        self._interrupt: BaseException | None = None
        self.waiting_for: list[str] = []  # senders `collect` is waiting for right now

    def put(self, kind: str, round_: int, sender: str, payload: Any, digest: bytes) -> bool:
        """Store a message; False when an identical copy was already delivered."""
        seen = self._digests_of(kind, round_)
        known = seen.get(sender)
        if known is not None:
            if known != digest:
                raise ConflictingDuplicate(
                    f"a different {kind} message for round {round_} from {sender} was already "
                    "received (a duplicate must repeat the first copy exactly)"
                )
            return False
        seen[sender] = digest
        self._boxes.setdefault((kind, round_), {})[sender] = payload
        self._changed.set()
        return True

    def remember(self, kind: str, round_: int, sender: str, digest: bytes) -> None:
        """Record that (kind, round_, sender) was delivered with this digest, without a payload
        (e.g. restored from disk after a restart), so retries can be checked against it."""
        self._digests_of(kind, round_)[sender] = digest

    def _digests_of(self, kind: str, round_: int) -> dict[str, bytes]:
        floor = self._forgotten.get(kind)
        if floor is not None and round_ < floor:  # below what forget_before dropped: it will
            self._forgotten[kind] = round_  # drop this one too
        return self._digests.setdefault((kind, round_), {})

    def digest(self, kind: str, round_: int, sender: str) -> bytes | None:
        """Digest of the delivered (kind, round_, sender) message, if it is still remembered."""
        return self._digests.get((kind, round_), {}).get(sender)

    def has(self, kind: str, round_: int, sender: str) -> bool:
        return sender in self._boxes.get((kind, round_), {})

    def discard_before(self, kind: str, round_: int) -> None:
        """Forget delivered payloads of `kind` for rounds < round_ (bounded memory)."""
        for key in [k for k in self._boxes if k[0] == kind and k[1] < round_]:
            del self._boxes[key]

    def forget_before(self, kind: str, round_: int) -> None:
        """Forget payloads and digests of `kind` for rounds < round_ (called every round: the
        digests of the rounds since the last call are dropped, not every key scanned)."""
        self.discard_before(kind, round_)
        floor = self._forgotten.get(kind)
        if floor is None or round_ - floor > len(self._digests):
            for key in [k for k in self._digests if k[0] == kind and k[1] < round_]:
                del self._digests[key]
        else:
            for r in range(floor, round_):
                self._digests.pop((kind, r), None)
        self._forgotten[kind] = max(round_, floor or 0)

    def interrupt(self, reason: BaseException) -> None:
        """Make a `collect` that is (or will next be) waiting raise Interrupted, once: e.g. a
        stream to a neighbour broke, so messages it carried may have to be sent again before
        the neighbours can answer."""
        self._interrupt = reason
        self._changed.set()

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
        try:
            while True:
                box = self._boxes.get((kind, round_), {})
                missing = [s for s in wanted if s not in box]
                self.waiting_for = missing
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
            self.waiting_for = []

    async def _wait(self, remaining: float) -> None:
        """Until the next put (or `remaining` seconds)."""
        self._changed.clear()
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # lands in the same loop iteration as a message, so a signalled agent would run on
        try:
            async with asyncio.timeout(remaining):
                await self._changed.wait()
        except TimeoutError:
            pass
