"""Every way a checkpoint or mask file can be damaged is detected and said (agent/state.py): a
damaged checkpoint is skipped with the reason in the log, never loaded."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.state import StateError, StateStore
from efpsn.masks.zero_sum import MaskCoefficients

EXPECTED = {"x": (4,)}
X = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)


def _meta(folder: Path) -> dict:
    return json.loads((folder / "state.json").read_text())


def _write_meta(folder: Path, meta: dict) -> None:
    (folder / "state.json").write_text(json.dumps(meta))


def _npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _replace_x(folder: Path, data: bytes) -> None:
    """Put `data` in x.npy with a matching sha256 (so the damage is in the content)."""
    (folder / "x.npy").write_bytes(data)
    meta = _meta(folder)
    meta["tensors"]["x"]["sha256"] = hashlib.sha256(data).hexdigest()
    _write_meta(folder, meta)


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "not json": (lambda f: (f / "state.json").write_text("{"), "cannot read"),
    "another format": (lambda f: _write_meta(f, {**_meta(f), "format": "x/0"}),
                       "is not an efpsn-agent-state/1 file"),
    "round does not match the folder": (lambda f: _write_meta(f, {**_meta(f), "round": 7}),
                                        "round 7 does not match the folder name"),
    "tensors missing": (lambda f: _write_meta(f, {**_meta(f), "tensors": None}),
                        "tensors [] != expected ['x']"),
    "array file missing": (lambda f: (f / "x.npy").unlink(), "cannot read"),
    "not an npy file": (lambda f: _replace_x(f, b"garbage"), "x.npy: "),
    "float32 array": (lambda f: _replace_x(f, _npy(np.zeros(4, dtype=np.float32))),
                      "holds float32 (4,), expected float64 (4,)"),
    "wrong shape": (lambda f: _replace_x(f, _npy(np.zeros(5))),
                    "holds float64 (5,), expected float64 (4,)"),
    "history missing": (lambda f: _write_meta(f, {**_meta(f), "history": None}),
                        "history is missing"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_checkpoint_is_skipped_with_its_reason(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # prepare: two checkpoints; the newest gets damaged
    store = StateStore(tmp_path)
    for r in (10, 20):
        store.save_checkpoint(run_id="r", round_=r, tensors={"x": X * r}, history=[])
    newest = store.checkpoint_folder / "round-00000020"
    spoil, reason = DAMAGE[damage]
    spoil(newest)
    # execute
    with caplog.at_level(logging.WARNING, logger="agent.state"):
        checkpoint = store.load_checkpoint(run_id="r", expected=EXPECTED)
    # assert: the older one is used, and the log says why the newest was not
    assert checkpoint is not None and checkpoint.round == 10
    assert checkpoint.tensors["x"].numpy().tobytes() == (X * 10).numpy().tobytes()
    assert f"skipping checkpoint {newest}: " in caplog.text and reason in caplog.text, caplog.text


def test_unsafe_checkpoints_are_refused_when_saved(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with pytest.raises(StateError, match=r"state tensor name '../x' is not a safe file name"):
        store.save_checkpoint(run_id="r", round_=1, tensors={"../x": X}, history=[])
    with pytest.raises(StateError, match="state tensor 'x' must be float64, got float32"):
        store.save_checkpoint(run_id="r", round_=1, tensors={"x": X.float()}, history=[])
    assert store.load_checkpoint(run_id="r", expected=EXPECTED) is None
    # saving the same round again replaces it
    store.save_checkpoint(run_id="r", round_=1, tensors={"x": X}, history=[])
    store.save_checkpoint(run_id="r", round_=1, tensors={"x": 2 * X}, history=[{"round": 1}])
    checkpoint = store.load_checkpoint(run_id="r", expected=EXPECTED)
    assert checkpoint is not None and checkpoint.history == [{"round": 1}]
    assert checkpoint.tensors["x"].tolist() == (2 * X).tolist()


def test_damaged_mask_fields_are_named(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.load_mask(run_id="r") is None
    store.save_mask(MaskCoefficients((1, -2, 3), 6), run_id="r", stats={"s": 1.0})
    payload = json.loads(store.mask_path.read_text())
    for field, value in (("numerators", ["1", "x"]), ("precision", None),
                         ("received", {"shares": {"agent1": "not hex"}})):
        store.mask_path.write_text(json.dumps({**payload, field: value}))
        with pytest.raises(StateError, match=f"{store.mask_path} is damaged: "):
            store.load_mask(run_id="r")
