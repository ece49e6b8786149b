"""The gRPC edge shared by coordinator and agents: servers with health and reflection, channels,
retries. The guard (admission, parsing, refusals) lives in efpsn.wire.guard."""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection

from efpsn.process.lifeline import launcher_gone
from efpsn.wire import calls, limits
from efpsn.wire.guard import (
    RejectionLog,
)
from efpsn.wire.stock import GuardedHealth, GuardedReflection

log = logging.getLogger("efpsn.wire.net")
T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


def split_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port); ValueError with the offending text otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


def check_port_free(listen: str) -> None:
    """Raise OSError in one line when `listen` (HOST:PORT, port > 0) cannot be bound: "port N
    on HOST is already in use" (gRPC itself says only "Failed to bind", its reason in a log
    line). A plain socket is bound as gRPC binds (SO_REUSEADDR, no SO_REUSEPORT), then closed."""
    host, port = split_address(listen)
    if port == 0:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {listen}: the host {host!r} does not resolve "
                      f"({exc.strerror}); expected an address of this machine") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(f"port {port} on {host} is already in use (another process "
                              f"listens there): stop it, or listen on another port (--listen "
                              f"{host}:PORT; port 0 picks a free one)") from None
            raise OSError(f"cannot listen on {listen}: {exc.strerror}; expected a free port "
                          "on an address of this machine") from None


@dataclass
class Server:
    """A running grpc.aio server with its health servicer and the port it bound."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int

    async def set_serving(self, serving: bool = True) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set("", status)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving: calls still open after `grace` seconds are cancelled, and every
        call's tasks have ended when this returns (efpsn/wire/calls.py)."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await calls.ended(self.server)


async def start_server(
    listen: str,
    *,
    add_servicers: Callable[[grpc.aio.Server], Iterable[str]],
    credentials: grpc.ServerCredentials | None = None,
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
    max_receive_bytes: int = limits.AGENT_RECEIVE_BYTES,
    rejections: RejectionLog | None = None,
) -> Server:
    """Start a server on `listen` (port 0 picks a free port) with grpc.health.v1 and reflection.

    add_servicers registers the service implementations and returns their full service names;
    `interceptors` carry their admission (a guard.Gatekeeper per service added by add_service).
    gRPC refuses bodies over max_receive_bytes (compressed ones by their decompressed size)
    before buffering them; refused health checks go to `rejections`.
    """
    check_port_free(listen)  # before gRPC, whose refusal is only a log line
    options = [o for o in limits.server_options() if o[0] != "grpc.max_receive_message_length"]
    options.append(("grpc.max_receive_message_length", max_receive_bytes))
    health_servicer = health.aio.HealthServicer()
    refusals = rejections or RejectionLog(log, "server")
    guarded_health = GuardedHealth(health_servicer, refusals)
    server = grpc.aio.server(options=options,
                             interceptors=[*interceptors, guarded_health.gatekeeper()])
    names = list(add_servicers(server))
    names.append(guarded_health.register(server))
    names.append(GuardedReflection([*names, reflection.SERVICE_NAME], refusals).register(server))
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:  # gRPC's "Failed to bind" (e.g. the port taken since the check)
        port = 0
    if port == 0:
        raise OSError(f"could not listen on {listen} (address in use or not local?)")
    await server.start()
    return Server(server=server, health=health_servicer, port=port)


def open_channel(
    address: str, *, credentials: grpc.ChannelCredentials | None = None,
    server_name: str | None = None, max_receive_bytes: int | None = None,
) -> grpc.aio.Channel:
    """A channel with the project's message limits and keepalive (TLS when credentials given);
    max_receive_bytes caps the replies (gRPC refuses a longer one before buffering it)."""
    options = list(limits.channel_options())
    if max_receive_bytes is not None:
        options = [o for o in options if o[0] != "grpc.max_receive_message_length"]
        options.append(("grpc.max_receive_message_length", max_receive_bytes))
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, credentials, options=options)


async def call_with_retry(
    call: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    what: str,
    base_delay: float = 0.05,
    max_delay: float = 2.0,
    on_retry: Callable[[grpc.aio.AioRpcError], None] | None = None,
) -> T:
    """Await call() until it succeeds, retrying UNAVAILABLE with exponential backoff and full
    jitter until the loop-time `deadline`; then raise TimeoutError naming `what`. on_retry(error)
    hears every retried failure (e.g. to tell a person what is being waited for)."""
    loop = asyncio.get_running_loop()
    delay = base_delay
    last: grpc.aio.AioRpcError | None = None
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRYABLE:
                raise
            last = exc
            if on_retry is not None:
                on_retry(exc)
        remaining = deadline - loop.time()
        if remaining <= 0:
            detail = last.details() if last is not None else "no answer"
            raise TimeoutError(f"{what}: unreachable until the deadline ({detail})")
        await asyncio.sleep(min(remaining, random.uniform(0, delay)))
        delay = min(max_delay, delay * 2)


def write_port_file(path: str | None, port: int) -> None:
    """Write the bound port so a parent process can find a server started on port 0."""
    if path:
        tmp = Path(path + ".part")
        tmp.write_text(f"{port}\n")
        tmp.replace(path)


def install_stop_signals(stop: asyncio.Event, *, what: str = "", final: bool = False) -> None:
    """SIGINT/SIGTERM set `stop` (so containers and `efpsn up` can shut us down cleanly). With
    `what`, each such signal is also said at once on stderr, before anything stops ("WHAT:
    SIGTERM: stopping"), and why when the launcher (`efpsn up`) that started us is gone: the
    log then tells a stop from a crash.

    final (a service process that ends with this loop: an agent's, the coordinator's): once a
    stop signal has come, later ones are ignored. The stop is under way (until_signalled
    re-cancels it every second; under `efpsn up` the lifeline's SIGKILL bounds it), and a later
    SIGTERM must not kill the process halfway through its exit: Linux repeats the parent-death
    signal as each thread of a killed launcher ends, and the lifeline sends its own, also after
    the loop has closed and put back the default action."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, _on_stop_signal, stop, sig, what, final)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass


def _on_stop_signal(stop: asyncio.Event, sig: int, what: str, final: bool) -> None:
    stop.set()  # first: saying it may fail (a closed pipe as stderr), stopping must not
    if final:
        loop = asyncio.get_running_loop()
        for each in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(each)  # so closing the loop restores nothing
            signal.signal(each, signal.SIG_IGN)
    if what:
        why = "; the launcher (efpsn up) is gone" if launcher_gone() else ""
        try:
            print(f"{what}: {signal.Signals(sig).name}: stopping{why}", file=sys.stderr,
                  flush=True)
        except (OSError, ValueError):
            pass


class Patience:
    """Tells a person, through `say`, what a retried call is waiting for: first after `first`
    seconds, then every `every` seconds, with the gRPC reason of the last failure."""

    def __init__(self, say: Callable[[str], None], what: str, *, first: float = 5.0,
                 every: float = 10.0, hint: str = "") -> None:
        self._say, self._what, self._hint = say, what, hint
        self._start = time.monotonic()
        self._next = self._start + first
        self._every = every

    def __call__(self, error: grpc.aio.AioRpcError) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every
        reason = (error.details() or "").splitlines()[0][:200] if error.details() else ""
        self._say(f"still waiting for {self._what} after {now - self._start:.0f}s "
                  f"({error.code().name}: {reason}){self._hint}")
