"""The membership changes one agent knows and what they change for it, round by round: the
pure core's functions (efpsn/departure/membership.py, efpsn/departure/joins.py,
efpsn/departure/remask.py) applied as the simulator's replay applies them
(efpsn/departure/replay.py), so that the network equals `efpsn simulate --leave` and
`--join`.

At round T each neighbour of the departed agent d (at T + 1 a neighbour that used d's round-T
message, Departure.late) mixes with the drop-node weights and drops the mask terms it shares
with d; at the re-base round R every remaining agent takes the Metropolis weights of the graph
without d (joined where it fell apart: the ends of a new edge exchange seeds right after the
decision, agent/departure/new_edges.py, and add them at R), restarts its tracker from its local
gradient and, with the stop rule, the remaining graph's rule (efpsn/optimize/stopping.py; no
window decided at T or later counts). A join at round R (a seat the run left empty) changes
the graph at R to the topology over the members with the newcomer: this agent drops the terms
of the edges it loses, adds the seeds of the edges it gains (exchanged before R), takes the new
weights and re-bases, as everyone does.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from agent.departure import records as saved
from agent.departure.ending import records
from agent.departure.fixed_terms import EdgeTerms
from agent.departure.reports import JoinNotice
from agent.options import AgentFailure
from agent.session import Session
from agent.state import StateStore
from efpsn.departure.joins import Join, join_reconfiguration
from efpsn.departure.last_window import CapEnd
from efpsn.departure.membership import (
    Departure,
    Reconfiguration,
    drop_node_weights,
    optimum_of,
    rebase,
    reconfigure,
)
from efpsn.departure.remask import add_seeds, drop_seeds, reseeded
from efpsn.masks.fading import FadingMask
from efpsn.masks.refresh import FixedMask, MaskProvider, RefreshedMask
from efpsn.optimize.driver import RoundDriver
from efpsn.optimize.stopping import StopRule
from efpsn.topology import Graph, metropolis_weights

__all__ = ["LocalDepartures"]

log = logging.getLogger("efpsn.agent")


class LocalDepartures:
    """The departures this agent knows and what they change for it, round by round."""

    def __init__(self, session: Session, masks: MaskProvider,
                 terms: EdgeTerms | None = None) -> None:
        self.session = session
        self.masks = masks
        # the paper's fixed mask: phase I's per-edge shares a departure subtracts (fixed_terms;
        # a restarted agent's: reloaded by Silence.resume)
        self.terms = (terms or EdgeTerms(None)) if isinstance(masks, FixedMask) else None
        self.decided: list[Departure] = []
        self.epoch = 0
        self.graph = session.problem.graph
        self.weights = session.weights()
        self.events: list[dict[str, Any]] = []
        self.names = {**session.names, session.index: session.assignment.name}
        self._rebased: set[int] = set()
        self.new_seeds: dict[int, tuple[bytes, bytes]] = {}  # new neighbour -> (s_ij, s_ji)
        # what a restart needs again (agent/departure/records.py): every new neighbour and seed
        self.joined_info: dict[str, tuple[int, str, int]] = {}
        self.seed_record: dict[int, tuple[bytes, bytes]] = {}
        self.window: int | None = None  # who left in the stop's last window (ending.py)
        self.capped: CapEnd | None = None  # a departure too late to re-base: the run's end
        # seats that are no part of the run (yet): isolated in the graph
        self.absent = {i for i in range(session.config.agents)
                       if self.graph.degree(i) == 0 and i != self.me}
        self.joins: list[JoinNotice] = []  # the joins this agent learned, in their order
        # a party that joined never learns the joins up to its own: its assignment's graph
        # holds them (0 for a member from the start)
        self.joins_before = session.assignment.join_epoch
        self.join_events: list[dict[str, Any]] = []

    @property
    def me(self) -> int:
        return self.session.index

    @property
    def known_joins(self) -> int:
        """How many of the run's joins this agent knows (the coordinator's `known`)."""
        return self.joins_before + len(self.joins)

    @property
    def gone(self) -> set[int]:
        return {d.agent for d in self.decided}

    def learn(self, departures: list[Departure], names: dict[int, str], driver: RoundDriver,
              joining: dict[str, tuple[int, str]] | None = None) -> dict[str, int]:
        """The coordinator's decision (all departures so far): check this agent can apply it;
        the new neighbours it shares a new edge with from the re-base round on (name ->
        index: their seeds are exchanged before it, agent/departure/new_edges.py)."""
        self.names = {**names, **self.names}
        new = [d for d in departures if d.agent not in self.gone]
        if not new:
            raise AgentFailure(f"{self.session.assignment.name}: the coordinator's answer "
                               "holds no new departure")
        zero_sum = self.session.config.mask == "zero-sum"
        if zero_sum and self.terms is not None and not self.terms.available:
            raise AgentFailure("a departure with the paper's fixed mask (--refresh never) needs "
                               "phase I's per-edge shares, which this agent does not hold (its "
                               "phase I ran with departures off?): agent/departure/fixed_terms.py")
        after = reconfigure(self.graph, self.gone | {d.agent for d in new} | self.absent)
        mine = sorted({b if a == self.me else a for a, b in after.new_edges if self.me in (a, b)})
        given = {index: (name, address) for name, (index, address) in (joining or {}).items()}
        if sorted(given) != mine:
            raise AgentFailure(f"the departure of {', '.join(self._name(d.agent) for d in new)} gives "
                               f"{self.session.assignment.name} the new neighbours "
                               f"{[f'agent{j + 1}' for j in mine]}, the coordinator named "
                               f"{sorted(n for n, _ in given.values())}")
        rebase_round = min(d.rebase_round for d in new)
        for j, (name, address) in given.items():
            self.session.joining[name] = (j, address, rebase_round)
            self.joined_info[name] = (j, address, rebase_round)
            self.names[j] = name
        self.decided.extend(new)
        self.epoch += 1
        if driver.stop is not None:  # no stop from a window decided at the round T or later
            driver.revise_stop(driver.stop.voided_from(min(d.round for d in new)))
        for d in new:
            self.events.append({**d.to_json(), "neighbours": [
                self._name(j) for j in self.graph.neighbours(d.agent)
                if j not in self.gone]})
        log.warning("%s: the coordinator decided: %s", self.session.assignment.name,
                    "; ".join(d.label() for d in new))
        return {name: j for j, (name, _) in given.items()}

    def add_seeds(self, seeds: dict[int, tuple[bytes, bytes]]) -> None:
        """The new edges' seeds, from their phase I (agent/departure/new_edges.py), until the
        re-base."""
        self.new_seeds.update(seeds)
        self.seed_record.update(seeds)

    def save(self, store: StateStore) -> None:
        """What a restart needs to re-apply the departures (agent/departure/records.py)."""
        saved.save(store, run_id=self.session.run_id, decided=self.decided, epoch=self.epoch,
                   events=self.events, names=self.names, joining=self.joined_info,
                   seeds=self.seed_record, joins=list(self.joins),
                   join_events=self.join_events)

    def restore(self, record: dict[str, Any], driver: RoundDriver) -> None:
        """A restart after departures or joins were applied: re-apply what they changed up to
        the checkpoint's round c (the drops of rounds <= c, the re-bases and joins before c
        without touching the checkpoint's trackers); round c's re-base or join is the loop's,
        as before the restart; a join still to come waits for its round."""
        c = driver.t
        self.decided = list(record["decided"])
        self.epoch, self.events = record["epoch"], record["events"]
        self.names = {**record["names"], **self.names}
        self.joined_info = dict(record["joining"])
        self.seed_record = dict(record["seeds"])
        self.new_seeds = dict(record["seeds"])
        self.join_events = list(record.get("join_events", []))
        for name, entry in self.joined_info.items():
            self.session.joining[name] = entry
        for notice in record.get("joins", []):  # each checked again, in order
            self.learn_join(notice, driver, restoring=True)
        sharing, outbox = driver.sharing, driver.outbox  # the checkpoint's stop window
        if driver.stop is not None and self.decided:
            driver.revise_stop(driver.stop.voided_from(min(d.round for d in self.decided)))
        joined = {notice.round: notice for notice in self.joins}
        rounds = sorted({r for d in self.decided for r in (d.round, d.round + 1)
                         if r <= c} | {d.rebase_round for d in self.decided
                                       if d.rebase_round < c} | {r for r in joined if r < c})
        for r in rounds:
            self._drop_at(r)
            if any(d.rebase_round == r for d in self.decided):
                self._rebased.add(r)
                self._rebase(r, driver, replaying=True)
            if r in joined:
                self._rebased.add(r)
                self._join_at(joined[r], driver, replaying=True)
        self._refresh(driver)
        if sharing is not None and driver.stop is not None and driver.stop.window(c) is not None:
            driver.sharing, driver.outbox = sharing, outbox
        log.warning("%s resumed with the membership changes %s applied up to round %d",
                    self.session.assignment.name,
                    ", ".join([d.label() for d in self.decided]
                              + [f"{n.name}@{n.round} joined" for n in self.joins]), c)

    def _drop_at(self, t: int) -> list[int]:
        dropped: list[int] = []
        for d in self.decided:
            first = d.round + int(self.me in d.late and not d.phase_one)  # used round T
            if t == first and d.agent in self.weights:
                dropped.append(d.agent)
        if dropped:
            self.weights = drop_node_weights(self.weights, agent=self.me, gone=dropped)
            self._remask(dropped)
        for j in dropped:
            name = self._name(j)
            self.session.drop(name, reason=self._reason(name))
        return dropped

    def before_round(self, t: int, driver: RoundDriver) -> tuple[list[str], list[str]]:
        """Apply what round t changes (before its messages are taken); the neighbours this
        agent stops exchanging with from round t on, and the new ones it starts with."""
        dropped = self._drop_at(t)
        if dropped:
            self._refresh(driver)
        names = [self._name(j) for j in dropped]
        joined: list[str] = []
        if any(d.rebase_round == t for d in self.decided) and t not in self._rebased:
            self._rebased.add(t)
            joined = self._rebase(t, driver)
        for notice in self.joins:
            if notice.round == t and t not in self._rebased:
                self._rebased.add(t)
                unlinked, linked = self._join_at(notice, driver)
                names, joined = names + unlinked, joined + linked
        return names, joined

    # ------------------------------------------------------------------ joins

    def learn_join(self, notice: JoinNotice, driver: RoundDriver, *,
                   restoring: bool = False) -> dict[str, int]:
        """A join the coordinator decided (coordinator/joins.py), checked against the public
        rule (the members' graph it names must be the topology over them with the newcomer,
        from the graph this agent will have at its round) and recorded; this agent's partners
        on the new edges, whose seeds it exchanges before the join's round (name -> index)."""
        me, name = self.me, self.session.assignment.name
        if notice.number != self.known_joins + 1:
            raise AgentFailure(f"{name}: the coordinator's join number {notice.number} is not "
                               f"the next one ({self.known_joins + 1})")
        if notice.round < driver.t and not restoring:
            raise AgentFailure(f"{name}: {notice.name} joins at round {notice.round}, which "
                               f"this agent has passed (it is at round {driver.t})")
        self.joins.append(notice)
        self.names[notice.index] = notice.name
        if restoring:  # checked when it was learned; its seeds are saved (or their exchange)
            return {}
        # the graph at the join's round before it: a departure being re-based comes first
        before = (Graph(self.graph.n, self.joins[-2].edges) if len(self.joins) > 1
                  else reconfigure(self.graph, self.gone | self.absent).graph)
        members = [i for i in range(self.session.config.agents)
                   if i not in self.gone and i not in self.absent
                   and all(i != n.index for n in self.joins)]
        members += [n.index for n in self.joins[:-1]]
        config = self.session.config
        recon = join_reconfiguration(before, members=sorted(members),
                                     join=Join(agent=notice.index, round=notice.round),
                                     topology=config.topology, seed=config.seed)
        if recon.graph.edges != notice.edges:
            raise AgentFailure(f"{name}: the coordinator's graph for {notice.name}'s join "
                               f"differs from the topology over the members "
                               f"({list(notice.edges)[:6]} against {list(recon.graph.edges)[:6]})")
        partners = sorted({b if a == me else a for a, b in recon.new_edges if me in (a, b)})
        out: dict[str, int] = {}
        for j in partners:
            who, address = notice.ends.get(j, ("", ""))
            if not who or not address:
                raise AgentFailure(f"{name}: the coordinator named no address for agent "
                                   f"{j + 1}, an end of a new edge of {notice.name}'s join")
            self.names[j] = who
            self.session.joining[who] = (j, address, notice.round)
            self.joined_info[who] = (j, address, notice.round)
            out[who] = j
        log.warning("%s: %s joins at round %d%s", name, notice.name, notice.round,
                    "".join(f"; new neighbour {n}" for n in out))
        return out

    def _join_at(self, notice: JoinNotice, driver: RoundDriver, *,
                 replaying: bool = False) -> tuple[list[str], list[str]]:
        """Round R of a join: the new graph's weights, this agent's edges rewired (the lost
        ones' terms dropped, the new ones' seeds added), the trackers re-based, the new
        graph's stop rule; the neighbours it stops and starts exchanging with."""
        me = self.me
        self.absent.discard(notice.index)
        target = Graph(self.graph.n, notice.edges, name=self.graph.name)
        old, new_set = set(self.graph.edges), set(target.edges)
        recon = Reconfiguration(
            graph=target, departed=tuple(sorted(self.gone | self.absent)),
            dropped_edges=tuple(sorted(old - new_set)), new_edges=tuple(sorted(new_set - old)),
            weights=metropolis_weights(target))
        self.graph = target
        self.weights = recon.agent_weights(me)
        lost = sorted({b if a == me else a for a, b in recon.dropped_edges if me in (a, b)})
        new = sorted({b if a == me else a for a, b in recon.new_edges if me in (a, b)})
        if isinstance(self.masks, (FadingMask, RefreshedMask)):
            self.masks = reseeded(self.masks, add_seeds(
                drop_seeds(self.masks.seeds, lost), {j: self.new_seeds.pop(j) for j in new}),
                since=notice.round)
        elif self.terms is not None and isinstance(self.masks, FixedMask):
            self.masks = self.terms.joined(self.terms.dropped(self.masks, lost), new)
        unlinked = [self._name(j) for j in lost]
        linked = [self._name(j) for j in new]
        for n in unlinked:
            self.session.unlink(n, until=notice.round)
        for n in linked:
            self.session.join(n)
        self._refresh(driver)
        if not replaying:  # a restart's checkpoint after R holds the re-based trackers
            driver.state = rebase(driver.state)
            driver.outbox = {k: driver.state[k] for k in driver.algorithm.message_keys}
        stop = StopRule.rebased(self.session.config, recon.remaining_weights(),
                                origin=notice.round, until=None, cap=driver.iterations)
        if stop.active:  # the cap extended by the new graph's step rule
            driver.iterations = stop.cap
        driver.revise_stop(stop)
        if not any(e["agent"] == notice.name for e in self.join_events):
            self.join_events.append(join_event(notice, recon, self._name, cap=driver.iterations))
        log.warning("%s: %s joined at round %d: the model is now %s%s%s",
                    self.session.assignment.name, notice.name, notice.round,
                    optimum_of(recon.remaining),
                    "".join(f"; new neighbour {n}" for n in linked),
                    "".join(f"; no longer a neighbour: {n}" for n in unlinked))
        return unlinked, linked

    def _rebase(self, t: int, driver: RoundDriver, *, replaying: bool = False) -> list[str]:
        # those gone by round t, as the replay has them (a restart knows later ones too)
        recon = reconfigure(self.graph, {d.agent for d in self.decided if d.round <= t}
                            | self.absent)
        self.graph = recon.graph
        self.weights = recon.agent_weights(self.me)
        new = sorted({b if a == self.me else a for a, b in recon.new_edges if self.me in (a, b)})
        joined = [self._name(j) for j in new]
        for name in joined:
            self.session.join(name)
        if new and isinstance(self.masks, (FadingMask, RefreshedMask)):  # phase I's terms
            self.masks = reseeded(self.masks, add_seeds(
                self.masks.seeds, {j: self.new_seeds.pop(j) for j in new}))
        elif new and self.terms is not None and isinstance(self.masks, FixedMask):
            self.masks = self.terms.joined(self.masks, new)
        self._refresh(driver)
        if not replaying:  # a restart's checkpoint after R holds the re-based trackers
            driver.state = rebase(driver.state)
            driver.outbox = {k: driver.state[k] for k in driver.algorithm.message_keys}
        # the stop rule of the remaining graph, its checks counted from R
        # (efpsn/optimize/stopping.py)
        pending = min((d.round for d in self.decided if d.round <= t < d.rebase_round), default=None)
        stop = StopRule.rebased(self.session.config, recon.remaining_weights(), origin=t,
                                until=pending, cap=driver.iterations)
        if stop.active:  # the cap extended by the remaining graph's step rule
            driver.iterations = stop.cap
        driver.revise_stop(stop)
        for event in self.events:  # a restart reloads them: those its last save preceded
            if event["rebase_round"] == t and not (replaying and "new_edges" in event):
                event.update(epoch=self.epoch, new_edges=[[self._name(a), self._name(b)]
                                                          for a, b in recon.new_edges],
                             cap=driver.iterations)
        log.warning("%s re-based at round %d: the model is now %s%s",
                    self.session.assignment.name, t, optimum_of(recon.remaining),
                    "".join(f"; new neighbour {n}" for n in joined))
        return joined

    def _remask(self, gone: list[int]) -> None:
        if isinstance(self.masks, (FadingMask, RefreshedMask)):
            self.masks = reseeded(self.masks, drop_seeds(self.masks.seeds, gone))
        elif self.terms is not None and isinstance(self.masks, FixedMask):
            self.masks = self.terms.dropped(self.masks, gone)

    def _refresh(self, driver: RoundDriver) -> None:
        driver.context = dataclasses.replace(
            driver.context, weights=dict(self.weights),
            oracle=self.session.problem.objective(self.me, self.masks))

    def _reason(self, name: str) -> str:
        d = next(d for d in self.decided if self.names.get(d.agent) == name)
        return (f"{name} was declared gone at round {d.round} by the coordinator (silent past "
                "the departure deadline); it cannot come back to this run")

    def _name(self, j: int) -> str:
        return self.names.get(j, f"agent{j + 1}")

    def to_json(self) -> dict[str, Any] | None:
        """What the records say (None when nobody left): agent/departure/ending.py's
        `records`."""
        return records(self)


def join_event(notice: JoinNotice, recon: Reconfiguration, name: Any, *, cap: int
               ) -> dict[str, Any]:
    """A join as the records name it (the simulator's replay writes the same)."""
    return {"agent": notice.name, "round": notice.round, "epoch": notice.number,
            "neighbours": [name(j) for j in recon.graph.neighbours(notice.index)],
            "new_edges": [[name(a), name(b)] for a, b in recon.new_edges],
            "dropped_edges": [[name(a), name(b)] for a, b in recon.dropped_edges], "cap": cap}
