"""Docker plumbing for tests/test_compose.py and tests/test_swarm.py: a private engine (and a
single-node swarm on it). The images are built by tests/docker_fixtures.py. Why it looks like
this:

- Only a Docker client ships on our machines: the engine (Debian's docker.io, Docker 20.10, and
  docker-compose v1.29) is installed with apt when `dockerd` is missing (root only).
- Our `dockerd` runs from a scratch folder with its own data root, exec root, pid file and unix
  socket, no default bridge, no iptables changes, and an address pool that overlaps nothing on the
  machine, so it collides neither with the machine's networking nor with another engineer's engine.
- Swarm: `docker swarm init --advertise-addr 127.0.0.1` with its own address pool for overlay
  networks (again one that overlaps nothing); Engine.close() leaves the swarm, which drops every
  service and secret with it.

Everything lives under one temporary folder and is removed by Engine.close(); only the apt
packages stay installed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from commands import free_port

REPO = Path(__file__).resolve().parents[1]
APT_PACKAGES = ("docker.io", "docker-compose", "debootstrap")
# Address pools for our engine's networks: 10.N.0.0/16 with N here, avoiding tests/netns.py's.
POOL_SECOND_OCTETS = range(160, 200)
SWARM_PORTS = 49152  # Swarm publishes ports below the ephemeral range only
GW_BRIDGE = "docker_gwbridge"  # a swarm node's bridge to the outside, one name per host


class EngineUnavailable(Exception):
    """The engine cannot be provided on this machine (the caller turns this into a skip)."""


def _tail(text: str, n: int = 4000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def run(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
        check: bool = True, input: bytes | None = None, cwd: str | Path | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output as text, and raise with the output's tail on failure."""
    proc = subprocess.run(list(cmd), env=dict(env) if env is not None else None, cwd=cwd,
                          input=input.decode() if input is not None else None,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited with {proc.returncode}:\n"
                           f"{_tail(proc.stdout, 2000)}\n{_tail(proc.stderr)}")
    return proc


# ------------------------------------------------------------------------------------ install

def missing_tools() -> list[str]:
    return [tool for tool in ("dockerd", "docker-compose", "debootstrap")
            if shutil.which(tool) is None]


def ensure_engine_installed(timeout: float = 900.0) -> float:
    """Install docker.io, docker-compose and debootstrap with apt when one of them is missing.
    Returns the seconds spent (0 when nothing had to be installed). Raises EngineUnavailable
    when it may not install (not root, not Linux, no apt)."""
    missing = missing_tools()
    if not missing:
        return 0.0
    if not sys.platform.startswith("linux"):
        raise EngineUnavailable(f"not Linux, and {', '.join(missing)} missing")
    if os.geteuid() != 0:
        raise EngineUnavailable(
            f"{', '.join(missing)} not installed and not root, so the test cannot install "
            f"them (as root: apt-get install -y {' '.join(APT_PACKAGES)})")
    if shutil.which("apt-get") is None:
        raise EngineUnavailable(f"{', '.join(missing)} missing and no apt-get to install them")
    start = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=600"]  # another engineer may be running apt right now
    run(["apt-get", *lock, "update"], timeout=timeout, env=env)
    run(["apt-get", *lock, "install", "-y", "--no-install-recommends", *APT_PACKAGES],
        timeout=timeout, env=env)
    still = missing_tools()
    if still:
        raise RuntimeError(f"apt-get installed {APT_PACKAGES} but {still} still missing")
    return time.monotonic() - start


# ------------------------------------------------------------------------------------ engine

def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine routes or has an address in (main and local tables)."""
    nets: list[ipaddress.IPv4Network] = []
    for cmd in (["ip", "-4", "route", "show", "table", "all"], ["ip", "-4", "-o", "addr"]):
        out = run(cmd, timeout=30, check=False).stdout
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", out):
            try:
                nets.append(ipaddress.ip_network(token, strict=False))
            except ValueError:
                pass
    return [n for n in nets if n.prefixlen > 0]


def pick_address_pool(*, taken: Sequence[str] = ()) -> str:
    """A free 10.N.0.0/16: no route or address of the machine in it, nor any of `taken`."""
    used = _used_networks() + [ipaddress.ip_network(t) for t in taken]
    octets = list(POOL_SECOND_OCTETS)
    random.shuffle(octets)
    for n in octets:
        pool = ipaddress.ip_network(f"10.{n}.0.0/16")
        if not any(pool.overlaps(u) for u in used):
            return str(pool)
    raise RuntimeError("no free 10.N.0.0/16 for the engine's networks")




def docker_client() -> str:
    """The client that came with the engine (same release) if present, else any on PATH."""
    dockerd = shutil.which("dockerd")
    if dockerd:
        for candidate in (Path(dockerd).with_name("docker"), Path("/usr/bin/docker")):
            if candidate.exists() and os.access(candidate, os.X_OK):
                return str(candidate)
    found = shutil.which("docker")
    if not found:
        raise RuntimeError("no docker client")
    return found


@dataclass
class Engine:
    """A dockerd of our own under `root` (data root, exec root, pid file, socket, logs)."""

    root: Path
    docker: str = field(default_factory=docker_client)
    compose_bin: str = field(default_factory=lambda: shutil.which("docker-compose") or "")
    proc: subprocess.Popen[bytes] | None = None
    address_pool: str = ""
    swarm_pool: str = ""  # set while this engine is a swarm manager
    made_gw_bridge: bool = False  # swarm init made the host's docker_gwbridge
    networks: set[str] = field(default_factory=set)  # ids of networks created on this engine
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DOCKER_", "COMPOSE_")) and not k.startswith("EFPSN_")}
        env.update(DOCKER_HOST=f"unix://{self.socket}", DOCKER_BUILDKIT="0",
                   COMPOSE_DOCKER_CLI_BUILD="0", DOCKER_CONFIG=str(self.root / "client"))
        return env

    # -------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 120.0) -> None:
        for sub in ("data", "exec", "client"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.address_pool = pick_address_pool()
        log = open(self.root / "dockerd.log", "wb")  # noqa: SIM115 (kept open for the daemon)
        cmd = [
            shutil.which("dockerd") or "dockerd",
            "--data-root", str(self.root / "data"),
            "--exec-root", str(self.root / "exec"),
            "--pidfile", str(self.root / "dockerd.pid"),
            "-H", f"unix://{self.socket}",
            "--bridge", "none",  # no docker0: the machine's default bridge is left alone
            "--iptables=false", "--ip-masq=false", "--ip-forward=false",
            "--default-address-pool", f"base={self.address_pool},size=24",
            "--config-file", str(self._daemon_json()),
        ]
        start = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = start + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if self.docker_run(["info"], timeout=30, check=False).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"dockerd not answering after {timeout:.0f}s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.5)
        self.timings["engine_start"] = time.monotonic() - start

    def _daemon_json(self) -> Path:
        # An empty config file: the machine's /etc/docker/daemon.json (if any) is not ours.
        path = self.root / "daemon.json"
        path.write_text("{}\n")
        return path

    def log_tail(self, n: int = 4000) -> str:
        try:
            return _tail((self.root / "dockerd.log").read_text(errors="replace"), n)
        except OSError:
            return "(no dockerd log)"

    def close(self) -> None:
        """Remove what runs on the engine, stop it, and delete the scratch folder. Best effort
        at every step, so a failure half-way still cleans up the rest."""
        errors: list[str] = []
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.swarm_leave()
            except Exception as exc:  # noqa: BLE001
                errors.append(f"leaving the swarm: {exc}")
            try:
                ids = self.docker_run(["ps", "-aq"], timeout=60, check=False).stdout.split()
                if ids:
                    self.docker_run(["rm", "-f", "-v", *ids], timeout=120, check=False)
                nets = self.docker_run(["network", "ls", "-q", "--no-trunc", "--filter",
                                        "type=custom"], timeout=60, check=False).stdout.split()
                self.networks.update(nets)
                for net in nets:
                    self.docker_run(["network", "rm", net], timeout=60, check=False)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"cleaning containers: {exc}")
            self._stop_daemon(errors)
        self._remove_leftover_bridges()
        self._unmount_under_root()
        shutil.rmtree(self.root, ignore_errors=True)
        if self.root.exists():
            errors.append(f"could not remove {self.root}")
        if errors:
            raise RuntimeError("; ".join(errors))

    def _stop_daemon(self, errors: list[str]) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            errors.append("dockerd ignored SIGTERM for 60 s; killed")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        # The managed containerd is dockerd's child in its process group: make sure it is gone.
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(2)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _remove_leftover_bridges(self) -> None:
        bridges = [f"br-{net[:12]}" for net in self.networks]
        if self.made_gw_bridge:
            bridges.append(GW_BRIDGE)
        for bridge in bridges:
            if Path("/sys/class/net", bridge).exists():
                run(["ip", "link", "delete", bridge], timeout=30, check=False)

    def _unmount_under_root(self) -> None:
        try:
            mounts = Path("/proc/self/mounts").read_text().splitlines()
        except OSError:
            return
        prefix = str(self.root) + "/"
        points = [m.split()[1] for m in mounts if len(m.split()) > 1]
        for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
            run(["umount", "-l", point], timeout=30, check=False)

    # -------------------------------------------------------------------- commands

    def docker_run(self, args: Sequence[str], *, timeout: float = 300.0, check: bool = True,
                   input: bytes | None = None) -> subprocess.CompletedProcess[str]:
        return run([self.docker, *args], timeout=timeout, env=self.env, check=check, input=input)

    def swarm_init(self) -> None:
        """Make this engine a single-node swarm (a real one: manager and worker at once): its
        control port on 127.0.0.1 only, its VXLAN port and its overlay networks' address pool
        free ones (Docker's defaults, 2377, 4789 and 10.0.0.0/8, may be taken)."""
        if Path("/sys/class/net", GW_BRIDGE).exists():  # the host-wide name every swarm uses
            raise EngineUnavailable(f"{GW_BRIDGE} exists: another engine on this machine is in "
                                    "a swarm")
        self.swarm_pool = pick_address_pool(taken=[self.address_pool])
        control = f"127.0.0.1:{free_port(host='0.0.0.0', below=SWARM_PORTS)}"
        self.made_gw_bridge = True
        self.docker_run(["swarm", "init", "--advertise-addr", control, "--listen-addr", control,
                         "--data-path-port", str(free_port(host="0.0.0.0", kind=socket.SOCK_DGRAM,
                                                          below=SWARM_PORTS)),
                         "--default-addr-pool", self.swarm_pool,
                         "--default-addr-pool-mask-length", "24"], timeout=120)

    def swarm_leave(self) -> None:
        """Leave the swarm if this engine is in one (its services and secrets go with it)."""
        state = self.docker_run(["info", "--format", "{{.Swarm.LocalNodeState}}"],
                                timeout=60, check=False).stdout.strip()
        if state not in ("", "inactive"):
            self.docker_run(["swarm", "leave", "--force"], timeout=120)
        self.swarm_pool = ""

    def compose(self, project: str, compose_file: Path, args: Sequence[str], *,
                extra_files: Sequence[Path] = (), environment: Mapping[str, str] | None = None,
                timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """docker-compose (v1.29) against this engine, with a fixed project name."""
        if not self.compose_bin:
            raise RuntimeError("docker-compose not installed")
        env = {**self.env, **(environment or {})}
        files = [arg for f in (compose_file, *extra_files) for arg in ("-f", str(f))]
        return run([self.compose_bin, "--ansi", "never", "-p", project, *files, *args],
                   timeout=timeout, env=env, check=check, cwd=compose_file.parent)

    def build(self, context: Path, tag: str, *, build_args: Mapping[str, str] | None = None,
              dockerfile: Path | None = None, timeout: float = 1800.0) -> float:
        """`docker build` with the legacy builder and host networking (our engine has no
        default bridge, and apt inside the base build needs the machine's network)."""
        cmd = ["build", "--network", "host", "-t", tag]
        if dockerfile is not None:
            cmd += ["-f", str(dockerfile)]
        for key, value in (build_args or {}).items():
            cmd += ["--build-arg", f"{key}={value}"]
        start = time.monotonic()
        self.docker_run([*cmd, str(context)], timeout=timeout)
        return time.monotonic() - start


def start_engine() -> Engine:
    """A started private engine in a fresh /tmp folder (short path: unix sockets are limited to
    108 bytes). The caller must close() it."""
    root = Path(tempfile.mkdtemp(prefix="efpsn-dk-", dir="/tmp"))
    engine = Engine(root=root)
    try:
        engine.start()
    except BaseException:
        with contextlib.suppress(Exception):  # the start error is the one to report
            engine.close()
        raise
    return engine


def wait_exited(engine: Engine, containers: Mapping[str, str], *, timeout: float,
                poll: float = 2.0) -> dict[str, int]:
    """Wait until every container (name -> id) has exited; return name -> exit code."""
    deadline = time.monotonic() + timeout
    while True:
        states = {}
        for name, cid in containers.items():
            out = engine.docker_run(["inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}",
                                     cid], timeout=60).stdout.split()
            states[name] = (out[0], int(out[1]))
        if all(status == "exited" for status, _ in states.values()):
            return {name: code for name, (_, code) in states.items()}
        if time.monotonic() > deadline:
            raise TimeoutError(f"containers still running after {timeout:.0f}s: {states}")
        time.sleep(poll)
