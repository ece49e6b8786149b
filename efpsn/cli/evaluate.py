"""`efpsn evaluate --model FILE --data FILE`: a saved model's accuracy and loss on a data file.

Building the parser imports nothing heavy (torch is imported when the command runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from efpsn.params.schema import Scale, parse_shape

if TYPE_CHECKING:
    import torch

    from efpsn.tasks.objective import Task

__all__ = ["Evaluation", "evaluate_model", "register"]

WHO = "efpsn evaluate"
EPILOG = """\
examples:
  efpsn evaluate --model results/run-X/agent1/model.safetensors --data D/test.npz
  efpsn evaluate --model results/run-X/agent1/model.safetensors --data D/agent1
  efpsn evaluate --model results/run-X/agent1/model.safetensors --data mine.csv --label-column y
  efpsn evaluate --model results/run-X/agent1/model.npy --data D/test.npz  (reads result.json)
"""


@dataclass(frozen=True)
class Evaluation:
    """A model's accuracy and loss on one data file (what `efpsn evaluate` prints)."""

    accuracy: float
    loss: float
    samples: int
    task: str
    l2: float

    def __str__(self) -> str:
        return (f"accuracy {self.accuracy:.4f}, loss {self.loss:.4f} on {self.samples} samples "
                f"(task {self.task}; loss = mean loss + (l2/2)||x||^2 with l2 = {self.l2:g}, "
                "as the run reports it)")


def _flat_model(path: Path, *, task: str | None, scale: str | None, input_shape: str | None,
                classes: int | None) -> tuple[Task, torch.Tensor, str]:
    """A model.npy (flat float64 vector) with the run's settings from result.json beside it,
    or from the flags."""
    settings: dict = {}
    beside = path.with_name("result.json")
    if beside.is_file():
        settings = json.loads(beside.read_text()).get("settings", {})
    chosen = {"task": task or settings.get("task"), "scale": scale or settings.get("scale"),
              "input_shape": input_shape or settings.get("input_shape"),
              "classes": classes or settings.get("classes")}
    missing = [f"--{k.replace('_', '-')}" for k, v in chosen.items() if v is None]
    if missing:
        raise ValueError(f"{path}: a flat model.npy without result.json beside it needs "
                         f"{', '.join(missing)}")
    l2 = settings.get("l2", -1.0)
    import numpy as np
    import torch

    from efpsn.tasks.catalog import make_task

    built = make_task(chosen["task"], l2=None if l2 < 0 else l2,
                      shape=parse_shape(chosen["input_shape"]), classes=int(chosen["classes"]))
    x = torch.from_numpy(np.load(path, allow_pickle=False).astype(np.float64))
    if x.shape != (built.num_params,):
        raise ValueError(f"{path}: holds {tuple(x.shape)} values, task {built.name} for "
                         f"{chosen['input_shape']} inputs and {chosen['classes']} classes has "
                         f"{built.num_params} parameters")
    return built, x, chosen["scale"]


def evaluate_model(model: str | Path, data: str | Path, *, task: str | None = None,
                   label_column: str = "label", scale: str | None = None,
                   input_shape: str | None = None, classes: int | None = None) -> Evaluation:
    """Accuracy and loss of a saved model (model.safetensors with its metadata, or model.npy with
    result.json or the schema given) on `data` (.npz, .csv or IDX folder), its features
    divided by the model's public scale (or `scale`), checked as an agent checks its data."""
    from efpsn.data.local import check_arrays, read_data
    from efpsn.tasks.model_io import read_model, task_for, vector_of

    model = Path(model)
    if model.suffix == ".npy":
        built, x, scale = _flat_model(model, task=task, scale=scale, input_shape=input_shape,
                                      classes=classes)
    else:
        saved = read_model(model)
        meta = saved.metadata
        if input_shape is not None or classes is not None:
            raise ValueError("--input-shape and --classes are for a flat model.npy; a "
                             "model.safetensors has them in its header")
        built = task_for(meta, task=task)
        x = vector_of(built, saved.state)
        if scale is None and meta.standardisation is not None:  # the run's own statistics
            data = Path(data)
            raw = read_data(data, who=WHO, label_column=label_column, classes=built.classes)
            dataset = check_arrays(raw.features, raw.labels, path=data, who=WHO,
                                   shape=built.shape, classes=built.classes, divisor=1.0,
                                   cells=raw.cells)
            dataset = dataclasses.replace(dataset, images=meta.inputs(dataset.images))
            return Evaluation(accuracy=built.accuracy(x, dataset),
                              loss=built.loss(x, dataset.images, dataset.labels),
                              samples=len(dataset), task=built.name, l2=built.l2)
        scale = scale or meta.scale
    data = Path(data)
    raw = read_data(data, who=WHO, label_column=label_column, classes=built.classes)
    dataset = check_arrays(raw.features, raw.labels, path=data, who=WHO, shape=built.shape,
                           classes=built.classes, divisor=Scale.of(scale).divisor(features=math.prod(built.shape)),
                           cells=raw.cells)
    return Evaluation(accuracy=built.accuracy(x, dataset),
                      loss=built.loss(x, dataset.images, dataset.labels),
                      samples=len(dataset), task=built.name, l2=built.l2)


def _handler(args: argparse.Namespace) -> int:
    print(evaluate_model(args.model, args.data, task=args.task, label_column=args.label_column,
                         scale=args.scale, input_shape=args.input_shape, classes=args.classes))
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `efpsn evaluate` to the `efpsn` parser's subcommands; returns its parser."""
    parser = subparsers.add_parser(
        "evaluate", help="accuracy and loss of a saved model on a data file",
        description="Print a trained model's accuracy and loss on a data file. The features "
                    "are divided by the model's public scale (from its header) and checked "
                    "as an agent checks its own data.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="FILE",
                        help="model.safetensors (as efpsn writes it), or a flat model.npy (with "
                             "result.json beside it, or --task/--input-shape/--classes/--scale)")
    parser.add_argument("--data", required=True, metavar="FILE",
                        help=".npz with X and y, .csv with a header row, a folder of IDX "
                             "files, or a data folder's agentK (its train file) or the data "
                             "folder itself (its public test file)")
    parser.add_argument("--task", default=None,
                        help="evaluate with this task instead of the saved one (same parameter "
                             "names and shapes), e.g. python:MODULE:FACTORY")
    parser.add_argument("--label-column", default="label", help="label column of a .csv")
    parser.add_argument("--scale", default=None,
                        help="divide features by this public constant instead of the saved "
                             "one: none, unit (/255) or div:C")
    parser.add_argument("--input-shape", default=None, help="for a flat model.npy only")
    parser.add_argument("--classes", type=int, default=None, help="for a flat model.npy only")
    parser.set_defaults(handler=_handler)
    return parser
