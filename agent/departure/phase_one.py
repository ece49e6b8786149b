"""A neighbour that leaves in phase I itself, at one agent: its key or its shares never come.

Phase I (agent/phases/phase_one.py) sends and collects through this object when departures are
on (agent/membership.py's PhaseOneMembership). A neighbour silent past the departure deadline is
reported to the coordinator as in phase II (agent/departure/silence.py: only a neighbour that
does not answer GetStatus is named; the report says
it comes from phase I, at round 0), and this agent waits for the decision, the same for every
agent (coordinator/departures.py): a departure at round 0 (re-base round n), marked as one in
phase I. It then finishes phase I without the departed neighbour: the Masker / SeedExchange
still draws its shares or seed (so every other edge's integers are the replay's) but sends and
awaits nothing more of it (`drop`), so the mask holds no term of that edge. Phase II adopts the
decision before round 0 (Silence.adopt: the new edges' seeds, the re-base at n), and the run
equals `efpsn simulate --leave agentK@0:n` bit for bit.

With --scale standard, the secure sum of column statistics between phase I and phase II
(agent/phases/secure_sum.py) reports and recovers through this object too: an agent far from the
departed one, already flooding, reports from there (round 0, phase I); a departure during the
flood is decided the same way. The flood then starts again on the remaining graph, without the
departed agents' vectors and pads, so the totals (and l2 = 1/N_total) are the remaining
agents', as `efpsn simulate --leave agentK@I` computes them.

Why not restart phase I on the remaining graph: agents far from the departed one may already
have finished phase I and stepped round 0 by the time anyone knows; a departure at round 0
changes nobody's weights but its neighbours' (drop-node weights) until the agreed re-base, so
their rounds stay valid, and nothing of phase I is redone. A refusal, no decision before the
deadline or no coordinator end the agent with exit 2 naming the silent neighbour, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from agent.departure import records
from agent.departure.reports import report_silence
from agent.mailbox import Mailbox
from agent.options import AgentFailure, RefusedByNeighbour
from agent.peers import Peers
from agent.session import Session
from agent.state import StateStore
from efpsn.departure.membership import Departure
from efpsn.masks.seeds import SeedExchange
from efpsn.masks.zero_sum import Masker

__all__ = ["Decided", "PhaseOneDecision", "PhaseOneDepartures"]

log = logging.getLogger("efpsn.agent")


@dataclass
class PhaseOneDecision:
    """Departures decided in phase I, as phase II adopts them (agent/departure/silence.py's
    Silence.adopt): what PhaseOneDepartures collected, or a restart reloaded."""

    decided: list[Departure]
    names: dict[int, str]
    joining: dict[str, tuple[int, str]]  # new neighbour -> (index, address)
    epoch: int

    @classmethod
    def reloaded(cls, record: dict[str, Any], session: Session) -> PhaseOneDecision:
        """A restart before phase II adopted them (agent/departure/records.py's record, not
        adopted): the departed neighbours dropped from the session again, as phase I had. An
        end of a new edge adopts it again: its seed exchange resumes from what it saved
        (agent/departure/exchange_file.py), or starts, when nothing of it was saved, hence
        sent."""
        name = session.assignment.name
        for d in record["decided"]:
            gone = record["names"][d.agent]
            if gone in session.neighbour_names:
                session.drop(gone, reason=f"{gone} was declared gone in phase I by the "
                             "coordinator (silent past the departure deadline); it cannot "
                             "come back to this run")
        log.warning("%s resumes with the departures %s decided in phase I", name,
                    ", ".join(d.label() for d in record["decided"]))
        return cls(decided=record["decided"], names=record["names"], epoch=record["epoch"],
                   joining={n: (j, address) for n, (j, address, _) in record["joining"].items()})


class PhaseOneDepartures:
    """Phase I's sends and waits, going on without a neighbour the coordinator declares gone;
    `decided`, `names`, `joining` and `epoch` are what phase II adopts."""

    def __init__(self, *, session: Session, peers: Peers, mailbox: Mailbox,
                 coordinator: grpc.aio.Channel, deadline: float, wait: float,
                 deciding: Callable[[bool], None]) -> None:
        self.session = session
        self.peers = peers
        self.mailbox = mailbox
        self.coordinator = coordinator
        self.deadline = deadline  # how long a neighbour may stay silent
        self.wait = wait  # how long a report waits for the others to report too
        self.deciding = deciding  # a new neighbour may call a moment before I hear a decision
        self.masker: Masker | SeedExchange | None = None
        self.decided: list[Departure] = []
        self.names: dict[int, str] = {}
        self.joining: dict[str, tuple[int, str]] = {}
        self.epoch = 0

    def save(self, store: StateStore) -> None:
        """The decisions so far (none: nothing), saved before phase I's result and the totals
        of the secure sum are, so that a restart before phase II adopted them knows who left
        (agent/departure/records.py, `adopted` False; Silence.adopt re-adopts them)."""
        if self.decided:
            records.save(
                store, run_id=self.session.run_id, decided=self.decided, epoch=self.epoch,
                events=[], names=self.names, seeds={}, adopted=False,
                joining={n: self.session.joining[n] for n in self.joining})

    async def send_all(self, method: str, make: Callable[[str], Any], *,
                       timeout: float | None = None) -> None:
        """Deliver make(name) to every neighbour (Peers.send_all's way, each waiting up to the
        departure deadline, not `timeout`); one silent past it is reported, and the others are
        not sent to again."""
        pending = sorted(self.session.neighbour_names)
        while pending:
            outcomes = await asyncio.gather(
                *(self.peers.send(n, method, make(n), timeout=self.deadline) for n in pending),
                return_exceptions=True)
            failed = {n: o for n, o in zip(pending, outcomes, strict=True)
                      if isinstance(o, BaseException)}
            for outcome in failed.values():
                if not isinstance(outcome, AgentFailure) or isinstance(outcome,
                                                                       RefusedByNeighbour):
                    raise outcome  # a neighbour that answers is not gone: its refusal stands
            if not failed:
                return
            await self.recover(sorted(failed), failed[min(failed)])
            pending = sorted(set(failed) & self.session.neighbour_names)

    async def collect(self, kind: str) -> dict[int, Any]:
        """Every remaining neighbour's `kind` ("key", "shares") of phase I, by index."""
        while True:
            try:
                return await self.peers.collect(kind, 0, timeout=self.deadline)
            except AgentFailure as failure:
                missing = sorted(n for n in self.session.neighbour_names
                                 if not self.mailbox.has(kind, 0, n))
                if not missing:
                    raise
                await self.recover(missing, failure)

    async def recover(self, missing: list[str], failure: AgentFailure) -> None:
        """Report the missing neighbours that do not answer and apply the decision to phase I;
        `failure` (with the coordinator's reason) when there is none."""
        name = self.session.assignment.name
        silent = await self.peers.unresponsive(missing)
        log.warning("%s: %s; %s", name, failure,
                    f"asking the coordinator whether {', '.join(silent)} left in phase I"
                    if silent else f"{', '.join(missing)} answer (waiting themselves): waiting "
                    "for the coordinator's decision")
        self.deciding(True)
        try:
            found, names, joining = await report_silence(
                self.coordinator, session=self.session, name=name, round_=0, silent=silent,
                epoch=self.epoch, timeout=self.wait, phase_one=True,
                last=self.session.config.iterations.count or 0)  # 0: --scale standard's
        except AgentFailure as undecided:
            raise AgentFailure(f"{failure}; {undecided}",
                               blame=undecided.blame and failure.blame) from None
        finally:
            self.deciding(False)
        new = [d for d in found if d.agent not in {g.agent for g in self.decided}]
        if not new:
            raise AgentFailure(f"{name}: the coordinator's answer holds no new departure")
        self.decided.extend(new)
        self.names.update(names)
        self.epoch += 1
        rebase_round = min(d.rebase_round for d in new)
        for other, (index, address) in joining.items():  # admitted before phase II adopts it
            self.joining[other] = (index, address)
            self.session.joining[other] = (index, address, rebase_round)
        gone = [d.agent for d in new if names[d.agent] in self.session.neighbour_names]
        for j in gone:
            left = names[j]
            self.session.drop(left, reason=f"{left} was declared gone in phase I by the "
                              "coordinator (silent past the departure deadline); it cannot "
                              "come back to this run")
            await self.peers.forget(left)
        if self.masker is not None:
            self.masker.drop(gone)
        log.warning("%s: the coordinator decided: %s (in phase I); %s", name,
                    "; ".join(d.label() for d in new),
                    f"going on without {', '.join(names[j] for j in gone)}" if gone
                    else "no neighbour of mine left")


Decided = PhaseOneDecision | PhaseOneDepartures  # what phase II adopts (Silence.adopt)

