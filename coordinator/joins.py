"""The coordinator's decision of when a party joins, without I/O: the members' polls in, one
decision out, the same for every agent.

A run with seats that join later (the run parameter `late`) has every member poll the
coordinator before stepping each check round: every JOIN_CHECK_EVERY-th round, and its last
(`checked`). A party that asks to join (`request`) is given the smallest check round that no
member has polled yet, R: every member polls there before stepping it, so every member hears
the decision by R, and the decision takes effect at R for everyone (efpsn/departure/joins.py's
rule: the topology over the members with the newcomer, its new edges seeded, everyone
re-based). Decisions are numbered with the departures' (`epoch`: the new edges' seeds are
drawn per decision); a join waits for a departure being re-based. A join the run can no
longer take is refused with its reason: the members finished, or the check round would be the
run's last round.

Nothing here sees data: names and round numbers only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from efpsn.departure.joins import JOIN_CHECK_EVERY, Join
from efpsn.departure.membership import Reconfiguration

__all__ = ["JoinBoard", "JoinRefused"]


class JoinRefused(ValueError):
    """A join the run cannot take (its reason is the message)."""


@dataclass
class JoinBoard:
    """Every join of one run: the members' polls, the decisions (see the module's doc)."""

    members: set[str]
    polled: dict[str, int] = field(default_factory=dict)  # member -> its last check round
    finished: dict[str, int] = field(default_factory=dict)  # member -> the round it ended at
    decided: list[tuple[int, Join, str]] = field(default_factory=list)  # (number, join, name)
    graphs: dict[int, Reconfiguration] = field(default_factory=dict)  # seat -> its join's
    caps: dict[int, int] = field(default_factory=dict)  # seat -> the members' cap before it

    @property
    def furthest(self) -> int:
        """The largest check round any member has polled (0: none yet)."""
        return max(self.polled.values(), default=0)

    def poll(self, name: str, round_: int, *, finished: bool = False) -> None:
        """Member `name` is about to step round `round_` (a check round), or ended there."""
        if name not in self.members:
            raise JoinRefused(f"{name} is no member of this run")
        self.polled[name] = max(round_, self.polled.get(name, 0))
        if finished:
            self.finished[name] = round_

    def decide(self, index: int, *, pending_until: int | None, last: int) -> Join:
        """The join of seat `index`: at the next check round nobody has polled (and
        after a departure being re-based, `pending_until`); nothing recorded (`record`).
        JoinRefused when the run cannot take it any more (`last`: the members' last round as
        it stands)."""
        if self.finished:
            end = max(self.finished.values())
            raise JoinRefused(f"the run ended at round {end}")
        if any(j.agent == index for _, j, _ in self.decided):
            raise JoinRefused("it has joined this run already")
        # after every round polled, a departure's re-base, and the joins decided before
        furthest = max(self.furthest, pending_until or 0,
                       *(j.round for _, j, _ in self.decided))
        r = (furthest // JOIN_CHECK_EVERY + 1) * JOIN_CHECK_EVERY
        if r >= last:
            raise JoinRefused(f"the members are at round {self.furthest} and the run's last "
                              f"round is {last}: a join takes effect at a check round before "
                              f"it (the next is {r})")
        return Join(agent=index, round=r)

    def record(self, join: Join, name: str, *, graph: Reconfiguration, last: int) -> int:
        """A decided join, numbered after the joins before it (the number its new edges' seeds
        are drawn for), with the members' graph from its round and their cap before it; the
        joiner is a member from now on (it polls too). Its number."""
        number = len(self.decided) + 1
        self.decided.append((number, join, name))
        self.graphs[join.agent] = graph
        self.caps[join.agent] = last
        self.members.add(name)
        return number

    def since(self, epoch: int) -> list[tuple[int, Join, str]]:
        """The joins decided after decision `epoch`."""
        return [entry for entry in self.decided if entry[0] > epoch]

