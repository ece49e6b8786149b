"""Restart with the same command: whether this agent's state folder can resume its run, what
it reloads (mask, phase I digests, newest checkpoint, sent messages), and how it replays the
rounds pushed to its previous process.

The storage itself is agent/state.py (assignment, mask, checkpoints) and agent/outbox.py (sent
messages); the receive rules after a restart are efpsn/ledger.py's (RoundLedger.resumed_from,
PhaseOneLedger.restore). This module decides and sequences, so a reader finds resume here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent import departure_state
from agent.concurrency import all_or_first_error
from agent.intake import Intake
from agent.mailbox import Mailbox
from agent.options import AgentFailure, RefusedByNeighbour
from agent.peers import Peers
from agent.session import Session
from agent.state import Checkpoint, SavedAssignment, StateError, StateStore
from efpsn.departure.remask import drop_seeds
from efpsn.ledger import Verdict
from efpsn.masks.factory import mask_of
from efpsn.masks.refresh import MaskProvider
from efpsn.masks.seeds import EdgeSeeds
from efpsn.masks.zero_sum import MaskCoefficients

__all__ = ["Replay", "check_address", "check_resumable", "mask_provider", "reload_checkpoint",
           "reload_phase_one"]

log = logging.getLogger("efpsn.agent")


def check_resumable(saved: SavedAssignment, *, name: str, store: StateStore) -> None:
    """AgentFailure with one line saying why, unless `saved` is this agent's unfinished run,
    stopped after phase I (checked before this process serves anything)."""
    where = store.folder
    run = saved.assignment.run_id
    if saved.assignment.name != name:
        raise AgentFailure(f"the state in {where} belongs to {saved.assignment.name}, not {name}")
    unresumable = store.unresumable()
    if unresumable is not None:
        raise AgentFailure(unresumable)
    if saved.finished:
        raise AgentFailure(
            f"{name} already finished run {run} (state in {where}); remove that folder (or give "
            "another --results/--state-dir) to start a new run")
    if not store.phase_one_saved():
        raise AgentFailure(
            f"{name} was stopped during phase I of run {run}: its mask was never saved (state "
            f"in {where}), and drawing a new one would break the zero sum of the masks. This "
            "run cannot continue: start a new run")


def check_address(saved: SavedAssignment, *, name: str, advertised: str) -> None:
    """The restarted agent must be reached where its neighbours know it."""
    if advertised != saved.advertise:
        raise AgentFailure(
            f"{name} advertised {saved.advertise} in run {saved.assignment.run_id}, but would "
            f"now be reached at {advertised}: restart it with the same --listen/--advertise")


def reload_phase_one(store: StateStore, *, name: str, session: Session
                     ) -> tuple[MaskCoefficients | EdgeSeeds, dict[str, float],
                                dict[str, dict[str, bytes]]]:
    """The saved phase I result (a resumed agent never redraws its mask or its seeds), with
    phase I's statistics and the digests of what it received."""
    coefficients = session.problem.N
    try:
        if session.config.refresh.refreshed:
            saved_seeds = store.load_seeds(run_id=session.run_id)
            if saved_seeds is None:
                raise StateError(f"no edge seeds in {store.seeds_path}")
            text, stats, received = saved_seeds
            seeds = EdgeSeeds.from_json(text, agent=session.index)
            # a neighbour that left in phase I (agent/phase_one_leave.py) has no seeds here
            record = departure_state.load(store.folder, run_id=session.run_id)
            left = {d.agent for d in record["decided"] if d.phase_one  # not a late one:
                    and session.index not in d.late} if record else set()  # it had its seed
            if seeds.neighbours not in (tuple(sorted(session.names)),
                                        tuple(sorted(set(session.names) - left))):
                raise ValueError(f"edge seeds are for neighbours {list(seeds.neighbours)}, "
                                 f"expected {sorted(session.names)}")
            # one that left during the secure sum after phase I: phase II ran without its seed
            return drop_seeds(seeds, left), stats, received
        saved = store.load_mask(run_id=session.run_id)
    except (StateError, ValueError) as exc:
        raise AgentFailure(f"{name} cannot resume: {exc}") from None
    if saved is None or saved.mask.num_coefficients != coefficients:
        raise AgentFailure(f"{name} cannot resume: no usable mask for {coefficients} "
                           f"coefficients in {store.mask_path}")
    return saved.mask, saved.stats, saved.received


def mask_provider(session: Session, phase_one: MaskCoefficients | EdgeSeeds) -> MaskProvider:
    """This agent's mask of every round: phase I's fixed mask, or the masks its edge seeds give
    (fading, or refreshed with period floor(t / R))."""
    return mask_of(phase_one, spec=session.problem.noise_spec, refresh=session.config.refresh)


def reload_checkpoint(store: StateStore, *, name: str, run_id: str,
                      expected: dict[str, tuple[int, ...]]) -> Checkpoint | None:
    """The newest intact checkpoint whose tensors have the algorithm's names and shapes."""
    try:
        return store.load_checkpoint(run_id=run_id, expected=expected)
    except StateError as exc:
        raise AgentFailure(f"{name} cannot resume: {exc}") from None


class Replay:
    """After a restart, round-t messages the neighbours pushed to this agent's previous process
    are pulled from them (Agent.GetRound) until each says it has not reached round t yet: from
    then on its pushes reach this process. A fresh start pulls nothing."""

    def __init__(self, *, peers: Peers, intake: Intake, mailbox: Mailbox,
                 neighbours: set[str], describe_loss: Callable[[str, int, str], str],
                 on_loss: Callable[[str], None]) -> None:
        self.peers = peers
        self.intake = intake  # a pulled message is taken as a pushed one (agent/intake.py)
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
            judgement = self.intake.take_round(message, senders={name}, round_=t)
        except ValueError as exc:
            raise AgentFailure(f"neighbour {name} served a bad round {t}: {exc}",
                               blame=name) from None
        if judgement.verdict in (Verdict.ACCEPT, Verdict.DUPLICATE):
            return  # filed now, or already (its push reached this process too)
        # REFUSE: a different copy of a round already taken; LATER: round t outside the
        # window this agent is at (never for the round being filled): either is a failure
        raise AgentFailure(f"neighbour {name} served round {t}: {judgement.reason}")
