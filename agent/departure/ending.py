"""A decision that ends the run for this agent instead of a re-base (agent/departure/silence.py):
the departure came after the run had ended for agents far from it, so the others end too, each
where the rule says (efpsn/departure/last_window.py), the same as `efpsn simulate --leave` replays:

- the run had stopped at S on the stop rule's certificate (Departure.stopped): end with the
  check round's state, S - D (`end_in_window`);
- the departure came too late to re-base before the cap N (Departure.capped): end with the
  iterate of round min(reach(i), N), the round this agent waits at (`end_at_cap`). An agent
  that waits at an earlier round (a neighbour's message slower than the deadline) collects
  the rounds up to it first, so where it ends never depends on timing.
"""

from __future__ import annotations

import logging
from typing import Any

from agent.options import AgentFailure
from efpsn.departure.last_window import cap_end, capped_model, capped_words, reach
from efpsn.departure.membership import Departure, optimum_of
from efpsn.optimize.driver import RoundDriver

# `local` below is agent/departure/local.py's LocalDepartures (which imports this module)
LocalDepartures = Any

__all__ = ["end_at_cap", "end_in_window", "records"]

log = logging.getLogger("efpsn.agent")


def end_in_window(local: LocalDepartures, new: list[Departure], names: dict[int, str],
                  driver: RoundDriver) -> None:
    """The decision says the run had stopped at S on the certificate before these agents
    left (efpsn/departure/last_window.py): end with the check round's state, S - D."""
    local.names = {**names, **local.names}
    stop_round = new[0].stopped
    assert stop_round is not None
    try:
        if driver.stop is None:
            raise ValueError("this agent runs no stop rule")
        driver.end_at_check(stop_round - driver.stop.hops)
    except ValueError as exc:
        raise AgentFailure(f"{local.session.assignment.name}: {exc}") from None
    _record(local, new, check_round=driver.t)
    local.window = new[0].agent
    log.warning("%s: %s; it ends with its model of round %d", local.session.assignment.name,
                "; ".join(d.label() for d in new) + f": the run had stopped at round "
                f"{stop_round} on the certificate of round {driver.t}", driver.t)


def end_at_cap(local: LocalDepartures, new: list[Departure], names: dict[int, str],
               driver: RoundDriver) -> bool:
    """The decision says the departure came too late to re-base before the cap N: this agent
    ends at min(reach, N) (its driver's last round becomes that); True when it is there
    already, False when it must collect the rounds up to it first."""
    local.names = {**names, **local.names}
    d, me, name = new[0], local.me, local.session.assignment.name
    if len(new) != 1 or d.capped != driver.iterations:
        raise AgentFailure(f"{name}: the coordinator ended the run at the cap {d.capped} after "
                           f"{', '.join(x.label() for x in new)}; this agent's last round is "
                           f"{driver.iterations} (one departure at a time is supported)")
    gone = local.gone  # the ones that left before: the graph the rounds run on

    def neighbours(i: int) -> list[int]:
        return [j for j in local.graph.neighbours(i) if j not in gone]

    ends = cap_end(reach([i for i in range(local.session.config.agents) if i not in gone],
                         neighbours, d), departure=d, cap=d.capped)
    end = ends.ended_at(me)
    if driver.t > end:
        raise AgentFailure(f"{name}: the run ended at the cap {d.capped} after {d.label()}, "
                           f"which ends this agent at round {end}, but it is at {driver.t}")
    driver.iterations = end
    _record(local, new, **ends.to_json())
    local.capped = ends
    log.warning("%s: %s left at round %d, %s; it ends with its model of round %d",
                name, local._name(d.agent), d.round, capped_words(ends.to_json()), end)
    return driver.done


def _record(local: LocalDepartures, new: list[Departure], **extra: object) -> None:
    local.decided.extend(new)
    local.epoch += 1
    for d in new:
        local.events.append({**d.to_json(), **extra, "neighbours": [
            local._name(j) for j in local.graph.neighbours(d.agent) if j not in local.gone]})


def records(local: LocalDepartures) -> dict[str, Any] | None:
    """What the records of `local`'s departures and joins say (None when nobody left or
    joined): who left and joined when, who is in the run at the end, and what the model is the
    optimum of. A party that joined records its own join too (`joined`)."""
    assignment = local.session.assignment
    if not local.decided and not local.join_events and not assignment.join_round:
        return None
    out = local.gone | local.absent
    remaining = [i for i in range(local.session.config.agents) if i not in out]
    # stopped in a departure's last window: certified on the objective of the agents in
    # the run at the check round, the one that left then among them; ended at the cap:
    # that objective's iterate, no optimum
    objective = remaining if local.window is None else sorted([*remaining, local.window])
    model = (optimum_of(objective) if local.capped is None else
             capped_model(remaining, local.capped.departure.agent))
    record: dict[str, Any] = {
        "departures": local.events,
        "remaining": [local.names.get(i, f"agent{i + 1}") for i in remaining],
        "optimum_of": model,
        # the members' graph the last rounds ran on (public): the summary's certificate
        "final_edges": [list(e) for e in local.graph.edges]}
    if local.join_events:
        record["joins"] = local.join_events
    if assignment.join_round:  # this party's own join: the round, its neighbours then
        record["joined"] = {"round": assignment.join_round, "epoch": assignment.join_epoch,
                            "neighbours": sorted(p.name for p in assignment.neighbours)}
    return record
