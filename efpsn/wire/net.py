"""The gRPC edge shared by coordinator and agents: servers with health and reflection, retries."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from efpsn.wire import limits

log = logging.getLogger("efpsn.wire.net")
T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


class Reject(Exception):
    """Raised inside an RPC handler to refuse the call with `code` and a message saying why."""

    def __init__(self, code: grpc.StatusCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class RejectionLog:
    """Counts refused calls by status code and logs them, at most `rate` lines per second
    (a burst of hostile requests must not flood the log); suppressed lines are counted."""

    def __init__(self, logger: logging.Logger, who: str, *, rate: float = 5.0,
                 burst: int = 20) -> None:
        self.logger = logger
        self.who = who
        self.counts: collections.Counter[str] = collections.Counter()
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._suppressed = 0

    def record(self, method: str, code: grpc.StatusCode, detail: str) -> None:
        self.counts[code.name] += 1
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < 1:
            self._suppressed += 1
            return
        self._tokens -= 1
        more = f" (+{self._suppressed} similar lines suppressed)" if self._suppressed else ""
        self._suppressed = 0
        level = logging.INFO if code == grpc.StatusCode.UNAVAILABLE else logging.WARNING
        self.logger.log(level, "%s: refused %s: %s: %s%s", self.who, method, code.name,
                        detail, more)


# What a handler's validation raises for bad input (WireError is a ValueError).
BAD_INPUT = (ValueError, TypeError)


@dataclass(frozen=True)
class Undecodable:
    """Stands in for a request whose bytes do not parse as the method's message type, so the
    handler (not gRPC's default path, which would answer UNKNOWN) refuses it by name."""

    type_name: str
    error: str


def _tolerant_parser(message_class: Any) -> Callable[[bytes], Any]:
    name = message_class.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError or whatever hostile bytes cause
            return Undecodable(name, f"{type(exc).__name__}: {exc}"[:200])

    return parse


def add_service(server: grpc.aio.Server, servicer: Any, service: ServiceDescriptor) -> str:
    """Register `servicer` for the unary service `service` (like the generated
    add_*Servicer_to_server) with request parsers that never raise: bytes that are not the
    expected message reach the (guarded) handler as Undecodable and get INVALID_ARGUMENT.
    Returns the service's full name."""
    handlers = {}
    for method in service.methods:
        if method.client_streaming or method.server_streaming:
            raise ValueError(f"{service.full_name}.{method.name}: only unary methods are served")
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=_tolerant_parser(GetMessageClass(method.input_type)),
            response_serializer=GetMessageClass(method.output_type).SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
    return service.full_name


def guarded(
    method: Callable[[Any, Any, Any], Awaitable[T]],
) -> Callable[[Any, Any, Any], Awaitable[T]]:
    """Wrap an async servicer method so that no exception escapes as UNKNOWN.

    Reject -> its code; ValueError/TypeError (bad input) -> INVALID_ARGUMENT; anything else is a
    bug -> INTERNAL, logged with its traceback. Every refusal goes to `self.rejections`
    (a RejectionLog) before the call is aborted with a message saying what was wrong.
    """

    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: Any) -> T:
        try:
            if isinstance(request, Undecodable):
                raise Reject(grpc.StatusCode.INVALID_ARGUMENT,
                             f"request is not a valid {request.type_name}: {request.error}")
            return await method(self, request, context)
        except Reject as exc:
            code, detail = exc.code, exc.detail
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except BAD_INPUT as exc:
            code, detail = grpc.StatusCode.INVALID_ARGUMENT, str(exc) or type(exc).__name__
        except Exception as exc:  # every other exception is a bug: INTERNAL, never UNKNOWN
            log.exception("%s failed on unexpected input", method.__name__)
            code, detail = grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})"
        detail = detail if len(detail) <= 1000 else detail[:1000] + "..."
        self.rejections.record(method.__name__, code, detail)
        await context.abort(code, detail)
        raise AssertionError("context.abort returned")  # pragma: no cover

    return handler


def split_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port); ValueError with the offending text otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


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
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_server(
    listen: str,
    *,
    add_servicers: Callable[[grpc.aio.Server], Iterable[str]],
    credentials: grpc.ServerCredentials | None = None,
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
) -> Server:
    """Start a server on `listen` (port 0 picks a free port) with grpc.health.v1 and reflection.

    add_servicers registers the service implementations and returns their full service names.
    """
    split_address(listen)
    server = grpc.aio.server(options=limits.server_options(), interceptors=list(interceptors))
    names = list(add_servicers(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names += [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    if credentials is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, credentials)
    if port == 0:
        raise OSError(f"could not listen on {listen} (address in use or not local?)")
    await server.start()
    return Server(server=server, health=health_servicer, port=port)


def open_channel(
    address: str, *, credentials: grpc.ChannelCredentials | None = None,
    server_name: str | None = None,
) -> grpc.aio.Channel:
    """A channel with the project's message limits and keepalive (TLS when credentials given)."""
    options = list(limits.channel_options())
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
) -> T:
    """Await call() until it succeeds, retrying UNAVAILABLE with exponential backoff and full
    jitter until the loop-time `deadline`; then raise TimeoutError naming `what`."""
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


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT/SIGTERM set `stop` (so containers and `efpsn up` can shut us down cleanly)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
