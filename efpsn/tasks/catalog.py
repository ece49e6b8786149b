"""Tasks by name: logreg, ridge, lenet, mlp:H1,H2,... and a user's own model,
python:MODULE:FACTORY."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from efpsn.data.images import IMAGE_SHAPE, NUM_CLASSES
from efpsn.params.model_sizes import DEFAULT_L2
from efpsn.params.schema import TaskSpec
from efpsn.tasks.logreg import LogisticRegressionTask
from efpsn.tasks.models import MLP
from efpsn.tasks.objective import LeNetTask, LossFn, Task
from efpsn.tasks.ridge import RidgeTask

__all__ = ["DataSchema", "MLPTask", "PythonTask", "make_task"]


class DataSchema:
    """The public schema of the data (what a user's FACTORY receives): per-sample input shape
    and number of classes. Never a sample count or a statistic of anyone's data."""

    def __init__(self, *, input_shape: tuple[int, ...], classes: int) -> None:
        self.input_shape = tuple(int(d) for d in input_shape)
        self.classes = int(classes)
        self.features = math.prod(self.input_shape)

    def __repr__(self) -> str:
        return f"DataSchema(input_shape={self.input_shape}, classes={self.classes})"


class MLPTask(Task):
    """A fully connected ReLU network d -> H1 -> ... -> C (autograd gradients; non-convex)."""

    convex = False

    def __init__(self, *, hidden: tuple[int, ...], l2: float = DEFAULT_L2["mlp"],
                 shape: tuple[int, ...] = IMAGE_SHAPE, classes: int = NUM_CLASSES) -> None:
        self.name = "mlp:" + ",".join(map(str, hidden))
        d = math.prod(shape)
        super().__init__(MLP(d, hidden, classes), l2=l2, shape=shape, classes=classes,
                         factory=lambda: MLP(d, hidden, classes))


def _import_factory(spec: str) -> Callable[[DataSchema], Any]:
    module_name, _, factory_name = spec[len("python:"):].rpartition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"task {spec!r}: cannot import module {module_name!r} ({exc}); put it "
                         "on PYTHONPATH at every agent") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise TypeError(f"task {spec!r}: module {module_name!r} has no callable "
                         f"{factory_name!r}; expected FACTORY(schema) -> torch.nn.Module")
    return factory


class PythonTask(Task):
    """A user's model: FACTORY(schema) returns an nn.Module (cross-entropy loss) or a pair
    (module, loss) with loss(logits, labels) -> scalar. Parameters are cast to float64.

    Initial parameters: the factory called again under torch.manual_seed(seed) (inside
    torch.random.fork_rng, so the caller's generator is untouched): the same at every agent
    for the same public seed, torch version and module.
    """

    convex = False

    def __init__(self, spec: str, *, l2: float = DEFAULT_L2["python"],
                 shape: tuple[int, ...] = IMAGE_SHAPE, classes: int = NUM_CLASSES) -> None:
        self.name = spec
        self._spec = spec
        self._schema = DataSchema(input_shape=shape, classes=classes)
        self._user_factory = _import_factory(spec)
        model, loss = self._build()
        self._check_widths(model)
        super().__init__(model, l2=l2, shape=shape, classes=classes,
                         factory=lambda: self._build()[0], loss=loss)

    def _check_widths(self, model: nn.Module) -> None:
        """One forward pass on one sample of the schema's shape (zeros: no one's data): the
        model must take it and give one output per class; else ValueError with the fix."""
        shape, classes = self._schema.input_shape, self._schema.classes
        shown = "x".join(map(str, shape))
        was_training = model.training
        model.eval()  # e.g. BatchNorm takes a batch of one only in eval mode
        try:
            with torch.no_grad():
                out = model(torch.zeros((1, *shape), dtype=torch.float64))
        except Exception as exc:  # noqa: BLE001 -- any error of the user's forward, explained
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ValueError(
                f"task {self._spec!r}: the model does not take the data's samples (shape "
                f"{shown}, {self._schema.features} values): one sample gave "
                f"{type(exc).__name__}: {reason}; expected its first layer to take "
                f"schema.features ({self._schema.features}) or schema.input_shape, from the "
                "schema FACTORY(schema) receives") from None
        finally:
            model.train(was_training)
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        if got != (1, classes):
            gives = (f"{type(out).__name__}" if got is None else
                     f"{got[-1]} outputs per sample" if len(got) == 2 and got[0] == 1 else
                     f"outputs of shape {got} for one sample")
            raise ValueError(
                f"task {self._spec!r}: the model gives {gives}, but the data has {classes} "
                f"classes; expected one output (logit) per class, shape (batch, {classes}): "
                f"build its last layer with schema.classes ({classes}) outputs")

    def _build(self) -> tuple[nn.Module, LossFn | None]:
        made = self._user_factory(self._schema)
        loss = None
        if isinstance(made, tuple) and len(made) == 2:
            made, loss = made
            if not callable(loss):
                raise TypeError(f"task {self._spec!r}: the factory's loss is not callable")
        if not isinstance(made, nn.Module):
            raise TypeError(f"task {self._spec!r}: the factory returned "
                             f"{type(made).__name__}, expected a torch.nn.Module "
                             "(or a pair (module, loss))")
        if not any(True for _ in made.parameters()):
            raise ValueError(f"task {self._spec!r}: the model has no parameters")
        return made.to(torch.float64), loss

    def init_params(self, seed: int) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model, _ = self._build()
        x = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
        self._check_x(x)
        return x


def make_task(name: TaskSpec | str, *, l2: float | None = None,
              shape: tuple[int, ...] = IMAGE_SHAPE, classes: int = NUM_CLASSES) -> Task:
    """The task `name` (a run's TaskSpec, or its text) for data of per-sample `shape` and
    `classes` classes; `l2=None` takes the task family's DEFAULT_L2. logreg and mlp fit any
    schema, ridge any input shape with classes 1, lenet needs 1x28x28."""
    try:
        spec = TaskSpec.of(name)
    except ValueError as exc:
        raise ValueError(f"unknown task: {exc}") from None
    weight = DEFAULT_L2[spec.kind] if l2 is None else l2
    built: Task
    if spec.kind == "logreg":
        built = LogisticRegressionTask(l2=weight, shape=shape, classes=classes)
    elif spec.kind == "ridge":
        built = RidgeTask(l2=weight, shape=shape, classes=classes)
    elif spec.kind == "lenet":
        built = LeNetTask(l2=weight, shape=shape, classes=classes)
    elif spec.kind == "mlp":
        built = MLPTask(hidden=spec.hidden, l2=weight, shape=shape, classes=classes)
    else:
        built = PythonTask(str(spec), l2=weight, shape=shape, classes=classes)
    built.spec = spec
    return built
