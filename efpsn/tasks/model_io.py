"""A trained model on disk: its state dict with parameter names, as safetensors (no pickle).

model.safetensors holds `{parameter name: float64 tensor}`, the names of the run's task model
(efpsn.tasks.LogisticRegression: linear.weight, linear.bias), and in its header the public facts
needed to use it again (format and version, task, per-sample input shape, classes, the public
scale divisor's spec, the l2 weight, and the parameters' names and shapes in model order; with
scale "standard", the network's column means and standard deviations the run standardised with,
which SavedModel.inputs applies to raw features, an empty cell taking the mean; for a .csv
table, its table schema: the class names and how a row becomes inputs). It
loads with `safetensors.torch.load_file(path)` into any module with `load_state_dict`; the
format is raw tensor bytes plus a JSON header, so reading it never runs code from the file. It
is written atomically, readable by its owner only (like model.npy: a model trained on private
data).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn

from efpsn.params.schema import Scale, TaskSpec, parse_shape
from efpsn.params.table import TableSchema
from efpsn.tasks.catalog import make_task
from efpsn.tasks.objective import Task

__all__ = ["FORMAT", "FORMAT_VERSION", "MODEL_FILE", "ModelMetadata", "SavedModel",
           "load_into", "read_model", "save_model", "state_dict_of", "task_for", "vector_of"]

FORMAT = "efpsn-model"
FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
_HEADER_KEY = "efpsn"  # the safetensors header entry holding the metadata (JSON)
_FIELDS = ("format", "format_version", "task", "input_shape", "classes", "scale", "l2",
           "parameters")
_OPTIONAL = ("standardisation",  # {"mean": [...], "std": [...]}: only with scale "standard"
             "table")  # a .csv table's schema (efpsn/params/table.py): class names, categories


@dataclass(frozen=True, kw_only=True)
class ModelMetadata:
    """What a saved model is and how its inputs are scaled (all public; in the file's header)."""

    task: TaskSpec  # its text (model.json, tests) is parsed here, once
    input_shape: str
    classes: int
    scale: Scale
    l2: float
    parameters: tuple[tuple[str, tuple[int, ...]], ...]
    format_version: int = FORMAT_VERSION
    # scale "standard": per feature (global mean, global standard deviation) of the run
    standardisation: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    table: TableSchema = field(default_factory=TableSchema)  # a .csv's encoding, class names

    def __post_init__(self) -> None:
        object.__setattr__(self, "task", TaskSpec.of(self.task))
        object.__setattr__(self, "scale", Scale.of(self.scale))
        object.__setattr__(self, "table", TableSchema.of(self.table))
        features = math.prod(parse_shape(self.input_shape))
        self.scale.divisor(features=features)
        if self.scale.standard != (self.standardisation is not None):
            raise ValueError("scale standard comes with the run's standardisation (mean and "
                             "std per feature), and only it")
        if self.standardisation is not None:
            mean, std = self.standardisation
            if len(mean) != features or len(std) != features or not all(
                    math.isfinite(m) for m in mean) or not all(
                    math.isfinite(s) and s > 0 for s in std):
                raise ValueError(f"standardisation must give {features} finite means and "
                                 f"{features} positive standard deviations")
        least = 1 if self.task.regression else 2
        if isinstance(self.classes, bool) or not isinstance(self.classes, int) \
                or self.classes < least:
            raise ValueError(f"classes must be an integer >= {least}, got {self.classes!r}")
        if self.table.given and self.table.features != features:
            raise ValueError(f"the table schema gives {self.table.features} features, the "
                             f"input shape {features}")
        if not (isinstance(self.l2, int | float) and math.isfinite(self.l2) and self.l2 >= 0):
            raise ValueError(f"l2 must be a finite number >= 0, got {self.l2!r}")
        if self.format_version != FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version!r} is not supported; "
                             f"expected {FORMAT_VERSION} (a newer efpsn wrote it?)")

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes by name (a table's label column of names), else ()."""
        return self.table.class_names

    @classmethod
    def of(cls, task: Task, *, scale: Scale | str,
           standardisation: tuple[np.ndarray, np.ndarray] | None = None,
           table: TableSchema | None = None) -> ModelMetadata:
        """The metadata of `task`'s model, whose inputs were divided by `scale` (standard:
        standardised with `standardisation`, the run's (mean, std) per feature), from rows
        encoded by `table` (a .csv table's schema)."""
        pair = None if standardisation is None else (
            tuple(float(v) for v in standardisation[0]),
            tuple(float(v) for v in standardisation[1]))
        return cls(task=task.spec or task.name, input_shape="x".join(map(str, task.shape)),
                   classes=task.classes, scale=scale, l2=task.l2,
                   parameters=tuple((name, tuple(t.shape))
                                    for name, t in task.unflatten(_zeros(task)).items()),
                   standardisation=pair, table=table or TableSchema())

    def inputs(self, features: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Raw features (samples first) as the model takes them: divided by the public scale,
        or standardised with the run's statistics; float64 of shape (n, *input_shape)."""
        shape = parse_shape(self.input_shape)
        x = torch.as_tensor(np.asarray(features, dtype=np.float64)).reshape(-1, math.prod(shape))
        if self.standardisation is not None:  # an empty cell (NaN) is the mean: 0 after
            mean, std = (torch.tensor(v, dtype=torch.float64) for v in self.standardisation)
            x = (torch.where(torch.isnan(x), mean, x) - mean) / std
        else:
            div = torch.as_tensor(np.asarray(self.scale.divisor(features=x.shape[1]),
                                             dtype=np.float64))
            x = x / div
        return x.reshape(-1, *shape)

    def to_json(self) -> dict[str, Any]:
        out = {"format": FORMAT, "format_version": self.format_version, "task": str(self.task),
               "input_shape": self.input_shape, "classes": self.classes, "scale": str(self.scale),
               "l2": self.l2, "parameters": [[n, list(s)] for n, s in self.parameters]}
        if self.standardisation is not None:
            out["standardisation"] = {"mean": list(self.standardisation[0]),
                                      "std": list(self.standardisation[1])}
        if self.table.given:
            out["table"] = self.table.to_json()
        return out

    @classmethod
    def from_json(cls, values: Any) -> ModelMetadata:
        """Parse the header's metadata; ValueError/TypeError name the field that is wrong."""
        if not isinstance(values, dict):
            raise TypeError(f"expected a JSON object, got {type(values).__name__}")
        unknown = sorted(set(values) - set(_FIELDS) - set(_OPTIONAL))
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
        pair = values.get("standardisation")
        if pair is not None:
            try:
                pair = (tuple(float(v) for v in pair["mean"]),
                        tuple(float(v) for v in pair["std"]))
            except (TypeError, KeyError, ValueError):
                raise ValueError("standardisation must be {\"mean\": [...], \"std\": [...]}") \
                    from None
        return cls(task=values["task"], input_shape=values["input_shape"],
                   classes=values["classes"], scale=values["scale"], l2=values["l2"],
                   parameters=parameters, format_version=values["format_version"],
                   standardisation=pair, table=TableSchema.from_json(values.get("table")))


@dataclass(frozen=True, eq=False)
class SavedModel:
    """A model read back: its named float64 tensors and its metadata."""

    state: dict[str, torch.Tensor]
    metadata: ModelMetadata

    def inputs(self, features: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Raw features prepared as the run prepared its own (ModelMetadata.inputs)."""
        return self.metadata.inputs(features)


def _zeros(task: Task) -> torch.Tensor:
    return torch.zeros(task.num_params, dtype=torch.float64)


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


def save_model(path: str | Path, *, task: Task, x: torch.Tensor, scale: Scale | str,
               standardisation: tuple[np.ndarray, np.ndarray] | None = None,
               table: TableSchema | None = None, mode: int = 0o600) -> Path:
    """Write `x` as a named state dict to `path` (e.g. RESULTS/agent1/model.safetensors), the
    metadata in its header; returns `path`. `scale` is the run's public scale spec (none, unit,
    div:C or standard, with `standardisation` the run's (mean, std) per feature); `table` the
    run's table schema (how a .csv's rows become inputs; the class names)."""
    from safetensors.torch import save as to_safetensors

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = json.dumps(ModelMetadata.of(task, scale=scale, standardisation=standardisation,
                                         table=table).to_json())
    data = to_safetensors(state_dict_of(task, x), metadata={_HEADER_KEY: header})
    _write_private(path, lambda fh: fh.write(data), mode=mode)
    return path


def read_model(path: str | Path) -> SavedModel:
    """A model written by save_model: the state dict, in model order, and the metadata of its
    header, checked against each other."""
    from safetensors import SafetensorError
    from safetensors.torch import load as from_safetensors

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file; expected a {MODEL_FILE} written by efpsn")
    data = path.read_bytes()
    try:
        state = from_safetensors(data)
        header = _safetensors_metadata(data)
    except (SafetensorError, ValueError, OSError) as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None
    if _HEADER_KEY not in header:
        raise ValueError(f"{path}: no efpsn metadata in its header; expected a {MODEL_FILE} "
                         "written by efpsn")
    try:
        metadata = ModelMetadata.from_json(json.loads(header[_HEADER_KEY]))
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not usable model metadata: {exc}") from None
    names = [name for name, _ in metadata.parameters]
    if sorted(state) != sorted(names):
        raise ValueError(f"{path}: its tensors {sorted(state)} disagree with the metadata's "
                         f"parameters {names}")
    ordered = {name: state[name] for name in names}  # safetensors stores them sorted by name
    shapes = tuple((name, tuple(t.shape)) for name, t in ordered.items())
    if shapes != metadata.parameters:
        raise ValueError(f"{path}: its tensors {list(shapes)} disagree with the metadata's "
                         f"parameters {list(metadata.parameters)}")
    return SavedModel(state=ordered, metadata=metadata)


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The string metadata of a safetensors file's JSON header (8-byte little-endian length,
    then the header)."""
    if len(data) < 8:
        raise ValueError("too short for a safetensors header")
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        raise ValueError("header length beyond the file")
    header = json.loads(data[8:8 + size])
    metadata = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    return {str(k): str(v) for k, v in metadata.items()}


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
