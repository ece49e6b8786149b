"""`efpsn evaluate --model FILE --data FILE`: a saved model's accuracy (R^2 for ridge) and loss on
a data file, the run's own scaling and table encoding applied.

Building the parser imports nothing heavy (torch is imported when the command runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
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
  efpsn evaluate --model results/run-X/model.safetensors --data D/test.csv   (the network's model)
  efpsn evaluate --model results/run-X/agent1/model.safetensors --data D/agent1
  efpsn evaluate --model results/run-X/agent1/model.safetensors --data mine.csv --label-column y
  efpsn evaluate --model results/run-X/agent1/model.npy --data D/test.npz  (reads result.json;
      a run with scale standard or a table: use model.safetensors, which holds its scaling)
"""


@dataclass(frozen=True)
class Evaluation:
    """A model's score (accuracy, or R^2 for ridge) and loss on one data file (what `efpsn
    evaluate` prints); with class names, each class's accuracy by name."""

    accuracy: float
    loss: float
    samples: int
    task: str
    l2: float
    score: str = "accuracy"
    by_class: dict[str, float | None] = field(default_factory=dict)

    def __str__(self) -> str:
        classes = ("; by class: " + ", ".join(
            f"{name} {'n/a' if value is None else f'{value:.4f}'}"
            for name, value in self.by_class.items())) if self.by_class else ""
        return (f"{self.score} {self.accuracy:.4f}, loss {self.loss:.4f} on {self.samples} "
                f"samples (task {self.task}; loss = mean loss + (l2/2)||x||^2 with l2 = "
                f"{self.l2:g}, as the run reports it){classes}")


def _flat_model(path: Path, *, task: str | None, scale: str | None, input_shape: str | None,
                classes: int | None) -> tuple[Task, torch.Tensor, str]:
    """A model.npy (flat float64 vector) with the run's settings from result.json beside it,
    or from the flags. A run that standardised its features or encoded a table is refused:
    the flat vector holds neither (its model.safetensors does)."""
    settings: dict = {}
    beside = path.with_name("result.json")
    if beside.is_file():
        settings = json.loads(beside.read_text()).get("settings", {})
    held = [what for what, there in (("scale standard", settings.get("scale") == "standard"),
                                     ("a table schema", bool(settings.get("table"))))
            if there]
    if held and scale is None:
        raise ValueError(f"{path}: a flat model.npy holds neither the run's standardisation nor "
                         f"its table encoding, and this run has {' and '.join(held)}; expected "
                         f"the model that does: --model {path.with_name('model.safetensors')} "
                         "(or the network's, RESULTS/model.safetensors)")
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
                   label_column: str | None = None, scale: str | None = None,
                   input_shape: str | None = None, classes: int | None = None) -> Evaluation:
    """Accuracy (R^2 for ridge) and loss of a saved model (model.safetensors with its metadata,
    or model.npy with result.json or the schema given) on `data` (.npz, .csv or IDX folder),
    read as the run read its own: a .csv by the run's table schema (class names, categories,
    empty cells), features standardised with the run's statistics or divided by its public
    scale (or `scale`), checked as an agent checks its data."""
    from efpsn.data.local import check_arrays, read_data
    from efpsn.tasks.model_io import read_model, task_for, vector_of

    model, data = Path(model), Path(data)
    table = None
    standardised = None
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
        table = meta.table if meta.table.given else None
        if scale is None and meta.standardisation is not None:  # the run's own statistics
            standardised = meta
        scale = scale or meta.scale
    regression = built.label_dtype.is_floating_point
    raw = read_data(data, who=WHO, label_column=label_column or "label",
                    classes=built.classes, table=table, regression=regression)
    divisor = 1.0 if standardised is not None else Scale.of(scale).divisor(
        features=math.prod(built.shape))
    dataset = check_arrays(raw.features, raw.labels, path=data, who=WHO, shape=built.shape,
                           classes=built.classes, divisor=divisor, cells=raw.cells,
                           regression=regression, missing=raw.missing,
                           fills=standardised is not None)
    if standardised is not None:
        dataset = dataclasses.replace(dataset, images=standardised.inputs(dataset.images))
    by_class = {}
    if table is not None and table.class_names:
        from efpsn.launch.summary import per_class_accuracy

        by_class = per_class_accuracy(built, x, dataset, table.class_names)
    return Evaluation(accuracy=built.accuracy(x, dataset),
                      loss=built.loss(x, dataset.images, dataset.labels),
                      samples=len(dataset), task=built.name, l2=built.l2,
                      score=built.score_name, by_class=by_class)


def _handler(args: argparse.Namespace) -> int:
    print(evaluate_model(args.model, args.data, task=args.task, label_column=args.label_column,
                         scale=args.scale, input_shape=args.input_shape, classes=args.classes))
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `efpsn evaluate` to the `efpsn` parser's subcommands; returns its parser."""
    parser = subparsers.add_parser(
        "evaluate", help="accuracy (R^2 for ridge) and loss of a saved model on a data file",
        description="Print a trained model's accuracy (R^2 for ridge) and loss on a data file, "
                    "read as the run read its own: a .csv by the run's table schema (class "
                    "names, categories, empty cells filled), the features standardised with "
                    "the run's statistics or divided by its public scale (from the model's "
                    "header), and checked as an agent checks its own data.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="FILE",
                        help="model.safetensors (as efpsn writes it: RESULTS/model.safetensors "
                             "is the network's), or a flat model.npy (with result.json beside "
                             "it, or --task/--input-shape/--classes/--scale)")
    parser.add_argument("--data", required=True, metavar="FILE",
                        help=".npz with X and y, .csv with a header row, a folder of IDX "
                             "files, or a data folder's agentK (its train file) or the data "
                             "folder itself (its public test file)")
    parser.add_argument("--task", default=None,
                        help="evaluate with this task instead of the saved one (same parameter "
                             "names and shapes), e.g. python:MODULE:FACTORY")
    parser.add_argument("--label-column", default=None,
                        help="label column of a .csv (default: the model's table schema's, "
                             "else label)")
    parser.add_argument("--scale", default=None,
                        help="divide features by this public constant instead of the saved "
                             "one: none, unit (/255) or div:C")
    parser.add_argument("--input-shape", default=None, help="for a flat model.npy only")
    parser.add_argument("--classes", type=int, default=None, help="for a flat model.npy only")
    parser.set_defaults(handler=_handler)
    return parser
