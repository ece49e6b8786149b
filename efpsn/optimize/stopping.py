"""Stop at the target: the round at which every agent (and the simulator) ends a run whose
certificate (efpsn/optimize/certificate.py) is met, agreed by max-consensus on the round messages.

Every `every` rounds (a check round s, public) each agent turns its own measures of round s
(efpsn.optimize.driver.progress: tracker ||y_i||, gap, step) and its own ||x_i|| into four integers,
rounded so that they only loosen the certificate:

    ceil(log2 ||y_i||), ceil(log2 gap_i), ceil(log2 step_i), -floor(log2 ||x_i||)

(a zero measure gives FLOOR, a missing or infinite one CEILING). These are the only numbers
the stop rule discloses, to the neighbours only, once per check: powers of two of how far
the agent still is from agreeing with them and from a stationary point, and of the size of
its own iterate. They travel in RoundMessage.stop (proto/efpsn/wire/v1/agent.proto) with the
messages of rounds s .. s + D - 1 (D the graph's diameter, public): each agent sends the
element-wise maximum of its own and of what its neighbours sent in the previous round, so
after round s + D - 1 every agent holds the network's maximum (the max over D hops reaches
everyone). At round s + D all of them evaluate the same function of the same integers:

    B = (2^T + L M 2^G) / mu + beta 2^S,    n = 2^-N - M 2^G - 2 beta 2^S <= ||x_bar||,

(M the graph's mean distance, efpsn.optimize.certificate.mean_distance, or the spread S of an
aggregated gap; ||x_i - x_bar|| <= ||z_i - z_bar|| + beta ||(x_i - x_i^-) - mean|| <= M gap + 2 beta
step), and stop there when B / (n - B) <= target (an upper bound on the certificate of round s).
Otherwise the run goes on to the next check, and at the latest to the step rule's rounds (the
cap).

A departure (efpsn/departure/membership.py) at round T voids every window whose stop would be
decided at round T or later (s + D > T: the departed agent's integers, and its relaying, are missing
from some agent's maximum, and the remaining graph's diameter may be longer), opens no window until
the re-base round R, and from R on the rule is the remaining graph's (its diameter D' and the
certificate's numbers for its weights), with checks at R + k period, k >= 1 (`origin`). An agent
close to the departed one learns of the departure before it can decide a window that opens
after T - D: it is then waiting for the departed agent's neighbours (StopRule.voided_from,
StopRule.rebased). An agent far from it (k hops from its nearest neighbour, with T + k >=
s + D) can complete the window of a check s < T before anyone knows: its maximum then holds
every party's integers, d's too, and when they certify it stops, exits and tells the
coordinator, whose decision is then "the run had stopped at s + D" instead of a re-base; the
agents that could not get that far end with their state of the check round s, which the
driver keeps (RoundDriver.check; efpsn/departure/last_window.py). The fading mask's fresh part
(efpsn/masks/fading.py) never rounds away: it sits in every agent's tracker and drives the agents
apart, so the tracker and (at the stop, two to four times larger on the main job) the gap term hold
the stop back until it has faded below the target; agt's consensus tails (efpsn/params/tail.py,
`tail`) mix it away first: each ends in a check of this rule at a public round (is_check), and a
regular check whose rounds meet a tail is none. """

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from efpsn.params.tail import TailSchedule, wanted

if TYPE_CHECKING:
    from efpsn.params.config import RunConfig

__all__ = ["CEILING", "FLOOR", "STOP_KEY", "TERMS", "StopRule", "exponents", "merge"]

STOP_KEY = "stop:"  # the in-process message key of RoundMessage.stop (never a tensor name)
TERMS = 4  # tracker, gap, step, -log2 ||x_i||
FLOOR = -1100  # a zero measure (below every float64's exponent)
CEILING = 1100  # a missing, infinite or NaN measure (above every float64's exponent)


def _ceil_log2(value: float) -> int:
    """The least e with 2^e >= value (FLOOR for 0, CEILING for non-finite or missing)."""
    if not math.isfinite(value) or value < 0:
        return CEILING
    if value == 0:
        return FLOOR
    mantissa, exponent = math.frexp(value)  # value = mantissa 2^exponent, mantissa in [0.5, 1)
    return max(FLOOR, min(CEILING, exponent - 1 if mantissa == 0.5 else exponent))


def _floor_log2(value: float) -> int:
    """The greatest e with 2^e <= value (FLOOR for 0 or not finite)."""
    if not math.isfinite(value) or value <= 0:
        return FLOOR
    return max(FLOOR, min(CEILING, math.frexp(value)[1] - 1))


def exponents(measures: Mapping[str, float], *, x_norm: float, momentum: float
              ) -> tuple[int, ...]:
    """This agent's four disclosed integers for a check (see the module docstring)."""
    step = measures.get("step", math.nan) if momentum else 0.0
    return (_ceil_log2(measures.get("tracker", math.nan)),
            _ceil_log2(measures.get("gap", math.nan)), _ceil_log2(step),
            -_floor_log2(x_norm))


def merge(own: Sequence[int], others: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The element-wise maximum (one max-consensus step)."""
    return tuple(max(values) for values in zip(own, *others, strict=True))


@dataclass(frozen=True)
class StopRule:
    """When a run may stop: check every `every` rounds (0: never; a check needs `hops` + 1
    rounds, so checks are at least that far apart), stop `hops` rounds after a check whose
    network-wide integers certify `target`, never after `cap` rounds."""

    every: int
    hops: int
    cap: int
    curvature: float | None
    l2: float
    momentum: float
    target: float
    factor: float | None = None  # the gap's factor in the bound (None: hops; for_run: M or S)
    origin: int = 0  # checks at origin + k period, k >= 1 (a departure's re-base round)
    until: int | None = None  # a departure's round T: no window decided at T or later
    tail: TailSchedule | None = None  # the consensus tails (efpsn/params/tail.py), agt's only

    @classmethod
    def for_run(cls, config: RunConfig, weights: np.ndarray, *, aggregate: bool = False,
                origin: int = 0, until: int | None = None, cap: int | None = None,
                rounds: int | None = None) -> StopRule:
        """The run's rule: its resolved `stop_every`, the certificate's public numbers
        (Certifier.for_run) and target, the cap (`iterations`) and the consensus tails of
        `tail` (efpsn/params/tail.py: agt's, at fractions of the step rule's `rounds`, the cap by
        default); `weights` and `origin` those of a re-base after a departure (`until`: another
        departure still to be re-based)."""
        from efpsn.optimize.certificate import TARGET, Certifier, diameter

        c = config.resolved()
        certifier = Certifier.for_run(c, weights, aggregate=aggregate)
        cap = c.iterations.total if cap is None else cap
        rule = cls(every=c.stop_every.rounds or 0, hops=diameter(weights), cap=cap,
                   curvature=certifier.curvature, l2=certifier.l2, momentum=certifier.momentum,
                   target=TARGET, factor=certifier.hops, origin=origin, until=until)
        if not rule.active or not wanted(c.tail, algorithm=c.algorithm, gamma=c.gamma):
            return rule
        return dataclasses.replace(rule, tail=TailSchedule.for_graph(
            weights, origin=origin, rounds=c.iterations.total if rounds is None else rounds,
            hops=rule.hops, cap=cap, aggregate=aggregate))

    @classmethod
    def rebased(cls, config: RunConfig, weights: np.ndarray, *, origin: int,
                until: int | None, cap: int) -> StopRule:
        """The remaining graph's rule from a departure's re-base round `origin` (for_run), its
        cap extended when it is active: `origin` + the step rule's rounds for the remaining
        graph (efpsn/params/step_rule.py: what a fresh run on that graph gets; the trackers restart
        at `origin`), never below the current `cap`. Public and the same at every agent and
        in the simulator's replay, so the run after a late departure still ends certified."""
        from efpsn.params.schema import parse_shape
        from efpsn.params.step_rule import step_rule

        rule = cls.for_run(config, weights, origin=origin, until=until, cap=cap)
        if not rule.active:
            return rule
        c = config.resolved()
        rounds = step_rule(algorithm=c.algorithm, task=c.task,
                           features=math.prod(parse_shape(c.input_shape)), l2=c.l2,
                           weights=weights).rounds
        return cls.for_run(config, weights, origin=origin, until=until,
                           cap=max(cap, origin + rounds), rounds=rounds)

    def voided_from(self, round_: int) -> StopRule:
        """This rule once an agent left at `round_`: no window decided at that round or later
        (until the re-base gives the remaining graph's rule: `for_run(..., origin=R)`)."""
        until = round_ if self.until is None else min(self.until, round_)
        return dataclasses.replace(self, until=until)

    def __post_init__(self) -> None:
        if self.every < 0 or self.hops < 1 or self.cap < 1 or self.origin < 0:
            raise ValueError(f"need every >= 0, hops >= 1, cap >= 1, origin >= 0; got "
                             f"{self.every}, {self.hops}, {self.cap}, {self.origin}")

    @property
    def active(self) -> bool:
        return self.every > 0 and self.curvature is not None and self.l2 > 0

    @property
    def period(self) -> int:
        """Rounds between checks: `every`, at least hops + 1 (one check at a time)."""
        return max(self.every, self.hops + 1)

    def is_check(self, t: int) -> bool:
        """Whether round t opens a check (its stop round t + hops before the cap, and before
        a departure's round `until`): every period rounds from the origin, and at every
        tail's check round; a regular check whose steps (t - 1 .. t + hops - 1) meet a tail's
        is none (mid-tail sum y = sum g holds at the old points, not the sent ones)."""
        if not (self.active and t > self.origin and t + self.hops < self.cap
                and (self.until is None or t + self.hops <= self.until)):
            return False
        if self.tail is not None and self.tail.is_check(t):
            return True
        return (t - self.origin) % self.period == 0 and (
            self.tail is None or not self.tail.overlaps(t - 1, t + self.hops - 1))

    def window(self, t: int) -> int | None:
        """The check round s whose integers round t's messages carry (s <= t < s + hops)."""
        if not self.active or t < self.origin:
            return None
        candidates = [t - (t - self.origin) % self.period]
        a = None if self.tail is None else self.tail.attempt(t)
        if a is not None:
            candidates.append(self.tail.check_round(a))  # type: ignore[union-attr]
        return next((s for s in candidates if s <= t < s + self.hops and self.is_check(s)),
                    None)

    def kind(self, t: int) -> str:
        """The kind of step round t's messages go to (efpsn/params/tail.py): agt's own step, or a
        tail's mix, gradient or track. A function of public numbers only (never `until`)."""
        return "agt" if self.tail is None or not self.active else self.tail.kind(t)

    def bound(self, network: Sequence[int]) -> float:
        """The certificate's upper bound from the network's integers (inf: none)."""
        tracker, gap, step, norm = (2.0 ** max(-1074, min(1023, e)) for e in network)
        if CEILING in network[:3] or self.curvature is None or self.l2 <= 0:
            return math.inf
        factor = self.hops if self.factor is None else self.factor
        b = (tracker + self.curvature * factor * gap) / self.l2 + self.momentum * step
        floor = (0.0 if network[3] >= CEILING else 1.0 / norm) - factor * gap \
            - 2 * self.momentum * step
        return b / (floor - b) if b < floor else math.inf

    def stops(self, network: Sequence[int]) -> bool:
        """Whether a check with the network's integers ends the run `hops` rounds later."""
        return self.bound(network) <= self.target
