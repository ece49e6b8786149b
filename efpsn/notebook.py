"""efpsn from Python (notebooks): `train(data_dir, **flags)` runs the local network `efpsn
up --data-dir DATA_DIR` runs, with the command line's defaults, and returns the network's model
and the run's summary.

    from efpsn.notebook import train
    model, summary = train("D")                  # as `efpsn up --data-dir D`
    model, summary = train("D", mask="none", iterations=500)    # flags by name
    model.predict(raw_features)     # class indices; the run's scaling applied (standard, div:)
    model.module                    # a torch module (float64) holding the trained parameters

Flags go by their `efpsn up` names with underscores (`insecure_noise_seed=7`, `holdout=0`); True
gives a switch (`insecure=True`). It starts real processes (a coordinator and one agent per
folder, mutual TLS) like the command does, and it prints what the command prints (quiet=True,
the default here: no progress bar). A bad flag or data raises ValueError with the one line the
command would print; a failed network raises the launcher's NetworkFailed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from efpsn.tasks.model_io import (
    MODEL_FILE,
    ModelMetadata,
    SavedModel,
    read_model,
    task_for,
    vector_of,
)

__all__ = ["TrainedModel", "train"]


@dataclass(frozen=True, eq=False)
class TrainedModel:
    """The network's model (the average of the agents' final iterates, as RESULTS/
    model.safetensors holds it) with what it needs to be used on raw features."""

    path: Path
    saved: SavedModel
    module: nn.Module

    @property
    def metadata(self) -> ModelMetadata:
        return self.saved.metadata

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The named float64 tensors, in model order."""
        return dict(self.saved.state)

    def inputs(self, features: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Raw features (samples first) scaled as the run scaled its own."""
        return self.saved.inputs(features)

    def predict(self, features: np.ndarray | torch.Tensor) -> np.ndarray:
        """The predicted class of every raw sample."""
        with torch.no_grad():
            return self.module(self.inputs(features)).argmax(dim=1).numpy()


def load_trained(path: str | Path) -> TrainedModel:
    """A model.safetensors written by efpsn as a TrainedModel (its task's module built)."""
    saved = read_model(path)
    task = task_for(saved.metadata)
    module = task.build_model(vector_of(task, saved.state)).double().eval()
    return TrainedModel(path=Path(path), saved=saved, module=module)


def _argv(flags: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    return out


def train(data_dir: str | Path, *, results: str | Path | None = None, quiet: bool = True,
          **flags: Any) -> tuple[TrainedModel, dict[str, Any]]:
    """Run `efpsn up --data-dir DATA_DIR [flags]` and return (the network's model, the run's
    summary: summary.json as a dict). results: the run's folder (default results/run-TIME, as
    the command)."""
    from efpsn.cli.up import parse_up, run_up
    from efpsn.process.signals import StopSignals

    folder = Path(results) if results is not None else (
        Path("results") / time.strftime("run-%Y%m%d-%H%M%S"))
    argv = ["--data-dir", str(data_dir), "--results", str(folder), *_argv(flags)]
    args = parse_up([*argv, "--quiet"] if quiet else argv)
    stops = (StopSignals("efpsn.notebook.train") if threading.current_thread() is threading.main_thread()
             else contextlib.nullcontext())  # signal handlers live in the main thread only
    with stops:
        summary = run_up(args)
    return load_trained(folder / MODEL_FILE), summary
