"""efpsn from Python (a script, a Jupyter notebook): `train(data_dir, **flags)` runs the local
network `efpsn up --data-dir DATA_DIR` runs, with the command line's defaults, and returns the
network's model and the run's summary.

    from efpsn.notebook import train
    model, summary = train("D")                  # as `efpsn up --data-dir D`
    model, summary = train("D", mask="none", iterations=500)    # flags by name
    model, summary = train("D", label_column="species", drop=["id", "comment"])
    model.predict("D/test.csv")     # a table's raw rows (a .csv, a dict of columns or a pandas
                                    # DataFrame): class names, or numbers for ridge
    model.predict(features)         # numbers: the run's scaling applied (standard, div:)
    model.module                    # a torch module (float64) holding the trained parameters

It calls what the command calls, with values (never command-line text): the folder inspected
once (efpsn/data/inspection.py: every problem of every file in one ValueError, before anything
starts), the run's config from the values given (efpsn.flags.names.config_from_values) and the
launcher (efpsn.launch.network.launch_local_network). Flags go by their `efpsn up` names with
underscores (`insecure_noise_seed=7`, `holdout=0`, `drop="id,comment"`); True gives a switch
(`insecure=True`). It starts real processes (a coordinator and one agent per folder, mutual
TLS) like the command does. Inside a running event loop (a Jupyter cell) the network runs in a
worker thread while the cell waits; progress is shown as plain lines (quiet=True: none), and
interrupting the cell stops every process it started. A failed network raises the launcher's
NetworkFailed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
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

__all__ = ["TrainedModel", "load_trained", "train"]

# train()'s keywords that are `efpsn up`'s own flags (not run parameters), by LaunchOptions
# field (no_fork: fork_agents off); `drop` and `preset` shape the folder's reading and the run
LAUNCH_KEYWORDS = ("holdout", "label_column", "host", "insecure", "checkpoint_every",
                   "cpu_placement", "departure_deadline", "insecure_noise_seed",
                   "debug_expose_mask", "allow_insecure_keys", "no_fork")


@dataclass(frozen=True, eq=False)
class TrainedModel:
    """The network's model (the average of the agents' final iterates, as RESULTS/
    model.safetensors holds it) with what it needs to be used on raw rows."""

    path: Path
    saved: SavedModel
    module: nn.Module

    @property
    def metadata(self) -> ModelMetadata:
        return self.saved.metadata

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes by name (a table whose label column holds names), else ()."""
        return self.metadata.class_names

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The named float64 tensors, in model order."""
        return dict(self.saved.state)

    def inputs(self, rows: Any) -> torch.Tensor:
        """Raw rows as the model takes them: a table's (a .csv path, a dict of columns or a
        DataFrame) encoded by the run's table schema, or numeric features (samples first);
        then scaled as the run scaled its own (empty cells take the run's column means)."""
        return self.saved.inputs(self._features(rows))

    def _features(self, rows: Any) -> np.ndarray | torch.Tensor:
        table = self.metadata.table
        tabular = isinstance(rows, str | Path | Mapping) or (
            hasattr(rows, "columns") and hasattr(rows, "to_numpy"))
        if not tabular:
            return rows
        if not table.given:
            raise ValueError("this model was trained on numbers, not on a table's columns: "
                             "give its features as an array (samples first)")
        from efpsn.data.table_encoding import encode_table, raw_table_of
        from efpsn.data.tables import DataProblems, read_raw_table

        if isinstance(rows, str | Path):
            raw = read_raw_table(Path(rows), refuse=lambda text: ValueError(f"{rows} {text}"))
            where = str(rows)
        else:
            raw = raw_table_of(rows if isinstance(rows, Mapping) else
                               {c: rows[c].tolist() for c in rows.columns})
            where = "the rows given"
        encoded, problems = encode_table(table, raw, where="", labels=False)
        if encoded is None:
            raise DataProblems(where, problems)
        return encoded.features

    def predict(self, rows: Any) -> np.ndarray:
        """Every raw row's prediction: its class name (a table of class names), its class
        index, or its number (ridge)."""
        with torch.no_grad():
            out = self.module(self.inputs(rows))
        if self.metadata.task.regression:
            return out.reshape(-1).numpy()
        classes = out.argmax(dim=1).numpy()
        if self.class_names:
            return np.asarray(self.class_names, dtype=object)[classes]
        return classes


def load_trained(path: str | Path) -> TrainedModel:
    """A model.safetensors written by efpsn as a TrainedModel (its task's module built)."""
    saved = read_model(path)
    task = task_for(saved.metadata)
    module = task.build_model(vector_of(task, saved.state)).double().eval()
    return TrainedModel(path=Path(path), saved=saved, module=module)


def _columns(drop: str | Sequence[str] | None) -> list[str]:
    if drop is None:
        return []
    items = [drop] if isinstance(drop, str) else list(drop)
    return [c.strip() for text in items for c in str(text).split(",") if c.strip()]


def train(data_dir: str | Path, *, results: str | Path | None = None, quiet: bool = False,
          drop: str | Sequence[str] | None = None, preset: str | None = None,
          **flags: Any) -> tuple[TrainedModel, dict[str, Any]]:
    """Run `efpsn up --data-dir DATA_DIR [flags]` with values and return (the network's model,
    the run's summary: summary.json as a dict). results: the run's folder (default
    results/run-TIME, as the command); quiet: no progress lines; drop: columns that are not
    features; the other keywords are run parameters or `efpsn up`'s flags by name."""
    from efpsn.data.inspection import inspect_folder
    from efpsn.flags.names import (
        check_flags_against_folder,
        config_from_values,
        network_resolved,
        run_values_by_name,
    )

    launch = {k: flags.pop(k) for k in LAUNCH_KEYWORDS if k in flags}
    given = run_values_by_name(flags)
    label_column = launch.get("label_column")
    folder = inspect_folder(data_dir, label_column=label_column, drop=_columns(drop),
                            given=given, before=lambda layout: check_flags_against_folder(
                                given, layout, label_column=label_column))
    config = network_resolved(config_from_values(given, folder=folder, preset=preset,
                                                 label_column=label_column, resolve=False))
    out = Path(results) if results is not None else (
        Path("results") / time.strftime("run-%Y%m%d-%H%M%S"))
    options: dict[str, Any] = {"results": out, "folder": folder, "quiet": quiet,
                               "progress": "lines",
                               "fork_agents": not launch.pop("no_fork", False), **launch}
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # as the command: no gRPC notices
    summary = _launch(config, options)
    return load_trained(out / MODEL_FILE), summary


def _launch(config: Any, options: dict[str, Any]) -> dict[str, Any]:
    """launch_local_network(config, **options): here, with the stop signals, from a plain
    script's main thread; in a worker thread inside a running event loop (a Jupyter cell,
    whose loop must not be blocked by another loop's run), which a KeyboardInterrupt of the
    waiting thread stops."""
    from efpsn.launch.network import launch_local_network
    from efpsn.process.signals import StopSignals

    try:
        asyncio.get_running_loop()
        in_loop = True
    except RuntimeError:
        in_loop = False
    if not in_loop:
        main = threading.current_thread() is threading.main_thread()
        with StopSignals("efpsn.notebook.train") if main else contextlib.nullcontext():
            return launch_local_network(config, **options)
    stop = threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["summary"] = launch_local_network(config, stop=stop, **options)
        except BaseException as exc:  # noqa: BLE001 -- handed to the waiting thread as it is
            box["error"] = exc

    worker = threading.Thread(target=work, name="efpsn-notebook-train", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except KeyboardInterrupt:
        stop.set()  # the launcher stops every process it started, then the thread ends
        worker.join()
        raise
    if "error" in box:
        raise box["error"]
    return box["summary"]
