"""How a neighbour's round message is taken, in one place, however it arrives (a PutRound push,
a message of its round stream, a restart's pull of a round pushed to the previous process):
parse (the one wire validation, efpsn/wire/rounds.py) -> the ledger's verdict (efpsn/ledger.py)
-> the mailbox (an accepted message only) -> the outcome, which each caller turns into its own
answer (an acknowledgement or a refusal; for the replay, going on or failing)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from agent.life import Life
from agent.mailbox import Mailbox
from efpsn.ledger import Judgement, Verdict
from efpsn.wire.rounds import parse_round

__all__ = ["Intake"]


class Intake:
    """Takes round messages into this agent's mailbox under its life's round ledger."""

    def __init__(self, *, life: Life, mailbox: Mailbox) -> None:
        self.life = life
        self.mailbox = mailbox

    def take_round(self, message: Any, *, senders: Collection[str],
                   round_: int | None = None) -> Judgement:
        """Validate `message` (a RoundMessage: from one of `senders`, of round `round_` when
        given; WireError, a ValueError, otherwise), judge it, file it when accepted, and return
        the judgement. Only in phase II (the life holds a session and a round ledger)."""
        session, ledger = self.life.session, self.life.rounds
        if session is None or ledger is None:
            raise RuntimeError(f"round messages taken in stage {self.life.stage.value}")
        record = parse_round(message, run_id=session.run_id, senders=senders,
                             shapes=session.message_shapes, seed=ledger.seed, round_=round_)
        judgement = ledger.judge(record.sender, record.round, record.digest)
        if judgement.verdict == Verdict.ACCEPT:
            self.mailbox.put("round", record.round, record.sender, record.tensors)
        return judgement
