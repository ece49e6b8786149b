"""A fresh start, before phase I: the public run parameters from the coordinator, this agent's
data and model prepared (agent/prepare.py), then registration declaring the data schema and the
model fingerprint, or the failure (the coordinator then cancels the run for everyone)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from agent.options import AgentFailure, AgentOptions, Cancelled
from agent.prepare import Prepared, failure_category, prepare
from efpsn.params.config import RunConfig
from efpsn.wire import records
from efpsn.wire.net import Patience, call_with_retry
from efpsn.wire.v1 import coordinator_pb2, coordinator_pb2_grpc

__all__ = ["bootstrap", "join_run", "registration"]

log = logging.getLogger("efpsn.agent")

FAILURE_REPORT_SECONDS = 10.0  # how long a failing agent tries to tell the coordinator


def _refusal(exc: grpc.aio.AioRpcError, options: AgentOptions) -> AgentFailure:
    """The coordinator's refusal as an AgentFailure; a cancellation names its cause."""
    message = (f"coordinator {options.coordinator} refused {options.name}: "
               f"{exc.code().name}: {exc.details()}")
    blamed = dict(exc.trailing_metadata() or ()).get(records.CANCELLED_BY)
    if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and blamed:
        return Cancelled(message, by=str(blamed))
    return AgentFailure(message)


async def _ask(stub_call: Callable[[float], object], *, options: AgentOptions,
               seconds: float, flag: str, waiting: str) -> object:
    """One coordinator call, retried while it is unreachable for up to `seconds` (the agent's
    option `flag`); a person hears what is awaited after 5 s and every 10 s (with the gRPC
    reason), and a timeout says how to wait longer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    patience = Patience(lambda line: log.warning("%s: %s", options.name, line), waiting,
                        hint=f"; giving up after {seconds:.0f}s ({flag})")
    try:
        return await call_with_retry(
            lambda: stub_call(max(0.1, deadline - loop.time())),  # type: ignore[arg-type,return-value]
            deadline=deadline, what=f"coordinator {options.coordinator}", on_retry=patience)
    except grpc.aio.AioRpcError as exc:
        raise _refusal(exc, options) from None
    except TimeoutError as exc:
        raise AgentFailure(f"{options.name}: {exc}; is the coordinator running there? "
                           f"({flag} SECONDS waits longer)") from None


async def fetch_parameters(stub: coordinator_pb2_grpc.CoordinatorStub, *,
                           options: AgentOptions) -> RunConfig:
    """The run's public parameters, validated once, here (retried until --connect-timeout)."""
    reply = await _ask(lambda timeout: stub.GetRunParameters(
        coordinator_pb2.RunParametersRequest(), timeout=timeout), options=options,
        seconds=options.connect_timeout, flag="--connect-timeout",
        waiting=f"the coordinator at {options.coordinator}")
    config = RunConfig.from_dict(records.run_parameters_from_proto(reply))  # type: ignore[arg-type]
    if not config.resolved_ok and not config.scale.standard:  # standard: resolved after the sum
        raise AgentFailure(f"{options.name}: the coordinator at {options.coordinator} sent "
                           f"schedule {str(config.schedule)!r}, {config.iterations} rounds, "
                           f"momentum {config.momentum}: not the step rule's concrete numbers (is it an "
                           "older efpsn?)")
    return config


def registration(prepared: Prepared, *, name: str, address: str
                 ) -> coordinator_pb2.RegisterRequest:
    """Registration with the declared schema and model fingerprint (nothing about the data
    beyond its schema: no sample count, no statistic)."""
    shape, classes = prepared.schema()
    return coordinator_pb2.RegisterRequest(
        name=name, address=address, input_shape=shape, classes=classes,
        model_fingerprint=prepared.task.fingerprint())


async def register(stub: coordinator_pb2_grpc.CoordinatorStub, prepared: Prepared, *,
                   options: AgentOptions, address: str) -> records.Assignment:
    """Register and wait for the assignment (the coordinator answers once all registered, or
    refuses with a reason when the run is cancelled)."""
    request = registration(prepared, name=options.name, address=address)
    reply = await _ask(lambda timeout: stub.Register(request, timeout=timeout), options=options,
                       seconds=options.register_timeout, flag="--register-timeout",
                       waiting=f"the other agents to register at {options.coordinator}")
    assignment = records.assignment_from_proto(reply)  # type: ignore[arg-type]
    if assignment.name != options.name:
        raise AgentFailure(f"coordinator assigned name {assignment.name!r} to {options.name}")
    return assignment


async def report_failure(stub: coordinator_pb2_grpc.CoordinatorStub, *, options: AgentOptions,
                         address: str, exc: BaseException) -> None:
    """Tell the coordinator this agent cannot take part, so it cancels the run and nobody waits
    for us; bounded by FAILURE_REPORT_SECONDS, and any error here is only logged."""
    request = coordinator_pb2.RegisterRequest(name=options.name, address=address,
                                              failure=failure_category(exc))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FAILURE_REPORT_SECONDS
    try:
        await call_with_retry(lambda: stub.Register(request, timeout=FAILURE_REPORT_SECONDS),
                              deadline=deadline, what=f"coordinator {options.coordinator}")
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.FAILED_PRECONDITION:  # the expected "cancelled"
            log.warning("%s could not report its failure: %s", options.name, err.details())
    except TimeoutError as err:
        log.warning("%s could not report its failure: %s", options.name, err)


async def bootstrap(channel: grpc.aio.Channel, *, options: AgentOptions, address: str,
                    on_parameters: Callable[[RunConfig], None] | None = None,
                    ) -> tuple[Prepared, records.Assignment]:
    """Parameters, preparation (off the event loop), registration: the fresh start.

    on_parameters(config) is called as soon as the run parameters arrive, to start work that
    needs nothing else (the node's Paillier key pair) while this agent prepares and waits."""
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    config = await fetch_parameters(stub, options=options)
    if on_parameters is not None:
        on_parameters(config)
    try:
        prepared = await asyncio.to_thread(prepare, config, options)
    except (ValueError, TypeError, OSError) as exc:
        await report_failure(stub, options=options, address=address, exc=exc)
        raise
    return prepared, await register(stub, prepared, options=options, address=address)


async def join_run(channel: grpc.aio.Channel, *, options: AgentOptions, address: str
                   ) -> tuple[Prepared, records.Assignment]:
    """A party of a seat the run left empty (`efpsn agent --join`): the run's parameters, this
    agent's data and model prepared and checked, then the join asked for (Coordinator.Join):
    its assignment at the round it takes part from. AgentFailure, one line with the
    coordinator's reason, when the run does not take it."""
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    config = await fetch_parameters(stub, options=options)
    if not config.late:
        raise AgentFailure(f"{options.name}: run at {options.coordinator} has no seat that "
                           "joins later (--late-seats): register without --join")
    prepared = await asyncio.to_thread(prepare, config, options)
    request = registration(prepared, name=options.name, address=address)
    reply = await _ask(lambda timeout: stub.Join(request, timeout=timeout), options=options,
                       seconds=options.connect_timeout, flag="--connect-timeout",
                       waiting=f"the coordinator at {options.coordinator} to take the join")
    assignment = records.assignment_from_proto(reply)  # type: ignore[arg-type]
    if assignment.name != options.name or not assignment.join_round:
        raise AgentFailure(f"the coordinator answered {options.name}'s join with "
                           f"{assignment.name!r}'s assignment (join round "
                           f"{assignment.join_round})")
    log.warning("%s joins run %s at round %d (neighbours %s)", options.name,
                assignment.run_id, assignment.join_round,
                ", ".join(p.name for p in assignment.neighbours))
    return prepared, assignment
