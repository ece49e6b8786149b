"""Hostile load on a live mutual-TLS network (loopback, bounded in count and time): body bombs,
gzip bombs, oversize bodies and floods from a CA-signed outsider ("intruder") and from a real
neighbour's certificate (agent2's, while agent2 runs), all aimed at agent1 during phase II.

Asserted: agent1's peak resident memory (VmHWM) stays under PEAK_BOUND_MB, its round rate
during the attack stays within 2x of the undisturbed rate measured just before in the same run,
nothing is lost (every agent finishes, the final models equal the simulator's bit for bit)."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from localnet import LocalNet

from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.simulator import run_simulation
from efpsn.wire import records
from efpsn.wire.records import Phase
from efpsn.wire.tls import TlsConfig
from efpsn.wire.v1 import agent_pb2

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

CONFIG = RunConfig(agents=4, iterations=8000, eval_every=2000, key_bits=2048,
                   round_timeout_seconds=60.0)
SEED = 3
PEAK_BOUND_MB = 600
WINDOW_ROUNDS = 120  # rounds per measurement window
ATTACK_SECONDS = 15.0  # the attack stops after this, or when its requests are all sent
MB = 1024 * 1024
PUT, PULL = "/efpsn.v1.Agent/PutRound", "/efpsn.v1.Agent/GetRound"
OTHER = ["/efpsn.v1.Agent/StreamRounds", "/efpsn.v1.Agent/PutShares", "/efpsn.v1.Agent/PutPublicKey",
         "/efpsn.v1.Agent/GetStatus", "/grpc.health.v1.Health/Check"]


def _vm_kb(pid: int, field: str, missing: int | None = None) -> int:
    """A memory figure of a live process; `missing` if it has exited (when given)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    if missing is not None:
        return missing
    raise KeyError(field)


def _waves(run_id: str, rng: random.Random) -> list[tuple[Any, ...]]:
    """(label, identity, method, bodies, compression, parallel, requests per second): every
    sending loop is bounded by its list of bodies, its pace and ATTACK_SECONDS."""
    bomb = b"\x12\x00" * (15 * MB // 2)  # 15 MB of empty tensor entries: huge once parsed
    oversize = b"\x00" * (20 * MB)  # over the 16 MiB receive cap
    gz_bomb = b"\x12\x00" * (30 * MB // 2)  # sent gzip-compressed: ~30 kB on the wire
    gz_small_bomb = b"\x12\x00" * (12 * MB // 2)
    neighbour_big = b"\x12\x00" * (8 * MB // 2)  # read (agent2 is a neighbour), then refused
    header = records.make_header(run_id=run_id, sender="agent2", round=1, phase=Phase.OPTIMIZE)
    pull_old = agent_pb2.RoundRequest(header=header).SerializeToString()
    garbage = [rng.randbytes(rng.randint(0, 300)) for _ in range(1000)]
    gz = grpc.Compression.Gzip
    return [
        ("outsider: 15 MB body bombs", "intruder", PUT, [bomb] * 16, None, 8, 2.0),
        ("outsider: 20 MB oversize bodies", "intruder", PUT, [oversize] * 8, None, 4, 1.0),
        ("outsider: gzip bombs (30 MB inflated)", "intruder", PUT, [gz_bomb] * 8, gz, 8, 1.0),
        ("outsider: garbage floods", "intruder", None, garbage * 2, None, 16, 150.0),
        ("neighbour: 8 MB bodies", "agent2", PUT, [neighbour_big] * 8, None, 2, 1.0),
        ("neighbour: gzip bombs (12 MB inflated)", "agent2", PUT, [gz_small_bomb] * 8, gz, 2,
         1.0),
        ("neighbour: 20 MB oversize bodies", "agent2", PUT, [oversize] * 4, None, 2, 0.5),
        ("neighbour: garbage and stale pulls", "agent2", None, garbage + [pull_old] * 200,
         None, 2, 80.0),
    ]


async def attack(address: str, tls_dir: Path, run_id: str) -> dict[str, Any]:
    """Send every wave at once (paced), from the outsider's and agent2's certificates."""
    out: dict[str, Any] = {"waves": {}, "bytes": 0}
    rng = random.Random(1010)
    started = time.monotonic()
    deadline = started + ATTACK_SECONDS
    methods = [PUT, PULL, *OTHER]
    channels: dict[str, grpc.aio.Channel] = {}
    for who in ("intruder", "agent2"):
        tls = TlsConfig.from_dir(tls_dir, who)
        channels[who] = grpc.aio.secure_channel(
            address, tls.channel_credentials(),
            options=[("grpc.ssl_target_name_override", "agent1"),
                     ("grpc.max_send_message_length", -1)])

    async def wave(label: str, who: str, method: str | None, bodies: list[bytes],
                   compression: Any, parallel: int, rate: float) -> None:
        codes: collections.Counter[str] = collections.Counter()
        sem = asyncio.Semaphore(parallel)

        async def one(i: int, body: bytes) -> None:
            await asyncio.sleep(i / rate)
            if time.monotonic() > deadline:
                codes["not sent"] += 1
                return
            async with sem:
                rpc = channels[who].unary_unary(method or methods[i % len(methods)])
                try:
                    await rpc(body, timeout=20, compression=compression)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code().name] += 1
            out["bytes"] += len(body)  # as the agent would see it, inflated

        await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
        out["waves"][label] = dict(codes)

    try:
        await asyncio.gather(*(wave(*w) for w in _waves(run_id, rng)))
    finally:
        for channel in channels.values():
            await channel.close()
    out["seconds"] = time.monotonic() - started
    return out


def test_hostile_load_neither_stalls_nor_bloats_an_agent(tmp_path: Path) -> None:
    figures: dict[str, Any] = {}
    with LocalNet(tmp_path, CONFIG, noise_seed=SEED) as net:
        net.start_all()
        pid = net.procs["agent1"].pid
        start = net.wait_round("agent1", 30, timeout=240)
        t0 = time.monotonic()
        end = net.wait_round("agent1", start + WINDOW_ROUNDS, timeout=120)
        calm = (end - start) / (time.monotonic() - t0)
        figures["calm_hwm_mb"] = _vm_kb(pid, "VmHWM") / 1024
        status = net.status("agent1")
        assert status is not None
        # The attacker is its own (niced) process, as it would be its own machine: its client
        # work (TLS, gzip) must not be billed to the agents' share of this 2-core machine.
        t0 = time.monotonic()
        attacker = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, __file__, net.address("agent1"),
             str(net.tls_dir), status.run_id], stdout=subprocess.PIPE, text=True)
        samples = []  # (time, round) of agent1 while the attacker runs
        try:
            while attacker.poll() is None and time.monotonic() - t0 < ATTACK_SECONDS + 60:
                now = net.status("agent1")
                if now is not None and not now.finished:
                    samples.append((time.monotonic(), now.round, now))
                time.sleep(0.5)
            attack_ended = time.monotonic()
            stdout, _ = attacker.communicate(timeout=30)
        finally:
            if attacker.poll() is None:
                attacker.kill()
                attacker.wait()
        assert len(samples) >= 10, samples
        (t_first, r_first, _), (t_last, r_last, after) = samples[0], samples[-1]
        # The whole attack fell inside agent1's phase II (else the run is too short for the test).
        assert attack_ended - t_last < 1.5, (attack_ended - t_last, r_last, CONFIG.iterations.total)
        figures.update(json.loads(stdout))
        figures["attack_seconds"] = figures.pop("seconds")
        attacked = (r_last - r_first) / (t_last - t_first)
        figures["rss_after_mb"] = _vm_kb(pid, "VmRSS", missing=-1) / 1024  # printed only
        figures["rejections"] = after.rejections
        codes = net.wait_agents(timeout=300)
        logs = {n: net.log(n) for n in net.names}
    results, xs = load_agent_results(tmp_path, net.names)
    # agent1's own high-water mark (VmHWM) at the end of phase II, which the attack fell inside.
    figures["peak_hwm_mb"] = results[0]["timings"]["max_rss_mb"]
    figures["calm_rounds_per_s"], figures["attack_rounds_per_s"] = calm, attacked
    sent = sum(sum(v for k, v in w.items() if k != "not sent") for w in figures["waves"].values())
    print(f"\nhostile load: {sent} requests ({figures['bytes'] / MB:.0f} MB of bodies, "
          f"uncompressed) in "
          f"{figures['attack_seconds']:.1f}s; agent1 {calm:.1f} rounds/s calm, {attacked:.1f} "
          f"during the attack; peak memory {figures['peak_hwm_mb']:.0f} MB (calm "
          f"{figures['calm_hwm_mb']:.0f} MB, after {figures['rss_after_mb']:.0f} MB); "
          f"waves {figures['waves']}; rejections {figures['rejections']}")
    assert codes == {n: 0 for n in net.names}, {n: t[-2000:] for n, t in logs.items()}
    waves = figures["waves"]
    assert len(waves) == 8 and sent > 3000, waves
    for label, got in waves.items():
        assert "OK" not in got or label.startswith(("outsider: garbage", "neighbour: garbage")), (
            label, got)
        assert "UNKNOWN" not in got and "INTERNAL" not in got, (label, got)
    for label in ("outsider: 15 MB body bombs", "outsider: gzip bombs (30 MB inflated)"):
        assert set(waves[label]) <= {"PERMISSION_DENIED", "RESOURCE_EXHAUSTED"}, waves[label]
    assert figures["peak_hwm_mb"] < PEAK_BOUND_MB, figures
    assert attacked > calm / 2, figures
    sim = run_simulation(CONFIG, noise_seed=SEED)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0


if __name__ == "__main__":  # the attacker process: ADDRESS TLS_DIR RUN_ID -> JSON figures
    print(json.dumps(asyncio.run(attack(sys.argv[1], Path(sys.argv[2]), sys.argv[3]))))
