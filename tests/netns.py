"""Test hosts as Linux network namespaces on a private bridge (root only; no containers).

    with NetnsNetwork(["coordinator", "agent1", "agent2"]) as net:
        host = net["agent1"]            # .netns, .address, .veth
        proc = host.popen([sys.executable, "-m", "efpsn", "agent", ...])
        host.run(["ip", "-o", "addr"])  # one-shot command inside the namespace

Layout of one network (tag = "efn<pid><letter>", e.g. efn4711a; interface names are limited to
15 characters, hence the short tag):

    root namespace:  bridge  <tag>br            (no IP address, no uplink, no NAT, no routes)
                     veth    <tag>v<i>          (bridge port of host i)
    netns <tag>-<host>:  lo (up), eth0 = peer of <tag>v<i>, address <subnet>.(10+i)/24,
                     no default route: only the /24 on eth0 is reachable.

The /24 is picked from 10.213.0.0/16, 10.237.0.0/16 and 172.29.0.0/16 so that it overlaps no
address or route in the root namespace (`ip -o addr`, `ip route show table all`). The root
namespace gets no address on the bridge, so nothing on the machine can route into or out of
the test subnet: packets only move between the namespaces, through the bridge.

Teardown always runs (also when the body raises): processes started with Host.popen are
stopped (SIGTERM to their process group, then SIGKILL), any other process still inside one of
*our* namespaces is killed by pid, then the namespaces (which takes their eth0 and thus the
veth pair with them), the root-side veths and the bridge are deleted. Leftovers of an earlier
run that crashed (same "efn" prefix, owning pid no longer alive) are removed at start-up;
namespaces of a run whose pid is still alive are never touched.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

PREFIX = "efn"
_TAG = re.compile(rf"^{PREFIX}(\d+)[a-z]$")
_NETNS = re.compile(rf"^({PREFIX}\d+[a-z])-")
_LINK = re.compile(rf"^({PREFIX}\d+[a-z])(?:br|v\d+|p\d+)$")
_CANDIDATES = (
    ipaddress.ip_network("10.213.0.0/16"),
    ipaddress.ip_network("10.237.0.0/16"),
    ipaddress.ip_network("172.29.0.0/16"),
)
_counter = itertools.count()
CMD_TIMEOUT = 30.0  # every `ip` call is bounded


def _ip(
    *args: str, check: bool = True, timeout: float = CMD_TIMEOUT
) -> subprocess.CompletedProcess:
    out = subprocess.run(
        ["ip", *args], check=False, capture_output=True, text=True, timeout=timeout
    )
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


@functools.cache
def can_use_netns() -> tuple[bool, str]:
    """(True, "") when this process may create namespaces, bridges and veths; else (False, why)."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "network namespaces need root (run the netns tests as root)"
    if shutil.which("ip") is None:
        return False, "the `ip` command (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}z"
    try:
        _cleanup_tag(probe)
        try:
            _ip("netns", "add", f"{probe}-probe")
            _ip("link", "add", f"{probe}br", "type", "bridge")
            _ip("link", "add", f"{probe}v0", "type", "veth", "peer", "name", f"{probe}p0")
            _ip("link", "set", f"{probe}p0", "netns", f"{probe}-probe")
        finally:
            _cleanup_tag(probe)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot create a netns/bridge/veth here: {exc}"
    return True, ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_names() -> list[str]:
    out = _ip("-json", "netns", "list", check=False)
    if out.returncode != 0 or not out.stdout.strip():
        return []
    return [entry["name"] for entry in json.loads(out.stdout)]


def _link_names() -> list[str]:
    out = _ip("-json", "link", "show", check=False)
    if out.returncode != 0 or not out.stdout.strip():
        return []
    return [entry["ifname"] for entry in json.loads(out.stdout)]


def _netns_pids(netns: str) -> list[int]:
    out = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def _cleanup_tag(tag: str, *, kill: bool = True) -> list[str]:
    """Remove every namespace and root link of `tag`; return what could not be removed."""
    problems: list[str] = []
    for netns in [n for n in _netns_names() if n.startswith(tag + "-")]:
        if kill:
            for pid in _netns_pids(netns):  # only processes inside our own namespace
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        out = _ip("netns", "del", netns, check=False)
        if out.returncode != 0:
            problems.append(f"netns {netns}: {out.stderr.strip()}")
    for link in [n for n in _link_names() if _LINK.match(n) and _LINK.match(n).group(1) == tag]:
        out = _ip("link", "del", link, check=False)
        if out.returncode != 0 and link in _link_names():
            problems.append(f"link {link}: {out.stderr.strip()}")
    return problems


def cleanup_stale() -> list[str]:
    """Remove leftovers of crashed earlier runs: tags whose owning pid no longer exists.

    Processes that may still run inside such a namespace are not ours to kill; deleting the
    namespace name and the root-side links cuts them off, and they end on their own timeouts.
    """
    tags = set()
    for name in _netns_names():
        m = _NETNS.match(name)
        if m:
            tags.add(m.group(1))
    for name in _link_names():
        m = _LINK.match(name)
        if m:
            tags.add(m.group(1))
    removed = []
    for tag in sorted(tags):
        pid = int(_TAG.match(tag).group(1))
        if pid == os.getpid() or not _pid_alive(pid):
            if pid == os.getpid() and tag in _in_use:
                continue
            _cleanup_tag(tag, kill=False)
            removed.append(tag)
    return removed


_in_use: set[str] = set()


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address in or a route to."""
    nets: list[ipaddress.IPv4Network] = []
    out = _ip("-o", "-4", "addr", "show")
    for line in out.stdout.splitlines():
        m = re.search(r"\binet (\S+)", line)
        if m:
            nets.append(ipaddress.ip_interface(m.group(1)).network)
    out = _ip("-4", "route", "show", "table", "all", check=False)
    for line in out.stdout.splitlines():
        words = line.split()
        if words and words[0] in ("local", "broadcast", "unicast", "blackhole", "unreachable",
                                  "prohibit", "throw", "multicast", "anycast"):
            words = words[1:]
        if not words or words[0] == "default":
            continue
        try:
            nets.append(ipaddress.ip_network(words[0], strict=False))
        except ValueError:
            pass
    return nets


def pick_subnet(seed: int | None = None) -> ipaddress.IPv4Network:
    """A /24 from the candidate ranges that overlaps nothing on this machine."""
    used = _used_networks()
    start = (os.getpid() if seed is None else seed) % 256
    for base in _CANDIDATES:
        subnets = list(base.subnets(new_prefix=24))
        for k in range(len(subnets)):
            net = subnets[(start + k) % len(subnets)]
            if not any(net.overlaps(u) for u in used):
                return net
    raise RuntimeError(f"no free /24 in {[str(c) for c in _CANDIDATES]} (used: {used})")


def clean_env() -> dict[str, str]:
    """The current environment without proxy settings (gRPC would route through a proxy that
    is unreachable from the namespaces)."""
    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


@dataclass
class Host:
    name: str
    netns: str
    address: str  # IPv4 address on the bridge subnet
    veth: str  # root-side veth (a bridge port); its counters show the host's traffic
    processes: list[subprocess.Popen] = field(default_factory=list)

    def command(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *args]

    def run(self, args: Sequence[str], *, timeout: float = 60.0, check: bool = True,
            **kwargs) -> subprocess.CompletedProcess:
        """Run a command inside the namespace to completion (bounded by `timeout`)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("env", clean_env())
        return subprocess.run(self.command(args), timeout=timeout, check=check, **kwargs)

    def popen(self, args: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start a command inside the namespace in its own process group; stopped at teardown.
        (`ip netns exec` execs the command, so the Popen pid is the command's own pid.)"""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("env", clean_env())
        proc = subprocess.Popen(self.command(args), start_new_session=True, **kwargs)
        self.processes.append(proc)
        return proc

    def traffic(self) -> tuple[int, int]:
        """(bytes the host sent, bytes it received), read from its root-side veth."""
        stats = Path("/sys/class/net") / self.veth / "statistics"
        # the root-side end receives what the host sends, and the other way round
        return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())


def stop_processes(procs: Iterable[subprocess.Popen], *, grace: float = 10.0) -> None:
    """SIGTERM each still-running process group, SIGKILL what is left after `grace` seconds."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)


class NetnsNetwork:
    """Context manager: one namespace per host name, all on one private bridge."""

    def __init__(self, names: Sequence[str], *, subnet: str | None = None) -> None:
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"need distinct host names, got {names!r}")
        if len(names) > 200:
            raise ValueError("at most 200 hosts")
        for n in names:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", n):
                raise ValueError(f"host name must be [A-Za-z0-9_.-]{{1,40}}, got {n!r}")
        self.names = list(names)
        self.requested_subnet = subnet
        self.tag = ""
        self.bridge = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self.hosts: dict[str, Host] = {}
        self.cleaned_stale: list[str] = []
        self.teardown_problems: list[str] = []

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @property
    def bridge_netfilter(self) -> bool:
        """True when br_netfilter sends bridged packets through iptables (a FORWARD DROP
        policy, e.g. Docker's, would then drop the traffic between the namespaces)."""
        path = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        return path.exists() and path.read_text().strip() == "1"

    def __enter__(self) -> Self:
        ok, why = can_use_netns()
        if not ok:
            raise RuntimeError(why)
        self.cleaned_stale = cleanup_stale()
        letter = "abcdefghijklmnopqrstuvwxy"[next(_counter) % 25]
        self.tag = f"{PREFIX}{os.getpid()}{letter}"
        _in_use.add(self.tag)
        _cleanup_tag(self.tag, kill=False)  # our pid, reused from a crashed run
        self.bridge = f"{self.tag}br"
        try:
            self.subnet = (ipaddress.ip_network(self.requested_subnet)
                           if self.requested_subnet else pick_subnet())
            used = _used_networks()
            clash = [str(u) for u in used if self.subnet.overlaps(u)]
            if clash:
                raise RuntimeError(f"subnet {self.subnet} overlaps {clash} on this machine")
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            prefix = self.subnet.prefixlen
            for i, name in enumerate(self.names):
                netns = f"{self.tag}-{name}"
                veth, peer = f"{self.tag}v{i}", f"{self.tag}p{i}"
                address = str(self.subnet.network_address + 10 + i)
                _ip("netns", "add", netns)
                self.hosts[name] = Host(name=name, netns=netns, address=address, veth=veth)
                _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", netns)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", netns, "link", "set", "lo", "up")
                _ip("-n", netns, "link", "set", peer, "name", "eth0")
                _ip("-n", netns, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
                _ip("-n", netns, "link", "set", "eth0", "up")
            self._wait_links_up()
        except BaseException:
            self._teardown()
            raise
        return self

    def _wait_links_up(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = {h.name: Path(f"/sys/class/net/{h.veth}/operstate").read_text().strip()
                      for h in self.hosts.values()}
            if all(s == "up" for s in states.values()):
                return
            time.sleep(0.05)
        raise RuntimeError(f"veths not up after {timeout}s: {states}")

    def __exit__(self, *exc: object) -> None:
        self._teardown()

    def _teardown(self) -> None:
        try:
            stop_processes([p for h in self.hosts.values() for p in h.processes])
        finally:
            self.teardown_problems = _cleanup_tag(self.tag)
            _in_use.discard(self.tag)
        left = [n for n in _netns_names() if n.startswith(self.tag + "-")]
        left += [n for n in _link_names() if n.startswith(self.tag)]
        if left:
            self.teardown_problems.append(f"still present: {left}")
        if self.teardown_problems:
            print(f"netns teardown of {self.tag}: {self.teardown_problems}", file=sys.stderr)

    def describe(self) -> str:
        hosts = ", ".join(f"{h.name}={h.address} ({h.netns})" for h in self.hosts.values())
        return f"bridge {self.bridge}, subnet {self.subnet}: {hosts}"
