"""The transport caps as a live server enforces them: a body one byte over each cap is refused
(by whom, with which code), one at the cap goes through; serde's default caps likewise. The
caps are the documented ones (efpsn/wire/limits.py), written out: a changed cap fails here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from coordinator.service import serve
from efpsn.params.config import RunConfig
from efpsn.wire import limits, serde
from efpsn.wire.guard import Admission, Gatekeeper, RejectionLog, guarded, unread_handler
from efpsn.wire.net import Server, open_channel, start_server
from efpsn.wire.records import WireError
from efpsn.wire.v1 import common_pb2

pytestmark = pytest.mark.timeout(120)

KiB, MiB = 1024, 1024 * 1024


def body(size: int) -> bytes:
    """A serialized efpsn.v1.Tensor of exactly `size` bytes (its data field padded)."""
    for length_bytes in range(1, 6):  # the data field: a tag byte, a varint length, the bytes
        data = size - 1 - length_bytes
        if 0 <= data < 2 ** (7 * length_bytes) and (length_bytes == 1 or data >= 2 ** (
                7 * (length_bytes - 1))):
            message = common_pb2.Tensor(data=bytes(data)).SerializeToString()
            assert len(message) == size
            return message
    raise AssertionError(f"no Tensor of exactly {size} bytes")


class Sink:
    """Admits every caller up to `grant` bytes; Put answers how many data bytes it read, Get
    answers a Tensor of exactly shape[0] bytes."""

    def __init__(self, grant: int) -> None:
        self.grant = grant
        self.rejections = RejectionLog(logging.getLogger("test.sink"), "sink")

    def admit(self, method: str, context: Any) -> Admission:
        return Admission(self.grant)

    @guarded
    async def Put(self, request: common_pb2.Tensor, context: Any) -> common_pb2.Tensor:
        return common_pb2.Tensor(shape=[len(request.data)])

    @guarded
    async def Get(self, request: common_pb2.Tensor, context: Any) -> bytes:
        return body(request.shape[0])

    def gatekeeper(self) -> Gatekeeper:
        return Gatekeeper("test.Sink", self.admit, rejections=self.rejections)

    def add(self, server: grpc.aio.Server) -> list[str]:
        handlers = {
            name: grpc.stream_unary_rpc_method_handler(
                unread_handler(getattr(self, name), common_pb2.Tensor), request_deserializer=None,
                response_serializer=serialize)
            for name, serialize in (("Put", common_pb2.Tensor.SerializeToString), ("Get", None))
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Sink",
                                                                               handlers),))
        return ["test.Sink"]


@asynccontextmanager
async def sink_server(**kwargs: Any) -> AsyncIterator[Server]:
    """efpsn.wire.net.start_server with the project's defaults, serving a Sink on 127.0.0.1."""
    sink = Sink(2**30)
    server = await start_server("127.0.0.1:0", add_servicers=sink.add,
                                interceptors=[sink.gatekeeper()], **kwargs)
    try:
        yield server
    finally:
        await server.stop(None)


async def outcome(call: Callable[[], Awaitable[Any]]) -> tuple[str, str]:
    """(status code name, details) of a call; ("OK", "") when it succeeds."""
    try:
        await call()
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


# ---------------------------------------------------------------------------- request caps


def test_a_server_reads_a_body_at_its_receive_cap_and_refuses_one_byte_more() -> None:
    async def scenario() -> None:
        async with sink_server() as server, open_channel(f"127.0.0.1:{server.port}") as channel:
            put = channel.unary_unary("/test.Sink/Put",
                                      response_deserializer=common_pb2.Tensor.FromString)
            cap = 16 * MiB  # what an agent reads at most, before anything else is known
            reply = await put(body(cap), timeout=30)
            assert len(body(cap)) == cap and reply.shape[0] > cap - 8
            code, detail = await outcome(lambda: put(body(cap + 1), timeout=30))
            # refused by gRPC from the length prefix, before the body is buffered
            assert (code, detail) == (
                "RESOURCE_EXHAUSTED",
                f"SERVER: Received message larger than max ({cap + 1} vs. {cap})")

    run(scenario)


def test_admission_is_a_grpc_interceptor_and_nothing_is_read_without_it() -> None:
    """The Gatekeeper (a grpc.aio.ServerInterceptor) admits a caller before its body is read;
    a guarded service served without one reads no request at all (it fails closed)."""
    assert issubclass(Gatekeeper, grpc.aio.ServerInterceptor)
    admitted: list[str] = []

    class Counting(Sink):
        def admit(self, method: str, context: Any) -> Admission:
            admitted.append(method)
            return Admission(self.grant)

    async def scenario(gated: bool) -> tuple[str, str]:
        sink = Counting(2**20)
        server = await start_server("127.0.0.1:0", add_servicers=sink.add,
                                    interceptors=[sink.gatekeeper()] if gated else [])
        try:
            async with open_channel(f"127.0.0.1:{server.port}") as channel:
                put = channel.unary_unary("/test.Sink/Put",
                                          response_deserializer=common_pb2.Tensor.FromString)
                return await outcome(lambda: put(body(100), timeout=30))
        finally:
            await server.stop(None)

    assert asyncio.run(scenario(True)) == ("OK", "") and admitted == ["Put"]
    assert asyncio.run(scenario(False)) == (
        "INTERNAL", "Put was not admitted: its server has no gatekeeper for it")
    assert admitted == ["Put"]


def test_a_client_sends_up_to_its_message_cap_and_never_more() -> None:
    async def scenario() -> None:
        async with sink_server() as server, open_channel(f"127.0.0.1:{server.port}") as channel:
            put = channel.unary_unary("/test.Sink/Put")
            cap = 64 * MiB  # what a client sends at most
            # one byte more never leaves the client
            assert await outcome(lambda: put(bytes(cap + 1), timeout=30)) == (
                "RESOURCE_EXHAUSTED", f"CLIENT: Sent message larger than max ({cap + 1} vs. {cap})")
            # at the cap it leaves, and the server's smaller receive cap refuses it
            code, detail = await outcome(lambda: put(bytes(cap), timeout=30))
            assert (code, detail.split("(")[0]) == (
                "RESOURCE_EXHAUSTED", "SERVER: Received message larger than max ")

    run(scenario)


def test_replies_beyond_the_message_cap_are_not_sent_and_smaller_ones_arrive() -> None:
    async def scenario() -> None:
        async with sink_server() as server, open_channel(f"127.0.0.1:{server.port}") as channel:
            get = channel.unary_unary("/test.Sink/Get",
                                      request_serializer=common_pb2.Tensor.SerializeToString)
            cap = 64 * MiB  # what a server sends at most
            assert await outcome(lambda: get(common_pb2.Tensor(shape=[cap + 1]), timeout=30)) == (
                "RESOURCE_EXHAUSTED", f"SERVER: Sent message larger than max ({cap + 1} vs. {cap})")
            # a client takes replies beyond gRPC's default 4 MiB
            reply = await get(common_pb2.Tensor(shape=[5 * MiB]), timeout=30)
            assert len(reply) == 5 * MiB

    run(scenario)


def test_a_health_check_is_a_small_request() -> None:
    cap = 16 * KiB  # a request that carries only a name

    def check(name_bytes: int) -> bytes:
        return health_pb2.HealthCheckRequest(service="s" * name_bytes).SerializeToString()

    at_cap, over = check(cap - 3), check(cap - 2)
    assert (len(at_cap), len(over)) == (cap, cap + 1)

    async def scenario() -> None:
        async with sink_server() as server, open_channel(f"127.0.0.1:{server.port}") as channel:
            rpc = channel.unary_unary("/grpc.health.v1.Health/Check")
            assert await outcome(lambda: rpc(over, timeout=30)) == (
                "INVALID_ARGUMENT",
                (f"request of {cap + 1} bytes is larger than the {cap} bytes Check can "
                 "carry in this run"))
            code, _ = await outcome(lambda: rpc(at_cap, timeout=30))
            assert code == "NOT_FOUND"  # read, parsed and answered: no such service

    run(scenario)


def test_the_coordinator_reads_registrations_up_to_its_cap(tmp_path: Path) -> None:
    cap, small = 256 * KiB, 16 * KiB  # a registration; a request that carries only a name
    port_file = tmp_path / "port"

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(RunConfig(), listen="127.0.0.1:0",
                                         port_file=str(port_file), stop=stop))
        try:
            while not port_file.exists():
                await asyncio.sleep(0.01)
            async with open_channel(f"127.0.0.1:{port_file.read_text().strip()}") as channel:
                register = channel.unary_unary("/efpsn.v1.Coordinator/Register")
                assert await outcome(lambda: register(b"\xff" * (cap + 1), timeout=30)) == (
                    "RESOURCE_EXHAUSTED",
                    f"SERVER: Received message larger than max ({cap + 1} vs. {cap})")
                code, detail = await outcome(lambda: register(b"\xff" * cap, timeout=30))
                assert code == "INVALID_ARGUMENT"
                assert detail.startswith("request is not a valid efpsn.v1.RegisterRequest")
                status = channel.unary_unary("/efpsn.v1.Coordinator/GetRunStatus")
                assert await outcome(lambda: status(b"\xff" * (small + 1), timeout=30)) == (
                    "INVALID_ARGUMENT", (f"request of {small + 1} bytes is larger than the "
                                         f"{small} bytes GetRunStatus can carry in this run"))
                code, detail = await outcome(lambda: status(b"\xff" * small, timeout=30))
                assert detail.startswith("request is not a valid efpsn.v1.RunStatusRequest")
        finally:
            stop.set()
            await task

    run(scenario)


def test_a_second_server_cannot_bind_a_port_in_use() -> None:
    """No SO_REUSEPORT: nobody can listen next to us and take half of our callers."""

    async def scenario() -> None:
        async with sink_server() as server:
            with pytest.raises(OSError, match=f"port {server.port} on 127.0.0.1 is already "
                                              "in use"):
                await start_server(f"127.0.0.1:{server.port}", add_servicers=Sink(1).add)

    run(scenario)


# ---------------------------------------------------------------------------- serde's caps


def test_keys_up_to_the_key_cap_are_read_and_longer_ones_refused() -> None:
    bits = 16384  # the largest Paillier key a peer may send
    largest = 2**bits - 1  # odd, exactly MAX_KEY_BITS bits
    assert serde.public_key_from_proto(serde.public_key_to_proto(largest)) == largest
    longer = serde.int_to_bytes(2**bits + 1)
    forged = common_pb2.PaillierPublicKey(n=longer, fingerprint=serde.key_fingerprint(2**bits + 1))
    with pytest.raises(WireError, match=f"^public key n \\(at most {bits} bits\\)"):
        serde.public_key_from_proto(forged)
    with pytest.raises(WireError,
                       match=f"^Paillier modulus has {bits + 1} bits, more than {bits}$"):
        serde.public_key_to_proto(2**bits + 1)


def test_ciphertexts_up_to_the_ciphertext_cap_are_read_and_longer_ones_refused() -> None:
    cap = 2 * 16384 // 8  # a ciphertext lives below n^2 for the largest key

    def batch(size: int) -> common_pb2.CiphertextBatch:
        return common_pb2.CiphertextBatch(key_fingerprint=bytes(32), ciphertexts=[b"\x01" * size],
                                          num_coefficients=1, packed=False)

    assert serde.ciphertexts_from_proto(batch(cap)).ciphertexts == (int.from_bytes(b"\x01" * cap),)
    with pytest.raises(WireError) as refused:
        serde.ciphertexts_from_proto(batch(cap + 1))
    assert str(refused.value) == (
        f"ciphertext 0: integer must be at most {cap} bytes long, got {cap + 1}")


def test_tensors_are_capped_in_dimensions_and_elements_before_allocation() -> None:
    dims = 32
    one = common_pb2.Tensor(dtype="float32", shape=[1] * dims, data=bytes(4))
    assert tuple(serde.tensor_from_proto(one).shape) == (1,) * dims
    with pytest.raises(WireError, match=f"^tensor has {dims + 1} dimensions, more than {dims}$"):
        serde.tensor_from_proto(common_pb2.Tensor(dtype="float32", shape=[1] * (dims + 1),
                                                  data=bytes(4)))
    elements = 64 * MiB // 4  # any float32 tensor a 64 MiB message can carry
    with pytest.raises(WireError) as refused:
        serde.tensor_from_proto(common_pb2.Tensor(dtype="float32", shape=[elements + 1]))
    assert str(refused.value) == (
        f"tensor of shape [{elements + 1}] has {elements + 1} elements, more than the cap "
        f"{elements}")
    # at the cap the shape is accepted, and only the missing data refuses it
    with pytest.raises(WireError, match=f"^tensor data must be {4 * elements} bytes"):
        serde.tensor_from_proto(common_pb2.Tensor(dtype="float32", shape=[elements]))


# ---------------------------------------------------------------------------- option builders


@pytest.mark.parametrize("build", [limits.channel_options, limits.server_options])
def test_message_caps_must_be_positive_int32(build: Callable[..., limits.GrpcOptions]) -> None:
    for accepted in (1, 2**31 - 1):
        options = dict(build(max_message_bytes=accepted))
        assert options["grpc.max_send_message_length"] == accepted
        assert options["grpc.max_receive_message_length"] == accepted
    for refused in (0, -1, 2**31):
        with pytest.raises(ValueError) as error:
            build(max_message_bytes=refused)
        assert str(error.value) == f"max_message_bytes must be in (0, 2^31), got {refused}"
    for wrong in (True, 1.0, "1"):
        with pytest.raises(TypeError) as error:
            build(max_message_bytes=wrong)
        assert str(error.value) == (
            f"max_message_bytes must be an int, got {type(wrong).__name__}")


def test_the_keepalive_policy_clients_and_servers_are_given() -> None:
    """Clients ping after 30 s idle (keeping NATs open), even without calls and without data in
    between, and give a connection up 10 s after an unanswered ping; servers accept pings
    10 s apart (else they would answer GOAWAY too_many_pings) and ping idle clients after 60 s.
    Waiting for real pings would take minutes: these are the options gRPC is given."""
    client, server = dict(limits.channel_options()), dict(limits.server_options())
    assert {k: client[k] for k in client if "keepalive" in k or "ping" in k} == {
        "grpc.keepalive_time_ms": 30_000, "grpc.keepalive_timeout_ms": 10_000,
        "grpc.keepalive_permit_without_calls": 1, "grpc.http2.max_pings_without_data": 0}
    assert {k: server[k] for k in server if "keepalive" in k or "ping" in k} == {
        "grpc.keepalive_time_ms": 60_000, "grpc.keepalive_timeout_ms": 10_000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.min_ping_interval_without_data_ms": 10_000,
        "grpc.http2.max_pings_without_data": 0}
    assert tuple(limits.channel_options()) == limits.CHANNEL_OPTIONS
    assert tuple(limits.server_options()) == limits.SERVER_OPTIONS
