"""Whether a neighbour's message is acceptable, decided in one place and without I/O.

`RoundLedger` owns phase II's rules: the receive window (the round being collected and the
next), the digests of what each neighbour delivered (a retry must repeat the first copy
exactly), how long consumed rounds are remembered, and the resume point of a restarted agent.
`PhaseOneLedger` does the same for phase I's keys and shares. The servicer (agent/servicer.py)
asks for a verdict on every message that passed the wire checks; the client side asks
`holds` whether a neighbour's message confirms one of ours. Nothing here reads a socket.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass

__all__ = ["Judgement", "PhaseOneLedger", "RoundLedger", "Verdict"]


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


class PhaseOneLedger:
    """Phase I's receive rules: one key and one batch of shares per neighbour, identical copies
    acknowledged; once phase I is over here (or restored from disk after a restart) only copies
    of what was received are acknowledged, anything new is refused."""

    KINDS = ("key", "shares")

    def __init__(self) -> None:
        self._digests: dict[str, dict[str, bytes]] = {kind: {} for kind in self.KINDS}
        self.closed = False

    def judge(self, kind: str, sender: str, digest: bytes) -> Judgement:
        """The verdict on `sender`'s phase I message of `kind` with this digest."""
        if kind not in self._digests:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        known = self._digests[kind].get(sender)
        if known is not None and known == digest:
            return Judgement(Verdict.DUPLICATE, "duplicate of a phase I message" if self.closed
                             else "duplicate ignored")
        if self.closed:
            return Judgement(Verdict.REFUSE, f"phase I is over at this agent, and this {kind} "
                             f"message is not the one it received from {sender}",
                             "FAILED_PRECONDITION")
        if known is not None:
            return Judgement(Verdict.REFUSE, f"a different {kind} message from {sender} was "
                             "already received (a duplicate must repeat the first copy "
                             "exactly)", "INVALID_ARGUMENT")
        self._digests[kind][sender] = digest
        return Judgement(Verdict.ACCEPT)

    def close(self) -> None:
        """Phase I is over: from now on only copies of what was received are acknowledged."""
        self.closed = True

    def received(self) -> dict[str, dict[str, bytes]]:
        """kind -> sender -> digest of what was accepted (saved with the mask)."""
        return {kind: dict(by) for kind, by in self._digests.items() if by}

    def restore(self, received: dict[str, dict[str, bytes]]) -> None:
        """Phase I finished in a previous process: remember its digests, accept nothing new."""
        for kind, by in received.items():
            if kind in self._digests:
                self._digests[kind].update(by)
        self.closed = True
