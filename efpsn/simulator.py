"""n agents in one process, driving the same phase I and phase II step code as the network."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import StepContext
from efpsn.crypto.paillier import generate_keypair
from efpsn.departure.joins import Join
from efpsn.departure.last_window import capped_line
from efpsn.departure.membership import Departure, check_departures
from efpsn.departure.remask import sums_to_zero
from efpsn.departure.replay import MembershipReplay
from efpsn.masks.factory import seeded_blocks, seeded_mask
from efpsn.masks.fading import FadingMask
from efpsn.masks.network import independent_masks, no_masks, zero_sum_masks, zero_sum_masks_fast
from efpsn.masks.refresh import FixedMask, MaskProvider, RefreshedMask
from efpsn.masks.seeds import exchange_seeds, exchange_seeds_fast
from efpsn.masks.zero_sum import MaskCoefficients, noise_generator
from efpsn.metrics import evaluate
from efpsn.optimize.certificate import Certificate, Certifier
from efpsn.optimize.channels import MESSAGE_MODES, simulated_channels
from efpsn.optimize.driver import RoundDriver, worst
from efpsn.optimize.stopping import StopRule
from efpsn.params.config import RunConfig
from efpsn.params.schedules import make_schedule
from efpsn.params.tail import record as tail_record
from efpsn.problem import Problem, average, build_problem

PROTOCOLS = ("fast", "paillier")


def make_masks(
    problem: Problem,
    *,
    protocol: str = "fast",
    noise_seed: int | None = None,
    allow_insecure_keys: bool = False,
) -> list[MaskCoefficients]:
    """Every agent's mask coefficients eta_bar_i for the configured mask mode (phase I's: with
    refreshed masks see make_mask_providers).

    protocol="paillier" runs the real phase I (key generation, encryption under each neighbour's
    key, homomorphic sums, decryption) between in-process Maskers; "fast" computes the same
    integers without encryption. With the same noise seed both give identical masks.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    c, graph, spec = problem.config, problem.graph, problem.noise_spec
    rngs = [noise_generator(noise_seed, i) for i in range(graph.n)]
    if c.mask == "none":
        return no_masks(graph, spec)
    if c.mask == "independent":
        return independent_masks(rngs, graph, spec)
    if protocol == "fast":
        return zero_sum_masks_fast(rngs, graph, spec)
    return zero_sum_masks(
        rngs, graph, spec, layout=problem.layout, key_bits=c.key_bits,
        allow_insecure=allow_insecure_keys,
    )


def make_mask_providers(
    problem: Problem,
    *,
    protocol: str = "fast",
    noise_seed: int | None = None,
    allow_insecure_keys: bool = False,
) -> list[MaskProvider]:
    """Every agent's masks of every round: phase I's fixed mask (refresh never), the fading
    masks (efpsn/masks/fading.py), or masks refreshed every R rounds from the seeds phase I shares
    (by real Paillier between in-process agents, or the fast path that yields the same seeds). The
    refreshed masks share one NoiseBlocks: each edge's stream is derived once per period, not at
    both ends."""
    c = problem.config
    refresh = c.refresh if c.resolved_ok else c.resolved().refresh
    if not refresh.refreshed:
        return [FixedMask(m) for m in make_masks(problem, protocol=protocol,
                                                 noise_seed=noise_seed,
                                                 allow_insecure_keys=allow_insecure_keys)]
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == "fast":
        seeds = exchange_seeds_fast(problem.graph, noise_seed=noise_seed)
    else:
        keypairs = [generate_keypair(c.key_bits, allow_insecure=allow_insecure_keys)
                    for _ in range(problem.n)]
        seeds = exchange_seeds(problem.graph, keypairs, noise_seed=noise_seed,
                               allow_insecure=allow_insecure_keys)
    blocks = seeded_blocks(problem.noise_spec, refresh)
    return [seeded_mask(s, spec=problem.noise_spec, refresh=refresh, blocks=blocks)
            for s in seeds]


@dataclass
class SimulationResult:
    """A finished simulation: settings, per-round history, final metrics, iterates and masks."""

    config: RunConfig
    protocol: str
    history: list[dict[str, float]]
    final: dict[str, float]
    xs: list[torch.Tensor]
    masks: list[MaskCoefficients]  # phase I's (refreshed: the first period's)
    timings: dict[str, float] = field(default_factory=dict)
    periods_zero_sum: int = 0  # refreshed masks: how many periods were checked, every round
    every_period_zero_sum: bool = True  # ... and whether each summed to zero exactly
    convergence: Certificate | None = None  # efpsn/optimize/certificate.py, from the last round
    departures: dict[str, Any] | None = None  # MembershipReplay.to_json, when anyone left
    # or joined
    tails: dict[str, Any] | None = None  # the consensus tails' schedule (TailSchedule.to_json)

    def masks_sum_to_zero(self) -> bool:
        """Phase I's masks, and with refreshed masks every period's, sum to zero exactly (after
        a departure: the remaining agents' masks, every round)."""
        after = self.departures is None or bool(self.departures["remaining_masks_sum_to_zero"])
        return mask_sums_are_zero(self.masks) and self.every_period_zero_sum and after

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": {**self.config.to_dict(), "protocol": self.protocol},
            "history": self.history,
            "final": self.final,
            "timings": self.timings,
            "convergence": None if self.convergence is None else self.convergence.to_json(),
            **({} if self.departures is None else self.departures),
            **({} if self.tails is None else {"tails": self.tails}),
            # A simulation is not private: the masks are reported so users can inspect them.
            "masks": {
                "precision": self.config.precision,
                "eta_bar": [m.values().tolist() for m in self.masks],
                "numerator_sums": [
                    str(sum(col)) for col in zip(*(m.numerators for m in self.masks), strict=True)
                ],
            },
        }


def run_simulation(
    config: RunConfig,
    *,
    protocol: str = "fast",
    noise_seed: int | None = None,
    problem: Problem | None = None,
    x_star: torch.Tensor | None = None,
    allow_insecure_keys: bool = False,
    on_round: Callable[[int, dict[str, float] | None], None] | None = None,
    departures: Sequence[Departure] = (),
    joins: Sequence[Join] = (),
    messages: str = "clear",
) -> SimulationResult:
    """Run phase I then `config.iterations.total` synchronous phase II rounds for every agent (the
    step rule's numbers where the config asks for them: RunConfig.resolved).

    `departures` replays agents that leave for good, `joins` the seats the run leaves empty
    (`late`) taking part from a round on (efpsn/departure/replay.py): the metrics are the
    members' (and x_star should be their optimum).

    `messages`: "clear" (every neighbour gets the message) or "aggregate" (secure neighbourhood
    aggregation, efpsn/optimize/channels.py: each agent learns only the weighted sum of its
    neighbours' messages; simulator only, no departures)."""
    if messages not in MESSAGE_MODES:
        raise ValueError(f"messages must be one of {MESSAGE_MODES}, got {messages!r}")
    if messages == "aggregate" and (departures or joins or config.late):
        raise ValueError("departures and joins are not supported with aggregated messages")
    config = config.resolved()
    problem = problem if problem is not None else build_problem(config)
    if noise_seed is None:
        noise_seed = config.seed  # a simulation is reproducible by default; it is not private
    t0 = time.perf_counter()
    providers = make_mask_providers(problem, protocol=protocol, noise_seed=noise_seed,
                                    allow_insecure_keys=allow_insecure_keys)
    masks = [p.coefficients(0) for p in providers]
    t_phase1 = time.perf_counter() - t0
    zero_sum = ZeroSumCheck(providers)
    departures = check_departures(departures, agents=problem.n)
    replay = (MembershipReplay(problem=problem, providers=providers, departures=departures,
                               joins=joins, noise_seed=noise_seed)
              if departures or joins or config.late_seats else None)

    algorithm = make_algorithm(config.algorithm, momentum=config.momentum.value)
    schedule = make_schedule(config.schedule, iterations=config.iterations.total)
    n = problem.n
    x0 = problem.initial_params()
    # the stop rule agrees over the run's graph; a replayed departure voids the windows it
    # cuts and re-bases the rule on the remaining graph (efpsn/optimize/stopping.py)
    aggregate = messages == "aggregate"
    stop = StopRule.for_run(config, problem.member_weights, aggregate=aggregate)
    drivers = [
        RoundDriver(algorithm=algorithm, schedule=schedule, iterations=config.iterations.total,
                    eval_every=config.eval_every, x0=x0, stop=stop,
                    context=StepContext(agent=i, weights=problem.agent_weights(i),
                                        lr=schedule(0), oracle=problem.objective(i, providers[i])))
        for i in range(n)
    ]
    channels = simulated_channels(messages, algorithm=algorithm,
                                  contexts=[d.context for d in drivers], weights=problem.weights)
    certifier = Certifier.for_run(config, problem.member_weights, aggregate=aggregate)
    history = [{"round": 0, **evaluate(problem, [d.state["x"] for d in drivers], x_star=x_star)}]
    t1 = time.perf_counter()
    active, neighbours = ((replay.active, replay.neighbours) if replay is not None
                          else (list(range(n)), problem.graph.neighbours))
    window = None  # a departure's last window that stopped the run (efpsn/departure/last_window.py)
    for t in itertools.count():  # to the cap, which a departure's re-base may extend
        if all(drivers[i].done for i in active):  # the stop rule's round, the same at every
            break  # agent (each its own after a departure too late to re-base: replay.capped)
        if replay is not None and replay.stops_at(t):  # a departure in the last window
            replay.end(drivers)
            window = replay.window
            break
        if replay is not None and replay.apply(t, drivers):
            active, neighbours = replay.active, replay.neighbours
            zero_sum.use(())  # from now on the replay checks the remaining masks, every round
            if replay.connected():  # the transition of a cut graph keeps the last one
                certifier = Certifier.for_run(config, replay.remaining_weights())
        # round t's messages, sealed for each receiver before anyone steps (a sender is anyone
        # an active agent takes messages from)
        stepping = [i for i in active if not drivers[i].done]
        receivers: dict[int, list[int]] = {}
        for i in stepping:
            for j in neighbours(i):
                receivers.setdefault(j, []).append(i)
        sent = {j: channels[j].seal(drivers[j].outbox, t, to) for j, to in receivers.items()}
        due = [drivers[i].step(channels[i].open({j: sent[j][i] for j in neighbours(i)}, t))
               for i in stepping]
        zero_sum.check(t)
        if replay is not None:
            replay.check(t)
        record = None
        if any(due):
            xs = [drivers[i].state["x"] for i in active]
            measures = worst([drivers[i].measures for i in active])
            convergence = certifier(measures, rounds=t + 1,
                                    x_bar_norm=float(torch.linalg.vector_norm(average(xs))))
            record = {"round": t + 1, **evaluate(problem, xs, x_star=x_star, agents=active),
                      **measures}
            if convergence.bound is not None and math.isfinite(convergence.bound):
                record["certificate"] = convergence.bound  # absent while there is no bound
            history.append(record)
        if on_round is not None:
            on_round(t + 1, record)
    t_phase2 = time.perf_counter() - t1
    capped = None if replay is None else replay.capped  # each agent ends at its own round
    rounds = (window.stop_round if window is not None else
              max(drivers[i].t for i in active) if capped is not None else drivers[active[0]].t)
    if replay is not None and len(replay.departed) < len(departures):
        missed = [d.label() for d in departures if d.agent not in replay.departed]
        raise ValueError(f"the run ended at round {rounds}, before the departures {missed}")
    if replay is not None and len(replay.joined) < len(joins):
        missed = [j.label() for j in joins if j.agent in replay.absent]
        raise ValueError(f"the run ended at round {rounds}, before the joins {missed}")
    ended = window if window is not None else capped
    if any(drivers[i].t != (rounds if ended is None else ended.ended_at(i)) for i in active):
        raise RuntimeError(f"the agents stopped at different rounds {[d.t for d in drivers]}")
    xs = [drivers[i].state["x"] for i in active]
    convergence = certifier(worst([drivers[i].measures for i in active]), rounds=rounds,
                            x_bar_norm=float(torch.linalg.vector_norm(average(xs))))
    if window is not None:  # the window's certificate, of round s, for every agent then in
        convergence = window.certificate()
        history.append({"round": rounds, **evaluate(problem, xs, x_star=x_star, agents=active)})
    if capped is not None:  # the iterate of every party's objective, at each agent's end
        convergence = Certificate(None, False, capped_line(capped.cap))
        history.append({"round": rounds, **evaluate(problem, xs, x_star=x_star, agents=active)})
    return SimulationResult(
        config=config,
        protocol=protocol,
        history=history,
        final=dict(history[-1]),
        xs=xs,
        masks=masks,
        periods_zero_sum=zero_sum.periods,
        every_period_zero_sum=zero_sum.ok,
        convergence=convergence,
        departures=None if replay is None else replay.to_json(),
        tails=tail_record(stop.tail, mode=config.tail, algorithm=config.algorithm,
                          gamma=config.gamma, active=stop.active),
        timings={
            "phase1_seconds": t_phase1,
            "phase2_seconds": t_phase2,
            "seconds_per_round": t_phase2 / max(1, rounds),
            "rounds": rounds,
        },
    )


def mask_sums_are_zero(masks: Sequence[MaskCoefficients]) -> bool:
    """True when sum_i numerator_ik == 0 exactly for every k (integer arithmetic)."""
    return all(sum(col) == 0 for col in zip(*(m.numerators for m in masks), strict=True))


class ZeroSumCheck:
    """Checks, once per refresh period, that the agents' refreshed masks of the period sum to
    zero exactly (integers), from what the providers already derived for the round."""

    def __init__(self, providers: Sequence[MaskProvider]) -> None:
        self.periods = 0
        self.ok = True
        self.use(providers)

    def use(self, providers: Sequence[MaskProvider]) -> None:
        """Check these agents' masks from now on (the remaining ones, after a departure)."""
        self.providers = [p for p in providers if isinstance(p, (RefreshedMask, FadingMask))]
        self._last: int | None = None

    def check(self, t: int) -> None:
        if not self.providers:
            return
        period = self.providers[0].refresh.period(t)
        if period == self._last:
            return
        self._last = period
        self.ok = self.ok and sums_to_zero(self.providers, t, exact=False)
        self.periods += 1
