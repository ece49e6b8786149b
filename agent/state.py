"""An agent's crash-safe state on disk: its assignment, its phase I mask, phase II checkpoints.

Layout of the state folder (default RESULTS/NAME/state; mode 0700, every file 0600):

    assignment.json                 run id, assignment (neighbours, weights, public parameters),
                                    the address this agent advertised and the port it bound;
                                    written right after registration, before phase I starts
    mask.json                       the phase I result (mask numerators, as decimal strings),
                                    phase I statistics and the sha256 digests of the keys and
                                    shares received; written before phase II starts
    seeds.json                      instead, with refreshed masks: the edge seeds phase I shared
                                    (secret like a mask), statistics and digests
    checkpoints/round-00000050/     the algorithm state after 50 completed rounds:
        state.json                  round, tensor names/shapes/sha256, evaluation history
        x.npy, y.npy, ...           one float64 array per state tensor (np.save, no pickle)
    outbox/rounds-00000050.log      the round messages this agent sent (agent/outbox.py),
                                    served to neighbours that replay from an older checkpoint
    unresumable.json                why this run can never resume here (written when it fails)
    totals.json                     scale standard: the secure sum's totals (agent/phases/
                                    secure_sum.py), written once, before phase II
    departures.json                 the departures this agent applied and its new edges' seeds
                                    (agent/departure/records.py)
    edge_terms.json                 the fixed mask's per-edge terms (agent/departure/
                                    fixed_terms.py)
    rejoin.json                     a new edge's seed exchange while it runs (agent/departure/
                                    exchange_file.py)

The phases and the departure subsystem own the formats of their records (totals, departures,
edge terms, an exchange); the store writes, reads and deletes them (`save_record`,
`load_record`, `discard`), so this folder has one writer, and `mark_finished` deletes every
secret of the run at its end.

Every file is written to a temporary name, flushed, fsync'ed and renamed, and a checkpoint folder
is renamed into place only when complete (its files fsync'ed at once, then the folder), so a
crash (even SIGKILL) leaves either the old or the new version, never half of one. Phase II
writes its checkpoints on a thread while the rounds go on (agent/checkpoint_writer.py): a
checkpoint of round t is on disk before the agent sends its round t + 1 message. Nothing is pickled;
arrays are read with allow_pickle=False and checked against their sha256. When the run finishes, the
mask and the checkpoints (both private: they reveal this agent's perturbation and iterates) are
deleted and assignment.json is marked finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.durable import fsync_dir, write_all, write_private
from efpsn.jsonfile import read_run_json, write_json
from efpsn.masks.zero_sum import MaskCoefficients
from efpsn.params.config import RunConfig
from efpsn.wire import records

log = logging.getLogger("agent.state")

FORMAT = "efpsn-agent-state/1"
# the records the phases and the departure subsystem keep here (their owners give the formats)
TOTALS, DEPARTURES, EDGE_TERMS, EXCHANGE = ("totals.json", "departures.json", "edge_terms.json",
                                            "rejoin.json")
RUN_RECORDS = (TOTALS, DEPARTURES, EDGE_TERMS, EXCHANGE)
_TENSOR_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_CHECKPOINT_DIR = re.compile(r"^round-(\d{8,})$")


class StateError(RuntimeError):
    """The state folder cannot be used (unreadable, for another agent, corrupt beyond repair)."""


@dataclass(frozen=True)
class SavedAssignment:
    assignment: records.Assignment
    config: RunConfig  # the run's parameters, as GetRunParameters gave them
    advertise: str
    port: int
    finished: bool


@dataclass(frozen=True)
class SavedMask:
    mask: MaskCoefficients
    stats: dict[str, float]
    received: dict[str, dict[str, bytes]]  # kind -> sender -> digest of the phase I message


@dataclass(frozen=True)
class Checkpoint:
    """Algorithm state after `round` completed rounds, and the evaluations up to it."""

    round: int
    tensors: dict[str, torch.Tensor]
    history: list[dict[str, float]]


def _json_bytes(payload: Any, *, indent: int | None = 1) -> bytes:
    """JSON text of a state file; indent=None: compact, by json's C encoder (a checkpoint's
    growing evaluation history, written every few rounds)."""
    return (json.dumps(payload, indent=indent, allow_nan=True) + "\n").encode()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read {path}: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise StateError(f"{path} is not an {FORMAT} file")
    return payload


def _digests_out(received: dict[str, dict[str, bytes]] | None) -> dict[str, dict[str, str]]:
    return {kind: {sender: d.hex() for sender, d in by.items()}
            for kind, by in (received or {}).items()}


def _phase_one_record(payload: dict[str, Any]) -> tuple[dict[str, float],
                                                        dict[str, dict[str, bytes]]]:
    """Phase I's statistics and received digests, as saved with its result."""
    stats = {str(k): float(v) for k, v in dict(payload.get("stats", {})).items()}
    received = {str(kind): {str(s): bytes.fromhex(d) for s, d in dict(by).items()}
                for kind, by in dict(payload.get("received", {})).items()}
    return stats, received


@dataclass(frozen=True)
class PreparedCheckpoint:
    """A checkpoint's files as bytes (each .npy, then state.json): taken from the tensors at
    once, so the rounds that follow cannot change what a later write puts on disk."""

    round: int
    files: tuple[tuple[str, bytes], ...]


def prepare_checkpoint(*, run_id: str, round_: int, tensors: dict[str, torch.Tensor],
                       history: list[dict[str, float]]) -> PreparedCheckpoint:
    """The files of the state after `round_` rounds (float64 tensors with safe names)."""
    files, entries = [], {}
    for key in sorted(tensors):
        if not _TENSOR_NAME.match(key):
            raise StateError(f"state tensor name {key!r} is not a safe file name")
        array = tensors[key].detach().cpu().numpy()
        if array.dtype != np.float64:
            raise StateError(f"state tensor {key!r} must be float64, got {array.dtype}")
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array).astype("<f8"), allow_pickle=False)
        data = buffer.getvalue()
        files.append((f"{key}.npy", data))
        entries[key] = {"file": f"{key}.npy", "shape": list(array.shape),
                        "sha256": hashlib.sha256(data).hexdigest()}
    meta = {"format": FORMAT, "run_id": run_id, "round": round_, "tensors": entries,
            "history": history}
    files.append(("state.json", _json_bytes(meta, indent=None)))
    return PreparedCheckpoint(round=round_, files=tuple(files))


class StateStore:
    """Reads and writes one agent's state folder (see the module docstring for the layout)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    # ------------------------------------------------------------------ folder

    def _ensure(self, sub: Path | None = None) -> Path:
        target = self.folder if sub is None else sub
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, 0o700)
        return target

    @property
    def assignment_path(self) -> Path:
        return self.folder / "assignment.json"

    @property
    def mask_path(self) -> Path:
        return self.folder / "mask.json"

    @property
    def seeds_path(self) -> Path:
        """Refreshed masks: phase I's edge seeds instead of a mask."""
        return self.folder / "seeds.json"

    def phase_one_saved(self) -> bool:
        """Whether phase I's result (a mask, or edge seeds) was saved."""
        return self.mask_path.exists() or self.seeds_path.exists()

    @property
    def checkpoint_folder(self) -> Path:
        return self.folder / "checkpoints"

    # ------------------------------------------------------------------ assignment

    def save_assignment(self, assignment: records.Assignment, *, config: RunConfig,
                        advertise: str, port: int, finished: bool = False) -> None:
        self._ensure()
        payload = {"format": FORMAT, "run_id": assignment.run_id, "name": assignment.name,
                   "advertise": advertise, "port": port, "finished": finished,
                   "assignment": dataclasses.asdict(assignment), "parameters": config.to_dict()}
        write_private(self.assignment_path, _json_bytes(payload))

    def load_assignment(self) -> SavedAssignment | None:
        """The saved assignment, or None when this folder holds no run."""
        if not self.assignment_path.exists():
            return None
        payload = _read_json(self.assignment_path)
        try:
            raw = dict(payload["assignment"])
            raw["neighbours"] = tuple(records.Peer(**p) for p in raw["neighbours"])
            params = raw.pop("params", None)  # where a state folder of an older efpsn kept them
            assignment = records.Assignment(**raw)
            # the same invariants as on the wire: a hand-edited file fails here, not later
            records.check_assignment(assignment)
            config = RunConfig.from_dict(payload.get("parameters", params))
            return SavedAssignment(
                assignment=assignment, config=config, advertise=str(payload["advertise"]),
                port=int(payload["port"]), finished=bool(payload["finished"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"{self.assignment_path} is damaged: {exc}") from None

    def mark_finished(self, saved: SavedAssignment) -> None:
        """The run is over: delete the mask (or seeds), the checkpoints, the sent messages and
        every record of the run (RUN_RECORDS: totals, departures, edge terms, an exchange),
        keep a finished marker."""
        self.save_assignment(saved.assignment, config=saved.config, advertise=saved.advertise,
                             port=saved.port, finished=True)
        self.mask_path.unlink(missing_ok=True)
        self.seeds_path.unlink(missing_ok=True)
        self.discard(*RUN_RECORDS)
        shutil.rmtree(self.checkpoint_folder, ignore_errors=True)
        shutil.rmtree(self.outbox_folder, ignore_errors=True)
        fsync_dir(self.folder)

    # ------------------------------------------------------------------ records

    def record_path(self, name: str) -> Path:
        if name not in RUN_RECORDS:
            raise ValueError(f"{name!r} is not a record of the state folder ({RUN_RECORDS})")
        return self.folder / name

    def has_record(self, name: str) -> bool:
        return self.record_path(name).exists()

    def save_record(self, name: str, payload: dict[str, Any]) -> None:
        """STATE/NAME (one of RUN_RECORDS) as strict JSON: 0600, written atomically and synced
        (a restart reads it). Its owner gives the payload, with "format" and "run_id"."""
        self._ensure()
        write_json(self.record_path(name), payload, mode=0o600, sync=True)

    def load_record(self, name: str, *, fmt: int, run_id: str) -> dict[str, Any] | None:
        """The payload save_record wrote for `run_id` (None: none saved); ValueError when it is
        another run's, another format's or unreadable (its owner says why in its own words)."""
        path = self.record_path(name)
        if not path.exists():
            return None
        try:
            payload: dict[str, Any] = read_run_json(path, fmt=fmt, run_id=run_id)
        except (OSError, AttributeError) as exc:
            raise ValueError(f"{path} is unreadable: {exc}") from None
        return payload

    def discard(self, *names: str) -> None:
        """Delete these records (those that exist)."""
        for name in names:
            self.record_path(name).unlink(missing_ok=True)

    # ------------------------------------------------------------------ unresumable runs

    @property
    def outbox_folder(self) -> Path:
        """My sent round messages (agent/outbox.py)."""
        return self.folder / "outbox"

    @property
    def unresumable_path(self) -> Path:
        return self.folder / "unresumable.json"

    def mark_unresumable(self, reason: str) -> None:
        """Record why this run can never resume here, so a restart says so at once."""
        self._ensure()
        write_private(self.unresumable_path, _json_bytes({"format": FORMAT, "reason": reason}))

    def unresumable(self) -> str | None:
        """The reason recorded by mark_unresumable, if any."""
        if not self.unresumable_path.exists():
            return None
        return str(_read_json(self.unresumable_path).get("reason", "unknown reason"))

    # ------------------------------------------------------------------ mask

    def save_mask(self, mask: MaskCoefficients, *, run_id: str, stats: dict[str, float],
                  received: dict[str, dict[str, bytes]] | None = None) -> None:
        """The phase I result, its statistics, and the digests of the phase I messages received
        (so that a restarted agent can still tell a retry from a different message)."""
        self._ensure()
        payload = {
            "format": FORMAT,
            "run_id": run_id,
            "precision": mask.precision,
            "numerators": [str(v) for v in mask.numerators],
            "stats": stats,
            "received": _digests_out(received),
        }
        write_private(self.mask_path, _json_bytes(payload))

    def save_seeds(self, seeds_json: str, *, run_id: str, stats: dict[str, float],
                   received: dict[str, dict[str, bytes]] | None = None) -> None:
        """Refreshed masks: the edge seeds (efpsn/masks/seeds.py EdgeSeeds.to_json), with phase I's
        statistics and received digests as for a mask. Secret like the mask: 0600, deleted when
        the run finishes."""
        self._ensure()
        payload = {"format": FORMAT, "run_id": run_id, "seeds": json.loads(seeds_json),
                   "stats": stats, "received": _digests_out(received)}
        write_private(self.seeds_path, _json_bytes(payload))

    def load_seeds(self, *, run_id: str) -> tuple[str, dict[str, float],
                                                  dict[str, dict[str, bytes]]] | None:
        """(seeds JSON, stats, received digests) saved by save_seeds, or None."""
        if not self.seeds_path.exists():
            return None
        payload = _read_json(self.seeds_path)
        if payload.get("run_id") != run_id:
            raise StateError(f"{self.seeds_path} belongs to run {payload.get('run_id')!r}, "
                             f"not {run_id!r}")
        try:
            stats, received = _phase_one_record(payload)
            return json.dumps(payload["seeds"]), stats, received
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"{self.seeds_path} is damaged: {exc}") from None

    def load_mask(self, *, run_id: str) -> SavedMask | None:
        if not self.mask_path.exists():
            return None
        payload = _read_json(self.mask_path)
        if payload.get("run_id") != run_id:
            raise StateError(f"{self.mask_path} belongs to run {payload.get('run_id')!r}, "
                             f"not {run_id!r}")
        try:
            mask = MaskCoefficients(tuple(int(v) for v in payload["numerators"]),
                                    int(payload["precision"]))
            stats, received = _phase_one_record(payload)
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"{self.mask_path} is damaged: {exc}") from None
        return SavedMask(mask=mask, stats=stats, received=received)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, *, run_id: str, round_: int, tensors: dict[str, torch.Tensor],
                        history: list[dict[str, float]], keep: int = 2) -> Path:
        """Write the state after `round_` rounds; keep the newest `keep` checkpoints."""
        return self.write_checkpoint(prepare_checkpoint(run_id=run_id, round_=round_,
                                                        tensors=tensors, history=history),
                                     keep=keep)

    def write_checkpoint(self, prepared: PreparedCheckpoint, *, keep: int = 2) -> Path:
        """put_checkpoint, then prune_checkpoints."""
        final = self.put_checkpoint(prepared)
        self.prune_checkpoints(keep=keep)
        return final

    def put_checkpoint(self, prepared: PreparedCheckpoint) -> Path:
        """Put a prepared checkpoint on disk: its files and their folder, flushed and renamed
        into place. Touches nothing but the files: safe on a thread of its own."""
        parent = self._ensure(self.checkpoint_folder)
        name = f"round-{prepared.round:08d}"
        final = parent / name
        tmp = parent / f".{name}.part"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
        write_all(tmp, prepared.files)  # every file flushed to disk (at once)
        fsync_dir(tmp)  # its entries, before the folder is renamed into place
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(parent)
        return final

    def prune_checkpoints(self, *, keep: int = 2) -> None:
        """Delete all but the newest `keep` checkpoints (deleting a folder's files waits on the
        file system's journal: 44 ms at load 9, more than writing one)."""
        for old in self._checkpoint_dirs()[keep:]:
            shutil.rmtree(old, ignore_errors=True)

    def _checkpoint_dirs(self) -> list[Path]:
        """Complete checkpoint folders, newest first."""
        if not self.checkpoint_folder.is_dir():
            return []
        found = []
        for p in self.checkpoint_folder.iterdir():
            m = _CHECKPOINT_DIR.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return [p for _, p in sorted(found, reverse=True)]

    def load_checkpoint(self, *, run_id: str, expected: dict[str, tuple[int, ...]]
                        ) -> Checkpoint | None:
        """The newest intact checkpoint whose tensors are exactly `expected` (name -> shape);
        damaged ones are skipped with a warning. None when there is none."""
        for folder in self._checkpoint_dirs():
            try:
                return self._read_checkpoint(folder, run_id=run_id, expected=expected)
            except StateError as exc:
                log.warning("skipping checkpoint %s: %s", folder, exc)
        return None

    def _read_checkpoint(self, folder: Path, *, run_id: str,
                         expected: dict[str, tuple[int, ...]]) -> Checkpoint:
        meta = _read_json(folder / "state.json")
        if meta.get("run_id") != run_id:
            raise StateError(f"it belongs to run {meta.get('run_id')!r}, not {run_id!r}")
        round_ = meta.get("round")
        if not isinstance(round_, int) or folder.name != f"round-{round_:08d}":
            raise StateError(f"round {round_!r} does not match the folder name")
        entries = meta.get("tensors")
        if not isinstance(entries, dict) or set(entries) != set(expected):
            raise StateError(f"tensors {sorted(entries or {})} != expected {sorted(expected)}")
        tensors = {}
        for key, entry in entries.items():
            path = folder / f"{key}.npy"
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise StateError(f"cannot read {path}: {exc}") from None
            if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
                raise StateError(f"{path} does not match its sha256")
            try:
                array = np.load(io.BytesIO(data), allow_pickle=False)
            except ValueError as exc:
                raise StateError(f"{path}: {exc}") from None
            if array.dtype != np.dtype("<f8") or tuple(array.shape) != tuple(expected[key]):
                raise StateError(f"{path} holds {array.dtype} {array.shape}, expected float64 "
                                 f"{expected[key]}")
            tensors[key] = torch.from_numpy(array.astype(np.float64, copy=True))
        history = meta.get("history")
        if not isinstance(history, list):
            raise StateError("history is missing")
        return Checkpoint(round=round_, tensors=tensors, history=history)
