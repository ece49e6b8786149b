"""Before registering: this agent's model built and its own data loaded and checked against the
run's public parameters, so that a bad file stops the run before phase I."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agent.options import AgentOptions
from efpsn.data.local import DataError, LocalData, load_local_data
from efpsn.params.checks import LOCAL_DATA
from efpsn.params.config import RunConfig
from efpsn.params.schema import parse_shape
from efpsn.problem import Problem, build_problem, build_task
from efpsn.tasks.objective import Task

__all__ = ["Prepared", "failure_category", "prepare"]


@dataclass(frozen=True, eq=False)
class Prepared:
    """This agent's model and data for a run, checked before it registers, and the problem
    built once from them: with agent-local data its public part (graph, basis, model), to which
    the assignment adds this agent's own shard; shards by index: the whole public problem."""

    config: RunConfig
    task: Task
    problem: Problem
    local: LocalData | None = None

    def problem_for(self, index: int) -> Problem:
        """The problem as agent `index` sees it (its own shard only, for local data)."""
        if self.local is None:
            return self.problem
        n = self.config.agents
        return dataclasses.replace(
            self.problem,
            shards=[self.local.train if i == index else None for i in range(n)],
            holdouts=[self.local.holdout if i == index else None for i in range(n)],
            test=self.local.test)

    def schema(self) -> tuple[str, int]:
        """What this agent declares at registration besides its model's fingerprint: the input
        shape per sample and the number of classes (never a count or a statistic)."""
        return "x".join(map(str, self.task.shape)), self.task.classes


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
    standard = config.scale.standard
    if standard and not local_mode:
        raise ValueError(f"{who}: scale standard needs agent-local data (run the coordinator "
                         "with --data local)")
    if standard:
        from efpsn.stats.standardise import check_standardisable

        try:
            check_standardisable(config)
        except ValueError as exc:
            raise ValueError(f"{who}: {exc}") from None
    try:
        task = build_task(config)
    except (ValueError, TypeError, ImportError) as exc:
        reason = str(exc).removeprefix(f"task {str(config.task)!r}: ")  # the task named once
        raise ValueError(f"{who}: cannot build the model of task {str(config.task)!r}: "
                         f"{reason}") from None
    if not local_mode:
        return Prepared(config=config, task=task, problem=build_problem(config, task=task))
    assert options.data is not None
    table = config.table  # a .csv's public encoding, the same at every agent (or none)
    if table.given and options.label_column not in (None, table.label_column):
        raise ValueError(f"{who}: --label-column {options.label_column} disagrees with the "
                         f"run's table schema, whose label column is {table.label_column!r}: "
                         "drop --label-column")
    local = load_local_data(
        options.data, who=who, shape=parse_shape(config.input_shape), classes=config.classes,
        divisor=config.divisor, seed=config.seed, holdout=options.holdout,
        batch_size=config.batch.wire(), test_path=options.test_data,
        label_column=table.label_column or options.label_column or "label", table=table,
        regression=config.task.regression, fills=standard,  # standard: empty cells filled
        moment_bound=None if standard else config.moment_bound,  # standard: checked after
    )
    problem = build_problem(config, local={}, task=task)  # the public part, checked once
    return Prepared(config=config, task=task, problem=problem, local=local)


def failure_category(exc: BaseException) -> str:
    """What the other agents learn about a failure: a category, never the data's contents."""
    if isinstance(exc, DataError):
        return "its local data cannot be used"
    return "its data or model could not be prepared"
