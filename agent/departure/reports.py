"""What the departure subsystem tells the coordinator and hears from it: a report of silent
neighbours and the decision that answers it (coordinator/departures.py decides, the same for
every agent), that an agent finished, and the polls of a run with seats that join later
(coordinator/joins.py). Only names and round numbers go to the coordinator."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from agent.options import AgentFailure
from agent.session import Session
from efpsn.departure.membership import Departure
from efpsn.wire.v1 import coordinator_pb2, coordinator_pb2_grpc

__all__ = ["JoinNotice", "poll_membership", "report_finished", "report_silence"]

log = logging.getLogger("efpsn.agent")


async def report_silence(channel: grpc.aio.Channel, *, session: Session, name: str,
                         round_: int, silent: list[str], epoch: int, timeout: float,
                         phase_one: bool = False, last: int = 0
                         ) -> tuple[list[Departure], dict[int, str],
                                    dict[str, tuple[int, str]]]:
    """Report the silent neighbours and wait for the coordinator's decision: every departure of
    the run so far, the departed agents' names by index, and this agent's new neighbours when
    the decision cut the graph (name -> (index, address)). AgentFailure (naming the silent
    ones) when it refuses or cannot decide. `phase_one`: this agent is still in phase I;
    `last`: its last round as it stands (0: not known)."""
    request = coordinator_pb2.SilenceReport(run_id=session.run_id, sender=name, round=round_,
                                            silent=silent, epoch=epoch, phase_one=phase_one,
                                            last=last)
    try:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        reply = await stub.ReportSilence(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        gone = (exc.details() or "").startswith(f"{name} was declared gone")  # its own cause
        raise AgentFailure(f"the coordinator decided no departure: {exc.code().name}: "
                           f"{exc.details()}",
                           blame=None if gone else (silent[0] if silent else name)) from None
    if reply.run_id != session.run_id:
        raise AgentFailure(f"{name}: the coordinator answered for run {reply.run_id[:64]!r}")
    n = session.config.agents
    out, names, joining = [], {}, {}
    try:
        for p in reply.joining:
            if (p.index >= n or p.index == session.index or p.name in session.neighbour_names
                    or not p.name or not p.address or len(p.address) > 512):
                raise ValueError(f"{p.name[:64]!r} (index {p.index}) cannot be a new neighbour")
            joining[p.name] = (int(p.index), p.address)
        for d in reply.departed:
            known = {**session.names, session.index: name}.get(d.index, d.agent)
            if d.index >= n or any(j >= n for j in d.late_index) or known != d.agent:
                raise ValueError(f"{d.agent[:64]!r} (index {d.index}) is not an agent of "
                                 "this run")
            names[int(d.index)] = d.agent
            out.append(Departure(agent=int(d.index), round=int(d.round),
                                 rebase_round=int(d.rebase_round),
                                 late=tuple(int(j) for j in d.late_index),
                                 phase_one=bool(d.phase_one),
                                 stopped=int(d.stopped) or None,
                                 capped=int(d.capped) or None))
    except ValueError as exc:
        raise AgentFailure(f"{name}: the coordinator sent a departure it cannot apply: "
                           f"{exc}") from None
    return out, names, joining


async def report_finished(channel: grpc.aio.Channel, *, session: Session, name: str,
                          round_: int, epoch: int, timeout: float, capped: bool = False
                          ) -> None:
    """Tell the coordinator this agent stopped at `round_` on the stop rule's certificate
    (`capped`: at the run's cap), so that a departure decided after it is decided as the end
    it was (coordinator/departures.py, efpsn/departure/last_window.py). Bounded by `timeout`; a
    failure is only logged (the run is over for this agent; without the report a neighbour stuck
    behind a departure exits 2 as before)."""
    request = coordinator_pb2.SilenceReport(run_id=session.run_id, sender=name, round=round_,
                                            epoch=epoch, finished=round_, capped=capped)
    try:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        await stub.ReportSilence(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:  # e.g. a coordinator that stopped serving (--linger)
        log.info("%s could not tell the coordinator it finished at round %d: %s: %s", name,
                 round_, exc.code().name, exc.details())


@dataclass(frozen=True)
class JoinNotice:
    """A join the coordinator decided (coordinator/joins.py): who, from which round, where it
    serves, its number, the members' graph from then on and their cap before it."""

    name: str
    index: int
    round: int
    address: str
    number: int
    edges: tuple[tuple[int, int], ...]
    cap: int
    ends: dict[int, tuple[str, str]]  # the new edges' ends: index -> (name, address)


async def poll_membership(channel: grpc.aio.Channel, *, session: Session, name: str,
                          round_: int, known: int, timeout: float, finished: bool = False,
                          ) -> list[JoinNotice]:
    """Before stepping check round `round_` (or having ended there, `finished`): the joins
    decided after the first `known`. AgentFailure when the coordinator does not answer: a
    member of a run with late seats never steps a check round without the decisions."""
    request = coordinator_pb2.MembershipPoll(run_id=session.run_id, sender=name, round=round_,
                                             finished=finished, known=known)
    try:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        reply = await stub.PollMembership(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise AgentFailure(f"{name}: the coordinator did not answer the poll of round "
                           f"{round_} (a run whose seats join later polls it every check "
                           f"round): {exc.code().name}: {exc.details()}") from None
    if reply.run_id != session.run_id:
        raise AgentFailure(f"{name}: the coordinator answered for run {reply.run_id[:64]!r}")
    n = session.config.agents
    notices = []
    try:
        for j in reply.joins:
            edges = tuple((int(e.a), int(e.b)) for e in j.edges)
            if (not 0 <= j.index < n or not j.name or not j.address or len(j.address) > 512
                    or j.round < 1 or j.epoch < 1 or any(not 0 <= a < b < n for a, b in edges)):
                raise ValueError(f"{j.name[:64]!r} (index {j.index}) at round {j.round}")
            ends = {int(p.index): (p.name, p.address) for p in j.ends}
            if any(not 0 <= i < n or not p or not a or len(a) > 512
                   for i, (p, a) in ends.items()):
                raise ValueError(f"the ends of {j.name[:64]!r}'s new edges")
            notices.append(JoinNotice(name=j.name, index=int(j.index), round=int(j.round),
                                      address=j.address, number=int(j.epoch), edges=edges,
                                      cap=int(j.cap), ends=ends))
    except ValueError as exc:
        raise AgentFailure(f"{name}: the coordinator sent a join it cannot apply: {exc}"
                           ) from None
    return notices
