"""An asyncio buffer for neighbours' messages: early ones wait, missing ones are named."""

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


class Mailbox:
    """Messages keyed by (kind, round, sender).

    `put` never blocks (it runs inside gRPC handlers); `collect` waits for a full set of senders.
    A message that arrives before its round is buffered; a second copy of the same
    (kind, round, sender) is reported as a duplicate and not stored again.
    """

    def __init__(self) -> None:
        self._boxes: dict[tuple[str, int], dict[str, Any]] = {}
        self._changed = asyncio.Event()

    def put(self, kind: str, round_: int, sender: str, payload: Any) -> bool:
        """Store a message; False when that (kind, round, sender) was already delivered."""
        box = self._boxes.setdefault((kind, round_), {})
        if sender in box:
            return False
        box[sender] = payload
        self._changed.set()
        return True

    def has(self, kind: str, round_: int, sender: str) -> bool:
        return sender in self._boxes.get((kind, round_), {})

    def discard_before(self, kind: str, round_: int) -> None:
        """Forget delivered messages of `kind` for rounds < round_ (bounded memory)."""
        for key in [k for k in self._boxes if k[0] == kind and k[1] < round_]:
            del self._boxes[key]

    async def collect(
        self, kind: str, round_: int, senders: Iterable[str], *, timeout: float
    ) -> dict[str, Any]:
        """Wait until every sender delivered (kind, round_); return their payloads by sender."""
        wanted = sorted(set(senders))
        start = time.monotonic()
        deadline = start + timeout
        while True:
            box = self._boxes.get((kind, round_), {})
            missing = [s for s in wanted if s not in box]
            if not missing:
                return {s: box[s] for s in wanted}
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NeighbourTimeout(
                    kind=kind, round_=round_, missing=missing, waited=time.monotonic() - start
                )
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=remaining)
            except TimeoutError:
                pass
