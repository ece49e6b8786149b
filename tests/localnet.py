"""A coordinator and agents as real processes on loopback ports, for tests that must kill,
freeze or restart individual processes (test_restart.py, test_security.py).

    net = LocalNet(folder, config, noise_seed=7)
    net.start_all()                      # coordinator + agent1..agentN, mutual TLS
    net.wait_round("agent2", 40)
    net.kill("agent2"); net.restart("agent2")   # the very same command line
    net.wait_agents(timeout=300)

Every process gets its own session (start_new_session) so stop() can end it and its children
by process group; stop() always runs (use LocalNet as a context manager).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Self

from efpsn.flags.names import run_parameters_args
from efpsn.launch.processes import Child, ExitedBeforeServing, spawn, stop_children, wait_port
from efpsn.params.config import RunConfig
from efpsn.wire.status_client import AgentStatus, fetch_status
from efpsn.wire.tls import TlsConfig, generate_certificates

CRASH_HOOK = Path(__file__).parent / "crash_hook"


def crash_at(round_: int | str, *, name: str = "") -> dict[str, str]:
    """The environment that makes an agent (`name` only, when given; several: "agent2,agent4")
    SIGKILL itself on reaching round `round_`, before it sends anything for it; "keys" or
    "shares": in phase I, before it sends its public key or its shares ("shares1": after its
    shares reached its first neighbour only)
    (tests/crash_hook/sitecustomize.py)."""
    path = os.pathsep.join([str(CRASH_HOOK), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"PYTHONPATH": path, "CRASH_AT_ROUND": f"{name}:{round_}" if name else str(round_)}


def crash_each(rounds: dict[str, int | str]) -> dict[str, str]:
    """crash_at with a round of its own for each agent named (e.g. {"agent3": "600!"}; "T!":
    once its neighbours' round-T messages came, so the departure round is T exactly)."""
    env = crash_at(0)
    env["CRASH_AT_ROUND"] = ";".join(f"{name}:{at}" for name, at in rounds.items())
    return env


def launch_with_agent_killed(config: RunConfig, *, at: int | str, name: str, results: Path,
                             data: Path, noise_seed: int, departure_deadline: float) -> dict:
    """`efpsn up`'s launcher on the data folder `data` (no held-out part, insecure test keys
    allowed) with agent `name` SIGKILLing itself at `at` (crash_at); the run's summary."""
    from efpsn.launch.network import launch_local_network

    env = crash_at(at, name=name)
    saved = {variable: os.environ.get(variable) for variable in env}
    os.environ.update(env)
    try:
        return launch_local_network(
            config, results=results, data_dir=data, quiet=True, holdout=0.0,
            insecure_noise_seed=noise_seed, departure_deadline=departure_deadline,
            allow_insecure_keys=True)
    finally:
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value


class LocalNet:
    def __init__(
        self,
        folder: Path,
        config: RunConfig,
        *,
        tls: bool = True,
        noise_seed: int | None = 7,
        agent_args: tuple[str, ...] = (),
        names: list[str] | None = None,
        agent_env: dict[str, dict[str, str]] | None = None,
        own_args: dict[str, tuple[str, ...]] | None = None,
        coordinator_args: tuple[str, ...] = (),
    ) -> None:
        self.folder = folder
        self.config = config
        self.names = names or [f"agent{i}" for i in range(1, config.agents + 1)]
        self.logs = folder / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.children: dict[str, Child] = {}
        self.argv: dict[str, list[str]] = {}
        self.ports: dict[str, int] = {}
        self.tls_dir = folder / "tls"
        if tls:
            generate_certificates(self.tls_dir, ["coordinator", *self.names, "intruder"],
                                  overwrite=True)
            self.tls_args = ["--tls-dir", str(self.tls_dir)]
            self.monitor: TlsConfig | None = TlsConfig.from_dir(self.tls_dir, "coordinator")
        else:
            self.tls_args = ["--insecure"]
            self.monitor = None
        self.agent_args = list(agent_args)
        self.own_args = dict(own_args or {})  # per agent, e.g. its own --data
        self.coordinator_args = list(coordinator_args)  # e.g. --allow-insecure-keys
        self.env = dict(agent_env or {})  # extra environment per process (test hooks)
        debug = ["--debug-expose-mask"]
        if noise_seed is not None:
            debug += ["--insecure-noise-seed", str(noise_seed)]
        self.debug = debug

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ processes

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        return {name: child.process for name, child in self.children.items()}

    def _spawn(self, name: str) -> None:
        """Start `name` with its recorded command line; a restart appends to the same log."""
        self.children[name] = spawn(name, self.argv[name], self.folder,
                                    env=self.env.get(name, {}), append_log=True)

    def wait_port(self, name: str, timeout: float = 180.0) -> int:
        try:
            self.ports[name] = wait_port(self.children[name], timeout)
        except ExitedBeforeServing as exc:
            raise RuntimeError(f"{name} exited with {exc.child.process.returncode}:\n"
                               f"{self.log(name)[-3000:]}") from None
        return self.ports[name]

    def start_coordinator(self) -> int:
        # --keep-serving: tests decide when it stops (it would exit once the run is assigned)
        self.argv["coordinator"] = [
            "efpsn", "coordinator", "--listen", "127.0.0.1:0", "--keep-serving",
            "--expected-names", ",".join(self.names), *self.tls_args,
            *run_parameters_args(self.config, self.folder), *self.coordinator_args,
        ]
        self._spawn("coordinator")
        return self.wait_port("coordinator")

    def start_agent(self, name: str, *, wait: bool = True) -> None:
        self.argv[name] = [
            "efpsn", "agent", "--name", name, "--listen", "127.0.0.1:0",
            "--coordinator", f"127.0.0.1:{self.ports['coordinator']}",
            "--results", str(self.folder), *self.tls_args, *self.agent_args,
            *self.own_args.get(name, ()), *self.debug,
        ]
        self._spawn(name)
        if wait:
            self.wait_port(name)

    def start_all(self) -> None:
        self.start_coordinator()
        for name in self.names:
            self.start_agent(name, wait=False)
        for name in self.names:
            self.wait_port(name)

    def restart(self, name: str, *, env: dict[str, str] | None = None) -> None:
        """Start `name` again with exactly the command line it had (and the extra environment
        `env`, which replaces the one it had: none by default)."""
        assert self.procs[name].poll() is not None, f"{name} is still running"
        self.env[name] = dict(env or {})
        self._spawn(name)

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.procs[name].pid, sig)

    def kill(self, name: str) -> None:
        """SIGKILL: no handler runs, nothing is flushed or cleaned up."""
        self.signal(name, signal.SIGKILL)
        self.procs[name].wait(timeout=30)

    def stop(self) -> None:
        for child in self.children.values():
            if child.running:
                try:
                    os.killpg(child.process.pid, signal.SIGCONT)  # in case a test froze it
                except ProcessLookupError:
                    pass
        stop_children(list(self.children.values()), grace=10.0)

    # ------------------------------------------------------------------ observing

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def log(self, name: str) -> str:
        try:
            return (self.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def status(self, name: str, timeout: float = 2.0) -> AgentStatus | None:
        """GetStatus as the agent's operator (its own certificate), so private figures show."""
        tls = TlsConfig.from_dir(self.tls_dir, name) if self.monitor is not None else None
        return asyncio.run(fetch_status(name, self.address(name), timeout=timeout, tls=tls))

    def join_frozen(self, joiner: str, members: list[str], *, timeout: float = 120) -> int:
        """Start the late seat `joiner` with the members frozen (SIGSTOP), so that none passes
        another check round before the coordinator decides; thaw them; the decided round."""
        for name in members:
            self.signal(name, signal.SIGSTOP)
        try:
            time.sleep(0.3)  # a status answered while stopping: not one round further
            self.start_agent(joiner, wait=False)
            self.wait_for(lambda: f"{joiner} joins at round" in self.log("coordinator"),
                          timeout=timeout, what="the coordinator's decision")
        finally:
            for name in members:
                self.signal(name, signal.SIGCONT)
        decided = re.search(rf"{joiner} joins at round (\d+)", self.log("coordinator"))
        assert decided is not None
        return int(decided.group(1))

    def wait_for(self, predicate, *, timeout: float, what: str, every: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            failed = {n: p.returncode for n, p in self.procs.items()
                      if n != "coordinator" and p.poll() not in (None, 0)}
            if failed:
                raise RuntimeError(f"waiting for {what}: {failed} failed:\n" + "\n".join(
                    f"--- {n}\n{self.log(n)[-2000:]}" for n in failed))
            time.sleep(every)
        raise TimeoutError(f"{what}: not within {timeout:.0f}s")

    def wait_round(self, name: str, round_: int, *, timeout: float = 300.0) -> int:
        """Poll GetStatus until `name` is at phase II round >= round_; return its round."""
        seen: list[int] = []

        def reached() -> bool:
            s = self.status(name)
            if s is not None and s.phase.name == "OPTIMIZE" and s.round >= round_:
                seen.append(s.round)
                return True
            return False

        self.wait_for(reached, timeout=timeout, what=f"{name} at round {round_}")
        return seen[-1]

    def wait_agents(self, *, timeout: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout
        agents = {n: self.procs[n] for n in self.names}
        while time.monotonic() < deadline and any(p.poll() is None for p in agents.values()):
            time.sleep(0.2)
        return {n: p.poll() for n, p in agents.items()}
