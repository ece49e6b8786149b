"""The coordinator's gRPC service: registration until the run is complete, then status only."""

from __future__ import annotations

import asyncio
import logging
import uuid

import grpc

from efpsn.config import RunConfig
from efpsn.coordinator.registry import Registry
from efpsn.net import Server, install_stop_signals, start_server, write_port_file
from efpsn.wire import serde
from efpsn.wire.v1 import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger("efpsn.coordinator")


class CoordinatorService(coordinator_pb2_grpc.CoordinatorServicer):
    """Holds Register calls open until every agent has registered, then answers them all."""

    def __init__(self, registry: Registry, *, register_timeout: float) -> None:
        self.registry = registry
        self.register_timeout = register_timeout
        self.complete = asyncio.Event()

    async def Register(
        self, request: coordinator_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.Assignment:
        try:
            self.registry.register(request.name, request.address)
        except ValueError as exc:
            log.warning("rejected registration %r at %r: %s", request.name, request.address, exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        log.info("registered %s at %s (%d/%d)", request.name, request.address,
                 len(self.registry.addresses), self.registry.config.agents)
        if self.registry.complete:
            self.complete.set()
        remaining = context.time_remaining()
        timeout = self.register_timeout if remaining is None else min(remaining, self.register_timeout)
        try:
            await asyncio.wait_for(self.complete.wait(), timeout=timeout)
        except TimeoutError:
            have = sorted(self.registry.addresses)
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"only {len(have)} of {self.registry.config.agents} agents registered "
                f"({', '.join(have)}) before the registration deadline",
            )
        return serde.assignment_to_proto(self.registry.assignments()[request.name])

    async def GetRunStatus(
        self, request: coordinator_pb2.RunStatusRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.RunStatus:
        names = sorted(self.registry.addresses)
        return coordinator_pb2.RunStatus(
            run_id=self.registry.run_id, registered=len(names),
            expected=self.registry.config.agents, names=names, assigned=self.registry.complete,
        )


async def serve(
    config: RunConfig,
    *,
    listen: str,
    run_id: str | None = None,
    port_file: str | None = None,
    register_timeout: float = 600.0,
    expected_names: set[str] | None = None,
    credentials: grpc.ServerCredentials | None = None,
    interceptors: list[grpc.aio.ServerInterceptor] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Validate the run, serve until stopped (SIGINT/SIGTERM or `stop`)."""
    registry = Registry(config, run_id=run_id or uuid.uuid4().hex[:16],
                        expected_names=expected_names)
    service = CoordinatorService(registry, register_timeout=register_timeout)

    def add(server: grpc.aio.Server) -> list[str]:
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(service, server)
        return [coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name]

    server: Server = await start_server(
        listen, add_servicers=add, credentials=credentials, interceptors=interceptors or ()
    )
    await server.set_serving(True)
    write_port_file(port_file, server.port)
    log.info("coordinator for run %s listening on port %d, expecting %d agents (%s)",
             registry.run_id, server.port, config.agents, config.topology)
    stop = stop or asyncio.Event()
    install_stop_signals(stop)
    try:
        await stop.wait()
    finally:
        await server.stop(grace=0.5)
