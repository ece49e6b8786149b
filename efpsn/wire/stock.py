"""The stock gRPC services every server carries (health, reflection), behind the same guard as
ours: a request that does not parse is refused by name and counted, never UNKNOWN with a
traceback per call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from efpsn.wire import calls, limits
from efpsn.wire.guard import (
    Admission,
    Gatekeeper,
    RejectionLog,
    Undecodable,
    guarded,
    tolerant_parser,
    unread_handler,
)


class GuardedHealth:
    """grpc.health.v1.Health's Check and Watch behind parsers that never raise: a request that
    is not a HealthCheckRequest is refused by name (INVALID_ARGUMENT) and counted in the
    rate-limited rejection log, never gRPC's UNKNOWN with a traceback per call."""

    def __init__(self, inner: health.aio.HealthServicer, rejections: RejectionLog) -> None:
        self.inner = inner
        self.rejections = rejections

    NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

    @staticmethod
    def admit(method: str, context: Any) -> Admission:
        """Any caller the TLS handshake let in may ask; its request is a service name."""
        return Admission(limits.SMALL_REQUEST_BYTES)

    def gatekeeper(self) -> Gatekeeper:
        """Its admission, for the server's interceptors."""
        return Gatekeeper(self.NAME, self.admit, rejections=self.rejections)

    @guarded
    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: Any) -> health_pb2.HealthCheckResponse:
        return await self.inner.Check(request, context)

    async def Watch(self, request: Any, context: Any) -> None:
        if isinstance(request, Undecodable):
            detail = f"request is not a valid {request.type_name}: {request.error}"
            self.rejections.record("Watch", grpc.StatusCode.INVALID_ARGUMENT, detail)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, detail)
        await self.inner.Watch(request, context)

    def register(self, server: grpc.aio.Server) -> str:
        """Serve it on `server`; returns the service's full name."""
        name = self.NAME
        serialize = health_pb2.HealthCheckResponse.SerializeToString
        handlers = {
            "Check": grpc.stream_unary_rpc_method_handler(
                unread_handler(self.Check, health_pb2.HealthCheckRequest,
                               tasks=calls.track(server)),
                request_deserializer=None, response_serializer=serialize),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self.Watch, request_deserializer=tolerant_parser(health_pb2.HealthCheckRequest),
                response_serializer=serialize),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        return name


class GuardedReflection:
    """grpc.reflection.v1alpha's ServerReflectionInfo stream with a parser that never raises:
    an undecodable request ends the stream with INVALID_ARGUMENT, counted and rate-limit logged."""

    def __init__(self, service_names: list[str], rejections: RejectionLog) -> None:
        self.inner = ReflectionServicer(service_names)
        self.rejections = rejections

    async def ServerReflectionInfo(self, requests: AsyncIterator[Any],
                                   context: Any) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Undecodable):
                    detail = f"request is not a valid {request.type_name}: {request.error}"
                    self.rejections.record("ServerReflectionInfo",
                                           grpc.StatusCode.INVALID_ARGUMENT, detail)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, detail)
                yield request

        async for response in self.inner.ServerReflectionInfo(checked(), context):
            yield response

    def register(self, server: grpc.aio.Server) -> str:
        """Serve it on `server`; returns the service's full name."""
        handler = grpc.stream_stream_rpc_method_handler(
            self.ServerReflectionInfo,
            request_deserializer=tolerant_parser(reflection_pb2.ServerReflectionRequest),
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            reflection.SERVICE_NAME, {"ServerReflectionInfo": handler}),))
        return reflection.SERVICE_NAME
