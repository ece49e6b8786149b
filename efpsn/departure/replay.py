"""Membership changes replayed in the in-process simulator: departures (`efpsn simulate --leave
agentK@T`): at round T the departed agent stops, its neighbours drop it from their weights and
masks; at the re-base round R the network is joined where it fell apart, new edges get fresh
seeds, every remaining agent takes the new graph's Metropolis weights and the trackers restart
(efpsn/departure/membership.py); and joins (`efpsn simulate --join agentK@R`, a seat the run
left empty: efpsn/departure/joins.py): at round R the graph becomes the topology over the
members with the newcomer, the edges it adds get fresh seeds and the ones it drops lose their
terms, everyone takes its weights and re-bases, and the newcomer starts from the model's
initial point. A departure in the stop rule's last window whose agents far from it
reach the stop round ends the run there (efpsn/departure/last_window.py: `window`, `stops_at`,
`end`); one too late to re-base before the cap ends it at the cap, each agent at min(reach, cap)
(`capped`: their drivers' last rounds)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from efpsn.departure.joins import Join, join_reconfiguration, seed_epoch
from efpsn.departure.last_window import (
    CapEnd,
    LastWindow,
    cap_end,
    capped_model,
    capped_words,
    last_window,
    reach,
)
from efpsn.departure.membership import (
    Departure,
    Reconfiguration,
    check_rebase,
    optimum_of,
    rebase,
    reconfigure,
)
from efpsn.departure.membership import drop_node_weights as _drop_node_weights
from efpsn.departure.remask import (
    PairShares,
    add_seeds,
    draw_pair_shares,
    drop_seeds,
    new_edge_seeds,
    new_edge_shares,
    reseeded,
    sums_to_zero,
)
from efpsn.masks.fading import FadingMask
from efpsn.masks.refresh import FixedMask, MaskProvider, RefreshedMask
from efpsn.masks.seeds import EdgeSeeds
from efpsn.optimize.driver import RoundDriver
from efpsn.optimize.stopping import StopRule, merge
from efpsn.problem import Problem
from efpsn.topology import Graph

__all__ = ["MembershipReplay", "departures_line", "joins_line", "stopped_words"]


def _name(i: int) -> str:
    return f"agent{i + 1}"


class MembershipReplay:
    """The network's changes over a simulated run: who is in (the seats the run leaves empty
    join later), with whom each agent mixes and with which weights, and each agent's current
    mask.

    `apply(t, drivers)` before round t's messages are taken makes the departures of round t,
    the re-bases and the joins of round t; `check(t)` verifies the members' masks of round t
    sum to zero exactly (integers) once anyone has left or joined.
    """

    def __init__(self, *, problem: Problem, providers: Sequence[MaskProvider],
                 departures: Sequence[Departure], noise_seed: int | None,
                 joins: Sequence[Join] = ()) -> None:
        self.problem = problem
        self.departures = tuple(departures)
        self.joins = tuple(sorted(joins, key=lambda j: (j.round, j.agent)))
        self.noise_seed = noise_seed
        self.graph = problem.graph
        self.departed: set[int] = set()
        self.absent = set(problem.config.late_seats)  # seats that have not joined yet
        stray = [j.label() for j in self.joins if j.agent not in self.absent]
        if stray or len({j.agent for j in self.joins}) < len(self.joins):
            raise ValueError(f"--join {', '.join(stray) or 'a seat twice'}: only a seat the run "
                             f"leaves empty (late: {problem.config.late or 'none'}) joins, once")
        self.joined: list[dict[str, Any]] = []
        self.weights = {i: problem.agent_weights(i) for i in range(problem.n)}
        self.providers = list(providers)
        self.epoch = 0
        self.events: list[dict[str, Any]] = []
        self.rounds_checked = 0
        self.zero_sum = True
        self.window: LastWindow | None = None  # the run stopped in a departure's last window
        self.capped: CapEnd | None = None  # a departure too late to re-base: the run's end
        zero_sum = problem.config.mask == "zero-sum"
        self.seeds: list[EdgeSeeds] | None = None
        self.shares: list[PairShares] | None = None
        if zero_sum and all(isinstance(p, (FadingMask, RefreshedMask)) for p in providers):
            self.seeds = [p.seeds for p in providers]  # type: ignore[union-attr]
        elif zero_sum and all(isinstance(p, FixedMask) for p in providers):
            self.shares = draw_pair_shares(problem.graph, problem.noise_spec,
                                           noise_seed=noise_seed)
            count = problem.noise_spec.num_coefficients
            for s, p in zip(self.shares, providers, strict=True):
                if s.numerators(count) != p.coefficients(0).numerators:
                    raise ValueError("phase I's fixed masks do not match their redrawn shares")

    @property
    def active(self) -> list[int]:
        return [i for i in range(self.problem.n)
                if i not in self.departed and i not in self.absent]

    @property
    def changed(self) -> bool:
        """Whether anyone has left or joined (the members' masks are checked every round)."""
        return bool(self.departed) or bool(self.joined)

    def neighbours(self, i: int) -> tuple[int, ...]:
        """The agents whose messages agent i mixes in this round."""
        return tuple(j for j in sorted(self.weights[i]) if j != i)

    def apply(self, t: int, drivers: Sequence[RoundDriver]) -> bool:
        """Round t's departures and re-bases; True when anything changed."""
        changed = False
        for d in self.departures:
            if d.round == t:
                self._leave(d, drivers)
                changed = True
            elif d.late and not d.phase_one and d.round + 1 == t:  # they used its round-T
                # message; drop it now
                self._drop(d.agent, d.late, drivers)
                changed = True
        if any(d.rebase_round == t for d in self.departures):
            self._rebase(t, drivers)
            changed = True
        for j in self.joins:
            if j.round == t:
                self._join(j, t, drivers)
                changed = True
        return changed

    def _leave(self, d: Departure, drivers: Sequence[RoundDriver]) -> None:
        ended = self.window is not None or self.capped is not None
        if not ended:
            self.window = self._last_window(d, drivers)
        cap = drivers[d.agent].iterations
        capped = None
        if not ended and self.window is None and d.rebase_round >= cap:  # too late: the end
            capped = self.capped = cap_end(reach(self.active, self.neighbours, d),
                                           departure=d, cap=cap)
            for i, end in capped.ends.items():
                drivers[i].iterations = end
        elif not ended and self.window is None:  # it re-bases: before the cap as it stands
            check_rebase(d, cap=cap)
        self.departed.add(d.agent)
        touched = [j for j in self.neighbours(d.agent) if j not in self.departed]
        stray = sorted(set(d.late) - set(touched))
        if stray:
            raise ValueError(f"{d.label()}: {[_name(j) for j in stray]} are not neighbours of "
                             f"{_name(d.agent)} at round {d.round}")
        self._drop(d.agent, [j for j in touched if d.phase_one or j not in d.late], drivers)
        if d.phase_one:  # they finished phase I without it: round 0 never held its terms
            for j in touched:  # but those that got its shares sent round 0 with them
                if j not in d.late:
                    drivers[j].restart()
        for i in self.active:  # no stop from a window that would be decided at round T or later
            stop = drivers[i].stop
            drivers[i].revise_stop(None if stop is None else stop.voided_from(d.round))
        record = d.to_json() if capped is None else {**dataclasses.replace(
            d, capped=capped.cap).to_json(), **capped.to_json()}
        self.events.append({**record, "neighbours": [_name(j) for j in touched]})

    def _last_window(self, d: Departure, drivers: Sequence[RoundDriver]) -> LastWindow | None:
        """Whether d leaves inside a window that certifies the target and some agent reaches
        its stop round all the same (efpsn/departure/last_window.py). Every agent's integers of
        round T (`sharing`) are maxima over some of the round-s integers, each its own among them,
        so their maximum is the network's, which an agent that completes the window holds."""
        stop = drivers[d.agent].stop
        s = None if stop is None else stop.window(d.round)
        if stop is None or s is None:
            return None
        shared = [drivers[i].sharing for i in self.active]
        if any(x is None for x in shared):
            return None
        network = merge(shared[0], shared[1:])
        if not stop.stops(network):
            return None
        reached = reach(self.active, self.neighbours, d)
        return last_window(reached, departure=d, check_round=s, hops=stop.hops,
                           bound=stop.bound(network))

    def stops_at(self, t: int) -> bool:
        """Whether the run ends before round t (a departure's last window stopped it at t)."""
        return self.window is not None and t == self.window.stop_round

    def end(self, drivers: Sequence[RoundDriver]) -> None:
        """The run stopped in a departure's last window: the agents that did not reach the
        stop round end with their check round's state (RoundDriver.end_at_check)."""
        assert self.window is not None
        for i in self.window.at_check:
            drivers[i].end_at_check(self.window.check_round)
        for event in self.events:
            if event["agent"] == _name(self.window.departure.agent):
                event.update(self.window.to_json())

    def _drop(self, agent: int, neighbours: Sequence[int],
              drivers: Sequence[RoundDriver]) -> None:
        for j in neighbours:
            self.weights[j] = _drop_node_weights(self.weights[j], agent=j, gone={agent})
        self._remask(neighbours, drop={agent}, new_edges=())
        self._refresh(neighbours, drivers)

    def _rebase(self, t: int, drivers: Sequence[RoundDriver]) -> None:
        recon = reconfigure(self.graph, self.departed | self.absent)
        self.epoch += 1
        self.graph = recon.graph
        for i in recon.remaining:
            self.weights[i] = recon.agent_weights(i)
        self._remask(sorted({i for e in recon.new_edges for i in e}), drop=set(),
                     new_edges=recon.new_edges)
        self._refresh(recon.remaining, drivers)
        # the stop rule of the remaining graph, its checks counted from R
        # (efpsn/optimize/stopping.py)
        pending = min((d.round for d in self.departures
                       if d.round <= t < d.rebase_round), default=None)
        self._restart_trackers(recon, t, drivers, until=pending)
        # agents whose one neighbour now holds every term of their mask (privacy, not accuracy)
        lonely = ([_name(i) for i in recon.remaining if recon.graph.degree(i) == 1]
                  if len(recon.remaining) > 2 else [])
        for event in self.events:
            if event["rebase_round"] == t:
                event.update(epoch=self.epoch, new_edges=[[_name(a), _name(b)]
                                                          for a, b in recon.new_edges],
                             one_neighbour=lonely,
                             cap=drivers[recon.remaining[0]].iterations)

    def _restart_trackers(self, recon: Reconfiguration, t: int,
                          drivers: Sequence[RoundDriver], *, until: int | None) -> None:
        """The trackers restart (y := g) and the stop rule of the new graph begins, its checks
        counted from round t (efpsn/optimize/stopping.py), the cap extended by its step rule."""
        stop = StopRule.rebased(self.problem.config, recon.remaining_weights(), origin=t,
                                until=until, cap=drivers[recon.remaining[0]].iterations)
        for i in recon.remaining:
            driver = drivers[i]
            driver.state = rebase(driver.state)
            driver.outbox = {k: driver.state[k] for k in driver.algorithm.message_keys}
            if stop.active:  # the cap extended by the remaining graph's step rule
                driver.iterations = stop.cap
            driver.revise_stop(stop)

    def _join(self, join: Join, t: int, drivers: list[RoundDriver]) -> None:
        """Agent k takes part from round t: the topology over the members with it (or the
        operator's neighbours), its new edges seeded, the dropped ones' terms gone at both
        ends, every member re-based, k from the model's initial point."""
        config = self.problem.config
        if any(d.round <= t < d.rebase_round for d in self.departures):
            raise ValueError(f"--join {join.label()}: a departure is being re-based then; a join "
                             "takes effect after it")
        if t >= drivers[self.active[0]].iterations:
            raise ValueError(f"--join {join.label()}: the run's last round is "
                             f"{drivers[self.active[0]].iterations}")
        recon = join_reconfiguration(self.graph, members=self.active, join=join,
                                     topology=config.topology, seed=config.seed)
        number = len(self.joined) + 1  # the join's number: its new edges' seeds
        self.graph = recon.graph
        self.absent.discard(join.agent)
        for i in recon.remaining:
            self.weights[i] = recon.agent_weights(i)
        self._rewire(recon.dropped_edges, recon.new_edges, epoch=seed_epoch(number), since=t)
        newcomer = drivers[join.agent]
        self._refresh(recon.remaining, drivers)
        drivers[join.agent] = RoundDriver(
            algorithm=newcomer.algorithm, context=drivers[join.agent].context,
            schedule=newcomer.schedule, iterations=drivers[self.active[0]].iterations,
            eval_every=newcomer.eval_every, x0=self.problem.initial_params(), start=t)
        members = [i for i in recon.remaining if i != join.agent]
        for i in members:  # the others re-base (the newcomer's init is a re-based state)
            drivers[i].state = rebase(drivers[i].state)
            drivers[i].outbox = {k: drivers[i].state[k]
                                 for k in drivers[i].algorithm.message_keys}
        stop = StopRule.rebased(config, recon.remaining_weights(), origin=t, until=None,
                                cap=drivers[members[0]].iterations)
        for i in recon.remaining:
            if stop.active:
                drivers[i].iterations = stop.cap
            drivers[i].revise_stop(stop)
        name = _name
        self.joined.append({**join.to_json(), "epoch": number,
                            "neighbours": [name(j) for j in recon.graph.neighbours(join.agent)],
                            "new_edges": [[name(a), name(b)] for a, b in recon.new_edges],
                            "dropped_edges": [[name(a), name(b)] for a, b in recon.dropped_edges],
                            "cap": drivers[join.agent].iterations})

    def _rewire(self, dropped: Sequence[tuple[int, int]],
                new_edges: Sequence[tuple[int, int]], *, epoch: int, since: int) -> None:
        """Each end of a dropped edge loses its terms, each end of a new one gets its seeds
        (its shares, with the paper's fixed mask), drawn for `epoch`; a fading mask's new
        edges fade from round `since`."""
        touched = sorted({i for e in (*dropped, *new_edges) for i in e})
        lost: dict[int, set[int]] = {i: set() for i in touched}
        for a, b in dropped:
            lost[a].add(b)
            lost[b].add(a)
        if self.seeds is not None:
            added = new_edge_seeds(new_edges, noise_seed=self.noise_seed, epoch=epoch)
            for i in touched:
                seeds = add_seeds(drop_seeds(self.seeds[i], lost[i]), added.get(i, {}))
                self.seeds[i] = seeds
                self.providers[i] = reseeded(self.providers[i], seeds, since=since)
        elif self.shares is not None:
            spec = self.problem.noise_spec
            fresh = new_edge_shares(new_edges, spec, noise_seed=self.noise_seed, epoch=epoch)
            for i in touched:
                self.shares[i] = self.shares[i].without(lost[i]).plus(fresh.get(i, {}))
                self.providers[i] = self.shares[i].mask(spec.num_coefficients)

    def _remask(self, agents: Sequence[int], *, drop: set[int],
                new_edges: Sequence[tuple[int, int]]) -> None:
        if self.seeds is not None:
            added = new_edge_seeds(new_edges, noise_seed=self.noise_seed, epoch=self.epoch)
            for i in agents:
                seeds = add_seeds(drop_seeds(self.seeds[i], drop), added.get(i, {}))
                self.seeds[i] = seeds
                self.providers[i] = reseeded(self.providers[i], seeds)
        elif self.shares is not None:
            spec = self.problem.noise_spec
            fresh = new_edge_shares(new_edges, spec, noise_seed=self.noise_seed,
                                    epoch=self.epoch)
            for i in agents:
                self.shares[i] = self.shares[i].without(drop).plus(fresh.get(i, {}))
                self.providers[i] = self.shares[i].mask(spec.num_coefficients)

    def _refresh(self, agents: Sequence[int], drivers: Sequence[RoundDriver]) -> None:
        for i in agents:
            drivers[i].context = dataclasses.replace(
                drivers[i].context, weights=self.weights[i],
                oracle=self.problem.objective(i, self.providers[i]))

    def check(self, t: int) -> None:
        """Round t's remaining masks sum to zero exactly (zero-sum masks, once anyone left;
        not in the one round in which a late neighbour still mixes the departed agent in)."""
        if not self.changed or (self.seeds is None and self.shares is None):
            return
        if any(d.late and d.round == t for d in self.departures):
            return  # a late neighbour still holds the departed agent's terms this round
        self.rounds_checked += 1
        self.zero_sum = self.zero_sum and sums_to_zero(
            (self.providers[i] for i in self.active), t)

    def connected(self) -> bool:
        """Whether the remaining agents' current mixing graph is connected (between a departure
        that cut it and the re-base, it is not)."""
        keep = self.active
        edges = tuple((a, b) for a, i in enumerate(keep) for b, j in enumerate(keep)
                      if a < b and j in self.weights[i])
        return Graph(len(keep), edges).is_connected()

    def remaining_weights(self) -> Any:
        """The mixing matrix of the remaining agents (rows and columns of the active ones)."""
        import numpy as np

        keep = self.active
        w = np.zeros((len(keep), len(keep)))
        for a, i in enumerate(keep):
            for b, j in enumerate(keep):
                w[a, b] = self.weights[i].get(j, 0.0)
        return w

    def to_json(self) -> dict[str, Any]:
        """What the records say: who left, when, what changed, what the model is the optimum
        of, and whether the remaining masks summed to zero in every round checked."""
        # a run that stopped in a departure's last window: the model is certified at the check
        # round, on the objective of every agent in the run then (the departed one's too)
        window, capped = self.window, self.capped
        objective = self.active if window is None else [*self.active, window.departure.agent]
        return {
            "departures": self.events,
            **({"joins": self.joined} if self.joined else {}),
            "remaining": [_name(i) for i in self.active],
            "optimum_of": optimum_of(objective) if capped is None
            else capped_model(self.active, capped.departure.agent),
            "rounds_zero_sum_checked": self.rounds_checked,
            "remaining_masks_sum_to_zero": self.zero_sum,
        }


def departures_line(record: dict[str, Any]) -> str:
    """One line of the command's output from MembershipReplay.to_json: who left, when, and what
    the model is the optimum of."""
    gone = "; ".join(f"{e['agent']} left {_when(e)} ({_after(e)})" for e in record["departures"])
    return (f"{gone}; the model is {record['optimum_of']}; remaining masks sum to zero "
            f"exactly: {record['remaining_masks_sum_to_zero']} "
            f"({record['rounds_zero_sum_checked']} rounds checked)")


def _joined(event: dict[str, Any]) -> str:
    edges = event.get("new_edges") or []
    lonely = event.get("one_neighbour") or []
    return "".join(f", new edge {a}-{b}" for a, b in edges) + "".join(
        f", {name} has one neighbour left" for name in lonely)


def _after(event: dict[str, Any]) -> str:
    """What followed a departure: the re-base, or the stop the run had already made."""
    if "stopped" in event:
        return stopped_words(event)
    if "capped" in event:
        return capped_words(event)
    return f"re-based at round {event['rebase_round']}{_joined(event)}"


def stopped_words(event: dict[str, Any]) -> str:
    """A departure in the stop rule's last window, in words (efpsn/departure/last_window.py)."""
    return (f"the run had stopped at round {event['stopped']} on the certificate of round "
            f"{event['check_round']}: {', '.join(event.get('finished', [])) or 'nobody'} "
            f"ended at {event['stopped']}, "
            f"{', '.join(event.get('at_check', [])) or 'nobody'} at {event['check_round']}")


def _when(event: dict[str, Any]) -> str:
    return "in phase I" if event.get("phase_one") else f"at round {event['round']}"


def joins_line(record: dict[str, Any]) -> str:
    """Who joined when, and with whom, in one line (MembershipReplay.to_json's `joins`)."""
    return "; ".join(
        f"{j['agent']} joined at round {j['round']} (neighbours {', '.join(j['neighbours'])}"
        + "".join(f", new edge {a}-{b}" for a, b in j["new_edges"])
        + "".join(f", edge {a}-{b} dropped" for a, b in j["dropped_edges"]) + ")"
        for j in record.get("joins", []))
