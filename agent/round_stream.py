"""My end of the long-lived StreamRounds call to one neighbour: round messages written in order,
with no answer per message.

The neighbour's own next round message is the acknowledgement: it cannot compute its round t+1
without my round t. So the rounds a neighbour may lack are only the last few written on a
stream; when the stream breaks (the neighbour refused a message, restarted, or is not ready),
the caller (agent/peers.py) delivers those with the unary PutRound, which retries and reports
exactly as before, and the next round opens a new stream.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

import grpc

from efpsn.wire.v1 import agent_pb2

METHOD = "/efpsn.v1.Agent/StreamRounds"
# Rounds a neighbour may lack when a stream breaks: my round t is confirmed once its round t+1
# arrives, and I write round t+1 only after its round t arrived, so at most my last two.
UNCONFIRMED = 2


class StreamBroken(Exception):
    """The stream has ended; the reason is its cause."""


class RoundStream:
    """One StreamRounds call on `channel`. `send` writes a serialized RoundMessage; when the
    call ends (a refusal, a reset, the neighbour gone) `broken` holds why, `on_break` is called
    once, and `written` names the rounds the neighbour may not have received."""

    def __init__(self, channel: grpc.aio.Channel,
                 on_break: Callable[[BaseException], None] | None = None) -> None:
        open_call = channel.stream_unary(
            METHOD, request_serializer=None,  # bytes, serialized once for every neighbour
            response_deserializer=agent_pb2.RoundAck.FromString)
        self._call = open_call()
        self._on_break = on_break
        self.written: collections.deque[int] = collections.deque(maxlen=UNCONFIRMED)
        self.broken: BaseException | None = None
        self.writing = False  # a write is under way (gRPC has not taken all of it yet)
        self._watcher = asyncio.ensure_future(self._watch())

    async def send(self, data: bytes, round_: int) -> None:
        """Write one round message (StreamBroken if the stream has ended)."""
        if self.broken is not None:
            raise StreamBroken("the stream has ended") from self.broken
        self.written.append(round_)  # before the write: a write cut short may have gone out
        self.writing = True
        try:
            await self._call.write(data)
        except Exception as exc:  # the call ended (refusal, reset, cancelled)
            self._fail(exc)
            raise StreamBroken(str(exc) or type(exc).__name__) from exc
        finally:
            self.writing = False

    async def _watch(self) -> None:
        """Wait for the end of the call: it only ends early, with the neighbour's status."""
        try:
            await self._call
            self._fail(StreamBroken("the neighbour ended the stream"))
        except asyncio.CancelledError:
            self._fail(StreamBroken("the stream was closed"))
            raise
        except Exception as exc:  # noqa: BLE001 - a refusal (AioRpcError) or a broken call
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
            self._call.cancel()
            if self._on_break is not None:
                self._on_break(exc)

    async def close(self) -> None:
        """End the call and its watcher (without calling on_break)."""
        self._on_break = None
        self._fail(StreamBroken("the stream was closed"))
        self._watcher.cancel()
        await asyncio.wait({self._watcher})
