"""Phase II's round stream (StreamRounds) against a real agent server over mutual TLS on
loopback: messages filed in order with one answer when the sender ends the stream, admission
before the first byte is read, the first refusal ending the stream with PutRound's status, and
the sender mending a broken stream with PutRound."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from harness import InProcessAgent, assigned_agents

from agent.exchange import Replay, RoundLink
from agent.options import AgentFailure, RefusedByNeighbour
from agent.outbox import Outbox
from agent.round_stream import METHOD, RoundStream, StreamBroken
from efpsn.params.config import RunConfig
from efpsn.wire import guard, records, rounds
from efpsn.wire.net import open_channel
from efpsn.wire.records import Phase
from efpsn.wire.tls import TlsConfig
from efpsn.wire.v1 import agent_pb2

RUN = "stream-run"
# the paper's DSGD: a round message is one tensor x, which these tests craft by hand
CONFIG = RunConfig.preset("paper", agents=4, iterations=1000, key_bits=2048, round_timeout_seconds=20.0)
START = 4  # the receiver's current round


@dataclass
class Pair:
    receiver: InProcessAgent  # agent1, serving, in phase II at round START
    sender: InProcessAgent  # agent2, its neighbour (not serving: it only sends)
    tls_dir: Path

    @property
    def address(self) -> str:
        return self.receiver.address

    @property
    def shape(self) -> tuple[int, ...]:
        return self.receiver.session.message_shapes["x"]

    def message(self, t: int, *, sender: str = "agent2", run: str = RUN,
                value: float = 1.0) -> agent_pb2.RoundMessage:
        x = torch.full(self.shape, value + t, dtype=torch.float64)
        return rounds.message_to_proto({"x": x}, header=records.make_header(
            run_id=run, sender=sender, round=t, phase=Phase.OPTIMIZE))

    def channel(self, who: str) -> grpc.aio.Channel:
        tls = TlsConfig.from_dir(self.tls_dir, who)
        return open_channel(self.address, credentials=tls.channel_credentials(),
                            server_name="agent1")


@contextlib.asynccontextmanager
async def serving_pair() -> AsyncIterator[Pair]:
    """agent1 serving in phase II, and agent2 (its neighbour) ready to send to it."""
    folder = Path(tempfile.mkdtemp(prefix="efpsn-stream-"))
    try:
        async with assigned_agents(folder, CONFIG, run_id=RUN, names=("agent1", "agent2"),
                                   serve=("agent1",), round_=START) as agents:
            # agent2's neighbour agent1 is at its served address
            assert agents["agent2"].session.addresses["agent1"] == agents["agent1"].address
            yield Pair(agents["agent1"], agents["agent2"], folder / "tls")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _outbox(*messages: agent_pb2.RoundMessage) -> Outbox:
    """My sent round messages, as the exchange keeps them."""
    outbox = Outbox(keep=8)
    for m in messages:
        outbox.remember(m.header.round, m.SerializeToString())
    return outbox


def in_pair(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test body with a fresh serving pair on its own event loop."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        async def body() -> None:
            async with serving_pair() as pair:
                await test(pair, *args, **kwargs)

        asyncio.run(body())

    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        list(inspect.signature(test).parameters.values())[1:])
    return run


async def _stream(channel: grpc.aio.Channel, bodies: list[bytes]
                  ) -> tuple[agent_pb2.RoundAck | None, str, str]:
    """Write `bodies` on one StreamRounds call, then end it: (answer, status, details)."""
    call = channel.stream_unary(METHOD, request_serializer=None,
                                response_deserializer=agent_pb2.RoundAck.FromString)()
    try:
        for body in bodies:
            await call.write(body)
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # the call ended early: its status says why
    try:
        answer = await call
    except grpc.aio.AioRpcError:
        answer = None
    return answer, (await call.code()).name, await call.details()


@in_pair
async def test_rounds_are_acknowledged_in_order_and_filed(pair: Pair) -> None:
    channel = pair.channel("agent2")
    try:
        first, second = pair.message(START), pair.message(START + 1)
        answer, code, _ = await _stream(channel, [m.SerializeToString()
                                                  for m in (first, second, first)])
        empty, empty_code, _ = await _stream(channel, [])
    finally:
        await channel.close()
    assert code == "OK" and (answer.round, answer.detail) == (START, "duplicate ignored")
    assert empty_code == "OK" and empty == agent_pb2.RoundAck()
    mailbox = pair.receiver.mailbox
    assert mailbox.has("round", START, "agent2") and mailbox.has("round", START + 1, "agent2")
    # the digest filed with the message is the one a retry is compared with
    ledger = pair.receiver.phase_two.ledger
    assert ledger.digest("agent2", START) == rounds.round_digest(first, seed=ledger.seed)
    assert not pair.receiver.service.rejections.counts


@pytest.mark.parametrize("who", ["intruder", "agent3"])
@in_pair
async def test_outsider_is_refused_before_anything_is_read(
        pair: Pair, who: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = []
    real_read = guard._read_raw

    async def counting_read(*args: object, **kwargs: object) -> bytes | None:
        reads.append(args[0])
        return await real_read(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(guard, "_read_raw", counting_read)
    channel = pair.channel(who)
    try:
        bomb = b"\x12\x00" * (4 * 1024 * 1024)  # 8 MB of empty tensor entries
        answer, code, details = await _stream(channel, [bomb])
    finally:
        await channel.close()
    assert (answer, code) == (None, "PERMISSION_DENIED")
    assert f"certificate is for ['{who}'], not a neighbour of agent1" in details
    assert reads == []  # refused at admission, before the first message was read
    assert pair.receiver.service.rejections.counts == {"PERMISSION_DENIED": 1}
    assert pair.receiver.mailbox.size() == 0


@in_pair
async def test_first_refusal_ends_the_stream_with_put_rounds_status(pair: Pair) -> None:
    limit = pair.receiver.session.request_limits["StreamRounds"]
    cases = {
        "garbage": (b"\xff\x00garbage", "INVALID_ARGUMENT", "not a valid efpsn.v1.RoundMessage"),
        "another run": (pair.message(START, run="other").SerializeToString(),
                        "INVALID_ARGUMENT", "run"),
        "claims agent3": (pair.message(START, sender="agent3").SerializeToString(),
                          "PERMISSION_DENIED", "claims to come from 'agent3'"),
        "oversize": (b"\x00" * (limit + 1), "INVALID_ARGUMENT", "larger than"),
        "round ahead": (pair.message(START + 2).SerializeToString(), "UNAVAILABLE",
                        "ahead of its window"),
        "conflicting copy": (pair.message(START, value=7.0).SerializeToString(),
                             "INVALID_ARGUMENT", "already received"),
    }
    channel = pair.channel("agent2")
    try:
        valid = pair.message(START).SerializeToString()
        for label, (bad, status, words) in cases.items():
            after = pair.message(START + 1).SerializeToString()
            answer, code, details = await _stream(channel, [valid, bad, after])
            assert answer is None and code == status and words in details, (label, code, details)
    finally:
        await channel.close()
    assert not pair.receiver.mailbox.has("round", START + 1, "agent2")
    assert sum(pair.receiver.service.rejections.counts.values()) == len(cases)


@in_pair
async def test_a_broken_stream_is_mended_with_put_round(pair: Pair) -> None:
    peers, mailbox = pair.sender.peers, pair.sender.mailbox
    interrupted: list[BaseException] = []
    mailbox.interrupt = interrupted.append  # type: ignore[method-assign]
    # a round ahead of the receiver's window: the write succeeds, then the receiver ends the
    # stream (UNAVAILABLE); repair delivers that round with PutRound, retried until the
    # receiver has moved on
    ahead = pair.message(START + 2)
    await peers.send_round("agent1", START + 2, ahead.SerializeToString(), timeout=10.0)
    stream = peers._streams["agent1"]
    await _until(lambda: stream.broken is not None, timeout=10)
    assert isinstance(stream.broken, grpc.aio.AioRpcError)
    assert stream.broken.code() == grpc.StatusCode.UNAVAILABLE
    assert len(interrupted) == 1  # a waiting collect would have woken up to repair

    async def advance() -> None:
        await asyncio.sleep(0.5)
        pair.receiver.phase_two.ledger.advance(START + 1)

    mover = asyncio.ensure_future(advance())
    loop = asyncio.get_running_loop()
    holds = pair.sender.phase_two.ledger.holds
    await peers.repair(_outbox(ahead), holds=holds, deadline=loop.time() + 10)
    await mover
    assert pair.receiver.mailbox.has("round", START + 2, "agent2")
    assert "agent1" not in peers._streams  # the next round opens a new stream
    # a round the neighbour has confirmed (its next round arrived) is not sent again
    nxt = pair.message(START + 3)
    await peers.send_round("agent1", START + 3, nxt.SerializeToString(), timeout=10.0)
    stream = peers._streams["agent1"]
    await _until(lambda: stream.broken is not None, timeout=10)  # ahead again
    pair.sender.phase_two.ledger.advance(START + 3)
    pair.sender.phase_two.ledger.judge("agent1", START + 4, b"confirms round START+3")
    rejected_before = sum(pair.receiver.service.rejections.counts.values())
    await peers.repair(_outbox(nxt), holds=holds, deadline=loop.time() + 10)
    assert sum(pair.receiver.service.rejections.counts.values()) == rejected_before  # nothing sent
    # a message the receiver refuses for good: repair raises, naming the neighbour and the
    # reason exactly as PutRound reports it
    bad = pair.message(START + 2, value=9.0)
    await peers.send_round("agent1", START + 2, bad.SerializeToString(), timeout=10.0)
    stream = peers._streams["agent1"]
    await _until(lambda: stream.broken is not None, timeout=10)
    with pytest.raises(RefusedByNeighbour) as info:
        await peers.repair(_outbox(bad), holds=holds, deadline=loop.time() + 10)
    assert info.value.code == "INVALID_ARGUMENT"
    assert str(info.value).startswith(
        f"sending OPTIMIZE round {START + 2} to neighbour agent1 ({pair.address}) was refused: "
        f"INVALID_ARGUMENT: a different round message for round {START + 2} from agent2 was "
        "already received"), info.value
    assert not peers.unacknowledged


@in_pair
async def test_a_write_on_an_ended_stream_goes_by_put_round(pair: Pair) -> None:
    peers = pair.sender.peers
    garbage_stream = RoundStream(pair.channel("agent2"))
    try:
        await garbage_stream.send(b"\xff\x00garbage", START)
        await _until(lambda: garbage_stream.broken is not None, timeout=10)
        assert garbage_stream.broken.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(StreamBroken):
            await garbage_stream.send(pair.message(START).SerializeToString(), START)
    finally:
        await garbage_stream.close()
    # Peers: a stream that ended before the write -> this round by PutRound at once
    peers._streams["agent1"] = garbage_stream
    message = pair.message(START)
    await peers.send_round("agent1", START, message.SerializeToString(), timeout=10.0)
    assert pair.receiver.mailbox.has("round", START, "agent2")


class _StuckStream:
    """A round stream whose neighbour takes no more data: a write never ends."""

    def __init__(self) -> None:
        self.broken: BaseException | None = None
        self.writing = False
        self.written: list[int] = []
        self.closed = False

    async def send(self, data: bytes, round_: int) -> None:
        self.written.append(round_)
        self.writing = True
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.closed = True
        self.broken = StreamBroken("the stream was closed")


@in_pair
async def test_a_write_still_under_way_at_the_deadline_fails_the_next_round(pair: Pair) -> None:
    """No timer per write: the round's writes are checked at the next round's start, and one
    still under way at the deadline fails the round, naming the neighbour; its stream is
    closed (the next round starts afresh)."""
    sender = pair.sender
    stuck = _StuckStream()
    sender.peers._streams["agent1"] = stuck  # type: ignore[assignment]
    replay = Replay(peers=sender.peers, take=sender.phase_two.take_round,
                    mailbox=sender.mailbox, neighbours=set(), describe_loss=lambda *a: "",
                    on_loss=lambda n: None)
    link = RoundLink(peers=sender.peers, outbox=Outbox(keep=8), replay=replay, run_id=RUN,
                     name="agent2", neighbours=["agent1"], timeout=0.5,
                     holds=sender.phase_two.ledger.holds)
    for neighbour in sender.session.neighbour_names:  # their round START is already here
        sender.mailbox.put("round", START, neighbour, {"x": torch.zeros(pair.shape)})
    x = torch.ones(pair.shape, dtype=torch.float64)
    loop = asyncio.get_running_loop()
    start = loop.time()
    inbox = await link.exchange(START, {"x": x})
    assert len(inbox) == len(sender.session.neighbour_names)
    with pytest.raises(AgentFailure) as info:
        await link.delivered()
    assert 0.4 < loop.time() - start < 5.0
    assert stuck.written == [START] and stuck.closed
    assert info.value.blame == "agent1", info.value
    assert str(info.value).startswith(
        f"timed out sending OPTIMIZE round {START} to neighbour agent1 ({pair.address}): it "
        "accepted no more data before the round deadline"), info.value
    await link.delivered()  # nothing left behind


async def _until(done: Callable[[], bool], *, timeout: float) -> None:
    """Poll `done` until it holds (TimeoutError after `timeout` seconds)."""
    async with asyncio.timeout(timeout):
        while not done():
            await asyncio.sleep(0.01)


@pytest.mark.process
def test_transport_benchmark_runs_every_path() -> None:
    """benchmarks/bench_transport.py (a few messages): every path of its table is measured and
    printed with its ratio to bare gRPC, so the benchmark the README cites keeps working."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_transport.py"),
                          "--messages", "30"], capture_output=True, text=True, timeout=300,
                         cwd=root, check=True).stdout
    rows = {line[:56].strip(): line[56:].split() for line in out.splitlines()
            if line.startswith(("agent transport", "bare grpc", "raw TCP"))}
    assert len(rows) == 8, out
    assert rows["bare grpc.aio unary, same bytes"][1] == "1.00", out
    for label, (cpu, ratio, wall, wall_ratio) in rows.items():
        assert float(cpu) > 0 and float(wall) > 0 and float(ratio) > 0, (label, out)


@pytest.mark.parametrize("outcome", ["written", "refused"])
def test_writes_that_end_as_the_deadline_passes_decide_the_round(outcome: str) -> None:
    """A process frozen past the round deadline (SIGSTOP) wakes to find its writes ending in
    the same turn of the loop as the deadline: then no write is late, and their outcomes
    decide the round (a finished write passes, a refusal is raised), never an IndexError."""
    async def write() -> None:
        await asyncio.sleep(0)  # ends in the turn the deadline fires
        if outcome == "refused":
            raise AgentFailure("refused by agent1", blame="agent1")

    async def scenario() -> None:
        link = RoundLink(peers=None, outbox=Outbox(keep=8),  # type: ignore[arg-type]
                         replay=None, run_id=RUN, name="agent2",  # type: ignore[arg-type]
                         neighbours=["agent1"], timeout=0.5, holds=lambda name, t: False)
        loop = asyncio.get_running_loop()
        link._sending = {"agent1": asyncio.ensure_future(write())}
        link._sent = (START, loop.time() - 1.0)  # the deadline passed while we were frozen
        if outcome == "written":
            await link.delivered()
        else:
            with pytest.raises(AgentFailure, match="refused by agent1"):
                await link.delivered()
        assert link._sending == {}

    asyncio.run(scenario())
