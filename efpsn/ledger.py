"""Whether a neighbour's message is acceptable, decided in one place and without I/O.

`RoundLedger` owns phase II's rules: the receive window (the round being collected and the
next), the digests of what each neighbour delivered (a retry must repeat the first copy
exactly), how long consumed rounds are remembered, and the resume point of a restarted agent.
`FirstCopyLedger` does the same for a phase whose messages each come once (the statistics
flood), and `PhaseOneLedger` for phase I's keys and shares. The phase that owns the messages
(agent/phases/) asks for a verdict on every message that passed the wire checks; the client side
asks `holds` whether a neighbour's message confirms one of ours. Nothing here reads a socket.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass

__all__ = ["FirstCopyLedger", "Judgement", "PhaseOneLedger", "RoundLedger", "Verdict"]


class Verdict(enum.Enum):
    """What to do with a message."""

    ACCEPT = "accept"  # new and in the window: file it
    DUPLICATE = "duplicate"  # a copy of what was delivered (or consumed): acknowledge, drop
    LATER = "later"  # ahead of the window: the sender retries (UNAVAILABLE)
    REFUSE = "refuse"  # never acceptable: `code` says which gRPC status, `reason` why


@dataclass(frozen=True)
class Judgement:
    """A verdict, the gRPC status name for a refusal (or LATER) and a reason saying why."""

    verdict: Verdict
    reason: str = ""
    code: str = ""  # "INVALID_ARGUMENT", "FAILED_PRECONDITION" or "UNAVAILABLE"


class RoundLedger:
    """Phase II's receive rules for one agent.

    position: the round being collected (every round below it was consumed). A round-t message
    is accepted while t is position or position + 1 (a neighbour is never more than one round
    ahead); later rounds wait (LATER); consumed rounds are only compared with the digest
    remembered for them (the newest `keep` rounds), or acknowledged blindly when they predate
    the round this process resumed at (its previous process consumed them). Rounds past
    `last` (the run's final round) are refused.

    seed: the secret key of the digests this ledger compares (efpsn/wire/rounds.py's
    round_digest), drawn anew for every ledger unless given (tests). The digests live in
    memory only, with the ledger: a restarted agent's ledger starts empty (rounds before
    `resumed_from` are acknowledged blindly), so the seed is never saved or sent.
    """

    def __init__(self, *, last: int, keep: int, position: int = 0,
                 resumed_from: int | None = None, seed: int | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if seed is not None and not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        self.seed = secrets.randbits(64) if seed is None else seed
        self.last = last
        self.keep = keep
        self.position = position
        self.resumed_from = resumed_from
        self._digests: dict[int, dict[str, bytes]] = {}
        self._floor = position - keep  # every round below it is forgotten

    def judge(self, sender: str, round_: int, digest: bytes) -> Judgement:
        """The verdict on `sender`'s round-`round_` message with content digest `digest`; an
        accepted message is recorded (its later copies are duplicates)."""
        t = round_
        if t > self.last:
            return Judgement(Verdict.REFUSE, f"round {t} is beyond the run's last round "
                             f"{self.last}", "INVALID_ARGUMENT")
        known = self._digests.get(t, {}).get(sender)
        if t < self.position:
            if known is None and self.resumed_from is not None and t < self.resumed_from:
                return Judgement(Verdict.DUPLICATE, "round consumed before this agent restarted")
            if known is None:
                return Judgement(Verdict.REFUSE, f"round {t} is behind this agent (at round "
                                 f"{self.position}) and older than the rounds it remembers",
                                 "FAILED_PRECONDITION")
            if known != digest:
                return Judgement(Verdict.REFUSE, f"round {t} from {sender} conflicts with the "
                                 "copy already received", "INVALID_ARGUMENT")
            return Judgement(Verdict.DUPLICATE, "duplicate of a consumed round")
        if t > self.position + 1:
            return Judgement(Verdict.LATER, f"this agent is at round {self.position}; round {t} "
                             "is ahead of its window, retry", "UNAVAILABLE")
        if known is not None:
            if known != digest:
                return Judgement(Verdict.REFUSE, f"a different round message for round {t} "
                                 f"from {sender} was already received (a duplicate must repeat "
                                 "the first copy exactly)", "INVALID_ARGUMENT")
            return Judgement(Verdict.DUPLICATE, "duplicate ignored")
        self._digests.setdefault(t, {})[sender] = digest
        return Judgement(Verdict.ACCEPT)

    def holds(self, sender: str, round_: int) -> bool:
        """Whether `sender`'s round-`round_` message was delivered (and is still remembered)."""
        return sender in self._digests.get(round_, {})

    def digest(self, sender: str, round_: int) -> bytes | None:
        """The remembered digest of `sender`'s round-`round_` message."""
        return self._digests.get(round_, {}).get(sender)

    def advance(self, position: int) -> None:
        """Round `position - 1` is consumed: move the window, forget rounds older than `keep`."""
        if position < self.position:
            raise ValueError(f"the window only moves forward: {self.position} -> {position}")
        self.position = position
        floor = position - self.keep
        if floor - self._floor > len(self._digests):  # a long jump: one pass over what is held
            for t in [t for t in self._digests if t < floor]:
                del self._digests[t]
        else:  # round by round: only the rounds that just fell out
            for t in range(self._floor, floor):
                self._digests.pop(t, None)
        self._floor = max(self._floor, floor)

    def remembered(self) -> int:
        """How many (round, sender) digests are held (bounded by keep x neighbours + window)."""
        return sum(len(by) for by in self._digests.values())


class FirstCopyLedger:
    """The receive rules of a phase whose messages each come once: one message per slot and
    sender (phase I's key, its shares; a round of the statistics flood), the first copy wins:
    identical copies are acknowledged, a different one is refused; once the phase is over here
    (or restored from disk after a restart) only copies of what was received are
    acknowledged, anything new is refused. `phase` names it in the refusals."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self._digests: dict[str, dict[str, bytes]] = {}
        self.closed = False

    def judge(self, slot: str, sender: str, digest: bytes, *, what: str | None = None
              ) -> Judgement:
        """The verdict on `sender`'s message for `slot` with this digest (`what`: the message's
        name in a refusal, the slot's by default)."""
        what = slot if what is None else what
        known = self._digests.get(slot, {}).get(sender)
        if known is not None and known == digest:
            return Judgement(Verdict.DUPLICATE, f"duplicate of a {self.phase} message"
                             if self.closed else "duplicate ignored")
        if self.closed:
            return Judgement(Verdict.REFUSE, f"{self.phase} is over at this agent, and this "
                             f"{what} message is not the one it received from {sender}",
                             "FAILED_PRECONDITION")
        if known is not None:
            return Judgement(Verdict.REFUSE, f"a different {what} message from {sender} was "
                             "already received (a duplicate must repeat the first copy "
                             "exactly)", "INVALID_ARGUMENT")
        self._digests.setdefault(slot, {})[sender] = digest
        return Judgement(Verdict.ACCEPT)

    def close(self) -> None:
        """The phase is over: from now on only copies of what was received are acknowledged."""
        self.closed = True

    def received(self) -> dict[str, dict[str, bytes]]:
        """slot -> sender -> digest of what was accepted."""
        return {slot: dict(by) for slot, by in self._digests.items() if by}

    def restore(self, received: dict[str, dict[str, bytes]]) -> None:
        """The phase finished in a previous process: remember its digests, accept nothing new."""
        for slot, by in received.items():
            self._digests.setdefault(slot, {}).update(by)
        self.closed = True


class PhaseOneLedger(FirstCopyLedger):
    """Phase I's receive rules: one key and one batch of shares per neighbour
    (FirstCopyLedger's rules; saved with the mask, restored after a restart)."""

    KINDS = ("key", "shares")

    def __init__(self) -> None:
        super().__init__("phase I")

    def judge(self, slot: str, sender: str, digest: bytes, *, what: str | None = None
              ) -> Judgement:
        """The verdict on `sender`'s phase I message of kind `slot` with this digest."""
        if slot not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {slot!r}")
        return super().judge(slot, sender, digest, what=what)

    def restore(self, received: dict[str, dict[str, bytes]]) -> None:
        super().restore({kind: by for kind, by in received.items() if kind in self.KINDS})
