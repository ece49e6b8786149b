"""The coordinator's decision of who left, without I/O: reports of silent neighbours in, one
decision out, the same for every agent.

An agent whose neighbour sent nothing past its departure deadline reports the neighbours it
misses that do not answer (GetStatus) and the round it is collecting; a missing neighbour that
answers is alive and waits itself, so it is not named (else it could be declared gone because
its own report comes a moment later), and a report naming nobody still counts as a live
agent's. Rounds are synchronous, so when an agent is gone for
good every other agent ends up waiting (for it, or for someone who waits for it) and reports.
The rule, public and deterministic:

- decide only when every agent still in the run has reported, except the agents the reports
  name silent and that did not report themselves: those are gone. Whoever reports is alive and
  is not declared gone, so two neighbours that disagree (each says the other is silent) cannot
  both go on: both wait, and nothing is decided until the deadline;
- agent d left at round T = the smallest round a report names it silent at; the reporters that
  name it one round later used its round-T message (Departure.late); the re-base round is
  R = T + the number of agents at the start (efpsn.departure.membership.parse_leave's rule), which
  no agent can have reached: every one is waiting at T + 2 at most (T = 0 too: d finished phase I
  and sent no round message);
- reports are counted per decision (`epoch`); a report of an older epoch is answered with the
  decisions it missed;
- a report from an agent still in phase I (waiting for a neighbour's key or shares) counts as
  one at round 0: the agent it misses left in phase I (Departure.phase_one), decided as a
  departure at round 0 (R = n: agents far from it may step round 0 before anyone knows);
  its neighbours that report it from round 0 of phase II got its shares (it died while
  sending them) and sent their round-0 message with its terms: they are its `late` ones;
- the last round allowed for a re-base is the larger of the reporters' cap (Report.last:
  each agent's, extended by the re-bases it applied) and the coordinator's, which follows
  the decisions: a re-base that extends the cap (the stop rule's, efpsn/optimize/stopping.py's
  StopRule.rebased, given as `extend`) extends it here too, so a second departure after the
  original cap is decided like the first (0: not known, with --scale standard's L2 weight
  from the agents' secure sum: not checked here);
- a decision that cuts the graph joins the pieces (efpsn.departure.membership.reconfigure, the rule the
  agents apply at the re-base round): the ends of each new edge are told each other's address;
- an agent that stopped on the stop rule's certificate reports its stop round S (`finish`):
  it is accounted for, neither waiting nor silent. A departure decided while some agents
  finished (agents far from the departed one completed the last window before it mattered,
  efpsn/departure/last_window.py) is decided as "the run had stopped at S" (Departure.stopped):
  every finished agent must name the same S, the departure and every report must come before it;
  nobody re-bases and no edge is added: the others end with their check round's model;
- a departure too late to re-base (R >= the cap N as above) is decided as "the run ended at
  the cap N" (Departure.capped): an agent that finished N (far from the departed one, it
  never waited) reports it (`finish` with `capped`), the others end with their iterate of the
  round they wait at (efpsn/departure/last_window.py, CapEnd). Every finished agent must name N,
  every report and the departure must come before it; nobody re-bases, no edge is added.

Nothing here sees data: names and round numbers only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from efpsn.departure.membership import MIN_PARTIES, Departure, Reconfiguration, reconfigure
from efpsn.topology import Graph

__all__ = ["DepartureBoard", "Refused", "Report"]


class Refused(ValueError):
    """A report the coordinator cannot take (its reason is the message)."""


@dataclass(frozen=True)
class Report:
    """`sender` collects round `round` and misses the round messages of `silent`."""

    sender: str
    round: int
    silent: frozenset[str]
    epoch: int
    phase_one: bool = False  # the sender is still in phase I (round 0)
    last: int = 0  # the sender's last round as it stands (its extended cap); 0: not known


class DepartureBoard:
    """Every departure of one run, decided from the agents' reports (see the module doc)."""

    def __init__(self, names: Sequence[str], *, iterations: int,
                 graph: Graph | None = None,
                 extend: Callable[[Reconfiguration, int, int], int] | None = None,
                 absent: set[int] | None = None) -> None:
        self.names = list(names)  # index order: names[i] is agent index i
        # seats that are no part of the run yet (late ones that have not joined)
        self.absent = set() if absent is None else set(absent)
        self.iterations = iterations  # the cap: the last round, extended by re-bases
        self.extend = extend  # (remaining graph, re-base round, cap) -> the cap from there
        self.graph = graph  # the run's graph, joined after each decision that cut it
        self.new_edges: list[tuple[int, int, int]] = []  # (epoch, a, b): edges a decision added
        self.decided: list[Departure] = []
        self.epoch = 0
        self.failure: str | None = None  # reports that cannot be decided: every waiter stops
        self.finished: dict[str, int] = {}  # agents that stopped on the certificate: round S
        self.at_cap: set[str] = set()  # finished agents that ended at the cap (no certificate)
        self._reports: dict[str, Report] = {}

    @property
    def gone(self) -> set[str]:
        return {self.names[d.agent] for d in self.decided}

    def refusal(self, sender: str) -> str | None:
        """Why `sender` may not take part any more (it was declared gone), or None."""
        for d in self.decided:
            if self.names[d.agent] == sender:
                return (f"{sender} was declared gone at round {d.round} (it sent nothing past "
                        "the departure deadline); the others finished without it: it cannot "
                        "come back to this run")
        return None

    def report(self, report: Report) -> bool:
        """File a report; True when it made a decision (self.decided grew). Refused when the
        sender is gone or unknown, or when the reports contradict each other."""
        if report.sender not in self.names:
            raise Refused(f"{report.sender!r} is not an agent of this run")
        if self.failure is not None:
            raise Refused(self.failure)
        reason = self.refusal(report.sender)
        if reason is not None:
            raise Refused(reason)
        if report.epoch > self.epoch:
            raise Refused(f"{report.sender} reports epoch {report.epoch}; only {self.epoch} "
                          "departure decisions were made")
        if report.epoch < self.epoch:
            return False  # it missed a decision: it gets it at once
        unknown = sorted(report.silent - set(self.names))
        if unknown:
            raise Refused(f"{report.sender} reports unknown agents {unknown} silent")
        if report.phase_one and report.round != 0:
            raise Refused(f"{report.sender} reports from phase I at round {report.round}")
        self._reports[report.sender] = dataclasses.replace(report,
                                                           silent=report.silent - self.gone)
        return self._decide()

    def finish(self, sender: str, round_: int, *, capped: bool = False) -> bool:
        """`sender` stopped at round `round_` on the stop rule's certificate (`capped`: at the
        run's cap, no certificate); True when that made a decision (it was the last agent to
        account for)."""
        if sender not in self.names:
            raise Refused(f"{sender!r} is not an agent of this run")
        reason = self.refusal(sender)
        if reason is not None:
            raise Refused(reason)
        if round_ < 1:
            raise Refused(f"{sender} reports it finished at round {round_}")
        self.finished[sender] = round_
        if capped:
            self.at_cap.add(sender)
        self._reports.pop(sender, None)
        if self.failure is not None or not self._reports:
            return False
        return self._decide()

    def withdraw(self, sender: str) -> None:
        """The sender stopped waiting (its call ended): its report no longer counts."""
        self._reports.pop(sender, None)

    def since(self, epoch: int) -> list[Departure]:
        """Every departure decided (all of them: an agent applies the ones it lacks)."""
        return list(self.decided) if epoch < self.epoch else []

    def joining(self, sender: str, epoch: int) -> list[int]:
        """The agents `sender` shares a new edge with, added by the decisions after `epoch`."""
        me = self.names.index(sender)
        return sorted({b if a == me else a for e, a, b in self.new_edges
                       if e > epoch and me in (a, b)})

    def joined(self, index: int, graph: Graph) -> None:
        """Seat `index` joined (coordinator/joins.py): a member from now on, on `graph`."""
        self.absent.discard(index)
        self.graph = graph

    def _decide(self) -> bool:
        live = (set(self.names) - self.gone - set(self.finished)
                - {self.names[i] for i in self.absent})
        reporters = set(self._reports)
        silent = (set().union(*(r.silent for r in self._reports.values())) - reporters
                  - set(self.finished))
        if not silent or reporters | silent != live or not reporters:
            return False
        try:
            staying = live - silent
            if len(staying) + len(self.finished) < MIN_PARTIES:
                raise Refused(f"{', '.join(sorted(silent, key=self.names.index))} silent: "
                              f"only {', '.join(sorted(staying)) or 'nobody'} would stay, and a "
                              f"run goes on with at least {MIN_PARTIES} parties")
            departures = [self._departure(name)
                          for name in sorted(silent, key=self.names.index)]
            if self.finished and self.at_cap:
                departures = self._capped(departures, None)
            elif self.finished:
                departures = self._stopped(departures)
            else:
                departures = self._check(departures)
        except Refused as exc:
            self.failure = str(exc)
            raise
        self.decided.extend(departures)
        self.epoch += 1
        self._reports.clear()
        ended = any(d.stopped is not None or d.capped is not None for d in departures)
        if self.graph is not None and not ended:  # nobody re-bases after the run ended
            recon = reconfigure(self.graph, {d.agent for d in self.decided} | self.absent)
            self.graph = recon.graph
            self.new_edges.extend((self.epoch, a, b) for a, b in recon.new_edges)
            if self.extend is not None:  # the agents extend their cap at R the same way
                self.iterations = self.extend(recon, min(d.rebase_round for d in departures),
                                              self.iterations)
        return True

    def _check(self, departures: list[Departure]) -> list[Departure]:
        latest = max(r.round for r in self._reports.values())
        # the cap: the reporters' (each agent's as it stands) or the coordinator's, extended at
        # each decision (it cannot compute it with --scale standard: 0); the larger of the two
        # (an agent extends its cap at R only); 0: not known, nothing to check
        cap = max(self.iterations, min((r.last for r in self._reports.values() if r.last),
                                       default=0))
        late = [d for d in departures if cap and d.rebase_round >= cap]
        if late and all(d.round > 0 for d in departures):  # too late: the run ends at N
            return self._capped(departures, cap)
        for d in departures:
            if d.rebase_round <= latest:
                raise Refused(f"{d.label()}: an agent is already at round {latest}, past the "
                              "re-base round")
        for d in late:  # in phase I or at round 0, with fewer rounds than agents: no end to say
            raise Refused(f"{self.names[d.agent]} left at round {d.round}: too late to "
                          f"re-base before the last round {cap} (needs "
                          f"{d.rebase_round - d.round} more rounds)")
        return departures

    def _capped(self, departures: list[Departure], cap: int | None) -> list[Departure]:
        """Departures too late to re-base before the cap (`cap`; None: the round the finished
        agents name, which must be one and the same): the run ended at the cap."""
        if cap is None:
            if self.at_cap != set(self.finished):
                raise Refused(f"{', '.join(sorted(self.finished))} finished, some on the "
                              "certificate and some at the cap")
            cap = self._finished_round("last rounds")
        self._all_before(departures, cap, f"the run's last round is {cap}")
        return [dataclasses.replace(d, capped=cap) for d in departures]

    def _stopped(self, departures: list[Departure]) -> list[Departure]:
        """The departures of a run some agents had finished on the certificate: stopped at
        their round S (the same at all), each departure and every report before it."""
        stop = self._finished_round("stop rounds")
        self._all_before(departures, stop, f"{', '.join(sorted(self.finished))} finished at "
                         f"round {stop}")
        return [dataclasses.replace(d, stopped=stop) for d in departures]

    def _finished_round(self, what: str) -> int:
        """The one round every finished agent names (Refused when they differ)."""
        rounds = sorted(set(self.finished.values()))
        if len(rounds) > 1:
            raise Refused(f"the finished agents report different {what} {rounds}")
        return rounds[0]

    def _all_before(self, departures: list[Departure], end: int, why: str) -> None:
        """Every report and departure comes before the run's end `end` (Refused otherwise)."""
        latest = max(r.round for r in self._reports.values())
        if latest >= end or any(d.round >= end for d in departures):
            raise Refused(f"an agent waits at round {latest}, but {why}")

    def _departure(self, name: str) -> Departure:
        rounds = {s: r.round for s, r in self._reports.items() if name in r.silent}
        phase_one = any(r.phase_one for r in self._reports.values() if name in r.silent)
        first = min(rounds.values())
        late = sorted(s for s, t in rounds.items() if t == first + 1)
        if first == 0 and late and not phase_one:
            raise Refused(f"{name} sent its round-0 message to {', '.join(late)} only: a "
                          "departure while sending round 0 is not supported")
        if phase_one:  # the neighbours that got its shares finished phase I and sent round 0
            late = sorted(s for s, r in self._reports.items() if name in r.silent
                          and not r.phase_one)
        ahead = sorted(s for s, t in rounds.items() if t > first + 1)
        if ahead:
            raise Refused(f"the reports contradict each other: {', '.join(ahead)} miss {name} "
                          f"at a round after {first + 1}, but its neighbours cannot be two "
                          "rounds apart")
        # round 0 (it finished phase I and sent no round message) too: agents far from it may
        # have stepped round 0 already, so the re-base comes n rounds later as for any round
        return Departure(agent=self.names.index(name), round=first,
                         rebase_round=first + len(self.names),
                         late=tuple(self.names.index(s) for s in late), phase_one=phase_one)
