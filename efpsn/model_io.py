"""A trained model on disk: a PyTorch state dict with parameter names (model.pt) and its public metadata (model.json).

model.pt holds `{parameter name: float64 tensor}` in `model.parameters()` order, the names of
the run's task model (efpsn.tasks.LogisticRegression: linear.weight, linear.bias). It loads with
`torch.load(path, weights_only=True)`, which reads tensors, dicts and strings and never runs
code from the file. model.json, next to it, holds the public facts needed to use it again:
format and version, task, per-sample input shape, classes, the public scale divisor's spec, the
l2 weight and the parameter names and shapes. Both are written atomically, readable by their
owner only (like model.npy: a model trained on private data).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn

from efpsn.config import check_task_spec, parse_shape, scale_divisor
from efpsn.tasks import Task, make_task

__all__ = ["FORMAT", "FORMAT_VERSION", "MODEL_FILE", "ModelMetadata", "SavedModel",
           "load_into", "metadata_path", "read_model", "save_model", "state_dict_of",
           "task_for", "vector_of"]

FORMAT = "efpsn-model"
FORMAT_VERSION = 1
MODEL_FILE = "model.pt"
_FIELDS = ("format", "format_version", "task", "input_shape", "classes", "scale", "l2",
           "parameters")


@dataclass(frozen=True, kw_only=True)
class ModelMetadata:
    """model.json: what a saved model is and how its inputs are scaled (all public)."""

    task: str
    input_shape: str
    classes: int
    scale: str
    l2: float
    parameters: tuple[tuple[str, tuple[int, ...]], ...]
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        check_task_spec(self.task)
        parse_shape(self.input_shape)
        scale_divisor(self.scale)
        if isinstance(self.classes, bool) or not isinstance(self.classes, int) \
                or self.classes < 2:
            raise ValueError(f"classes must be an integer >= 2, got {self.classes!r}")
        if not (isinstance(self.l2, int | float) and math.isfinite(self.l2) and self.l2 >= 0):
            raise ValueError(f"l2 must be a finite number >= 0, got {self.l2!r}")
        if self.format_version != FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version!r} is not supported; "
                             f"expected {FORMAT_VERSION} (a newer efpsn wrote it?)")

    @classmethod
    def of(cls, task: Task, *, scale: str) -> ModelMetadata:
        """The metadata of `task`'s model, whose inputs were divided by `scale`."""
        return cls(task=task.name, input_shape="x".join(map(str, task.shape)),
                   classes=task.classes, scale=scale, l2=task.l2,
                   parameters=tuple((name, tuple(t.shape))
                                    for name, t in task.unflatten(_zeros(task)).items()))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": self.format_version, "task": self.task,
                "input_shape": self.input_shape, "classes": self.classes, "scale": self.scale,
                "l2": self.l2, "parameters": [[n, list(s)] for n, s in self.parameters]}

    @classmethod
    def from_json(cls, values: Any) -> ModelMetadata:
        """Parse model.json's object; ValueError/TypeError name the field that is wrong."""
        if not isinstance(values, dict):
            raise TypeError(f"expected a JSON object, got {type(values).__name__}")
        unknown = sorted(set(values) - set(_FIELDS))
        missing = [k for k in _FIELDS if k not in values]
        if unknown or missing:
            raise ValueError(f"expected exactly the fields {list(_FIELDS)}; unknown {unknown}, "
                             f"missing {missing}")
        if values["format"] != FORMAT:
            raise ValueError(f"format must be {FORMAT!r}, got {values['format']!r}")
        try:
            parameters = tuple((str(n), tuple(int(d) for d in s))
                               for n, s in values["parameters"])
        except (TypeError, ValueError):
            raise ValueError("parameters must be a list of [name, [dims...]] pairs") from None
        return cls(task=values["task"], input_shape=values["input_shape"],
                   classes=values["classes"], scale=values["scale"], l2=values["l2"],
                   parameters=parameters, format_version=values["format_version"])


@dataclass(frozen=True, eq=False)
class SavedModel:
    """A model read back: its named float64 tensors and its metadata."""

    state: dict[str, torch.Tensor]
    metadata: ModelMetadata


def _zeros(task: Task) -> torch.Tensor:
    return torch.zeros(task.num_params, dtype=torch.float64)


def metadata_path(model_path: str | Path) -> Path:
    """model.json for model.pt (the same stem, next to it)."""
    return Path(model_path).with_suffix(".json")


def state_dict_of(task: Task, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The flat float64 vector `x` as `{parameter name: tensor}` (contiguous copies, in
    model.parameters() order): what the task's model's load_state_dict takes."""
    return {name: view.detach().clone().contiguous() for name, view in task.unflatten(x).items()}


def vector_of(task: Task, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The flat float64 vector of a state dict with exactly `task`'s parameter names and
    shapes; ValueError names the first that differs."""
    wanted = task.unflatten(_zeros(task))
    if list(state) != list(wanted):
        raise ValueError(f"the state's parameters {list(state)} are not the model's "
                         f"{list(wanted)} (task {task.name})")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(wanted[name].shape):
            raise ValueError(f"parameter {name!r} has shape {tuple(tensor.shape)}, the model "
                             f"of task {task.name} needs {tuple(wanted[name].shape)}")
    return torch.cat([t.detach().to(torch.float64).reshape(-1) for t in state.values()])


def _write_private(path: Path, write: Callable[[IO[bytes]], None], *, mode: int) -> None:
    """Write atomically (a temporary file, then rename); the file never exists with wider
    rights than `mode`."""
    tmp = path.with_name(path.name + ".part")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as fh:
        write(fh)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def save_model(path: str | Path, *, task: Task, x: torch.Tensor, scale: str,
               mode: int = 0o600) -> Path:
    """Write `x` as a state dict to `path` (e.g. RESULTS/agent1/model.pt) and its metadata
    to metadata_path(path); returns the metadata's path. `scale` is the run's public scale
    spec (none, unit or div:C)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = state_dict_of(task, x)
    text = json.dumps(ModelMetadata.of(task, scale=scale).to_json(), indent=2) + "\n"
    _write_private(path, lambda fh: torch.save(state, fh), mode=mode)
    meta = metadata_path(path)
    _write_private(meta, lambda fh: fh.write(text.encode()), mode=mode)
    return meta


def read_model(path: str | Path) -> SavedModel:
    """A model written by save_model: the state dict (torch.load with weights_only=True) and
    the metadata next to it, checked against each other."""
    path = Path(path)
    meta = metadata_path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file; expected a model.pt written by efpsn")
    if not meta.is_file():
        raise ValueError(f"{path}: no {meta.name} next to it; expected the metadata efpsn "
                         "writes with every model.pt")
    try:
        metadata = ModelMetadata.from_json(json.loads(meta.read_text()))
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{meta}: not usable model metadata: {exc}") from None
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise ValueError(f"{path}: not a readable state dict ({type(exc).__name__}); "
                         "expected a model.pt written by efpsn") from None
    if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ValueError(f"{path}: expected a state dict {{parameter name: tensor}}")
    shapes = tuple((name, tuple(t.shape)) for name, t in state.items())
    if shapes != metadata.parameters:
        raise ValueError(f"{path}: its tensors {list(shapes)} disagree with {meta.name}'s "
                         f"parameters {list(metadata.parameters)}")
    return SavedModel(state=dict(state), metadata=metadata)


def task_for(metadata: ModelMetadata, *, task: str | None = None) -> Task:
    """The task that evaluates a saved model: metadata.task, or `task` given instead (the
    same parameter names and shapes are checked by vector_of)."""
    return make_task(task or metadata.task, l2=metadata.l2,
                     shape=parse_shape(metadata.input_shape), classes=metadata.classes)


def load_into(module: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """Copy a saved state into `module`: by name when the names match, else by order (the
    parameters must then have the same shapes in the same order); returns `module`."""
    own = dict(module.named_parameters())
    if list(own) == list(state):
        module.load_state_dict(dict(state), strict=False)
        return module
    if [tuple(p.shape) for p in own.values()] != [tuple(t.shape) for t in state.values()]:
        raise ValueError(f"the module's parameters {[(n, tuple(p.shape)) for n, p in own.items()]}"
                         f" do not match the saved {[(n, tuple(t.shape)) for n, t in state.items()]}"
                         " by name, nor by order and shape")
    with torch.no_grad():
        for param, tensor in zip(own.values(), state.values(), strict=True):
            param.copy_(tensor)
    return module
