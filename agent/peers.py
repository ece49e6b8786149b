"""The agent's client side: one channel per peer, calls retried until a deadline, and errors
that name the neighbour, its address and what was being done. Phase drivers hand it plain
values (keys, ciphertexts, serialized round messages); protobuf stays here and in the servicer."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from agent.concurrency import all_or_first_error, settle
from agent.life import Life
from agent.mailbox import Mailbox, NeighbourTimeout
from agent.options import AgentFailure, AgentOptions, RefusedByNeighbour
from agent.outbox import Outbox
from agent.round_stream import RoundStream, StreamBroken
from agent.session import Session
from efpsn.crypto import paillier
from efpsn.wire import records, serde
from efpsn.wire.net import Patience, call_with_retry, open_channel
from efpsn.wire.records import Phase
from efpsn.wire.rounds import round_request
from efpsn.wire.v1 import agent_pb2, agent_pb2_grpc, common_pb2

log = logging.getLogger("efpsn.agent")

Deliver = Callable[..., Awaitable[None]]  # (method, make(name) -> request, *, timeout)


class Peers:
    """Sends to and collects from the neighbours of one session."""

    def __init__(self, options: AgentOptions, mailbox: Mailbox, life: Life) -> None:
        self.options = options
        self.mailbox = mailbox
        self.life = life  # its session once assigned
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[str, RoundStream] = {}  # neighbour -> my round stream to it
        self.unacknowledged: collections.Counter[str] = collections.Counter()  # sends in flight

    def open(self, address: str, server_name: str, *,
             max_receive_bytes: int | None = None) -> grpc.aio.Channel:
        """A channel to `address` whose server must present a certificate for `server_name`."""
        tls = self.options.tls
        if tls is None:
            return open_channel(address, max_receive_bytes=max_receive_bytes)
        return open_channel(address, credentials=tls.channel_credentials(),
                            server_name=server_name, max_receive_bytes=max_receive_bytes)

    def _say(self, line: str) -> None:
        log.warning("%s: %s", self.options.name, line)

    @property
    def session(self) -> Session | None:
        return self.life.session

    def coordinator(self) -> grpc.aio.Channel:
        """The channel to the coordinator (opened once, closed with the others)."""
        channel = self._channels.get("coordinator")
        if channel is None:
            opts = self.options
            channel = self._channels["coordinator"] = self.open(opts.coordinator,
                                                                opts.coordinator_name)
        return channel

    def keep(self, key: str, channel: grpc.aio.Channel) -> None:
        """Close `channel` with the others at the end."""
        self._channels[key] = channel

    async def close(self) -> None:
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stream.close()
        for channel in self._channels.values():
            await channel.close()

    async def forget(self, name: str) -> None:
        """A neighbour that left for good: close my round stream and channel to it."""
        stream = self._streams.pop(name, None)
        if stream is not None:
            await stream.close()
        channel = self._channels.pop(name, None)
        if channel is not None:
            await channel.close()
        self.unacknowledged.pop(name, None)

    def _session(self) -> Session:
        session = self.life.session
        assert session is not None, "no session yet"
        return session

    def _stub(self, name: str) -> agent_pb2_grpc.AgentStub:
        return agent_pb2_grpc.AgentStub(self._channel(name))

    def _channel(self, name: str) -> grpc.aio.Channel:
        channel = self._channels.get(name)
        if channel is None:
            # a neighbour's largest legitimate reply is a round message (GetRound): a bigger
            # one is refused by gRPC before it is buffered or parsed
            s = self._session()
            channel = self.open(s.address_of(name), name,
                                max_receive_bytes=s.request_limits["PutRound"] + 64)
            self._channels[name] = channel
        return channel

    def header(self, phase: Phase, round_: int) -> common_pb2.Header:
        return records.make_header(
            run_id=self._session().run_id, sender=self.options.name, round=round_, phase=phase
        )

    async def call(self, name: str, method: str, request: Any, *, deadline: float,
                   what: str) -> Any:
        """One RPC to a neighbour, retried while it is unreachable or not ready; errors name the
        neighbour, its address and what was being done."""
        loop = asyncio.get_running_loop()
        rpc: Callable[..., Awaitable[Any]] = getattr(self._stub(name), method)
        address = self._session().address_of(name)
        try:
            return await call_with_retry(
                lambda: rpc(request, timeout=max(0.1, deadline - loop.time())),
                deadline=deadline, what=f"{what} neighbour {name} ({address})",
                on_retry=Patience(self._say, f"neighbour {name} ({address}): {what} it"),
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise AgentFailure(
                    f"timed out {what} neighbour {name} ({address}): no answer before the "
                    "round deadline (neighbour stopped, frozen or overloaded?)", blame=name,
                ) from None
            raise RefusedByNeighbour(
                f"{what} neighbour {name} ({address}) was refused: {exc.code().name}: "
                f"{exc.details()}", code=exc.code().name, detail=exc.details() or "",
                neighbour=name,
            ) from None
        except TimeoutError as exc:
            raise AgentFailure(str(exc), blame=name) from None

    async def send(self, name: str, method: str, request: Any, *, timeout: float) -> None:
        """Deliver one message to a neighbour (phase and round in every error)."""
        loop = asyncio.get_running_loop()
        what = f"{Phase(request.header.phase).name} round {request.header.round}"
        self.unacknowledged[name] += 1
        try:
            ack = await self.call(name, method, request, deadline=loop.time() + timeout,
                                  what=f"sending {what} to")
        finally:
            self._done_sending(name)
        if not ack.accepted:
            raise AgentFailure(f"neighbour {name} ({self._session().address_of(name)}) refused "
                               f"{what}: {ack.detail}", blame=name)

    async def send_round(self, name: str, t: int, data: bytes, *, timeout: float,
                         timed: bool = True) -> None:
        """Write my round-t message (`data`, its serialized bytes) on my round stream to a
        neighbour; if that stream has ended, deliver it with PutRound, which retries and names
        every failure as `send` does. A stream that ends later is mended by `repair`.
        `timed=False`: no timer of its own for the write; the caller bounds the wait and calls
        `stalled` at the deadline (RoundLink: one check per round for all neighbours, instead
        of a timer armed and cancelled for every message)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.unacknowledged[name] += 1
        try:
            stream = self._streams.get(name)
            if stream is None:
                stream = self._streams[name] = RoundStream(self._channel(name),
                                                           on_break=self.mailbox.interrupt)
            try:
                if timed:
                    async with asyncio.timeout_at(deadline):
                        await stream.send(data, t)
                else:
                    await stream.send(data, t)
                return
            except TimeoutError:
                raise await self.stalled(name, t) from None
            except StreamBroken:
                pass  # the unary call below gets the neighbour's answer for this message
        finally:
            self._done_sending(name)
        await self.put_round(name, data, timeout=max(0.1, deadline - loop.time()))

    def writing(self, name: str) -> bool:
        """Whether a write on my round stream to `name` is under way (not taken by gRPC)."""
        stream = self._streams.get(name)
        return stream is not None and stream.writing

    async def stalled(self, name: str, t: int) -> AgentFailure:
        """The failure of a round-t write to `name` still under way at the round deadline;
        its stream is closed (a write may have been cut short: the next round starts afresh)."""
        stream = self._streams.get(name)
        if stream is not None:
            await stream.close()
        return AgentFailure(
            f"timed out sending OPTIMIZE round {t} to neighbour {name} "
            f"({self._session().address_of(name)}): it accepted no more data before the "
            "round deadline (neighbour stopped, frozen or overloaded?)", blame=name)

    async def put_round(self, name: str, data: bytes, *, timeout: float) -> None:
        """Deliver one serialized round message with PutRound, acknowledged."""
        await self.send(name, "PutRound", agent_pb2.RoundMessage.FromString(data),
                        timeout=timeout)

    async def repair(self, outbox: Outbox, *, holds: Callable[[str, int], bool],
                     deadline: float) -> None:
        """For every round stream that has ended: deliver with PutRound the rounds written on
        it that the neighbour has not confirmed (its round t+1 message confirms my round t:
        `holds(name, t + 1)`, phase II's ledger knows); `outbox` holds my recent round
        messages. A refusal raises RefusedByNeighbour."""
        loop = asyncio.get_running_loop()
        for name, stream in sorted(self._streams.items()):
            if stream.broken is None:
                continue
            del self._streams[name]
            await stream.close()
            for t in stream.written:
                data = outbox.get(t)
                if data is None or holds(name, t + 1):
                    continue
                await self.put_round(name, data, timeout=max(0.1, deadline - loop.time()))

    async def pull(self, name: str, t: int, *, deadline: float) -> agent_pb2.RoundMessage | None:
        """A neighbour's round-t message as it sent it to this agent's previous process
        (GetRound), still to be taken (agent/phases/phase_two.py) as a pushed one is; None when it
        has not reached round t yet. RefusedByNeighbour when it refuses (NOT_FOUND: it no longer
        holds that round)."""
        reply = await self.call(name, "GetRound", round_request(
            header=self.header(Phase.OPTIMIZE, t)), deadline=deadline,
            what=f"pulling OPTIMIZE round {t} from")
        return reply.message if reply.available else None

    async def send_public_key(self, public_key: paillier.PublicKey, *, timeout: float,
                              via: Deliver | None = None) -> None:
        """Phase I, step 1: my Paillier public key to every neighbour (`via`: another way to
        deliver to all, e.g. agent/departure/phase_one.py's, which goes on without a departed
        neighbour)."""
        message = serde.public_key_message(header=self.header(Phase.KEYS, 0), n=public_key.n)
        await (via or self.send_all)("PutPublicKey", lambda name: message, timeout=timeout)

    async def send_shares(self, outgoing: Mapping[str, tuple[paillier.PublicKey, list[int]]], *,
                          num_coefficients: int, packed: bool, timeout: float,
                          via: Deliver | None = None) -> None:
        """Phase I: each neighbour's ciphertexts, under its key (name -> (key, ciphertexts))."""
        header = self.header(Phase.SHARES, 0)
        await (via or self.send_all)("PutShares", lambda name: serde.shares_message(
            header=header, fingerprint=paillier.fingerprint(outgoing[name][0]),
            ciphertexts=outgoing[name][1], num_coefficients=num_coefficients, packed=packed),
            timeout=timeout)

    def _done_sending(self, name: str) -> None:
        self.unacknowledged[name] -= 1
        if self.unacknowledged[name] <= 0:
            del self.unacknowledged[name]

    async def send_all(self, method: str, make: Callable[[str], Any], *, timeout: float) -> None:
        """Deliver make(name) to every neighbour, concurrently."""
        await all_or_first_error(
            self.send(name, method, make(name), timeout=timeout)
            for name in sorted(self._session().addresses)
        )

    async def collect(self, kind: str, round_: int, *, timeout: float,
                      senders: Mapping[str, int] | None = None) -> dict[int, Any]:
        """Wait for one message per neighbour (or per `senders`, name -> index); keyed by
        neighbour index.

        Halfway through the wait, the neighbours still missing are asked (GetStatus) whom they
        wait for themselves, so a timeout names the agent that actually stopped when it is
        a neighbour's neighbour."""
        s = self._session()
        loop = asyncio.get_running_loop()
        start = loop.time()
        probe: asyncio.Future[str] | None = None
        index = {name: i for i, name in s.names.items()} if senders is None else dict(senders)
        wanted = s.neighbour_names if senders is None else frozenset(senders)
        try:
            try:
                got = await self.mailbox.collect(kind, round_, wanted, timeout=timeout / 2)
            except NeighbourTimeout as slow:
                probe = asyncio.ensure_future(self._why_missing(slow.missing))
                got = await self.mailbox.collect(
                    kind, round_, wanted, timeout=max(0.0, timeout - (loop.time() - start)))
        except NeighbourTimeout as exc:
            where = ", ".join(f"{m} ({s.address_of(m)})" for m in exc.missing)
            hints = ""
            if probe is not None and probe.done() and not probe.cancelled() \
                    and probe.exception() is None:
                hints = probe.result()
            late = NeighbourTimeout(kind=kind, round_=round_, missing=exc.missing,
                                    waited=loop.time() - start)
            raise AgentFailure(f"{self.options.name}: {late} [{where}]{hints}",
                               blame=exc.missing[0]) from None
        finally:
            if probe is not None:
                await settle(probe)
        return {index[name]: payload for name, payload in got.items()}

    async def _why_missing(self, missing: list[str]) -> str:
        """'; agent5 waits for agent4 itself (round 40)' and the like, from their GetStatus."""

        async def ask(name: str) -> str:
            try:
                st = await self._stub(name).GetStatus(agent_pb2.StatusRequest(), timeout=2.0)
            except grpc.aio.AioRpcError:
                return f"{name} does not answer"
            if st.error:
                return f"{name} failed: {st.error[:300]}"
            if st.waiting_for:
                return (f"{name} waits itself for {', '.join(st.waiting_for)} "
                        f"(at round {st.round})")
            return f"{name} is at round {st.round}"

        answers = await asyncio.gather(*(ask(n) for n in missing))  # ask() never raises
        return "; " + "; ".join(answers)

    async def unresponsive(self, names: list[str], *, timeout: float = 2.0) -> list[str]:
        """Those of `names` that do not answer GetStatus within `timeout`: stopped, frozen or
        unreachable. A neighbour that answers is alive (it waits itself, typically)."""

        async def silent(name: str) -> bool:
            try:
                await self._stub(name).GetStatus(agent_pb2.StatusRequest(), timeout=timeout)
            except grpc.aio.AioRpcError:
                return True
            return False

        answers = await asyncio.gather(*(silent(n) for n in names))  # silent() never raises
        return [n for n, quiet in zip(names, answers, strict=True) if quiet]
