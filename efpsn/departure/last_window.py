"""A departure in the stop rule's last window, without I/O: which agents finish the window's
stop round on the certificate, and which end with their check round's model.

The stop rule (efpsn/optimize/stopping.py) checks at round s and stops at S = s + D. When agent d
sends nothing from round T on, an agent can still step every round whose messages its neighbours
sent: agent i steps round t once every neighbour j sent round t, so the round it waits at is

    reach(i) = 1 + min over neighbours j of sent(j),   sent(j) = reach(j) for j != d,
    sent(d) = T - 1 to its neighbours (T to a late one, Departure.late: it got round T),

a shortest-path distance from d's neighbours (`reach`): d's neighbours wait at T (T + 1 the late
ones), an agent k hops further at most k rounds later. An agent with reach(i) >= S completes
round S before anyone decides anything: it never waited for d, so every message it took is
the one it takes in the run without the departure, and at S it holds the network's maximum of
the round-s integers, d's among them (d's round-s message went out before T: an agent can only
complete S when T > s, or through a late neighbour that got it). If they certify the target,
it stops there and exits 0 on a genuine certificate of round s for the objective of every
party in the run at s, d's included. The others wait for d, report, and when the coordinator
decides (coordinator/departures.py: it knows the finished ones, which reported their stop),
the run had already stopped at S: they end with their iterate of the check round s, which they
hold (reach(i) >= T > s, and the driver keeps the check round's state while a window is open:
RoundDriver.check), instead of re-basing (`LastWindow`). Nothing here depends on timing: the
graph, T, the late neighbours and S fix who ends where, so `efpsn simulate --leave agentK@T`
replays it (efpsn/departure/replay.py) bit for bit.

A departure too late to re-base before the run's cap N (R = T + n >= N: a fixed
`--iterations`, or a cap the certificate did not stop before) ends the run at N the same way
(`CapEnd`): an agent with reach(i) >= N completes N (and tells the coordinator it finished at
the cap), every other one ends with its iterate of the round it waits at, reach(i) = T + k,
the last round it completed; nobody re-bases. That model is the iterate of the objective of
every party in the run at T (the departed one's included), neither certified nor the
remaining parties' optimum; who ends where again depends on the graph and T only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from efpsn.departure.membership import Departure
from efpsn.optimize.certificate import TARGET, Certificate

__all__ = ["CapEnd", "LastWindow", "cap_end", "capped_line", "capped_model", "capped_words", "certified_line",
           "last_window", "reach"]


def reach(agents: Iterable[int], neighbours: Callable[[int], Sequence[int]],
          departure: Departure) -> dict[int, int]:
    """The round each agent of `agents` (the ones still in, d's neighbours among them) waits at
    once d sends nothing from round T on (the module docstring); agents with no path to a
    neighbour of d that avoids d get a very large round (nothing holds them)."""
    d, t = departure.agent, departure.round
    keep = [i for i in agents if i != d]
    never = 2 ** 62
    out = {i: never for i in keep}
    for j in neighbours(d):
        if j in out:
            out[j] = t + 1 if j in departure.late else t
    for _ in range(len(keep)):  # Bellman-Ford on unit edges: at most n - 1 relaxations
        changed = False
        for i in keep:
            best = min((out[j] + 1 for j in neighbours(i) if j in out), default=never)
            if best < out[i]:
                out[i], changed = best, True
        if not changed:
            break
    return out


@dataclass(frozen=True)
class LastWindow:
    """The run stopped at `stop_round` S on the certificate of the check round `check_round`
    s = S - D, although `departure` left at T in between: `finished` completed S (and exited),
    `at_check` end with their iterate of s."""

    departure: Departure
    check_round: int
    stop_round: int
    finished: tuple[int, ...]
    at_check: tuple[int, ...]
    bound: float  # the stop rule's bound from the network's round-s integers (<= its target)

    def __post_init__(self) -> None:
        if not self.check_round < self.stop_round or not self.finished:
            raise ValueError(f"a last window needs s < S and an agent that finished S; got "
                             f"s={self.check_round}, S={self.stop_round}, {self.finished}")

    def ended_at(self, agent: int) -> int:
        """The round of the model `agent` ends with."""
        return self.stop_round if agent in self.finished else self.check_round

    def certificate(self) -> Certificate:
        """The run's certificate: the window's, of round s, for every agent in the run then."""
        return Certificate(self.bound, True, certified_line(self.bound, self.check_round))

    def to_json(self) -> dict[str, object]:
        return {"stopped": self.stop_round, "check_round": self.check_round,
                "finished": [f"agent{i + 1}" for i in self.finished],
                "at_check": [f"agent{i + 1}" for i in self.at_check]}


def certified_line(bound: float, check_round: int) -> str:
    """The converged line of a run stopped in a departure's last window."""
    return (f"converged: ||x_bar - x*|| <= {bound:.2g} ||x*|| at round {check_round} (the stop "
            f"rule's certificate, on every party's objective at that round; target {TARGET:g})")


def last_window(reached: dict[int, int], *, departure: Departure, check_round: int,
                hops: int, bound: float) -> LastWindow | None:
    """The outcome when the window opened at `check_round` certifies the target and
    `departure` left before its stop round: None when no agent reaches the stop round (every
    agent waits for d, the window is void and the run re-bases as for any departure)."""
    stop_round = check_round + hops
    finished = tuple(sorted(i for i, r in reached.items() if r >= stop_round))
    if not finished:
        return None
    return LastWindow(departure=departure, check_round=check_round, stop_round=stop_round,
                      finished=finished, bound=bound,
                      at_check=tuple(sorted(i for i in reached if i not in finished)))


@dataclass(frozen=True)
class CapEnd:
    """The run ended at its cap `cap` N although `departure` left at T < N too late to re-base:
    `ends[i]` is the round agent i ends at (min(reach(i), N): N for the agents that finished)."""

    departure: Departure
    cap: int
    ends: dict[int, int]

    @property
    def finished(self) -> tuple[int, ...]:
        return tuple(sorted(i for i, r in self.ends.items() if r == self.cap))

    def ended_at(self, agent: int) -> int:
        return self.ends[agent]

    def to_json(self) -> dict[str, object]:
        return {"capped": self.cap, "finished": [f"agent{i + 1}" for i in self.finished],
                "ended": {f"agent{i + 1}": r for i, r in sorted(self.ends.items())
                          if r != self.cap}}


def cap_end(reached: dict[int, int], *, departure: Departure, cap: int) -> CapEnd:
    """Where each agent ends when `departure` came too late to re-base before the cap."""
    if not departure.round < cap:
        raise ValueError(f"{departure.label()}: the run had ended at its cap {cap} before")
    return CapEnd(departure=departure, cap=cap,
                  ends={i: min(r, cap) for i, r in sorted(reached.items())})


def capped_words(event: dict[str, object]) -> str:
    """A departure too late to re-base before the cap, in words (CapEnd.to_json's keys)."""
    ended = event.get("ended") or {}
    assert isinstance(ended, dict)
    finished = event.get("finished") or []
    assert isinstance(finished, list)
    return (f"too late to re-base: the run ended at the cap {event['capped']}: "
            f"{', '.join(finished) or 'nobody'} finished it"
            + "".join(f", {name} ended at {r}" for name, r in ended.items()))


def capped_model(remaining: Iterable[int], departed: int) -> str:
    """What the model of a run that ended at its cap after `departed` left too late to re-base
    is (`remaining`: the agents still in), in the words the records use after "the model is"."""
    names = ",".join(str(i + 1) for i in sorted({*remaining, departed}))
    return (f"the iterate of agents {names}'s objective at the rounds they ended (agent"
            f"{departed + 1}'s data included), not certified and not the optimum of the "
            "remaining parties' objective")


def capped_line(cap: int) -> str:
    """The convergence line of a run that ended at its cap after a late departure."""
    return (f"not certified: the run ended at the cap {cap} after a departure too late to "
            "re-base, with no certificate of any round")
