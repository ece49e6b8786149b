"""Per-message cost of the agents' transport against a bare gRPC and a raw socket ping-pong.

    python benchmarks/bench_transport.py [--messages 2000] [--insecure]

One process, one event loop, both ends: an agent's real receive path (its gRPC server with the
servicer that authenticates, validates, decodes and files round messages) fed by a real sender
(agent/peers.py) with the paper's round message (the 7,850 float64 parameters of logistic
regression, 63 KB), once over the round stream phase II uses (Peers.send_round; the next
message goes once the receiver has filed the previous one) and once with one PutRound call per
message (its fallback); then, with the same bytes and certificates:
  * bare grpc.aio: a unary method that returns an empty reply, no parsing at all (the baseline
    the ratios are taken against); the same over one bidirectional stream; and one client
    stream with no reply, the sender waiting until the server has each message (what the
    agents' round stream does: a neighbour's next round message is the acknowledgement);
  * a raw TCP socket (asyncio streams) with a length prefix and a 1-byte ack, with TLS like the
    others and (for scale) without.
Every path waits for each message's answer before sending the next (ping-pong). Prints CPU
milliseconds per message (process time of both ends together, so it counts every core the
work used) and wall milliseconds per round trip, and the ratios to bare gRPC. Numbers depend on
the machine and its load (printed); the ratios are the figures to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import ssl
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import torch

from agent.assembly import local_agents
from coordinator.registry import local_assignments
from efpsn.params.config import RunConfig
from efpsn.process.runtime import configure_threads, machine_load
from efpsn.wire import records, rounds
from efpsn.wire.net import open_channel
from efpsn.wire.records import Phase
from efpsn.wire.rounds import encode_round
from efpsn.wire.tls import TlsConfig, generate_certificates

RUN = "bench-transport"
# the paper's DSGD: a round message is one tensor x, which these tests craft by hand
CONFIG = RunConfig.preset("paper", agents=3, iterations=1_000_000, key_bits=2048, round_timeout_seconds=30.0)
BARE_METHOD = "/bench.Bare/Put"
BARE_STREAM = "/bench.Bare/Stream"
BARE_SINK = "/bench.Bare/Sink"


async def _measure(n: int, send: Callable[[int], Awaitable[None]]) -> tuple[float, float]:
    """(CPU ms per message, wall ms per message) over n sequential messages after a warm-up."""
    for t in range(20):
        await send(t)
    cpu, wall = time.process_time(), time.perf_counter()
    for t in range(20, 20 + n):
        await send(t)
    return ((time.process_time() - cpu) * 1e3 / n, (time.perf_counter() - wall) * 1e3 / n)


async def agent_transport(tls_dir: Path | None, n: int, *, stream: bool) -> tuple[float, float]:
    """agent2 pushes round messages to agent1's real server; agent1 consumes each one. stream:
    over agent2's round stream (Peers.send_round, phase II's path); else one PutRound each."""
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-") as tmp:  # its keys go with it
        async with local_agents(Path(tmp), CONFIG, run_id=RUN, names=("agent1", "agent2"),
                                serve_names=("agent1",), tls=tls_dir is not None,
                                assign=functools.partial(local_assignments, run_id=RUN),
                                ) as agents:
            receiver, sender = agents["agent1"], agents["agent2"]
            x = torch.linspace(-1, 1, receiver.session.message_shapes["x"][0],
                               dtype=torch.float64)

            async def send(t: int) -> None:
                data = encode_round({"x": x}, run_id=RUN, sender="agent2", round_=t)
                if stream:
                    await sender.peers.send_round("agent1", t, data, timeout=30.0)
                else:
                    await sender.peers.put_round("agent1", data, timeout=30.0)
                # the receiving agent's round loop: wait until the message is filed (a stream
                # has no answer per message: the next one goes out once this one is in),
                # consume it
                await receiver.mailbox.collect("round", t, ["agent2"], timeout=30.0)
                receiver.mailbox.discard_before("round", t + 1)
                receiver.phase_two.ledger.advance(t + 1)

            return await _measure(n, send)


async def bare_grpc(tls_dir: Path | None, payload: bytes, n: int, *,
                    stream: str = "") -> tuple[float, float]:
    """A unary bytes -> empty bytes method: gRPC, HTTP/2 and TLS, nothing else. stream="bidi":
    one bidirectional call, an empty reply per message; "client": one client stream with no
    reply, the sender waiting until the server has the message (seen in-process), as the
    agents' round stream does."""
    async def put(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    async def bidi(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in requests:
            yield b""

    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def sink(requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        async for request in requests:
            received.put_nowait(request)
        return b""

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 26)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Bare", {
        "Put": grpc.unary_unary_rpc_method_handler(put),
        "Stream": grpc.stream_stream_rpc_method_handler(bidi),
        "Sink": grpc.stream_unary_rpc_method_handler(sink)}),))
    if tls_dir:
        server_tls = TlsConfig.from_dir(tls_dir, "agent1")
        port = server.add_secure_port("127.0.0.1:0", server_tls.server_credentials())
        client_tls = TlsConfig.from_dir(tls_dir, "agent2")
        channel = open_channel(f"127.0.0.1:{port}", credentials=client_tls.channel_credentials(),
                               server_name="agent1")
    else:
        port = server.add_insecure_port("127.0.0.1:0")
        channel = open_channel(f"127.0.0.1:{port}")
    await server.start()
    call = channel.unary_unary(BARE_METHOD)
    open_stream = (channel.stream_stream(BARE_STREAM)() if stream == "bidi"
                   else channel.stream_unary(BARE_SINK)())

    async def send(t: int) -> None:
        if stream == "bidi":
            await open_stream.write(payload)
            await open_stream.read()
        elif stream == "client":
            await open_stream.write(payload)
            await received.get()
        else:
            await call(payload, timeout=30.0)

    try:
        return await _measure(n, send)
    finally:
        open_stream.cancel()
        await channel.close()
        await server.stop(0)


# A bare gRPC server in a process of its own: one bidirectional method, an empty reply a message.
BARE_SERVER = """
import asyncio, sys, grpc
from efpsn.wire.tls import TlsConfig

async def serve(tls_dir, port_file):
    async def stream(requests, context):
        async for _ in requests:
            yield b""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 26)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Bare", {"Stream": grpc.stream_stream_rpc_method_handler(stream)}),))
    credentials = TlsConfig.from_dir(tls_dir, "agent1").server_credentials()
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    with open(port_file + ".part", "w") as out:
        out.write(str(port))
    import os; os.replace(port_file + ".part", port_file)
    await server.wait_for_termination()

asyncio.run(serve(sys.argv[1], sys.argv[2]))
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bare_grpc_processes(tls_dir: Path, payload: bytes, n: int) -> tuple[float, float]:
    """A bare grpc.aio bidirectional stream to a server in another process (mutual TLS): each
    message waits for its empty reply, as agents in separate processes wait for each other.
    CPU ms per message of both processes together, and wall ms per message."""
    port_file = tls_dir.parent / "bare-port"
    server = await asyncio.create_subprocess_exec(sys.executable, "-c", BARE_SERVER,
                                                  str(tls_dir), str(port_file))
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if server.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError("the bare gRPC server did not start")
            await asyncio.sleep(0.05)
        client = TlsConfig.from_dir(tls_dir, "agent2")
        channel = open_channel(f"127.0.0.1:{int(port_file.read_text())}",
                               credentials=client.channel_credentials(), server_name="agent1")
        call = channel.stream_stream(BARE_STREAM)()
        for _ in range(20):
            await call.write(payload)
            await call.read()
        cpu, server_cpu, wall = time.process_time(), _cpu_seconds(server.pid), time.perf_counter()
        for _ in range(n):
            await call.write(payload)
            await call.read()
        total = time.process_time() - cpu + _cpu_seconds(server.pid) - server_cpu
        elapsed = time.perf_counter() - wall
        call.cancel()
        await channel.close()
        return total * 1e3 / n, elapsed * 1e3 / n
    finally:
        server.kill()
        await server.wait()


def _ssl_contexts(tls_dir: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls_dir / "ca.pem"))
    server.load_cert_chain(tls_dir / "agent1.pem", tls_dir / "agent1.key")
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(tls_dir / "ca.pem"))
    client.load_cert_chain(tls_dir / "agent2.pem", tls_dir / "agent2.key")
    return server, client


async def raw_socket(tls_dir: Path | None, payload: bytes, n: int) -> tuple[float, float]:
    """Length-prefixed messages over one TCP connection, a 1-byte ack each."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                await reader.readexactly(size)
                writer.write(b"k")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    server_ctx, client_ctx = _ssl_contexts(tls_dir) if tls_dir else (None, None)
    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_ctx, server_hostname="agent1" if client_ctx else None)
    frame = struct.pack(">I", len(payload)) + payload

    async def send(t: int) -> None:
        writer.write(frame)
        await writer.drain()
        await reader.readexactly(1)

    try:
        return await _measure(n, send)
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def measure_all(*, messages: int, insecure: bool) -> dict[str, tuple[float, float]]:
    """Every path of the table (CPU and wall ms per message), printed with the ratios."""
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-transport-") as tmp:
        tls_dir = None
        if not insecure:
            tls_dir = Path(tmp) / "tls"
            generate_certificates(tls_dir, ["agent1", "agent2", "agent3"])
        x = torch.linspace(-1, 1, 7850, dtype=torch.float64)
        header = records.make_header(run_id=RUN, sender="agent2", round=1, phase=Phase.OPTIMIZE)
        payload = rounds.message_to_proto({"x": x}, header=header).SerializeToString()
        security = "plaintext" if insecure else "mutual TLS"
        print(f"round message: {len(payload):,} bytes; {messages} messages each; "
              f"{security}; {machine_load()}")
        rows = {
            "agent transport, round stream (phase II's path)":
                await agent_transport(tls_dir, messages, stream=True),
            "agent transport, one PutRound per message (fallback)":
                await agent_transport(tls_dir, messages, stream=False),
            "bare grpc.aio unary, same bytes": await bare_grpc(tls_dir, payload, messages),
            "bare grpc.aio bidirectional stream, same bytes":
                await bare_grpc(tls_dir, payload, messages, stream="bidi"),
            "bare grpc.aio client stream, no reply, same bytes":
                await bare_grpc(tls_dir, payload, messages, stream="client"),
            **({} if tls_dir is None else {
                "bare grpc.aio bidi stream, server in another process":
                    await bare_grpc_processes(tls_dir, payload, messages)}),
            f"raw TCP socket ({'plaintext' if insecure else 'TLS'})":
                await raw_socket(tls_dir, payload, messages),
        }
        if tls_dir is not None:
            rows["raw TCP socket (plaintext, for scale)"] = await raw_socket(
                None, payload, messages)
    bare_cpu, bare_wall = rows["bare grpc.aio unary, same bytes"]
    print(f"\n{'path':<56} {'CPU ms/msg':>10} {'x bare':>7} {'wall ms/msg':>11} {'x bare':>7}")
    for name, (cpu, wall) in rows.items():
        print(f"{name:<56} {cpu:>10.3f} {cpu / bare_cpu:>7.2f} {wall:>11.3f} "
              f"{wall / bare_wall:>7.2f}")
    print(f"\nmachine: {machine_load()}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--insecure", action="store_true", help="plaintext everywhere")
    args = parser.parse_args()
    configure_threads()
    asyncio.run(measure_all(messages=args.messages, insecure=args.insecure))


if __name__ == "__main__":
    main()
