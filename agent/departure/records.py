"""The departures an agent applied, on disk, so that it can be restarted after one (kill -9 and
the same command again) and resume: STATE/departures.json (0600, written atomically by the state
store, deleted with the run's other secrets when it finishes, like the phase I seeds it extends).

It holds the coordinator's decisions (who left, at which round, the re-base round, the late
neighbours), the decision epoch, the records written to result.json, and for a departure that
cut the graph the new neighbours (name, index, address, re-base round) and the seeds of the new
edges (secret like phase I's seeds: this agent's s_ij and s_ji, hex). Nothing of its data.

On resume (agent/departure/local.py: LocalDepartures.restore) the agent re-applies what the
departures changed up to its checkpoint round: the drop-node weights and masks of the rounds
up to it, the re-bases before it (weights, new edges, the stop rule and its cap; not the
trackers: the checkpoint holds them), so it goes on exactly as it would have: the network still
equals `efpsn simulate --leave ...` bit for bit. Applying a departure forces a checkpoint at
that round (agent/phases/phase_two.py), so a neighbour of the departed agent never needs one of its
messages again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agent.departure.reports import JoinNotice
from agent.state import DEPARTURES, StateStore
from efpsn.departure.membership import Departure

__all__ = ["left_in_phase_one", "load", "save"]

FORMAT = 1


def save(store: StateStore, *, run_id: str, decided: list[Departure], epoch: int,
         events: list[dict[str, Any]], names: dict[int, str],
         joining: dict[str, tuple[int, str, int]],
         seeds: dict[int, tuple[bytes, bytes]], adopted: bool = True,
         joins: list[JoinNotice] | None = None, join_events: list[dict[str, Any]] | None = None,
         ) -> None:
    """`adopted` False: decisions taken in phase I, saved before phase I's result (so that a
    restart knows them), not yet adopted by phase II (agent/departure/phase_one.py). `joins`:
    the joins this agent knows (coordinator/joins.py), in their order."""
    store.save_record(DEPARTURES, {
        "joins": [{**dataclasses.asdict(j), "edges": [list(e) for e in j.edges],
                   "ends": {str(i): list(e) for i, e in j.ends.items()}}
                  for j in joins or []],
        "join_events": list(join_events or []),
        "format": FORMAT, "run_id": run_id, "epoch": epoch, "events": events,
        "adopted": adopted,
        "decided": [[d.agent, d.round, d.rebase_round, list(d.late), d.phase_one]
                    for d in decided],
        "names": {str(i): n for i, n in names.items()},
        "joining": {n: [j, address, r] for n, (j, address, r) in joining.items()},
        "seeds": {str(j): [a.hex(), b.hex()] for j, (a, b) in seeds.items()},
    })


def load(store: StateStore, *, run_id: str) -> dict[str, Any] | None:
    """The saved record, parsed (None: no departure was applied here). ValueError when it
    belongs to another run or is damaged."""
    path = store.record_path(DEPARTURES)
    try:
        payload = store.load_record(DEPARTURES, fmt=FORMAT, run_id=run_id)
        if payload is None:
            return None
        return {
            "epoch": int(payload["epoch"]), "events": list(payload["events"]),
            "adopted": bool(payload.get("adopted", True)),
            "decided": [Departure(agent=int(a), round=int(t), rebase_round=int(r),
                                  late=tuple(int(j) for j in late),
                                  phase_one=bool(rest and rest[0]))
                        for a, t, r, late, *rest in payload["decided"]],
            "names": {int(i): str(n) for i, n in payload["names"].items()},
            "joining": {str(n): (int(j), str(address), int(r))
                        for n, (j, address, r) in payload["joining"].items()},
            "seeds": {int(j): (bytes.fromhex(a), bytes.fromhex(b))
                      for j, (a, b) in payload["seeds"].items()},
            "joins": [JoinNotice(name=str(j["name"]), index=int(j["index"]),
                                 round=int(j["round"]), address=str(j["address"]),
                                 number=int(j["number"]),
                                 edges=tuple((int(a), int(b)) for a, b in j["edges"]),
                                 cap=int(j["cap"]),
                                 ends={int(i): (str(n), str(a))
                                       for i, (n, a) in j["ends"].items()})
                      for j in payload.get("joins", [])],
            "join_events": list(payload.get("join_events", [])),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is damaged: {exc}") from None


def left_in_phase_one(record: dict[str, Any] | None, index: int) -> set[int]:
    """The neighbours of agent `index` that left in phase I itself (not a late one: agent
    `index` had its seed), from a loaded record: its saved edge seeds lack theirs."""
    if record is None:
        return set()
    return {d.agent for d in record["decided"] if d.phase_one and index not in d.late}
