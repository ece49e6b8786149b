"""Guarded handlers: callers admitted before their request is read, parsers that never raise,
refusals counted and logged at a bounded rate; nothing escapes as UNKNOWN."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from efpsn.wire import limits

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
    """What a servicer's `admit(method, context)` grants a caller before its request is read:
    the largest request it may send to that method, and what to call once the call is over."""

    max_bytes: int
    release: Callable[[], None] | None = None


@dataclass(frozen=True)
class Unread:
    """A request still in gRPC's buffers: `guarded` admits the caller (certificate, size cap,
    calls in flight) before reading and parsing it, so nobody unauthenticated makes us read,
    allocate or parse a body."""

    message_class: Any


# Bodies larger than this are parsed in a worker thread, so the event loop keeps serving rounds.
PARSE_INLINE_BYTES = 256 * 1024


def _admit(servicer: Any, name: str, context: Any) -> Admission:
    """The servicer's admission of this caller to `name` (Reject if refused); a servicer
    without `admit` lets anybody send small requests."""
    admit = getattr(servicer, "admit", None)
    return admit(name, context) if admit is not None else Admission(limits.SMALL_REQUEST_BYTES)


async def _admit_and_read(servicer: Any, name: str, unread: Unread,
                          context: Any) -> tuple[Any, Admission]:
    admission = _admit(servicer, name, context)
    try:
        raw = await _read_raw(name, context, admission.max_bytes)
        if raw is None:
            return Undecodable(unread.message_class.DESCRIPTOR.full_name,
                               "no request message"), admission
        return await _parse(tolerant_parser(unread.message_class), raw), admission
    except BaseException:  # also a cancelled call: the caller's slot is freed in every case
        if admission.release is not None:
            admission.release()
        raise


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
    before the body; `guarded` asks `servicer.admit(method, context)` (certificate, per-method
    size cap) and only then reads and parses the body (see Unread). A client-streaming method
    (`guarded_stream`) is admitted once, when the stream opens, and then each message is read,
    capped and parsed the same way. Bytes that are not the expected message reach the
    handler as Undecodable and get INVALID_ARGUMENT. Returns the service's full name."""
    handlers = {}
    for method in service.methods:
        if method.server_streaming:
            raise ValueError(f"{service.full_name}.{method.name}: only unary and "
                             "client-streaming methods are served")
        # unary and client-streaming alike: gRPC hands over the call, the handler reads it
        handlers[method.name] = grpc.stream_unary_rpc_method_handler(
            unread_handler(getattr(servicer, method.name), GetMessageClass(method.input_type)),
            request_deserializer=None,
            response_serializer=GetMessageClass(method.output_type).SerializeToString)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
    return service.full_name


def unread_handler(bound: Callable[[Any, Any], Awaitable[T]],
                   message_class: Any) -> Callable[[Any, Any], Awaitable[T]]:
    """A gRPC handler that passes `bound` the call with its request still unread."""
    unread = Unread(message_class)

    async def handle(_requests: Any, context: Any) -> T:
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


async def _refuse(servicer: Any, name: str, context: Any, code: grpc.StatusCode,
                  detail: str, early: bool = False) -> None:
    """Count and log the refusal (an early caller's only at debug level), then end the call
    with `code` (context.abort raises)."""
    detail = detail if len(detail) <= 1000 else detail[:1000] + "..."
    if early:
        log.debug("%s: %s early (%s): %s", name, code.name, "the caller retries", detail)
    else:
        servicer.rejections.record(name, code, detail)
    await context.abort(code, detail)
    raise AssertionError("context.abort returned")  # pragma: no cover


def guarded(
    method: Callable[[Any, Any, Any], Awaitable[T]],
) -> Callable[[Any, Any, Any], Awaitable[T]]:
    """Wrap an async servicer method so that no exception escapes as UNKNOWN.

    An Unread request (from add_service) is admitted, read and parsed first (_admit_and_read);
    an already parsed message (a direct call) is admitted the same way, then handed on.
    Reject -> its code; ValueError/TypeError (bad input) -> INVALID_ARGUMENT; anything else is a
    bug -> INTERNAL, logged with its traceback. Every refusal goes to `self.rejections`
    (a RejectionLog) before the call is aborted with a message saying what was wrong.
    """

    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: Any) -> T:
        admission: Admission | None = None
        try:
            if isinstance(request, Unread):
                request, admission = await _admit_and_read(self, method.__name__, request,
                                                           context)
            else:
                admission = _admit(self, method.__name__, context)
            return await method(self, _parsed(request), context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - every exception becomes a status
            code, detail, early = _refusal(exc, method.__name__, context)
        finally:
            if admission is not None and admission.release is not None:
                admission.release()
        await _refuse(self, method.__name__, context, code, detail, early)
        raise AssertionError("unreachable")  # pragma: no cover

    return handler


def guarded_stream(
    empty: Callable[[], Any],
) -> Callable[[Callable[[Any, Any, Any], Awaitable[Any]]], Callable[[Any, Any, Any], Awaitable[Any]]]:
    """Serve a client stream with a per-message servicer method, guarded like `guarded`.

    The caller is admitted once, when the stream opens (servicer.admit); then every message is
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
        admission: Admission | None = None
        last = None
        try:
            admission = _admit(self, name, context)
            parse = tolerant_parser(unread.message_class)
            while True:
                raw = await _read_raw(name, context, admission.max_bytes)
                if raw is None:  # the sender closed its end
                    return last if last is not None else empty()
                last = await method(self, _parsed(await _parse(parse, raw)), context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - every exception becomes a status
            code, detail, early = _refusal(exc, name, context)
        finally:
            if admission is not None and admission.release is not None:
                admission.release()
        await _refuse(self, name, context, code, detail, early)

    return handler
