"""Restart with the same command: whether this agent's state folder can resume its run, and
its newest checkpoint (the rounds pushed to its previous process are replayed by
agent/exchange.py's Replay).

The storage itself is agent/state.py (assignment, mask, checkpoints) and agent/outbox.py (sent
messages); each phase reloads its own result (agent/phases/: PhaseOne.reload, SecureSum.reload)
and the receive rules after a restart are efpsn/ledger.py's (RoundLedger.resumed_from,
PhaseOneLedger.restore); agent/pipeline.py sequences a restart.
"""

from __future__ import annotations

import logging

from agent.options import AgentFailure
from agent.state import Checkpoint, SavedAssignment, StateError, StateStore

__all__ = ["check_address", "check_resumable", "reload_checkpoint"]

log = logging.getLogger("efpsn.agent")


def check_resumable(saved: SavedAssignment, *, name: str, store: StateStore) -> None:
    """AgentFailure with one line saying why, unless `saved` is this agent's unfinished run,
    stopped after phase I, or a joiner's (checked before this process serves anything)."""
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
    # a party that joined resumes its new edges' exchange (saved before it sent anything:
    # agent/departure/exchange_file.py), its phase I
    if not store.phase_one_saved() and not saved.assignment.join_round:
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


def reload_checkpoint(store: StateStore, *, name: str, run_id: str,
                      expected: dict[str, tuple[int, ...]]) -> Checkpoint | None:
    """The newest intact checkpoint whose tensors have the algorithm's names and shapes."""
    try:
        return store.load_checkpoint(run_id=run_id, expected=expected)
    except StateError as exc:
        raise AgentFailure(f"{name} cannot resume: {exc}") from None
