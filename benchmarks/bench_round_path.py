"""Our gRPC round path against bare grpc.aio moving the same bytes, two processes, one run.

    python benchmarks/bench_round_path.py [--rounds 1000] [--repeat 3]

Two processes play two neighbouring agents of the defaults' run (agt, logistic regression on
the main job's model: each round message carries y and z, 2 x 7,850 float64, 126 KB) and
exchange one message each way per round, as phase II does, with mutual TLS:
  * ours: each process is an agent's real transport (agent/assembly.py local_agents: its
    gRPC server with the servicer that authenticates, validates, decodes and files messages)
    driven by agent/exchange.py's RoundLink.exchange, the agent's own round (encode_round, the
    outbox, the round stream, the mailbox), then the ledger's and mailbox's end-of-round work;
  * bare: each process runs a grpc.aio server with one client-stream method that queues what
    arrives, and one client stream to the other; a round writes the same encoded bytes and
    waits for the other's message. No parsing, no checks.
Prints per round: CPU ms of both processes together (per agent: half; process CPU, every
thread, from /proc), wall ms, and ours / bare, with the machine's load at both ends.
`--repeat R` (default 3) runs R pairs, bare then ours, one after the other: on a shared
machine one pair moves by tens of percent with the load, so each pair's ratio is taken while
the load is about the same, and the medians (of the CPU figures and of the pairs' ratios) are
the figures to quote.

Trying gRPC's own settings: `--option KEY=VALUE` (repeatable; an integer value is
passed as one) adds a channel and server argument to every channel and server of both ends, in
both paths; `--env KEY=VALUE` (repeatable) sets an environment variable of both processes (e.g.
GRPC_POLL_STRATEGY=poll). With either, each of the R repeats runs the path(s) of `--paths`
twice, as they are and with the variant, alternating which goes first, and prints the
variant's CPU against the default's per pair and their median ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import torch

from efpsn.params.config import RunConfig
from efpsn.process.runtime import configure_threads, machine_load
from efpsn.wire.net import open_channel
from efpsn.wire.rounds import encode_round
from efpsn.wire.tls import TlsConfig, generate_certificates

RUN = "bench-round-path"
CONFIG = RunConfig(agents=2, topology="path", iterations=1_000_000, key_bits=2048, round_timeout_seconds=30.0)
WARMUP = 30
SINK = "/bench.Bare/Sink"
EXTRA: list[tuple[str, int | str]] = []  # --option's arguments, in a child process


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _message(name: str) -> dict[str, torch.Tensor]:
    seed = 1 if name == "agent1" else 2
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(7850, generator=gen, dtype=torch.float64) for k in ("y", "z")}


def _apply_options(extra: list[tuple[str, int | str]]) -> None:
    """Add `extra` to every channel's and server's gRPC arguments in this process."""
    if not extra:
        return
    EXTRA.extend(extra)  # for bare's server
    from efpsn.wire import limits
    channel_options, server_options = limits.channel_options, limits.server_options
    keys = {k for k, _ in extra}

    def merged(base: Any) -> Any:
        return lambda **kw: [o for o in base(**kw) if o[0] not in keys] + list(extra)

    limits.channel_options = merged(channel_options)  # type: ignore[assignment]
    limits.server_options = merged(server_options)  # type: ignore[assignment]


def _parse_pairs(items: list[str], *, numbers: bool) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        pairs.append((key, int(value) if numbers and value.lstrip("-").isdigit() else value))
    return pairs


async def _ours(me: str, other: str, folder: Path, ports: dict[str, int], rounds: int,
                ready: Path) -> dict[str, float]:
    from agent.assembly import local_agents
    from agent.exchange import Replay, RoundLink
    from coordinator.registry import local_assignments

    async with local_agents(folder, CONFIG, run_id=RUN, names=(me,), serve_names=(me,),
                            assign=functools.partial(local_assignments, run_id=RUN),
                            ports=ports, new_certificates=False) as agents:
        agent = agents[me]
        replay = Replay(peers=agent.peers, take=agent.phase_two.take_round,
                        mailbox=agent.mailbox, neighbours=set(), describe_loss=lambda *a: "",
                        on_loss=lambda n: None)
        assert agent.phase_two.ledger is not None
        link = RoundLink(peers=agent.peers, outbox=agent.outbox, replay=replay, run_id=RUN,
                         name=me, neighbours=[other], timeout=60.0,
                         holds=agent.phase_two.ledger.holds)
        message = _message(me)

        async def one(t: int) -> None:
            await link.exchange(t, message)
            agent.phase_two.ledger.advance(t + 1)
            agent.mailbox.discard_before("round", t + 1)

        return await _rounds(one, rounds, ready)


async def _bare(me: str, other: str, folder: Path, ports: dict[str, int], rounds: int,
                ready: Path) -> dict[str, float]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def sink(requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        async for request in requests:
            queue.put_nowait(request)
        return b""

    tls = TlsConfig.from_dir(folder / "tls", me)
    server = await start_bare_server(tls, ports[me], sink)
    channel, stream = await open_bare_stream(tls, other, ports[other])
    message = _message(me)

    async def one(t: int) -> None:
        data = encode_round(message, run_id=RUN, sender=me, round_=t)  # the same bytes
        await stream.write(data)
        await queue.get()

    try:
        return await _rounds(one, rounds, ready)
    finally:
        stream.cancel()
        await channel.close()
        await server.stop(0)


async def start_bare_server(tls: TlsConfig, port: int, sink: Any) -> grpc.aio.Server:
    """A started grpc.aio server on 127.0.0.1:`port`, mutual TLS, with one client-stream method
    (SINK) served by `sink(requests, context)`; the requests are raw bytes (no deserializer)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 26), *EXTRA])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Bare", {"Sink": grpc.stream_unary_rpc_method_handler(sink)}),))
    server.add_secure_port(f"127.0.0.1:{port}", tls.server_credentials())
    await server.start()
    return server


async def open_bare_stream(tls: TlsConfig, other: str, port: int,
                           metadata: tuple[tuple[str, str], ...] = ()) -> tuple[Any, Any]:
    """A channel to `other`'s bare server (the project's channel options, mutual TLS) and a
    client stream of raw bytes to its SINK, the channel ready."""
    channel = open_channel(f"127.0.0.1:{port}", credentials=tls.channel_credentials(),
                           server_name=other)
    await channel.channel_ready()
    return channel, channel.stream_unary(SINK)(metadata=metadata or None)


async def _rounds(one: Any, rounds: int, ready: Path) -> dict[str, float]:
    for t in range(WARMUP):
        await one(t)
    cpu, wall = time.process_time(), time.perf_counter()
    for t in range(WARMUP, WARMUP + rounds):
        await one(t)
    result = {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall}
    ready.write_text(json.dumps(result))
    await asyncio.sleep(1.0)  # the other end may still wait for our last message's bytes
    return result


def _child(args: argparse.Namespace) -> None:
    configure_threads()
    _apply_options(_parse_pairs(args.option, numbers=True))
    ports = json.loads(args.ports)
    other = "agent2" if args.name == "agent1" else "agent1"
    run = _ours if args.mode == "ours" else _bare
    asyncio.run(run(args.name, other, Path(args.folder), ports, args.rounds,
                    Path(args.folder) / f"{args.mode}-{args.name}.json"))


def _pair(mode: str, folder: Path, rounds: int, options: tuple[str, ...] = (),
          env: tuple[tuple[str, str], ...] = ()) -> dict[str, float]:
    """Both ends as separate processes; their CPU seconds added, the slower wall time."""
    ports = dict(zip(("agent1", "agent2"), _free_ports(2), strict=True))
    extra = [a for o in options for a in ("--option", o)]
    child_env = {**os.environ, **dict(env)}
    procs = [subprocess.Popen([sys.executable, __file__, "--child", "--mode", mode, "--name",
                               name, "--folder", str(folder), "--ports", json.dumps(ports),
                               "--rounds", str(rounds), *extra], env=child_env)
             for name in ports]
    for p in procs:
        if p.wait(timeout=900) != 0:
            raise RuntimeError(f"{mode}: a process failed ({p.returncode})")
    ends = [json.loads((folder / f"{mode}-{name}.json").read_text()) for name in ports]
    return {"cpu_ms": sum(e["cpu"] for e in ends) * 1e3 / rounds,
            "wall_ms": max(e["wall"] for e in ends) * 1e3 / rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="pairs of runs (bare, ours)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a gRPC channel/server argument to try against the default")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable of both processes to try")
    parser.add_argument("--paths", default="bare,ours",
                        help="with --option/--env: which paths to compare (bare, ours)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("ours", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    if args.repeat < 1 or args.rounds < 1:
        parser.error("--rounds and --repeat must be >= 1")
    if args.option or args.env:
        _variants(args)
        return
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-round-path-") as tmp:
        folder = Path(tmp)
        generate_certificates(folder / "tls", ["agent1", "agent2"])
        size = len(encode_round(_message("agent1"), run_id=RUN, sender="agent1", round_=1))
        print(f"round message {size:,} bytes, one each way per round; {args.rounds} rounds; "
              f"mutual TLS; two processes; {args.repeat} pairs; {machine_load()}")
        print(f"{'pair':<5} {'path':<34} {'CPU ms/round':>12} {'per agent':>10} "
              f"{'wall ms/round':>13} {'CPU x bare':>10}")
        pairs = []
        for i in range(args.repeat):
            rows = {mode: _pair(mode, folder, args.rounds) for mode in ("bare", "ours")}
            pairs.append(rows)
            for mode, label in LABELS:
                _row(str(i + 1), label, rows[mode], rows["bare"])
    median = {mode: {k: statistics.median(p[mode][k] for p in pairs) for k in ("cpu_ms", "wall_ms")}
              for mode in ("bare", "ours")}
    ratio = statistics.median(p["ours"]["cpu_ms"] / p["bare"]["cpu_ms"] for p in pairs)
    for mode, label in LABELS:
        _row("med", label, median[mode], median["bare"],
             ratio=ratio if mode == "ours" else 1.0)
    print(f"median of the pairs' ratios: ours {ratio:.2f}x bare (CPU); machine: {machine_load()}; "
          f"pid {os.getpid()}")


def _variants(args: argparse.Namespace) -> None:
    """Each path as it is against the same with args.option/args.env, alternating the order."""
    _parse_pairs(args.option, numbers=True)
    env = tuple(_parse_pairs(args.env, numbers=False))
    paths = [p for p in args.paths.split(",") if p]
    if not paths or any(p not in ("bare", "ours") for p in paths):
        raise SystemExit(f"--paths: expected bare and/or ours, got {args.paths!r}")
    variant = " ".join([*args.option, *(f"{k}={v}" for k, v in env)])
    ratios: dict[str, list[float]] = {p: [] for p in paths}
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-round-path-") as tmp:
        folder = Path(tmp)
        generate_certificates(folder / "tls", ["agent1", "agent2"])
        print(f"variant: {variant}; {args.rounds} rounds; {args.repeat} repeats; "
              f"{machine_load()}")
        print(f"{'rep':<4} {'path':<5} {'default CPU ms/agent':>20} {'variant':>8} {'ratio':>6}")
        for i in range(args.repeat):
            for path in paths:
                runs = {}
                order = ("default", "variant") if i % 2 == 0 else ("variant", "default")
                for which in order:
                    runs[which] = (_pair(path, folder, args.rounds, tuple(args.option), env)
                                   if which == "variant" else _pair(path, folder, args.rounds))
                ratio = runs["variant"]["cpu_ms"] / runs["default"]["cpu_ms"]
                ratios[path].append(ratio)
                print(f"{i + 1:<4} {path:<5} {runs['default']['cpu_ms'] / 2:>20.3f} "
                      f"{runs['variant']['cpu_ms'] / 2:>8.3f} {ratio:>6.3f}", flush=True)
    for path in paths:
        r = ratios[path]
        print(f"{path}: variant / default, median {statistics.median(r):.3f} "
              f"(range {min(r):.3f}-{max(r):.3f}, {len(r)} pairs)")
    print(f"machine: {machine_load()}")


LABELS = (("bare", "bare grpc.aio, same bytes"), ("ours", "ours (RoundLink.exchange)"))


def _row(pair: str, label: str, r: dict[str, float], bare: dict[str, float],
         ratio: float | None = None) -> None:
    ratio = r["cpu_ms"] / bare["cpu_ms"] if ratio is None else ratio
    print(f"{pair:<5} {label:<34} {r['cpu_ms']:>12.3f} {r['cpu_ms'] / 2:>10.3f} "
          f"{r['wall_ms']:>13.3f} {ratio:>10.2f}")


if __name__ == "__main__":
    main()
