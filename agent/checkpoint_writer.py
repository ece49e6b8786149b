"""Phase II's checkpoints put on disk by a thread while the rounds go on.

A checkpoint's files are fsync'ed (agent/state.py). Written on the event loop, every fsync
stopped this agent, and with it its neighbours, which wait for its next message: every agent
checkpoints at the same rounds, so the whole ring stood still while the disk flushed five
folders (measured: 56-63 ms of wall time per checkpoint per agent, 0.7 ms of it CPU, at load
8). Now the loop only takes the checkpoint's bytes from the tensors (`prepare_checkpoint`:
the rounds that follow cannot change them), and a worker thread writes, fsyncs and renames
exactly as before, then deletes the checkpoint before the previous one (deleting its files
waited on the file system's journal as long as writing: that part delays no round at all).

What a checkpoint of round t holds and promises is unchanged: the state after t rounds, taken
after every neighbour's round-t message came (so each of them holds my round t - 1 message).
When it is on disk is unchanged too: before this agent sends its round t + 1 message (`LAG`).
What runs meanwhile is the step of round t (and its evaluation), and the deletion of the older
checkpoint waits for no round at all. A process killed before the write is done resumes from
the checkpoint before, as one killed during a synchronous write did; a process about to send
round t + 1 holds round t's on disk, so a kill there (tests/crash_hook) resumes from exactly it.
(LAG = 2 would overlap a whole round more and still fit the neighbours' logs, --keep-rounds >=
--checkpoint-every + 3, but it uses up that rule's slack and makes the round a kill resumes
from depend on the disk's timing; not taken.) A checkpoint a departure asks for (its round is
where a restart must resume) is awaited at once, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from agent.concurrency import to_completion
from agent.state import StateStore, prepare_checkpoint

__all__ = ["LAG", "CheckpointWriter"]

log = logging.getLogger("efpsn.agent")

# rounds between a checkpoint's round t and the round whose message waits for it on disk
LAG = 1


class CheckpointWriter:
    """Checkpoints written by one worker thread, in order; each on disk within LAG rounds."""

    def __init__(self, store: StateStore, *, run_id: str, keep: int = 2) -> None:
        self.store = store
        self.run_id = run_id
        self.keep = keep
        self._thread: ThreadPoolExecutor | None = None
        self._pending: tuple[int, asyncio.Future[object]] | None = None  # on disk when done
        self._pruning: asyncio.Future[object] | None = None  # the older ones' deletion

    @property
    def pending(self) -> int | None:
        """The round of the checkpoint not known to be on disk yet, if any."""
        return None if self._pending is None else self._pending[0]

    async def save(self, *, round_: int, tensors: dict[str, torch.Tensor],
                   history: list[dict[str, float]], durable: bool = False) -> None:
        """Start writing the state after `round_` rounds (the previous write and deletion
        finished first); durable: return only once it is on disk."""
        await self.wait()
        prepared = prepare_checkpoint(run_id=self.run_id, round_=round_, tensors=tensors,
                                      history=history)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        loop = asyncio.get_running_loop()
        # one thread: the deletion runs after the write, and only if the write succeeded
        put = self._thread.submit(self.store.put_checkpoint, prepared)
        self._pending = (round_, asyncio.wrap_future(put, loop=loop))
        self._pruning = asyncio.wrap_future(
            self._thread.submit(_after, put, self.store.prune_checkpoints, self.keep),
            loop=loop)
        if durable:
            await self._on_disk()

    async def before_round(self, t: int) -> None:
        """Before sending my round-t message: the checkpoint of round t - LAG or older must be
        on disk."""
        if self._pending is not None and t >= self._pending[0] + LAG:
            await self._on_disk()

    async def _on_disk(self) -> None:
        if self._pending is not None:
            _, put = self._pending
            self._pending = None
            await to_completion(put)  # a thread cannot be stopped: a cancel waits for it

    async def wait(self) -> None:
        """Until the pending write and deletion ended; an error of theirs (a full disk, say)
        is raised here."""
        pruning, self._pruning = self._pruning, None
        await self._on_disk()
        if pruning is not None:
            await to_completion(pruning)

    async def close(self, *, failing: bool = False) -> None:
        """At phase II's end, however it ends: the pending work finished (nothing may touch
        the state folder behind a later step's back, e.g. the finished run's deletion), the
        thread stopped. An error is raised; failing (phase II is already ending with another):
        only logged."""
        try:
            await self.wait()
        except Exception:
            if not failing:
                raise
            log.exception("writing a checkpoint failed as well")
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=False)
                self._thread = None


def _after(put: Future[Path], prune: Callable[..., None], keep: int) -> None:
    """The deletion of older checkpoints, once the write `put` succeeded (its error is the
    write's to report)."""
    if put.exception() is None:
        prune(keep=keep)
