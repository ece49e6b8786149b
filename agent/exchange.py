"""One round's exchange with the neighbours: my message out, theirs in, broken streams mended.

Round messages go on the round streams (agent/round_stream.py), with no answer per message: a
neighbour's next round message is the acknowledgement, so only the neighbours' messages are
on the critical path. A stream that ended (a refusal, a neighbour restarting) is mended first:
the rounds it carried that were not confirmed go again by PutRound (Peers.repair), also when it
ends while we wait. After a restart, rounds pushed to the previous process are pulled from the
neighbours (Replay, below). The run's last round is sent by PutRound and acknowledged, since no
later round will confirm it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from agent.concurrency import all_or_first_error, settle
from agent.mailbox import Interrupted, Mailbox
from agent.options import AgentFailure, RefusedByNeighbour
from agent.outbox import Outbox
from agent.peers import Peers
from efpsn.algorithms.base import Message, Received
from efpsn.ledger import Judgement, Verdict
from efpsn.wire.rounds import encode_round

__all__ = ["Replay", "RoundLink"]

Take = Callable[..., Judgement]  # agent/phases/phase_two.py's PhaseTwo.take_round

log = logging.getLogger("efpsn.agent")


def _outcomes(tasks: list[asyncio.Future[Any]]) -> None:
    """Raise the first failure of finished `tasks`, every outcome retrieved before it is."""
    for task in tasks:
        if not task.cancelled():
            task.exception()
    for task in tasks:
        task.result()


class Replay:
    """After a restart, round-t messages the neighbours pushed to this agent's previous process
    are pulled from them (Agent.GetRound) until each says it has not reached round t yet: from
    then on its pushes reach this process. A fresh start pulls nothing."""

    def __init__(self, *, peers: Peers, take: Take, mailbox: Mailbox,
                 neighbours: set[str], describe_loss: Callable[[str, int, str], str],
                 on_loss: Callable[[str], None]) -> None:
        self.peers = peers
        self.take = take  # a pulled message is taken as a pushed one (PhaseTwo.take_round)
        self.mailbox = mailbox
        self.pending = set(neighbours)  # neighbours that may hold rounds this agent lost
        self._describe_loss = describe_loss
        self._on_loss = on_loss

    async def fill(self, t: int, *, deadline: float) -> None:
        """Pull round t from every neighbour that may still hold it for us."""
        wanted = [n for n in sorted(self.pending) if not self.mailbox.has("round", t, n)]
        if wanted:
            await all_or_first_error(self._pull(n, t, deadline=deadline) for n in wanted)

    async def _pull(self, name: str, t: int, *, deadline: float) -> None:
        try:
            message = await self.peers.pull(name, t, deadline=deadline)
        except RefusedByNeighbour as exc:
            if exc.code != "NOT_FOUND":
                raise
            reason = self._describe_loss(name, t, exc.detail)
            self._on_loss(reason)
            raise AgentFailure(reason) from None
        if message is None:
            self.pending.discard(name)  # it will push round t and later ones to this process
            return
        try:
            judgement = self.take(message, senders={name}, round_=t)
        except ValueError as exc:
            raise AgentFailure(f"neighbour {name} served a bad round {t}: {exc}",
                               blame=name) from None
        if judgement.verdict in (Verdict.ACCEPT, Verdict.DUPLICATE):
            return  # filed now, or already (its push reached this process too)
        # REFUSE: a different copy of a round already taken; LATER: round t outside the
        # window this agent is at (never for the round being filled): either is a failure
        raise AgentFailure(f"neighbour {name} served round {t}: {judgement.reason}")


class RoundLink:
    """Moves one agent's round messages: `exchange(t, outbox)` sends mine while collecting the
    neighbours' round-t messages (keyed by neighbour index)."""

    def __init__(self, *, peers: Peers, outbox: Outbox, replay: Replay, run_id: str,
                 name: str, neighbours: list[str], timeout: float,
                 holds: Callable[[str, int], bool]) -> None:
        self.peers = peers
        self.outbox = outbox
        self.holds = holds  # whether a neighbour's round arrived (phase II's RoundLedger)
        self.replay = replay
        self.run_id = run_id
        self.name = name
        self.neighbours = sorted(neighbours)
        self.timeout = timeout
        # my last round's deliveries, one task per neighbour, and the deadline that bounds
        # them (None: the final round's PutRound calls, bounded by their own deadlines)
        self._sending: dict[str, asyncio.Future[Any]] = {}
        self._sent: tuple[int, float | None] = (-1, None)

    async def exchange(self, t: int, message: Message, *, final: bool = False
                       ) -> dict[int, Received]:
        """Send my round-t message to every neighbour while collecting theirs."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        await self.delivered()
        await self.peers.repair(self.outbox, holds=self.holds, deadline=deadline)
        data = encode_round(message, run_id=self.run_id, sender=self.name, round_=t)
        self.outbox.remember(t, data)
        if final:
            self._sending = {n: asyncio.ensure_future(self.peers.put_round(
                n, data, timeout=self.timeout)) for n in self.neighbours}
            self._sent = (t, None)
        else:  # no timer per write: `delivered` checks them all against the deadline at once
            self._sending = {n: asyncio.ensure_future(self.peers.send_round(
                n, t, data, timeout=self.timeout, timed=False)) for n in self.neighbours}
            self._sent = (t, deadline)
        try:
            await self.replay.fill(t, deadline=deadline)
            return await self._collect(t, deadline)
        except BaseException:
            await self.abandon()
            raise

    async def drop(self, name: str) -> None:
        """A neighbour that left for good (agent/departure/): nothing more to or from it."""
        if name in self.neighbours:
            self.neighbours.remove(name)
        self.replay.pending.discard(name)
        await self.peers.forget(name)

    def join(self, name: str) -> None:
        """A new neighbour (a departure cut the graph): my round messages go to it too."""
        self.neighbours = sorted({*self.neighbours, name})

    async def recollect(self, t: int, message: Message) -> dict[int, Received]:
        """After a departure was decided during round t: deliver my rounds t - 1 and t again to
        the remaining neighbours, acknowledged (a delivery cut short by the silent neighbour's
        failure may have missed one; a copy already received is acknowledged as a duplicate),
        then collect their round-t messages."""
        await self.abandon()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        data = self.outbox.get(t)
        if data is None:
            data = encode_round(message, run_id=self.run_id, sender=self.name, round_=t)
            self.outbox.remember(t, data)
        sends = [self.outbox.get(t - 1), data] if t > 0 else [data]
        for each in sends:
            if each is not None:
                await all_or_first_error(self.peers.put_round(n, each, timeout=self.timeout)
                                         for n in self.neighbours)
        return await self._collect(t, deadline)

    async def _collect(self, t: int, deadline: float) -> dict[int, Received]:
        """The neighbours' round-t messages by `deadline` (the loop's clock), mending a stream
        that breaks while we wait."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return await self.peers.collect(
                    "round", t, timeout=max(0.0, deadline - loop.time()))
            except Interrupted:
                await self.peers.repair(self.outbox, holds=self.holds, deadline=deadline)

    async def delivered(self) -> None:
        """Wait until my last round message is written to every neighbour's stream (or, by
        PutRound, acknowledged); AgentFailure if a neighbour refused it or stayed unreachable
        until the deadline, or if a write was still under way at the deadline (the neighbour
        took no more data). Usually every write is done by the time the next round starts:
        then nothing waits and no timer is armed."""
        sending, self._sending = self._sending, {}
        tasks = list(sending.values())
        if all(task.done() for task in tasks):  # the common case: nothing waits, nothing armed
            _outcomes(tasks)
            return
        t, deadline = self._sent
        if deadline is None:  # the final round's PutRound calls, bounded by their deadlines
            await all_or_first_error(tasks)
            return
        try:
            async with asyncio.timeout_at(deadline):
                await all_or_first_error(tasks)
            return
        except TimeoutError:
            # all_or_first_error has cancelled the writes: the cancellation reaches each at
            # its next step, so a write still under way still says so here
            late = sorted(name for name, task in sending.items() if not task.done())
        if not late:
            # every write ended in the very turn the deadline fired (a process woken from a
            # SIGSTOP past it): their outcomes decide, as if they had ended in time
            _outcomes(tasks)
            return
        stuck = [name for name in late if self.peers.writing(name)] or late
        raise await self.peers.stalled(stuck[0], t)

    async def abandon(self) -> None:
        """Cancel a delivery still under way and collect its outcome, so that no task is left
        with an exception nobody retrieved."""
        sending, self._sending = self._sending, {}
        for task in sending.values():
            await settle(task)

    async def finish(self, t: int, message: Message) -> None:
        """Push my final message (round t, the run's last) and wait, still serving GetRound,
        until every neighbour has finished too (or the round deadline passes): a neighbour
        that restarts near the end can then still replay the rounds it needs from us."""
        try:
            await self.exchange(t, message, final=True)
            await self.delivered()
        except AgentFailure as exc:
            log.warning("%s finished, but not every neighbour confirmed it did: %s", self.name,
                        exc)
