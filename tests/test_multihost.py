"""Multi-host: the coordinator and five agents, each on its own "machine" (a Linux network
namespace with its own address on a private bridge; see tests/netns.py). No containers.

Every process binds 0.0.0.0:PORT inside its namespace with the SAME port number, agents
advertise NAMESPACE_ADDRESS:PORT, and dial the coordinator at its namespace address: exactly
the set-up of separate machines. Everything runs over mutual TLS: `efpsn certs` issues one
certificate per host with its name as DNS SAN and its namespace address as IP SAN, and every
client checks the peer's certificate against the peer's name although it dials an IP address.
The run is checked against the in-process simulator bit for bit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from netns import NetnsNetwork, can_use_netns, stop_processes

from efpsn.flags.names import run_parameters_args
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.simulator import run_simulation
from efpsn.wire.tls import generate_certificates

# 900 s is the outer bound of the whole module (the steps below have their own, shorter ones);
# pytest-timeout interrupts the fixture, whose `with` block then still tears everything down.
pytestmark = [pytest.mark.netns, pytest.mark.timeout(900)]

NOISE_SEED = 11
CONFIG = RunConfig(iterations=30, eval_every=10, key_bits=2048, round_timeout_seconds=120.0)
NAMES = [f"agent{i}" for i in range(1, CONFIG.agents + 1)]
START_TIMEOUT = 240.0  # python + torch + data import of one process on a busy 2-core machine
RUN_TIMEOUT = 600.0  # all agents done (phase I: 2048-bit keys; phase II: 30 rounds)

# Run inside agent5's namespace before agent5 exists, with agent5's certificate: health-check
# the other hosts at their advertised addresses (the server certificate checked against the
# host's name), see that plaintext is refused, and wait until the coordinator has the first four
# registrations.
PROBE = textwrap.dedent("""
    import json, sys, time
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from efpsn.wire.tls import TlsConfig
    from efpsn.wire.v1 import coordinator_pb2, coordinator_pb2_grpc
    tls = TlsConfig.from_dir(sys.argv[1], sys.argv[2])
    hosts = dict(arg.split("=", 1) for arg in sys.argv[3:])  # name=address
    def channel(name):
        return grpc.secure_channel(hosts[name], tls.channel_credentials(),
                                   options=[("grpc.ssl_target_name_override", name)])
    health, plaintext = {}, {}
    for name, address in hosts.items():
        with channel(name) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=30, wait_for_ready=True)
            health[address] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        with grpc.insecure_channel(address) as ch:
            try:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                plaintext[address] = "SERVED"
            except grpc.RpcError as exc:
                plaintext[address] = exc.code().name
    deadline = time.monotonic() + 120
    with channel("coordinator") as ch:
        stub = coordinator_pb2_grpc.CoordinatorStub(ch)
        while True:
            status = stub.GetRunStatus(coordinator_pb2.RunStatusRequest(), timeout=30)
            if status.registered >= len(hosts) - 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    print(json.dumps({"health": health, "plaintext": plaintext,
                      "registered": sorted(status.names)}))
""")


def _listening_ports_in_root() -> set[int]:
    """TCP ports with a LISTEN socket in this (the root) network namespace."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _free_port_in_root() -> int:
    """A port below the ephemeral range that nothing listens on here, so that a refused
    connection to 127.0.0.1:PORT from the root namespace means 'our servers are not here'."""
    busy = _listening_ports_in_root()
    for port in range(24711, 32000, 97):
        if port not in busy:
            return port
    raise RuntimeError("no free port in 24711..32000")


def _loopback_refuses(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        return False


def _wait_file(path: Path, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name} exited with {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        if path.exists() and path.read_text().strip():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{path.name}: not serving after {timeout:.0f}s")


def _netns_inode(pid: int) -> int:
    return Path(f"/proc/{pid}/ns/net").stat().st_ino


@pytest.fixture(scope="module")
def multihost(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the whole network across six namespaces; return what was observed. Everything
    (processes, namespaces, veths, bridge) is gone when this returns or raises."""
    ok, why = can_use_netns()  # probed here, not at collection: collecting changes nothing
    if not ok:
        pytest.skip(f"netns tests skipped: {why}")
    folder = tmp_path_factory.mktemp("multihost")  # shared: namespaces share the filesystem
    logs = folder / "logs"
    logs.mkdir()
    efpsn = [sys.executable, "-m", "efpsn"]
    port = _free_port_in_root()
    seen: dict[str, Any] = {"port": port, "folder": folder}
    started = time.monotonic()
    with NetnsNetwork(["coordinator", *NAMES]) as net:
        seen["layout"] = net.describe()
        seen["tag"] = net.tag
        seen["bridge"] = net.bridge
        seen["stale_cleaned"] = net.cleaned_stale
        seen["addresses"] = {name: h.address for name, h in net.hosts.items()}
        seen["routes"] = {name: h.run(["ip", "-4", "route", "show"]).stdout
                          for name, h in net.hosts.items()}
        seen["bridge_addr"] = subprocess.run(
            ["ip", "-o", "-4", "addr", "show", "dev", net.bridge],
            check=False, capture_output=True, text=True, timeout=30).stdout
        traffic_before = {name: h.traffic() for name, h in net.hosts.items()}

        coord = net["coordinator"]
        coord_address = f"{coord.address}:{port}"
        tls_dir = folder / "tls"  # one certificate per host: DNS:NAME and IP:its address
        per_host = [f"{n}={h.address}" for n, h in net.hosts.items()]
        generate_certificates(tls_dir, ["coordinator", *NAMES], ips=["127.0.0.1", *per_host])
        seen["tls_dir"] = tls_dir
        with open(logs / "coordinator.log", "w") as log:
            coord_proc = coord.popen(
                [*efpsn, "coordinator", "--listen", f"0.0.0.0:{port}",
                 "--port-file", str(folder / "coordinator.port"), "--register-timeout", "400",
                 "--tls-dir", str(tls_dir), *run_parameters_args(CONFIG, folder)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        _wait_file(folder / "coordinator.port", coord_proc, logs / "coordinator.log",
                   START_TIMEOUT)
        netns_of = {"coordinator": _netns_inode(coord_proc.pid)}  # serving: surely exec'd

        agents: dict[str, subprocess.Popen] = {}

        def start(name: str) -> None:
            host = net[name]
            with open(logs / f"{name}.log", "w") as log:
                agents[name] = host.popen(
                    [*efpsn, "agent", "--name", name, "--listen", f"0.0.0.0:{port}",
                     "--advertise", f"{host.address}:{port}", "--coordinator", coord_address,
                     "--results", str(folder), "--port-file", str(folder / f"{name}.port"),
                     "--register-timeout", "400", "--tls-dir", str(tls_dir),
                     "--insecure-noise-seed", str(NOISE_SEED), "--debug-expose-mask"],
                    stdout=log, stderr=subprocess.STDOUT,
                )

        # Four agents serve and wait (registration completes only with all five) ...
        for name in NAMES[:-1]:
            start(name)
        for name in NAMES[:-1]:
            _wait_file(folder / f"{name}.port", agents[name], logs / f"{name}.log",
                       START_TIMEOUT)
            netns_of[name] = _netns_inode(agents[name].pid)
        # ... which is when we look at where they are: not in our namespace ...
        seen["loopback_refused"] = {n: _loopback_refuses(port)
                                    for n in ["coordinator", *NAMES[:-1]]}
        # ... but reachable at their advertised addresses from another namespace (agent5's).
        probe = net[NAMES[-1]].run(
            [sys.executable, "-c", PROBE, str(tls_dir), NAMES[-1],
             f"coordinator={coord_address}",
             *[f"{n}={net[n].address}:{port}" for n in NAMES[:-1]]],
            timeout=START_TIMEOUT, check=False,
        )
        assert probe.returncode == 0, (
            f"probe from {NAMES[-1]}'s namespace failed (bridge-nf-call-iptables="
            f"{int(net.bridge_netfilter)}; a FORWARD DROP policy would block the bridge):\n"
            f"{probe.stdout}\n{probe.stderr}"
        )
        seen["probe"] = json.loads(probe.stdout.strip().splitlines()[-1])

        start(NAMES[-1])
        _wait_file(folder / f"{NAMES[-1]}.port", agents[NAMES[-1]],
                   logs / f"{NAMES[-1]}.log", START_TIMEOUT)
        netns_of[NAMES[-1]] = _netns_inode(agents[NAMES[-1]].pid)
        seen["netns_of"] = netns_of
        seen["our_netns"] = _netns_inode(os.getpid())
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline and any(p.poll() is None for p in agents.values()):
            failed = [n for n, p in agents.items() if p.poll() not in (None, 0)]
            if failed:
                break  # a failure: stop the rest now instead of waiting for round timeouts
            time.sleep(0.5)
        seen["agent_rc"] = {n: p.poll() for n, p in agents.items()}
        seen["traffic"] = {name: tuple(a - b for a, b in zip(h.traffic(), traffic_before[name],
                                                              strict=True))
                           for name, h in net.hosts.items()}
        stop_processes(agents.values())
        stop_processes([coord_proc])  # it exits --linger seconds after its bootstrap, or on SIGTERM
        seen["coordinator_rc"] = coord_proc.returncode
        seen["run_seconds"] = time.monotonic() - started
    seen["wall_seconds"] = time.monotonic() - started
    seen["teardown_problems"] = net.teardown_problems
    seen["logs"] = {p.stem: p.read_text(errors="replace") for p in logs.glob("*.log")}
    print(f"\nmultihost: {seen['layout']}; port {port}; "
          f"run {seen['run_seconds']:.1f}s, with teardown {seen['wall_seconds']:.1f}s; "
          f"bytes sent/received per host: {seen['traffic']}")
    return seen


def _tails(seen: dict[str, Any]) -> str:
    return "\n".join(f"--- {n}\n{t[-1500:]}" for n, t in sorted(seen["logs"].items()))


def test_five_agents_in_five_namespaces_finish(multihost) -> None:
    seen = multihost
    assert seen["agent_rc"] == {n: 0 for n in NAMES}, _tails(seen)
    assert seen["coordinator_rc"] == 0, _tails(seen)  # exited by itself or on SIGTERM: cleanly
    results, _ = load_agent_results(seen["folder"], NAMES)
    assert [r["final"]["round"] for r in results] == [CONFIG.iterations.total] * len(NAMES)
    assert len({r["run_id"] for r in results}) == 1
    assert [r["name"] for r in results] == NAMES


def test_masks_sum_to_exactly_zero(multihost) -> None:
    results, _ = load_agent_results(multihost["folder"], NAMES)
    numerators = [[int(v) for v in r["debug_mask_numerators"]] for r in results]
    assert all(len(row) == CONFIG.basis_counts()[1] for row in numerators)
    assert all(any(v != 0 for v in row) for row in numerators)  # each mask is non-trivial
    assert [sum(col) for col in zip(*numerators, strict=True)] == [0] * CONFIG.basis_counts()[1]


def test_final_parameters_equal_the_simulator_bitwise(multihost) -> None:
    results, xs = load_agent_results(multihost["folder"], NAMES)
    sim = run_simulation(CONFIG, protocol="fast", noise_seed=NOISE_SEED)
    assert [r["debug_mask_numerators"] for r in results] == [
        [str(v) for v in m.numerators] for m in sim.masks
    ]
    # Bitwise: same masks, batches, weights and summation order across real sockets between
    # namespaces give the very same float64 iterates as one process, not merely close ones.
    diffs = [float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)]
    assert max(diffs) == 0.0, diffs
    assert all(torch.equal(a, b) for a, b in zip(xs, sim.xs, strict=True))


def test_traffic_really_crossed_the_namespaces(multihost) -> None:
    seen = multihost
    port, addresses = seen["port"], seen["addresses"]
    # Each process ran in its own network namespace, none in ours.
    assert seen["our_netns"] not in seen["netns_of"].values()
    assert len(set(seen["netns_of"].values())) == 1 + len(NAMES)
    # Nothing served on 127.0.0.1:PORT in the root namespace while they all listened on PORT.
    assert seen["loopback_refused"] == {n: True for n in ["coordinator", *NAMES[:-1]]}
    # From agent5's namespace, the others answered at their own namespace addresses.
    assert seen["probe"]["health"] == {
        f"{addresses[n]}:{port}": "SERVING" for n in ["coordinator", *NAMES[:-1]]
    }
    assert seen["probe"]["registered"] == NAMES[:-1]
    # ... over mutual TLS only: a plaintext client got no answer from any of them
    assert seen["probe"]["plaintext"] == {
        f"{addresses[n]}:{port}": "UNAVAILABLE" for n in ["coordinator", *NAMES[:-1]]
    }
    # The coordinator saw every agent register from its namespace address.
    coord_log = seen["logs"]["coordinator"]
    for name in NAMES:
        assert f"registered {name} at {addresses[name]}:{port}" in coord_log, coord_log[-3000:]
    # Each agent's veth carried its rounds of parameters: 30 rounds x 2 neighbours x float64
    # vector is the raw payload (measured: payload + ~1%); half of it is a bound that holds even
    # if gRPC compression were switched on.
    _, xs = load_agent_results(seen["folder"], NAMES)
    payload = CONFIG.iterations.total * 2 * xs[0].numel() * 8 // 2
    for name in NAMES:
        sent, received = seen["traffic"][name]
        assert sent >= payload and received >= payload, (name, sent, received, payload)
    assert min(seen["traffic"]["coordinator"]) > 0
    # Isolated: no default route in any namespace, no address on the bridge in the root one.
    for name, routes in seen["routes"].items():
        assert "default" not in routes and routes.strip(), (name, routes)
    assert seen["bridge_addr"].strip() == ""


def test_everything_ran_over_mutual_tls_with_per_host_certificates(multihost) -> None:
    seen = multihost
    from cryptography import x509

    assert "mutual TLS" in seen["logs"]["coordinator"]
    for name in ["coordinator", *NAMES]:
        cert = x509.load_pem_x509_certificate((seen["tls_dir"] / f"{name}.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [name]
        assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {
            "127.0.0.1", seen["addresses"][name]}
        assert (seen["tls_dir"] / f"{name}.key").stat().st_mode & 0o777 == 0o600
    results, _ = load_agent_results(seen["folder"], NAMES)
    assert all(r["rejections"].get("PERMISSION_DENIED", 0) == 0 for r in results)


def test_teardown_left_nothing_behind(multihost) -> None:
    seen = multihost
    assert seen["teardown_problems"] == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           timeout=30, check=False)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           timeout=30, check=False)
    assert seen["tag"] not in netns.stdout
    assert seen["tag"] not in links.stdout
