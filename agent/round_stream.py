"""My end of the long-lived StreamRounds call to one neighbour: round messages written in order,
the neighbour's acknowledgements matched to them in order.

A stream is only the fast path. When it breaks (the neighbour refused a message, restarted,
or is not ready), every message still waiting for its acknowledgement fails with StreamBroken,
and the caller (agent/peers.py) delivers that round with the unary PutRound, which retries and
reports exactly as before; the next round opens a new stream.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import grpc

from efpsn.wire.v1 import agent_pb2

METHOD = "/efpsn.v1.Agent/StreamRounds"


class StreamBroken(Exception):
    """The stream ended before this message was acknowledged (the reason is the cause)."""


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # an acknowledgement nobody waits for any more is not an error


class RoundStream:
    """One StreamRounds call on `channel`; `send` writes a serialized RoundMessage and returns
    a future that resolves to its RoundAck (or fails with StreamBroken)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        open_call = channel.stream_stream(
            METHOD, request_serializer=None,  # bytes, serialized once for every neighbour
            response_deserializer=agent_pb2.RoundAck.FromString)
        self._call = open_call()
        self._pending: collections.deque[tuple[int, asyncio.Future[Any]]] = collections.deque()
        self.broken: BaseException | None = None
        self._reader = asyncio.ensure_future(self._read_acks())

    async def send(self, data: bytes, round_: int) -> asyncio.Future[Any]:
        """Write one round message; the future of its acknowledgement."""
        if self.broken is not None:
            raise StreamBroken("the stream has ended") from self.broken
        acked: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        acked.add_done_callback(_consume)
        self._pending.append((round_, acked))
        try:
            await self._call.write(data)
        except Exception as exc:  # noqa: BLE001 - the call ended (refusal, reset, cancelled)
            self._fail(exc)
        return acked

    async def _read_acks(self) -> None:
        try:
            while True:
                ack = await self._call.read()
                if ack is grpc.aio.EOF:
                    raise StreamBroken("the neighbour ended the stream")
                if not self._pending:
                    raise StreamBroken(f"acknowledgement of round {ack.round}, nothing was sent")
                round_, acked = self._pending.popleft()
                if ack.round != round_:
                    raise StreamBroken(f"acknowledgement of round {ack.round}, expected {round_}")
                if not acked.done():
                    acked.set_result(ack)
        except asyncio.CancelledError:
            self._fail(StreamBroken("the stream was closed"))
            raise
        except Exception as exc:  # noqa: BLE001 - every end of the call fails what is pending
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
            self._call.cancel()
        while self._pending:
            _, acked = self._pending.popleft()
            if not acked.done():
                failure = StreamBroken(str(exc) or type(exc).__name__)
                failure.__cause__ = exc
                acked.set_exception(failure)

    async def close(self) -> None:
        """End the call and the reader; what is pending fails with StreamBroken."""
        self._fail(StreamBroken("the stream was closed"))
        self._reader.cancel()
        await asyncio.wait({self._reader})

