"""Guarded handlers: callers admitted before their request is read (Gatekeeper, a gRPC server
interceptor), parsers that never raise, refusals counted and logged at a bounded rate; nothing
escapes as UNKNOWN."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from weakref import WeakSet

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from efpsn.wire import calls

log = logging.getLogger("efpsn.wire.net")
T = TypeVar("T")


class Reject(Exception):
    """Raised inside an RPC handler to refuse the call with `code` and a message saying why."""

    def __init__(self, code: grpc.StatusCode, detail: str, *,
                 metadata: tuple[tuple[str, str], ...] = (), early: bool = False) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.metadata = metadata  # trailing metadata: the refusal's facts as data
        # early: the caller is simply ahead of us (we are not assigned or ready yet) and
        # retries; a normal race at start-up, not counted or logged as a refusal
        self.early = early


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


def tolerant_parser(message_class: Any) -> Callable[[bytes], Any]:
    """A request parser that never raises: bytes that are not a `message_class` -> Undecodable."""
    name = message_class.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError or whatever hostile bytes cause
            return Undecodable(name, f"{type(exc).__name__}: {exc}"[:200])

    return parse


@dataclass(frozen=True)
class Admission:
    """What a service's gate grants a caller before its request is read: the largest request
    it may send to that method, what to call once the call is over, and the names in the
    caller's certificate (None without mutual TLS), read once for the handler."""

    max_bytes: int
    release: Callable[[], None] | None = None
    caller: frozenset[str] | None = None


# The admission of the call being served (set by Gatekeeper for the call's task).
_ADMITTED: contextvars.ContextVar[Admission | None] = contextvars.ContextVar(
    "efpsn_admitted", default=None)


def admitted() -> Admission | None:
    """This call's admission, or None outside a call the Gatekeeper admitted (a handler called
    directly with a parsed message)."""
    return _ADMITTED.get()


Gate = Callable[[str, Any], Admission]  # (method name, context) -> Admission, or Reject


class Gatekeeper(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Admission of one service's callers, as a gRPC server interceptor: before a handler of
    `service` (registered by add_service, its request still unread) runs, `gate(method,
    context)` decides from the caller's certificate and the method alone (who may send, how
    many bytes, how many calls in flight). A refusal ends the call unread, counted in
    `rejections`; an admission is the handler's (admitted()) and is released when the call
    ends, however it ends. Other services' calls pass through untouched."""

    def __init__(self, service: str, gate: Gate, *, rejections: RejectionLog) -> None:
        self.service = service
        self.gate = gate
        self.rejections = rejections

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        method = details.method
        if isinstance(method, bytes):
            method = method.decode("utf-8", "replace")
        service, _, name = method.strip("/").rpartition("/")
        if handler is None or service != self.service or handler.stream_unary is None:
            return handler
        inner = handler.stream_unary

        async def admit_then_serve(requests: Any, context: Any) -> Any:
            async with self.admitted(name, context):
                return await inner(requests, context)

        return grpc.stream_unary_rpc_method_handler(
            admit_then_serve, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

    @contextlib.asynccontextmanager
    async def admitted(self, method: str, context: Any) -> AsyncIterator[Admission]:
        """Admit the caller to `method` for the body of the block (a refusal aborts the call);
        tests drive a handler called directly through it too."""
        try:
            admission = self.gate(method, context)
        except Exception as exc:  # noqa: BLE001 - every refusal becomes a status
            code, detail, early = _refusal(exc, method, context)
            await _refuse(self.rejections, method, context, code, detail, early)
        token = _ADMITTED.set(admission)
        try:
            yield admission
        finally:
            _ADMITTED.reset(token)
            if admission.release is not None:
                admission.release()


@dataclass(frozen=True)
class Unread:
    """A request still in gRPC's buffers: the Gatekeeper admits the caller (certificate, size
    cap, calls in flight) before `guarded` reads and parses it, so nobody unauthenticated makes
    us read, allocate or parse a body."""

    message_class: Any


# Bodies larger than this are parsed in a worker thread, so the event loop keeps serving rounds.
PARSE_INLINE_BYTES = 256 * 1024


def _admission(name: str) -> Admission:
    """This call's admission; an unread request outside an admitted call is refused (its
    server lacks the service's Gatekeeper: nothing is read unadmitted)."""
    admission = admitted()
    if admission is None:
        raise Reject(grpc.StatusCode.INTERNAL,
                     f"{name} was not admitted: its server has no gatekeeper for it")
    return admission


async def _read_admitted(name: str, unread: Unread, context: Any) -> Any:
    """The request of an admitted call, read (at most the admitted bytes) and parsed."""
    raw = await _read_raw(name, context, _admission(name).max_bytes)
    if raw is None:
        return Undecodable(unread.message_class.DESCRIPTOR.full_name, "no request message")
    return await _parse(tolerant_parser(unread.message_class), raw)


async def _parse(parse: Callable[[bytes], Any], raw: bytes) -> Any:
    """Parse inline, or in a worker thread when the body is large (the loop keeps serving)."""
    if len(raw) > PARSE_INLINE_BYTES:
        return await asyncio.to_thread(parse, raw)
    return parse(raw)


async def _read_raw(name: str, context: Any, max_bytes: int) -> bytes | None:
    """The next request message's bytes (None at the end of the requests), refused unparsed
    when larger than `max_bytes`."""
    try:
        raw = await context.read()
    except Exception as exc:
        if _server_stopped(exc):
            raise  # not the caller's fault: gRPC ends the call itself (a warning, no refusal)
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT,
                     f"request could not be read ({type(exc).__name__})") from None
    if raw is grpc.aio.EOF or not isinstance(raw, bytes):
        return None
    if len(raw) > max_bytes:
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT,
                     f"request of {len(raw)} bytes is larger than the {max_bytes} bytes {name} "
                     "can carry in this run")
    return raw


def add_service(server: grpc.aio.Server, servicer: Any, service: ServiceDescriptor) -> str:
    """Register `servicer` for `service` (like the generated add_*Servicer_to_server), but so
    that no request is read before its caller is admitted.

    A unary method is served as stream-unary with raw bytes, so gRPC hands the handler the call
    before the body; the service's Gatekeeper (an interceptor the server is built with) admits
    the caller (certificate, per-method size cap), and only then does `guarded` read and parse
    the body (see Unread). A client-streaming method (`guarded_stream`) is admitted once, when
    the stream opens, and then each message is read, capped and parsed the same way. Bytes that are
    not the expected message reach the handler as Undecodable and get INVALID_ARGUMENT. Returns the
    service's full name."""
    handlers = {}
    for method in service.methods:
        if method.server_streaming:
            raise ValueError(f"{service.full_name}.{method.name}: only unary and "
                             "client-streaming methods are served")
        # unary and client-streaming alike: gRPC hands over the call, the handler reads it
        handlers[method.name] = grpc.stream_unary_rpc_method_handler(
            unread_handler(getattr(servicer, method.name), GetMessageClass(method.input_type),
                           tasks=calls.track(server)),
            request_deserializer=None,
            response_serializer=GetMessageClass(method.output_type).SerializeToString)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
    return service.full_name


def unread_handler(bound: Callable[[Any, Any], Awaitable[T]], message_class: Any, *,
                   tasks: WeakSet[asyncio.Task[Any]] | None = None,
                   ) -> Callable[[Any, Any], Awaitable[T]]:
    """A gRPC handler that passes `bound` the call with its request still unread; `tasks`
    (efpsn.wire.calls.track of its server) gets the task of each call, which the server's stop
    waits for."""
    unread = Unread(message_class)

    async def handle(_requests: Any, context: Any) -> T:
        task = asyncio.current_task()
        if tasks is not None and task is not None:
            tasks.add(task)
        return await bound(unread, context)

    return handle


def _server_stopped(exc: BaseException) -> bool:
    """Whether `exc` is grpc.aio's own error for a call cut short because this server is
    stopping (a long-lived round stream always is): it must reach gRPC, which ends the call,
    rather than become a refusal (its class is private to grpc._cython)."""
    return type(exc).__name__ == "_ServerStoppedError"


def _refusal(exc: Exception, name: str, context: Any) -> tuple[grpc.StatusCode, str, bool]:
    """The status and message a handler's exception becomes (never UNKNOWN); gRPC's own
    server-stopped error is re-raised for gRPC to end the call."""
    if _server_stopped(exc):
        raise exc
    if isinstance(exc, Reject):
        if exc.metadata:
            context.set_trailing_metadata(exc.metadata)
        return exc.code, exc.detail, exc.early
    if isinstance(exc, BAD_INPUT):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc) or type(exc).__name__, False
    log.error("%s failed on unexpected input", name, exc_info=exc)  # a bug: INTERNAL
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})", False


def _parsed(request: Any) -> Any:
    """The request, or Reject (INVALID_ARGUMENT) when its bytes did not parse."""
    if isinstance(request, Undecodable):
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT,
                     f"request is not a valid {request.type_name}: {request.error}")
    return request


async def _refuse(rejections: RejectionLog, name: str, context: Any, code: grpc.StatusCode,
                  detail: str, early: bool = False) -> None:
    """Count and log the refusal (an early caller's only at debug level), then end the call
    with `code` (context.abort raises)."""
    detail = detail if len(detail) <= 1000 else detail[:1000] + "..."
    if early:
        log.debug("%s: %s early (%s): %s", name, code.name, "the caller retries", detail)
    else:
        rejections.record(name, code, detail)
    await context.abort(code, detail)
    raise AssertionError("context.abort returned")  # pragma: no cover


def guarded(
    method: Callable[[Any, Any, Any], Awaitable[T]],
) -> Callable[[Any, Any, Any], Awaitable[T]]:
    """Wrap an async servicer method so that no exception escapes as UNKNOWN.

    An Unread request (from add_service) is read and parsed within what its caller was
    admitted to (Gatekeeper); an already parsed message (a direct call) is handed on.
    Reject -> its code; ValueError/TypeError (bad input) -> INVALID_ARGUMENT; anything else is a
    bug -> INTERNAL, logged with its traceback. Every refusal goes to `self.rejections`
    (a RejectionLog) before the call is aborted with a message saying what was wrong.
    """

    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: Any) -> T:
        try:
            if isinstance(request, Unread):
                request = await _read_admitted(method.__name__, request, context)
            return await method(self, _parsed(request), context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - every exception becomes a status
            code, detail, early = _refusal(exc, method.__name__, context)
        await _refuse(self.rejections, method.__name__, context, code, detail, early)
        raise AssertionError("unreachable")  # pragma: no cover

    return handler


def guarded_stream(
    empty: Callable[[], Any],
) -> Callable[[Callable[[Any, Any, Any], Awaitable[Any]]], Callable[[Any, Any, Any], Awaitable[Any]]]:
    """Serve a client stream with a per-message servicer method, guarded like `guarded`.

    The caller is admitted once, when the stream opens (Gatekeeper); then every message is
    read, refused unparsed if over the admitted size, parsed and handed to the method. When the
    caller ends the stream, the call answers with what the method returned for the last message
    (`empty()` if there was none). The first refusal ends the stream with its status, counted
    and logged as for a unary call.
    """
    return functools.partial(_guard_stream, empty=empty)


def _guard_stream(method: Callable[[Any, Any, Any], Awaitable[Any]], *,
                  empty: Callable[[], Any]) -> Callable[[Any, Any, Any], Awaitable[Any]]:
    @functools.wraps(method)
    async def handler(self: Any, unread: Any, context: Any) -> Any:
        name = method.__name__
        last = None
        try:
            max_bytes = _admission(name).max_bytes
            parse = tolerant_parser(unread.message_class)
            while True:
                raw = await _read_raw(name, context, max_bytes)
                if raw is None:  # the sender closed its end
                    return last if last is not None else empty()
                last = await method(self, _parsed(await _parse(parse, raw)), context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - every exception becomes a status
            code, detail, early = _refusal(exc, name, context)
        await _refuse(self.rejections, name, context, code, detail, early)

    return handler
