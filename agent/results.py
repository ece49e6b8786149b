"""What an agent leaves for its own operator when its run ends: result.json, its model as a named
state dict (model.safetensors) and as a flat vector (model.npy), all 0600 (the history holds
values of this agent's private f_i)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.session import Session
from efpsn.jsonfile import write_json
from efpsn.masks.zero_sum import MaskCoefficients
from efpsn.privacy.modes import privacy_statement
from efpsn.process.runtime import thread_cpus
from efpsn.tasks.model_io import MODEL_FILE, save_model

__all__ = ["failure_record", "write_failure", "write_results"]

log = logging.getLogger("efpsn.agent")


def write_results(folder: Path, *, session: Session, name: str, x: torch.Tensor,
                  history: list[dict[str, float]], timings: dict[str, float],
                  resumed_from: int | None, rejections: dict[str, int],
                  expose_mask: MaskCoefficients | None = None,
                  departures: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write FOLDER/model.safetensors and FOLDER/model.npy (the final iterate, float64; the
    latter flat in model.parameters() order) and FOLDER/result.json; return the result.
    `expose_mask`: the debug hook that also writes this agent's mask (never in a real
    deployment)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "model.npy.part"
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
        np.save(fh, x.detach().cpu().numpy().astype("<f8"), allow_pickle=False)
    tmp.replace(folder / "model.npy")
    save_model(folder / MODEL_FILE, task=session.problem.task, x=x, scale=session.config.scale,
               standardisation=session.standardisation, table=session.config.table)
    result: dict[str, Any] = {
        "settings": session.config.to_dict(),
        "privacy": privacy_statement(session.config, session.problem.graph).to_json(),
        "run_id": session.run_id,
        "name": name,
        "index": session.index,
        "neighbours": [p.name for p in session.assignment.neighbours],
        "history": history,
        "final": history[-1],
        "timings": timings,
        # the CPUs its threads may run on, gRPC's too (placed by efpsn up: one CPU, or a few)
        "cpus": thread_cpus(),
        "resumed_from_round": resumed_from,
        "rejections": rejections,
        "model": MODEL_FILE,  # the named state dict; model.npy: the same, flat
    }
    if departures is not None:  # who left, when, and what the model is the optimum of
        result.update(departures)
    if expose_mask is not None:
        log.warning("%s: writing its mask into result.json (debug hook; not private)", name)
        result["debug_mask_numerators"] = [str(v) for v in expose_mask.numerators]
    write_json(folder / "result.json", result, mode=0o600)
    return result


def failure_record(*, name: str, error: BaseException) -> dict[str, Any]:
    """Why this agent stopped, as data: its own one-line reason, and the other agent whose
    failure caused it (`blame`: a neighbour that stopped, or the agent the coordinator cancelled
    the run for), or None when the cause is this agent's own (its data, model, state)."""
    blame = getattr(error, "blame", None)
    return {"name": name, "reason": str(error) or type(error).__name__,
            "blame": blame if blame != name else None, "kind": type(error).__name__}


def write_failure(path: Path, *, name: str, error: BaseException) -> None:
    """failure_record as JSON at `path` (0600), for this agent's own operator (`efpsn up`
    asks for it with --failure-file)."""
    try:
        write_json(path, failure_record(name=name, error=error), mode=0o600)
    except OSError as exc:  # the folder itself may be the problem: say so, go on
        log.warning("%s could not record its failure in %s: %s", name, path, exc)
