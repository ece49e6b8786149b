"""Before phase I: fetch the public run parameters, load and check this agent's own data and
model, then register declaring the data schema and model fingerprint (or the failure)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from agent.options import AgentFailure, AgentOptions
from efpsn.config import LOCAL_DATA, RunConfig, parse_shape, scale_divisor
from efpsn.problem import Problem, build_problem, build_task
from efpsn.tasks import Task
from efpsn.tasks.local import DataError, LocalData, load_local_data
from efpsn.wire import serde
from efpsn.wire.net import call_with_retry
from efpsn.wire.v1 import coordinator_pb2, coordinator_pb2_grpc

if TYPE_CHECKING:
    from agent.peers import Peers

log = logging.getLogger("efpsn.agent")

FAILURE_REPORT_SECONDS = 10.0  # how long a failing agent tries to tell the coordinator


@dataclass(frozen=True, eq=False)
class Prepared:
    """This agent's model and data for a run, checked before it registers.

    Agent-local data: `local` (never leaves this process). Shards by index (the paper's mode):
    the whole public `problem`, built from the run parameters."""

    config: RunConfig
    task: Task
    local: LocalData | None = None
    problem: Problem | None = None

    def build(self, index: int) -> Problem:
        """The problem as agent `index` sees it (its own shard only, for local data)."""
        if self.problem is not None:
            return self.problem
        assert self.local is not None
        return build_problem(self.config, local={index: self.local}, task=self.task)

    def request(self, *, name: str, address: str) -> coordinator_pb2.RegisterRequest:
        """Registration with the declared schema and model fingerprint (nothing about the
        data beyond its schema: no sample count, no statistic)."""
        return coordinator_pb2.RegisterRequest(
            name=name, address=address, input_shape="x".join(map(str, self.task.shape)),
            classes=self.task.classes, model_fingerprint=self.task.fingerprint(),
        )


def prepare(config: RunConfig, options: AgentOptions) -> Prepared:
    """Build the model and load the data; DataError/ValueError name the agent and what is wrong."""
    who = options.name
    local_mode = config.data == LOCAL_DATA
    if local_mode and options.data is None:
        raise ValueError(f"{who}: the run's data is local (each agent brings its own): give "
                         "--data PATH (.npz with X and y, .csv with a header, or an IDX folder)")
    if not local_mode and options.data is not None:
        raise ValueError(f"{who}: --data {options.data} given, but the run cuts the public data "
                         f"set {config.data!r} into shards by index; run the coordinator with "
                         "--data local to use the agents' own data")
    try:
        task = build_task(config)
    except (ValueError, TypeError, ImportError) as exc:
        raise ValueError(f"{who}: cannot build the model of task {config.task!r}: {exc}") from None
    if not local_mode:
        return Prepared(config=config, task=task, problem=build_problem(config, task=task))
    assert options.data is not None
    local = load_local_data(
        options.data, who=who, shape=parse_shape(config.input_shape), classes=config.classes,
        divisor=scale_divisor(config.scale), seed=config.seed, holdout=options.holdout,
        batch_size=config.batch_size, test_path=options.test_data,
        label_column=options.label_column,
    )
    build_problem(config, local={}, task=task)  # the public part's own checks
    return Prepared(config=config, task=task, local=local)


def failure_category(exc: BaseException) -> str:
    """What the other agents learn about a failure: a category, never the data's contents."""
    if isinstance(exc, DataError):
        return "its local data cannot be used"
    return "its data or model could not be prepared"


async def fetch_parameters(stub: coordinator_pb2_grpc.CoordinatorStub, *, options: AgentOptions,
                           deadline: float) -> RunConfig:
    """The run's public parameters, retried until the coordinator answers or `deadline`."""
    loop = asyncio.get_running_loop()
    try:
        reply = await call_with_retry(
            lambda: stub.GetRunParameters(coordinator_pb2.RunParametersRequest(),
                                          timeout=max(0.1, deadline - loop.time())),
            deadline=deadline, what=f"coordinator {options.coordinator}",
        )
    except grpc.aio.AioRpcError as exc:
        raise AgentFailure(f"coordinator {options.coordinator} refused {options.name}: "
                           f"{exc.code().name}: {exc.details()}") from None
    return RunConfig.from_dict(serde.run_parameters_from_proto(reply))


async def register(stub: coordinator_pb2_grpc.CoordinatorStub,
                   request: coordinator_pb2.RegisterRequest, *, options: AgentOptions,
                   deadline: float) -> serde.Assignment:
    """Register and wait for the assignment (the coordinator answers once all registered, or
    refuses with a reason when the run is cancelled)."""
    loop = asyncio.get_running_loop()
    try:
        reply = await call_with_retry(
            lambda: stub.Register(request, timeout=max(0.1, deadline - loop.time())),
            deadline=deadline, what=f"coordinator {options.coordinator}",
        )
    except grpc.aio.AioRpcError as exc:
        raise AgentFailure(f"coordinator {options.coordinator} refused {options.name}: "
                           f"{exc.code().name}: {exc.details()}") from None
    assignment = serde.assignment_from_proto(reply)
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


async def bootstrap(peers: Peers, *, options: AgentOptions, address: str,
                    on_parameters: Callable[[RunConfig], None] | None = None,
                    ) -> tuple[Prepared, serde.Assignment]:
    """Parameters, preparation (off the event loop), registration: the fresh start.

    on_parameters(config) is called as soon as the run parameters arrive, to start work that
    needs nothing else (the node's Paillier key pair) while this agent prepares and waits."""
    loop = asyncio.get_running_loop()
    channel = peers.open(options.coordinator, options.coordinator_name)
    peers.keep("coordinator", channel)
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    deadline = loop.time() + options.register_timeout
    config = await fetch_parameters(stub, options=options, deadline=deadline)
    if on_parameters is not None:
        on_parameters(config)
    try:
        prepared = await asyncio.to_thread(prepare, config, options)
    except (ValueError, TypeError, OSError) as exc:
        await report_failure(stub, options=options, address=address, exc=exc)
        raise
    request = prepared.request(name=options.name, address=address)
    return prepared, await register(stub, request, options=options, deadline=deadline)
