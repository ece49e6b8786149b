"""deploy/swarm/ for real: a single-node Docker Swarm (a real swarm) on a private engine runs the
stack of a coordinator and five agents whose keys were made by the certificate-request flow, each
in its own party's folder; one agent's container is killed mid-run and Swarm's restart resumes
it bit for bit.

The engine and the images (built once per session with tests/test_compose.py's) come from
tests/docker_fixtures.py. Everything the test makes (stack, volumes, secrets, the swarm itself)
is removed at its end, also on failure; the images and the engine at the session's end. The
cheap tests at the top need no engine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import docker_support as ds
import pytest
from docker_fixtures import AGENTS
from test_compose import check_records

from efpsn.data.folders import load_data_dir
from efpsn.data.local import resolve_holdout
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = pytest.mark.process

REPO = ds.REPO
SWARM_DIR = REPO / "deploy" / "swarm"
STACK_FILE = SWARM_DIR / "stack.yml"
NODES = ["coordinator", *AGENTS]
STACK = "efpsn"
UID = 10001  # the images' user
ITERATIONS = 2000
EVAL_EVERY = 500
KILLED = "agent3"
KILL_AFTER_ROUND = 400  # kill it once it has a checkpoint at least this far into phase II
NOISE_SEED = 7  # test-only hook, so that the run can be compared with the simulator's
RUN_ENV = {"EFPSN_ITERATIONS": str(ITERATIONS), "EFPSN_EVAL_EVERY": str(EVAL_EVERY),
           "EFPSN_KEY_BITS": "2048"}
CONFIG = RunConfig(data="local", scale="unit", iterations=ITERATIONS, eval_every=EVAL_EVERY,
                   key_bits=2048)
RUN_TIMEOUT = 900.0  # deploy -> every agent complete, on a busy 2-core machine


def _swarm_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("efpsn_swarm", SWARM_DIR / "swarm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_yaml(text: str) -> dict[str, Any]:
    yaml = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml comes with check-jsonschema")
    return yaml.YAML(typ="safe", pure=True).load(text)


# ------------------------------------------------------------------------------- cheap tests


def test_the_stack_file_is_what_the_script_writes_and_isolates_every_agent() -> None:
    swarm = _swarm_module()
    assert STACK_FILE.read_text() == swarm.render_stack(len(AGENTS))
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is in the dev extra")
    lint = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(STACK_FILE)], capture_output=True, text=True, timeout=300, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    spec = _load_yaml(STACK_FILE.read_text())
    assert spec["version"] == "3.8"
    services = spec["services"]
    assert set(services) == set(NODES)
    assert set(spec["volumes"]) == {f"results-{name}" for name in AGENTS}
    assert spec["secrets"] == {
        "ca.pem": {"external": True, "name": "efpsn-ca.pem"},
        **{f"{n}{ext}": {"external": True, "name": f"efpsn-{n}{ext}"}
           for n in NODES for ext in (".pem", ".key")}}
    for name, service in services.items():
        assert service["init"] is True and service["networks"] == ["efpsn"], name
        # its own key (0400) and certificate and the CA certificate, owned by the images' user
        assert service["secrets"] == [
            {"source": "ca.pem", "uid": str(UID), "gid": str(UID), "mode": 0o444},
            {"source": f"{name}.pem", "uid": str(UID), "gid": str(UID), "mode": 0o444},
            {"source": f"{name}.key", "uid": str(UID), "gid": str(UID), "mode": 0o400}], name
        deploy = service["deploy"]
        assert deploy["endpoint_mode"] == "dnsrr", name  # no IPVS needed
        assert deploy["placement"]["constraints"] == [f"node.labels.efpsn.party.{name} == true"]
        assert deploy["restart_policy"]["condition"] == "on-failure", name
        command = [part for part in service["command"] if part != "--from-environment"]
        flags = dict(zip(command[0::2], command[1::2], strict=True))
        assert (flags["--tls-cert"], flags["--tls-key"], flags["--tls-ca"]) == (
            f"/run/secrets/{name}.pem", f"/run/secrets/{name}.key", "/run/secrets/ca.pem")
    for name in AGENTS:
        agent = services[name]
        assert agent["image"] == "${EFPSN_AGENT_IMAGE:-efpsn-agent:local}"
        assert agent["volumes"] == [  # only its own data folder, read-only
            {"type": "bind", "source": f"${{EFPSN_DATA_ROOT:-/srv/efpsn/data}}/{name}",
             "target": "/data", "read_only": True},
            {"type": "volume", "source": f"results-{name}", "target": "/results"}]
        flags = dict(zip(agent["command"][0::2], agent["command"][1::2], strict=True))
        assert flags["--advertise"] == f"{name}:50051"
        assert flags["--data"] == "/data" and flags["--results"] == "/results"
    coordinator = services["coordinator"]
    assert coordinator["image"] == "${EFPSN_COORDINATOR_IMAGE:-efpsn-coordinator:local}"
    assert "volumes" not in coordinator  # no data, no results
    # the run parameters come from the same variables, with the same defaults, as in compose
    compose = _load_yaml((REPO / "docker-compose.yml").read_text())["services"]["coordinator"]
    assert coordinator["environment"] == compose["environment"]
    assert "--from-environment" in coordinator["command"]
    assert "--from-environment" in compose["command"]
    pairs, compose_pairs = ({k: v for k, v in zip(c[0::2], c[1::2], strict=True)
                             if k not in ("--tls-cert", "--tls-key", "--tls-ca")}
                            for c in ([p for p in cmd if p not in ("--from-environment", "--keep-serving")]
                                      for cmd in (coordinator["command"], compose["command"])))
    assert pairs == compose_pairs


def test_the_script_refuses_bad_input_with_one_line(tmp_path: Path) -> None:
    swarm = _swarm_module()
    with pytest.raises(ValueError, match="at least 2 agents"):
        swarm.render_stack(1)
    party = tmp_path / "agent1"
    subprocess.run([sys.executable, "-m", "efpsn", "certs", "request", "--name", "agent1",
                    "--out", str(party)], check=True, capture_output=True, timeout=120)
    os.chmod(party / "agent1.key", 0o644)
    out = subprocess.run([sys.executable, str(SWARM_DIR / "swarm.py"), "secrets", "--name",
                          "agent1", "--dir", str(party)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out
    assert "readable by others" in out.stderr
    os.chmod(party / "agent1.key", 0o600)
    out = subprocess.run([sys.executable, str(SWARM_DIR / "swarm.py"), "secrets", "--name",
                          "agent1", "--dir", str(party)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 2 and "cannot read the TLS certificate" in out.stderr, out


# ------------------------------------------------------------------------------- real test


class Cluster:
    """The swarm on the test's engine, driven the way the README drives it."""

    def __init__(self, engine: ds.Engine) -> None:
        self.engine = engine
        # the engine's own client first on PATH: deploy/swarm/swarm.py calls `docker`
        self.env = {**engine.env, "PATH": f"{Path(engine.docker).parent}:{os.environ['PATH']}"}

    def script(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return ds.run([sys.executable, str(SWARM_DIR / "swarm.py"), *args], timeout=300,
                      env=self.env, check=check)

    def docker(self, *args: str, timeout: float = 120.0) -> str:
        return self.engine.docker_run(list(args), timeout=timeout).stdout

    def tasks(self, service: str) -> list[dict[str, Any]]:
        """Every task of STACK_service, oldest first: state, exit code, container id."""
        ids = self.docker("service", "ps", "-q", "--no-trunc", f"{STACK}_{service}").split()
        if not ids:
            return []
        tasks = json.loads(self.docker("inspect", *ids))
        tasks.sort(key=lambda t: t["CreatedAt"])
        return [{"state": t["Status"]["State"],
                 "exit": t["Status"].get("ContainerStatus", {}).get("ExitCode"),
                 "container": t["Status"].get("ContainerStatus", {}).get("ContainerID", ""),
                 "error": t["Status"].get("Err", "")} for t in tasks]

    def wait(self, what: str, done: Any, *, timeout: float, poll: float = 1.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = done()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} after {timeout:.0f}s: "
                                   f"{ {n: self.tasks(n) for n in NODES} }")
            time.sleep(poll)

    def running(self, service: str) -> str:
        """The container of the service's running task, or ''."""
        live = [t for t in self.tasks(service) if t["state"] == "running"]
        return live[-1]["container"] if live else ""

    def diagnostics(self) -> str:
        out = [self.engine.docker_run(["stack", "ps", "--no-trunc", STACK], timeout=60,
                                      check=False).stdout]
        for name in NODES:
            logs = self.engine.docker_run(["service", "logs", "--tail", "30", f"{STACK}_{name}"],
                                          timeout=60, check=False)
            out.append(ds._tail(logs.stdout + logs.stderr, 4000))
        return "\n".join(out)

    def remove_stack(self) -> None:
        """The stack, then (once its containers are gone) its volumes and the secrets."""
        self.engine.docker_run(["stack", "rm", STACK], timeout=120, check=False)
        label = f"label=com.docker.stack.namespace={STACK}"
        self.wait("stack containers still there", lambda: not self.docker(
            "ps", "-aq", "--filter", label).split(), timeout=120)
        # the network goes asynchronously; the volumes once no container holds them
        self.wait("stack network still there", lambda: not self.docker(
            "network", "ls", "-q", "--filter", label).split(), timeout=120)
        volumes = self.docker("volume", "ls", "-q", "--filter", label).split()
        if volumes:
            self.docker("volume", "rm", *volumes)
        secrets = self.docker("secret", "ls", "-q", "--filter", "label=efpsn.party").split()
        if secrets:
            self.docker("secret", "rm", *secrets)


@pytest.fixture
def swarm(docker_engine: ds.Engine) -> Iterator[Cluster]:
    """`docker swarm init` on the test engine; left (with all it holds) afterwards."""
    start = time.monotonic()
    docker_engine.swarm_init()
    docker_engine.timings["swarm: init"] = time.monotonic() - start
    try:
        yield Cluster(docker_engine)
    finally:
        start = time.monotonic()
        docker_engine.swarm_leave()
        docker_engine.timings["swarm: leave"] = time.monotonic() - start


def _certificates(work: Path) -> dict[str, Path]:
    """The README's flow: the operator's CA; every party's key and request in its own folder;
    each request signed by the CA into an answer folder; the answer (public) copied back.
    Returns each party's folder."""
    efpsn = [sys.executable, "-m", "efpsn", "certs"]
    ds.run([*efpsn, "init-ca", "--out", str(work / "ca")], timeout=120)
    parties = {}
    for name in NODES:
        party = work / "parties" / name
        ds.run([*efpsn, "request", "--name", name, "--out", str(party)], timeout=120)
        answer = work / "answers" / name
        ds.run([*efpsn, "sign", "--ca", str(work / "ca"), "--csr", str(party / f"{name}.csr"),
                "--out", str(answer)], timeout=120)
        for public in (f"{name}.pem", "ca.pem"):
            shutil.copy(answer / public, party / public)
        parties[name] = party
    return parties


def _override(work: Path) -> Path:
    """The test's addition to the stack: each agent's command plus the noise seed hook, and
    the BLAS kernels of the simulator the run is compared with (numpy's OpenBLAS picks them
    by CPU unless OPENBLAS_CORETYPE names them, as this machine's environment may, and other
    kernels give other bits)."""
    stack = _load_yaml(STACK_FILE.read_text())["services"]
    services: dict[str, Any] = {}
    for name in AGENTS:
        services[name] = {"command": [*stack[name]["command"], "--insecure-noise-seed",
                                      str(NOISE_SEED)]}
        if os.environ.get("OPENBLAS_CORETYPE"):
            services[name]["environment"] = {"OPENBLAS_CORETYPE": os.environ["OPENBLAS_CORETYPE"]}
    path = work / "test-override.yml"
    path.write_text(json.dumps({"version": "3.8", "services": services}))  # JSON is YAML
    return path


def _checkpoints(engine: ds.Engine, name: str) -> list[int]:
    """Rounds of the agent's checkpoints, read on its node (this one) from its volume."""
    found = engine.docker_run(["volume", "inspect", "-f", "{{.Mountpoint}}",
                               f"{STACK}_results-{name}"], timeout=60, check=False)
    folder = Path(found.stdout.strip() or "/nonexistent") / name / "state" / "checkpoints"
    try:
        return sorted(int(p.name.split("-")[1]) for p in folder.glob("round-*"))
    except (OSError, ValueError, IndexError):
        return []


@pytest.mark.docker
@pytest.mark.timeout(3600)
def test_stack_deploy_runs_five_parties_and_resumes_a_killed_agent(
    swarm: Cluster, efpsn_images: Path
) -> None:
    engine = swarm.engine
    work = engine.root / "swarm"
    parties = _certificates(work)
    data = efpsn_images / "data"
    env = {**swarm.env, **RUN_ENV, "EFPSN_DATA_ROOT": str(data)}
    timings = engine.timings
    try:
        # secrets (each party from its own folder) and labels, checked before the deploy
        assert swarm.script("check", "--agents", "5", check=False).returncode == 1
        start = time.monotonic()
        swarm.script("secrets", "--name", "coordinator", "--dir", str(parties["coordinator"]),
                     "--ca")
        for name in AGENTS:
            swarm.script("secrets", "--name", name, "--dir", str(parties[name]))
        node = swarm.docker("node", "ls", "-q").split()
        assert len(node) == 1
        swarm.script("label", "--node", node[0], *[a for n in NODES for a in ("--party", n)])
        assert swarm.script("check", "--agents", "5").stdout.strip() == "ready to deploy"
        timings["swarm: secrets + labels"] = time.monotonic() - start

        start = time.monotonic()
        ds.run([engine.docker, "stack", "deploy", "--resolve-image", "never", "-c",
                str(STACK_FILE), "-c", str(_override(work)), STACK], timeout=300, env=env)
        def all_running() -> dict[str, str] | None:
            found = {n: swarm.running(n) for n in AGENTS}
            return found if all(found.values()) else None

        containers = swarm.wait("agents not all running", all_running, timeout=RUN_TIMEOUT,
                                poll=0.5)
        assert len(set(containers.values())) == len(AGENTS)

        # each agent's container holds its own key, its certificate and the CA's, nothing else
        for name, cid in containers.items():
            listing = swarm.docker("exec", cid, "ls", "-ln", "/run/secrets").splitlines()[1:]
            seen = {line.split()[-1]: (line.split()[0], line.split()[2]) for line in listing}
            assert seen == {"ca.pem": ("-r--r--r--", str(UID)),
                            f"{name}.pem": ("-r--r--r--", str(UID)),
                            f"{name}.key": ("-r--------", str(UID))}, (name, listing)
            key = swarm.docker("exec", cid, "cat", f"/run/secrets/{name}.key")
            assert key.encode() == (parties[name] / f"{name}.key").read_bytes()
            mounts = json.loads(swarm.docker("inspect", "-f", "{{json .Mounts}}", cid))
            assert sorted((m["Type"], m["Destination"], m["RW"]) for m in mounts) == [
                ("bind", "/data", False), ("volume", "/results", True)], mounts
            assert [m["Source"] for m in mounts if m["Type"] == "bind"] == [str(data / name)]

        # kill one agent's container mid-run, once it has a checkpoint in phase II
        rounds = swarm.wait(f"{KILLED} has no checkpoint past round {KILL_AFTER_ROUND}",
                            lambda: [r for r in _checkpoints(engine, KILLED)
                                     if r >= KILL_AFTER_ROUND], timeout=RUN_TIMEOUT, poll=0.1)
        swarm.docker("kill", swarm.running(KILLED))
        assert max(rounds) < ITERATIONS
        timings["swarm: deploy -> kill"] = time.monotonic() - start

        swarm.wait("agents not all complete", lambda: all(
            swarm.tasks(n)[-1]["state"] == "complete" for n in AGENTS), timeout=RUN_TIMEOUT)
        timings["swarm: deploy -> all agents complete"] = time.monotonic() - start
        time.sleep(5)  # longer than the restart delay: a finished agent is not started again
        history = {n: [(t["state"], t["exit"]) for t in swarm.tasks(n)] for n in AGENTS}
        assert history == {n: ([("failed", 137)] if n == KILLED else []) + [("complete", 0)]
                           for n in AGENTS}, history
        logs = engine.docker_run(["service", "logs", "--raw", f"{STACK}_{KILLED}"], timeout=60)
        assert f"{KILLED} resumes run" in logs.stdout + logs.stderr

        # the results, copied out of each agent's last container (on its own node)
        results = work / "results"
        results.mkdir()
        records = {}
        for name in AGENTS:
            cid = swarm.tasks(name)[-1]["container"]
            swarm.docker("cp", f"{cid}:/results/{name}", str(results))
            records[name] = json.loads((results / name / "result.json").read_text())
        check_records(records, iterations=ITERATIONS, eval_every=EVAL_EVERY)
        _, xs = load_agent_results(results, AGENTS)
        # each container mounts only its own folder, no public test set: --holdout auto
        # holds its share out to score itself, so the simulator holds out the same rows
        holdout = resolve_holdout(None, public_test=False)
        local = load_data_dir(CONFIG, data, holdout=holdout)
        sim = run_simulation(CONFIG, noise_seed=NOISE_SEED,
                             problem=build_problem(CONFIG, local=local))
        assert [float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)] == [
            0.0] * len(AGENTS)

        # no command of the flow put a key anywhere but its party's folder (and its secret)
        for name, party in parties.items():
            key = (party / f"{name}.key").read_bytes()
            holders = [p for p in work.rglob("*") if p.is_file() and key in p.read_bytes()]
            assert holders == [party / f"{name}.key"], holders
    except BaseException:
        print(swarm.diagnostics(), flush=True)
        raise
    finally:
        start = time.monotonic()
        swarm.remove_stack()
        timings["swarm: stack rm + volumes + secrets"] = time.monotonic() - start
    assert not swarm.docker("ps", "-aq").split()
    assert not swarm.docker("volume", "ls", "-q").split()
    assert not swarm.docker("secret", "ls", "-q").split()
