"""Phase II's checkpoints written by a thread (agent/checkpoint_writer.py): on disk within LAG
rounds, one write at a time, the bytes taken when the checkpoint is due, errors not lost."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest
import torch

from agent.checkpoint_writer import LAG, CheckpointWriter
from agent.durable import write_all
from agent.state import PreparedCheckpoint, StateStore

SHAPES = {"x": (3, 2)}


class GatedStore(StateStore):
    """A store whose writes wait for `gate` (a slow disk), counting how many run at once."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.running = 0
        self.most = 0
        self.fail: Exception | None = None

    def put_checkpoint(self, prepared: PreparedCheckpoint) -> Path:
        self.running += 1
        self.most = max(self.most, self.running)
        self.started.set()
        try:
            assert self.gate.wait(10), "the test never opened the gate"
            if self.fail is not None:
                raise self.fail
            return super().put_checkpoint(prepared)
        finally:
            self.running -= 1


async def _blocked(awaitable: object, seconds: float = 0.2) -> bool:
    """Whether `awaitable` is still waiting after `seconds` (it keeps running as a task)."""
    task = asyncio.ensure_future(awaitable)  # type: ignore[arg-type]
    await asyncio.sleep(seconds)
    blocked = not task.done()
    if blocked:
        task.add_done_callback(lambda t: t.exception())
    return blocked


def test_a_checkpoint_is_awaited_before_the_round_lag_after_it(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    writer = CheckpointWriter(store, run_id="r")
    x = torch.arange(6, dtype=torch.float64).reshape(3, 2)

    async def body() -> None:
        await writer.save(round_=10, tensors={"x": x}, history=[{"round": 0.0}])
        assert writer.pending == 10 and store.started.wait(5)  # writing, rounds go on
        x.add_(100.0)  # the next rounds change the state: the checkpoint must not see it
        for t in range(11, 10 + LAG):
            assert not await _blocked(writer.before_round(t))
        waiting = asyncio.ensure_future(writer.before_round(10 + LAG))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the round-(10 + LAG) message waits for the disk
        store.gate.set()
        await waiting
        assert writer.pending is None
        await writer.close()

    asyncio.run(body())
    saved = store.load_checkpoint(run_id="r", expected=SHAPES)
    assert saved is not None and saved.round == 10
    assert torch.equal(saved.tensors["x"], torch.arange(6, dtype=torch.float64).reshape(3, 2))
    assert saved.history == [{"round": 0.0}]


def test_one_write_at_a_time_and_a_durable_one_returns_on_disk(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    writer = CheckpointWriter(store, run_id="r")
    x = torch.zeros(3, 2, dtype=torch.float64)

    async def body() -> None:
        await writer.save(round_=1, tensors={"x": x}, history=[])
        second = asyncio.ensure_future(writer.save(round_=2, tensors={"x": x + 2}, history=[],
                                                   durable=True))
        await asyncio.sleep(0.2)
        assert not second.done() and store.most == 1  # the next waits for the first
        store.gate.set()
        await second
        assert writer.pending is None  # durable: round 2 is on disk when save returns
        assert store.load_checkpoint(run_id="r", expected=SHAPES).round == 2  # type: ignore[union-attr]
        await writer.close()

    asyncio.run(body())
    assert store.most == 1


def test_a_failed_write_is_raised_and_only_logged_when_phase_two_fails_anyway(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = GatedStore(tmp_path)
    store.fail = OSError(28, "No space left on device")
    store.gate.set()
    writer = CheckpointWriter(store, run_id="r")
    x = torch.zeros(3, 2, dtype=torch.float64)

    async def body() -> None:
        await writer.save(round_=5, tensors={"x": x}, history=[])
        with pytest.raises(OSError, match="No space left"):
            await writer.before_round(5 + LAG)
        await writer.save(round_=10, tensors={"x": x}, history=[])
        with caplog.at_level(logging.ERROR, logger="efpsn.agent"):
            await writer.close(failing=True)  # phase II is already failing: logged only
        assert "writing a checkpoint failed" in caplog.text
        await writer.save(round_=15, tensors={"x": x}, history=[])
        with pytest.raises(OSError, match="No space left"):
            await writer.close()

    asyncio.run(body())
    assert store.load_checkpoint(run_id="r", expected=SHAPES) is None


def test_the_older_checkpoints_are_deleted_once_the_new_one_is_written(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    writer = CheckpointWriter(store, run_id="r", keep=2)

    async def body() -> None:
        for r in (5, 10, 15):
            await writer.save(round_=r, tensors={"x": torch.full((3, 2), float(r),
                                                                 dtype=torch.float64)},
                              history=[])
            await writer.before_round(r + LAG)
        await writer.close()

    asyncio.run(body())
    names = sorted(p.name for p in store.checkpoint_folder.iterdir())
    assert names == ["round-00000010", "round-00000015"]
    saved = store.load_checkpoint(run_id="r", expected=SHAPES)
    assert saved is not None and saved.round == 15 and float(saved.tensors["x"][0, 0]) == 15.0


def test_write_all_puts_every_file_private_and_never_over_one(tmp_path: Path) -> None:
    files = [(f"t{i}.npy", bytes([i]) * (1000 + i)) for i in range(11)]
    write_all(tmp_path, files)
    for name, data in files:
        assert (tmp_path / name).read_bytes() == data
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        write_all(tmp_path, [("new.npy", b"1"), ("t3.npy", b"2")])
    assert (tmp_path / "t3.npy").read_bytes() == files[3][1]
