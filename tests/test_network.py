"""Integration: a real coordinator and real agent processes on loopback ports."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from commands import efpsn_argv
from conftest import Processes
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = pytest.mark.timeout(600)

# The paper's phase I (Paillier-encrypted noise, a fixed mask on the last layer's biases); the
# default masks (every parameter, fading, from seeds) are tests/test_refresh_network.py's.
SMALL = RunConfig(iterations=40, eval_every=20, key_bits=2048, round_timeout_seconds=60.0,
                  refresh="never", selection="last-bias")
NAMES = [f"agent{i}" for i in range(1, 6)]




@pytest.fixture(scope="module")
def dsgd_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, Path, dict]:
    folder = tmp_path_factory.mktemp("dsgd")
    summary = launch_local_network(
        SMALL, results=folder, quiet=True, insecure_noise_seed=7, debug_expose_mask=True
    )
    return SMALL, folder, summary


@pytest.mark.process
def test_network_completes_both_phases_with_exactly_zero_sum_masks(dsgd_run) -> None:
    config, folder, summary = dsgd_run
    # ok means: every agent finished every round of one run (agent.summary.check_results)
    assert summary["ok"] and summary["problems"] == []
    assert json.loads((folder / "summary.json").read_text())["ok"] is True
    # `efpsn up` runs mutual TLS by default: a fresh CA and one certificate per process
    assert sorted(p.name for p in (folder / "tls").iterdir()) == sorted(
        ["ca.pem", "ca.key", "coordinator.pem", "coordinator.key"]
        + [f"{n}.{ext}" for n in NAMES for ext in ("pem", "key")])
    assert "mutual TLS" in (folder / "logs" / "coordinator.log").read_text()
    results, _ = load_agent_results(folder, NAMES)
    assert [r["final"]["round"] for r in results] == [config.iterations.total] * 5
    assert {r["run_id"] for r in results} == {summary["run_id"]}
    numerators = [[int(v) for v in r["debug_mask_numerators"]] for r in results]
    assert len(numerators[0]) == config.basis_counts()[1]
    assert all(any(v != 0 for v in row) for row in numerators)  # each mask is non-trivial
    assert [sum(col) for col in zip(*numerators, strict=True)] == [0] * config.basis_counts()[1]
    # phase I really used Paillier with packing: one ciphertext per neighbour, one decryption
    for r in results:
        assert r["timings"]["encryptions"] == 2 and r["timings"]["decryptions"] == 1


@pytest.mark.process
def test_network_matches_the_simulator_bitwise(dsgd_run) -> None:
    config, folder, summary = dsgd_run
    _, xs = load_agent_results(folder, NAMES)
    sim = run_simulation(config, protocol="fast", noise_seed=7)
    diffs = [float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)]
    # Same masks (same noise integers), same batches, same weights, same summation order:
    # the iterates agree bit for bit, not only to 1e-6.
    assert max(diffs) == 0.0, diffs
    assert summary["final"]["accuracy"] == pytest.approx(sim.final["accuracy"], abs=0)
    sim_masks = [[str(v) for v in m.numerators] for m in sim.masks]
    results, _ = load_agent_results(folder, NAMES)
    assert [r["debug_mask_numerators"] for r in results] == sim_masks


@pytest.mark.process
def test_lenet_on_its_mini_batch_default_matches_the_simulator_bitwise(tmp_path: Path) -> None:
    # prepare: LeNet with every default of a neural network (batches of 64, agt with momentum,
    # the one-cycle step, the fading masks from seeds), 6 rounds
    config = RunConfig(task="lenet", iterations=6, eval_every=3, key_bits=2048)
    resolved = config.resolved()
    assert resolved.batch_size.size == 64
    refresh = resolved.refresh  # 6 rounds: the fresh part is at its floor from round 3 on
    assert refresh.floor > 0 and refresh.fade is not None and refresh.fade**3 < refresh.floor
    # execute: over the network and in the simulator, the same noise seed
    summary = launch_local_network(config, results=tmp_path, quiet=True, insecure_noise_seed=5)
    sim = run_simulation(config, noise_seed=5)
    # assert: the same mini-batches, masks and steps: the iterates agree bit for bit
    _, xs = load_agent_results(tmp_path, NAMES)
    assert summary["ok"] and [float((a - b).abs().max()) for a, b in
                              zip(xs, sim.xs, strict=True)] == [0.0] * 5
    x0 = build_problem(config).initial_params()
    assert all(float((x - x0).abs().max()) > 0 for x in xs)  # the rounds moved every agent
    assert summary["final"]["accuracy"] == sim.final["accuracy"]


@pytest.mark.process
def test_production_results_do_not_expose_masks(tmp_path: Path) -> None:
    config = SMALL.replace(iterations=4, eval_every=2, algorithm="gt", schedule="constant:0.05")
    summary = launch_local_network(config, results=tmp_path, quiet=True, insecure_noise_seed=3,
                                   insecure=True)  # --insecure still works end to end
    results, xs = load_agent_results(tmp_path, NAMES)
    text = json.dumps([{k: v for k, v in r.items() if k != "privacy"} for r in results]) + \
        json.dumps({k: v for k, v in summary.items() if k != "privacy"})
    assert "mask" not in text.replace('"mask": "zero-sum"', "")
    # gradient tracking over the network (x and y travel) equals the simulator too
    sim = run_simulation(config, noise_seed=3)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0


def _rounds(ports: dict[str, int]) -> dict[str, int | None]:
    """Each agent's phase II round (None: not in phase II or not answering), via GetStatus."""
    import asyncio

    from efpsn.wire.status_client import fetch_statuses

    statuses = asyncio.run(fetch_statuses({n: f"127.0.0.1:{p}" for n, p in ports.items()},
                                          tls=None))
    return {n: (s.round if (s := statuses.get(n)) and s.phase.name == "OPTIMIZE" else None)
            for n in ports}


@pytest.mark.process
def test_stopped_neighbour_is_named_within_the_deadline(processes: Processes) -> None:
    # prepare: a 5-ring with a short round deadline and enough rounds to still be running
    timeout = 4.0
    # plaintext: this test is about deadlines, not about TLS (which the others use)
    processes.start("coordinator", [
        "efpsn", "coordinator", "--listen", "127.0.0.1:0", "--iterations", "100000",
        "--eval-every", "100000", "--key-bits", "2048", "--round-timeout", str(timeout),
        "--insecure"])
    port = processes.port("coordinator")
    # departures off: a neighbour silent past the deadline ends the run (with departures on,
    # the rest would go on without it: tests/test_departure_network.py)
    agents = {name: processes.start(name, [
        "efpsn", "agent", "--name", name, "--listen", "127.0.0.1:0", "--insecure",
        "--coordinator", f"127.0.0.1:{port}", "--results", str(processes.folder),
        "--departure-deadline", "0"])
        for name in NAMES}
    ports = {n: processes.port(n) for n in NAMES}
    # wait until phase II is under way everywhere (GetStatus: OPTIMIZE, round >= 2)
    deadline = time.monotonic() + 180
    rounds = _rounds(ports)
    while not all(r is not None and r >= 2 for r in rounds.values()):
        assert time.monotonic() < deadline, f"phase II not under way: {rounds}"
        assert all(a.running for a in agents.values()), rounds
        time.sleep(0.1)
        rounds = _rounds(ports)
    # execute: agent3 disappears without a word
    agents["agent3"].process.kill()
    killed_at = time.monotonic()
    agents["agent3"].process.wait(timeout=10)
    reached = _rounds({n: ports[n] for n in ("agent2", "agent4")})
    for name in ("agent2", "agent4"):  # agent3's neighbours on the ring
        agents[name].process.wait(timeout=timeout + 30)
    elapsed = time.monotonic() - killed_at
    # assert: its neighbours fail with a one-line error naming agent3, its address and a
    # phase II round at or after the kill, within the deadline (+ slack)
    for name in ("agent2", "agent4"):
        assert agents[name].process.returncode == 2
        text = agents[name].log_path.read_text()
        errors = [line for line in text.splitlines() if line.startswith("efpsn: error: ")]
        assert len(errors) == 1, text[-2000:]
        assert f"agent3 (127.0.0.1:{ports['agent3']})" in errors[0], errors[0]
        numbers = [int(m) for m in re.findall(r"round (\d+)", errors[0])]
        # the round it failed to receive, or the one before it whose delivery to agent3 is
        # confirmed during the next round (acknowledgements are off the critical path)
        assert numbers and all(r >= (reached[name] or 0) - 1 for r in numbers), (
            reached, errors)
    # (no lower bound: on a loaded machine a neighbour's round deadline may have started
    # well before the kill)
    assert elapsed < timeout + 15


@pytest.mark.process
def test_coordinator_serves_health_and_reflection_and_rejects_bad_runs(
        tmp_path: Path, processes: Processes) -> None:
    # bad parameters are one-line errors before anything listens
    bad = subprocess.run(
        efpsn_argv("coordinator", "--listen", "127.0.0.1:0", "--insecure",
              "--topology", "edges:" + str(tmp_path / "g")),
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "efpsn: error" in bad.stderr
    (tmp_path / "g").write_text("1 2\n3 4\n5 1\n")
    disconnected = subprocess.run(
        efpsn_argv("coordinator", "--listen", "127.0.0.1:0", "--insecure",
              "--topology", f"edges:{tmp_path / 'g'}"),
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert disconnected.returncode != 0 and "connected" in disconnected.stderr
    small_key = subprocess.run(
        efpsn_argv("coordinator", "--listen", "127.0.0.1:0", "--insecure", "--key-bits", "1024"),
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert small_key.returncode != 0 and "2048" in small_key.stderr

    # plaintext health and reflection (this part of the test is about them, not about TLS)
    coordinator = processes.start("coordinator", ["efpsn", "coordinator", "--listen",
                                                  "127.0.0.1:0", "--insecure"])
    try:
        port = processes.port("coordinator")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            reply = next(stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            ))
            names = {s.name for s in reply.list_services_response.service}
            assert "efpsn.v1.Coordinator" in names and "grpc.health.v1.Health" in names
    finally:
        processes.stop()
    assert coordinator.process.returncode == 0  # SIGTERM is a clean shutdown


def test_neither_tls_nor_insecure_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from efpsn.cli.main import main

    for args in (("coordinator", "--listen", "127.0.0.1:0"),
                 ("agent", "--name", "agent1", "--listen", "127.0.0.1:0",
                  "--coordinator", "127.0.0.1:1", "--results", str(tmp_path)),
                 ("agent", "--name", "agent1", "--coordinator", "127.0.0.1:1",
                  "--tls-cert", str(tmp_path / "agent1.pem")),
                 ("agent", "--name", "agent1", "--coordinator", "127.0.0.1:1",
                  "--tls-dir", str(tmp_path), "--insecure")):
        assert main(list(args)) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("efpsn: error: ") and err.count("\n") == 1, err
    assert "--insecure" in err
    # a certificate that names another node is refused before anything listens
    assert main(["certs", "--out", str(tmp_path / "tls"), "--names", "agent1,agent2"]) == 0
    tls = tmp_path / "tls"
    assert main(["agent", "--name", "agent1", "--coordinator", "127.0.0.1:1",
                 "--tls-cert", str(tls / "agent2.pem"), "--tls-key", str(tls / "agent2.key"),
                 "--tls-ca", str(tls / "ca.pem")]) == 2
    err = capsys.readouterr().err
    assert "agent2" in err and "'agent1'" in err and err.count("\n") == 1


@pytest.mark.process
def test_up_fails_cleanly_on_bad_data(tmp_path: Path) -> None:
    # Bad data is caught before any process starts: one error line, nothing left running.
    out = subprocess.run(
        efpsn_argv("up", "--iterations", "5", "--key-bits", "2048", "--quiet",
              "--results", str(tmp_path), "--data", "idx:" + str(tmp_path / "missing")),
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert "efpsn: error" in out.stderr
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], check=False, capture_output=True,
                              text=True)
    assert leftover.stdout.strip() == "", leftover.stdout
    assert not any(p.name.startswith("agent") for p in tmp_path.iterdir() if p.is_dir())


@pytest.mark.process
def test_agent_stops_promptly_on_sigterm(tmp_path: Path, processes: Processes) -> None:
    # An agent waiting for its coordinator (nothing listens there) is stopped the way
    # `docker stop` or an orchestrator does it: SIGTERM, and it must not linger.
    agent = processes.start("agent1", ["efpsn", "agent", "--name", "agent1", "--listen",
                                       "127.0.0.1:0", "--insecure", "--coordinator",
                                       "127.0.0.1:9", "--results", str(tmp_path)])
    processes.port("agent1")
    start = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    agent.process.wait(timeout=30)
    assert time.monotonic() - start < 10
    out = agent.log_path.read_text()
    assert agent.process.returncode == 130, out
    assert "interrupted" in out
