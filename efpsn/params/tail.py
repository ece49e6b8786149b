"""The consensus tail's public schedule: which kind of step every agent takes in round t.

Why: with the fading mask (efpsn/masks/fading.py) the fresh part keeps the agents apart, and the
certificate (efpsn/optimize/certificate.py) waits until that disagreement has faded at the mask's
rate RHO (docs/RESULTS.md, "Why a masked run stops later"). Mixing without gradients
removes it at the graph's mixing rate instead (0.54 per round on the 5-ring with W). So at a few
public fractions of the step rule's rounds K the run tries a tail: after round a,

    steps a .. a+m-1      "mix":      z_i <- sum_j w_ij z_j, x_i = z_i, y_i <- sum_j w_ij y_j
    step  a+m             "gradient": y_i <- sum_j w_ij y_j + g_i(p_i) - g_i, g_i = g_i(p_i)
                                      at the mixed points p_i = z_i (that round's mask)
    steps a+m+1 .. e+D-1  "track":    y_i <- sum_j w_ij y_j (x, z, g unchanged)

with e = a + 2m + 1 a check round of the stop rule (efpsn/optimize/stopping.py: the same four
integers, the same max-consensus over the D = hops rounds e .. e+D-1). At e every agent's z is p_i
and sum_i y_i = sum_i g_i(p_i) (W doubly stochastic, the masks of one round summing to zero), so the
certificate's bound holds for p_bar with the step term 0; the window's rounds only mix y, which
never raises max ||y_i||. A certified window stops the run at e+D with x_i = p_i; otherwise plain
agt resumes at e+D from x = z = p (the momentum restarts from zero) and the y, g it holds:
sum y = sum g still holds, so agt still converges to x* exactly.

Everything here is a pure function of public numbers (the round, the rule's origin and K, the
graph's hops and mixing rate): never of StopRule.until or of when an agent learned of a
departure, so every agent and the simulator take the same steps bit for bit. A re-base sets a
new origin and K (StopRule.rebased): the schedule restarts there and a tail it cuts is abandoned
(sum y = sum g holds after every kind of step, so the re-base's tracker restart is unchanged).
m is the least number of mixes that shrinks the disagreement by SHRINK at the mixing rate: the
second largest eigenvalue modulus of W or of the lazy W' = (I + W) / 2, whichever is smaller (W'
under secure aggregation, whose senders weight their messages by W'). A graph on which one tail
takes more than MAX_SHARE of K gets none (`reason` says so).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["AUTO_MAX_GAMMA", "AUTO_ON", "FRACTIONS", "KINDS", "MAX_SHARE", "SHRINK",
           "TAIL_HELP", "TAIL_MODES", "TailSchedule", "mixing_rate", "record", "wanted"]

AUTO_ON = True  # what --tail auto means for agt under an active stop rule: the one place to flip
# ... up to this gamma: measured on wine (docs/RESULTS.md, "The consensus tail in the protocol"),
# the many-round regressions gain nothing from the tails at gamma 1e3 but reach 0.16 against
# 0.19-0.24 at gamma 1e6, where a user asked for more noise: there auto means off (--tail on
# still takes them, and its privacy line says what was measured)
AUTO_MAX_GAMMA = 1e3
TAIL_MODES = ("auto", "on", "off")
TAIL_HELP = (f"consensus tails before some of the stop rule's checks (agt; efpsn/params/tail.py): auto "
             f"({'on' if AUTO_ON else 'off'} up to gamma {AUTO_MAX_GAMMA:g}, off above), on or "
             f"off")
# where attempts start, as fractions of K: at the defaults the first attempt that certifies
# has run 0.42-0.47 K of agt (wine, breast cancer, digits, the main job; docs/RESULTS.md);
# each failed attempt costs its 2m + 1 + D rounds, so none earlier, and sparser later (gamma 1e6)
FRACTIONS = (0.44, 0.48, 0.53, 0.6, 0.7, 0.82)
SHRINK = 1e-6  # the disagreement's reduction the mixes aim at
MAX_SHARE = 0.05  # no tails when one (2m + 1 + D rounds) takes more than this share of K
KINDS = ("agt", "mix", "gradient", "track")


def wanted(mode: str, *, algorithm: str, gamma: float) -> bool:
    """Whether the run asks for tails: --tail on, or auto (AUTO_ON, at gamma <= AUTO_MAX_GAMMA),
    and agt (gt and dsgd have none); the stop rule must still be active (StopRule.for_run)."""
    if mode not in TAIL_MODES:
        raise ValueError(f"tail must be one of {TAIL_MODES}, got {mode!r}")
    auto = AUTO_ON and gamma <= AUTO_MAX_GAMMA
    return algorithm == "agt" and (mode == "on" or (mode == "auto" and auto))


def record(schedule: TailSchedule | None, *, mode: str, algorithm: str, gamma: float,
           active: bool) -> dict[str, object] | None:
    """What a run's record says of its tails: the schedule's (to_json), or why `--tail auto`
    took none on an agt run under an active stop rule (gamma above AUTO_MAX_GAMMA); None where
    tails are not a question (off, gt, dsgd, a forced --iterations)."""
    if schedule is not None:
        return schedule.to_json()
    if active and mode == "auto" and AUTO_ON and algorithm == "agt" and gamma > AUTO_MAX_GAMMA:
        return {"none": f"no consensus tails: --tail auto takes none above gamma "
                        f"{AUTO_MAX_GAMMA:g} (at 1e6 they were measured to help a many-round "
                        "attacker, docs/RESULTS.md; --tail on asks for them)"}
    return None


def mixing_rate(weights: np.ndarray, *, lazy: bool) -> float:
    """The second largest eigenvalue modulus of W (or of W' = (I + W) / 2), rounded to 9 digits
    so that every machine's eigensolver gives the same public number."""
    w = np.asarray(weights, dtype=np.float64)
    if lazy:
        w = (np.eye(len(w)) + w) / 2
    moduli = np.sort(np.abs(np.linalg.eigvalsh((w + w.T) / 2)))
    return round(float(moduli[-2]), 9) if len(moduli) > 1 else 0.0


@dataclass(frozen=True)
class TailSchedule:
    """The tails of one stretch of a run: from `origin` (0, or a re-base round), the step rule's
    `rounds` K for the graph, its `hops` D, `mixes` m per half (0: no tails), `lazy` mixing
    (W' instead of W) and the run's `cap` (a tail must end before it)."""

    origin: int
    rounds: int
    hops: int
    mixes: int
    lazy: bool
    cap: int

    @classmethod
    def for_graph(cls, weights: np.ndarray, *, origin: int, rounds: int, hops: int, cap: int,
                  aggregate: bool = False) -> TailSchedule:
        """The tails on this graph (none when one would take more than MAX_SHARE of K)."""
        lazy = aggregate or mixing_rate(weights, lazy=True) < mixing_rate(weights, lazy=False)
        rate = mixing_rate(weights, lazy=lazy)
        mixes = 1 if rate <= SHRINK else max(1, math.ceil(math.log(SHRINK) / math.log(rate)))
        if rate >= 1 or 2 * mixes + 1 + hops > MAX_SHARE * rounds:
            mixes = 0
        return cls(origin=origin, rounds=rounds, hops=hops, mixes=mixes, lazy=lazy, cap=cap)

    @property
    def length(self) -> int:
        """The rounds one attempt takes, its stop window's included: 2m + 1 + D."""
        return 2 * self.mixes + 1 + self.hops

    @property
    def reason(self) -> str | None:
        """Why this graph gets no tails (None: it does)."""
        if self.mixes:
            return None
        return (f"no consensus tails: one takes more than {MAX_SHARE:g} of the step rule's "
                f"{self.rounds} rounds on this graph (diameter {self.hops})")

    @functools.cached_property
    def starts(self) -> tuple[int, ...]:
        """The rounds a after which the attempts start (each ends before the next and before
        the cap)."""
        if not self.mixes:
            return ()
        out: list[int] = []
        for f in FRACTIONS:
            a = self.origin + round(f * self.rounds)
            if (not out or a >= out[-1] + self.length) and a + self.length < self.cap:
                out.append(a)
        return tuple(out)

    def attempt(self, t: int) -> int | None:
        """The start a of the attempt whose steps include step t (a <= t < a + length)."""
        for a in self.starts:
            if a <= t < a + self.length:
                return a
        return None

    def kind(self, t: int) -> str:
        """The kind of the step that consumes round t's messages (one of KINDS)."""
        a = self.attempt(t)
        if a is None:
            return "agt"
        if t < a + self.mixes:
            return "mix"
        return "gradient" if t == a + self.mixes else "track"

    def check_round(self, a: int) -> int:
        """The check round e = a + 2m + 1 of the attempt after round a."""
        return a + 2 * self.mixes + 1

    def is_check(self, s: int) -> bool:
        """Whether round s is an attempt's check round."""
        return any(s == self.check_round(a) for a in self.starts)

    def overlaps(self, first: int, last: int) -> bool:
        """Whether any attempt's steps meet the steps first .. last."""
        return any(a <= last and first < a + self.length for a in self.starts)

    def to_json(self) -> dict[str, object]:
        """The record's form: the attempts' starts, the mixes and the matrix, or why none."""
        if self.reason is not None:
            return {"none": self.reason}
        return {"starts": list(self.starts), "mixes": self.mixes, "rounds": self.length,
                "mixing": "lazy (I + W) / 2" if self.lazy else "W"}

