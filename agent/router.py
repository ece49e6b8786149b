"""The agent's gRPC edge, a router: admit, authenticate, validate once, and hand each message to
the phase that owns it.

Every handler checks, before it touches any state: the caller's certificate names the claimed
sender (mutual TLS), the sender is a neighbour, and the message passes the wire checks (run,
phase, round, tensors: efpsn/wire/rounds.py; keys and ciphertexts: efpsn/wire/serde.py and
efpsn/crypto/paillier.py). Then the message goes to its owner, which judges it by its own
ledger (efpsn/ledger.py) and files it: phase I's keys and shares to PhaseOne, a new edge's to
the membership's NewEdges, the flood's statistics to SecureSum, round messages to PhaseTwo
(agent/phases/). Refusals are counted (GetStatus.rejections) and logged; no exception escapes
as UNKNOWN (efpsn/wire/guard.py). The router holds no phase state and never drives the run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from agent.life import Life
from agent.membership import Membership
from agent.options import NotReady
from agent.outbox import Outbox
from agent.phases.phase_one import PhaseOne
from agent.phases.phase_two import PhaseTwo
from agent.phases.secure_sum import SecureSum, stats_length
from agent.phases.shares import ShareCheck
from agent.session import Session
from agent.status import Status
from efpsn.crypto import paillier
from efpsn.ledger import Judgement, Verdict
from efpsn.stats.flood import flood_wire_rounds
from efpsn.wire import limits, records, serde
from efpsn.wire.guard import (
    Admission,
    Gatekeeper,
    Reject,
    RejectionLog,
    admitted,
    guarded,
    guarded_stream,
)
from efpsn.wire.records import Phase, WireError
from efpsn.wire.rounds import round_reply
from efpsn.wire.stats import parse_stats
from efpsn.wire.tls import caller_names
from efpsn.wire.v1 import agent_pb2, agent_pb2_grpc, common_pb2

StatusCode = grpc.StatusCode
SERVICE = agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name


def _short(text: str, limit: int = 64) -> str:
    """repr of (the start of) an untrusted string, for error messages."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


@dataclass(frozen=True)
class Identity:
    """Who this agent is on the wire: its name, whether it runs mutual TLS, whose certificate
    may read its private figures, and whether tests allow small Paillier keys."""

    name: str
    tls: bool
    operator: str
    allow_insecure_keys: bool = False


class AgentService(agent_pb2_grpc.AgentServicer):
    """Serves one agent: phase I keys and shares, phase II rounds, replays and status."""

    def __init__(self, *, identity: Identity, phase_one: PhaseOne, secure_sum: SecureSum,
                 phase_two: PhaseTwo, membership: Membership, outbox: Outbox, status: Status,
                 rejections: RejectionLog, waiting: Callable[[], set[str]]) -> None:
        self.identity = identity
        # the owners of what comes in (agent/phases/, agent/membership.py)
        self.phase_one = phase_one
        self.secure_sum = secure_sum
        self.phase_two = phase_two
        self.membership = membership
        self.outbox = outbox  # what GetRound serves
        self.status = status
        self.rejections = rejections
        self._waiting = waiting
        self._in_flight: Counter[str] = Counter()  # calls per caller (admission)

    def gatekeeper(self) -> Gatekeeper:
        """This service's admission, for its server's interceptors (efpsn.wire.guard)."""
        return Gatekeeper(SERVICE, self.admit, rejections=self.rejections)

    @property
    def life(self) -> Life:
        """This agent's life (agent/life.py): its session and round ledger."""
        return self.status.life

    @property
    def session(self) -> Session | None:
        """The assigned run (None while registering): the life's."""
        return self.life.session

    # ---------------------------------------------------------------- checks

    def admit(self, method: str, context: grpc.aio.ServicerContext) -> Admission:
        """The Agent service's gate (efpsn.wire.guard.Gatekeeper), before a byte of the body is
        read: the caller's certificate must name a neighbour in this run (GetStatus: any
        certificate the CA signed), the body may be at most what `method` can legitimately
        carry in this run (Session.request_limits), and one caller has at most a few calls in
        flight. The certificate's names are read once, here, for the handler."""
        names = caller_names(context) if self.identity.tls else None
        if names is not None and not names:
            raise Reject(StatusCode.UNAUTHENTICATED,
                         "this agent requires mutual TLS: the call carries no client certificate")
        max_bytes = limits.SMALL_REQUEST_BYTES
        if method != "GetStatus":
            s = self._assigned()
            if names is not None:
                self._may_send(s, names, certificate=True)
            if method not in s.request_limits:  # PutStats outside a scale standard run
                raise Reject(StatusCode.FAILED_PRECONDITION,
                             f"{method} has no part in this agent's run")
            max_bytes = s.request_limits[method]
        key = min(names) if names else context.peer()
        if self._in_flight[key] >= limits.CALLS_IN_FLIGHT_PER_CALLER:
            raise Reject(StatusCode.UNAVAILABLE,
                         f"{limits.CALLS_IN_FLIGHT_PER_CALLER} calls from {_short(key)} are "
                         "already in flight: retry later")
        self._in_flight[key] += 1

        def release() -> None:
            self._in_flight[key] -= 1
            if self._in_flight[key] <= 0:
                del self._in_flight[key]

        return Admission(max_bytes, release, caller=names)

    def _may_send(self, s: Session, names: frozenset[str], *, certificate: bool) -> None:
        """Who may send to this agent, the one rule: a neighbour of this run that has not
        departed. Asked of the certificate's names when the caller is admitted, and of the
        claimed sender when its message is authenticated."""
        if names.isdisjoint(s.departed) and not names.isdisjoint(s.admitted_names):
            return  # the common case, once per message: a neighbour still in the run
        gone = sorted(names & s.departed.keys())
        if gone:
            raise Reject(StatusCode.FAILED_PRECONDITION, s.departed[gone[0]])
        if names & s.admitted_names:
            return
        if not certificate:
            raise Reject(StatusCode.PERMISSION_DENIED,
                         f"sender {_short(min(names))} is not a neighbour of {self.identity.name} "
                         f"in run {s.run_id} (neighbours: {', '.join(sorted(s.neighbour_names))})")
        # a new neighbour told of a decision before this agent: a departure's, or, in a run
        # with seats that join later, a join's (heard at the next check round)
        if self.membership.deciding or (s.config.late_seats
                                        and not names.isdisjoint(s.assignment.members)):
            raise Reject(StatusCode.UNAVAILABLE, "awaiting the coordinator's decision",
                         early=True)
        raise Reject(
            StatusCode.PERMISSION_DENIED,
            f"the caller's certificate is for {sorted(names)[:4]}, not a neighbour of "
            f"{self.identity.name} in its run",  # no run id for outsiders
        )

    def _authenticate(self, context: grpc.aio.ServicerContext, claimed: str) -> Session:
        """The session, once the claimed sender is a name in the caller's certificate (mutual
        TLS; the names its admission read) and may send (_may_send)."""
        if self.identity.tls:
            admission = admitted()  # None: a handler called directly with a parsed message
            names = admission.caller if admission is not None else caller_names(context)
            if not names:
                raise Reject(StatusCode.UNAUTHENTICATED, "this agent requires mutual TLS: the "
                             "call carries no client certificate")
            if claimed not in names:
                raise Reject(StatusCode.PERMISSION_DENIED,
                             f"the caller's certificate is for {sorted(names)}, but the message "
                             f"claims to come from {_short(claimed)}")
        s = self._assigned()
        self._may_send(s, frozenset({claimed}), certificate=False)
        self.status.hear(claimed)  # the one place a neighbour's last message time is kept
        return s

    def _assigned(self) -> Session:
        session = self.life.session
        if session is None:
            # Not assigned (or not restored) yet: the sender retries UNAVAILABLE with backoff.
            raise Reject(StatusCode.UNAVAILABLE, "agent not assigned to a run yet", early=True)
        return session

    @staticmethod
    def _obey(judgement: Judgement) -> str:
        """The acknowledgement's detail for an accepted or duplicate message; a Reject for the
        others (with the ledger's status code and reason)."""
        if judgement.verdict in (Verdict.ACCEPT, Verdict.DUPLICATE):
            return judgement.reason
        raise Reject(StatusCode[judgement.code], judgement.reason)

    # ---------------------------------------------------------------- phase I

    def _phase_one_header(self, header: common_pb2.Header, context: grpc.aio.ServicerContext,
                          phase: Phase) -> tuple[Session, str]:
        s = self._authenticate(context, header.sender)
        parsed = records.validate_header(header, run_id=s.run_id, phase=phase, round=0)
        return s, parsed.sender

    def _rejoin_header(self, header: common_pb2.Header, context: grpc.aio.ServicerContext,
                       phase: Phase) -> tuple[Session, str]:
        """A new edge's phase I message: from a new neighbour, at its re-base round."""
        s = self._authenticate(context, header.sender)
        joining = s.joining.get(header.sender)
        if joining is None:
            raise Reject(StatusCode.FAILED_PRECONDITION, f"{_short(header.sender)} shares no "
                         f"new edge with {self.identity.name}")
        parsed = records.validate_header(header, run_id=s.run_id, phase=phase, round=joining[2])
        return s, parsed.sender

    @staticmethod
    def _ack(judgement: Judgement) -> common_pb2.Ack:
        return common_pb2.Ack(accepted=True, detail=AgentService._obey(judgement))

    @staticmethod
    def _not_ready(exc: NotReady) -> Reject:
        """A message before its owner can take it: the sender retries UNAVAILABLE."""
        return Reject(StatusCode.UNAVAILABLE, str(exc), early=True)

    def _new_edges(self) -> Any:
        edges = self.membership.new_edges
        if edges is None:  # departures off: _rejoin_header refuses first (no new edges)
            raise Reject(StatusCode.FAILED_PRECONDITION, "this agent has no new edges")
        return edges

    @staticmethod
    def _ciphertexts(request: agent_pb2.SharesMessage, expected: ShareCheck, *,
                     coefficients: int) -> list[int]:
        """The shares' ciphertexts, checked once: under the receiver's key, as many as its
        phase expects, each a valid ciphertext."""
        batch = serde.ciphertexts_from_proto(
            request.batch, expected_fingerprint=paillier.fingerprint(expected.public_key),
            expected_num_coefficients=coefficients, expected_packed=expected.packed)
        if len(batch.ciphertexts) != expected.count:
            raise WireError(f"expected {expected.count} ciphertexts, got {len(batch.ciphertexts)}")
        for i, c in enumerate(batch.ciphertexts):
            try:
                paillier.validate_ciphertext(expected.public_key, c)
            except ValueError as exc:
                raise WireError(f"ciphertext {i}: {exc}") from None
        return list(batch.ciphertexts)

    @guarded
    async def PutPublicKey(
        self, request: agent_pb2.PublicKeyMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        new_edge = request.header.round > 0  # a new edge's (agent/departure/new_edges.py)
        if new_edge:
            _, sender = self._rejoin_header(request.header, context, Phase.KEYS)
        else:
            _, sender = self._phase_one_header(request.header, context, Phase.KEYS)
        n = serde.public_key_from_proto(request.key)
        digest = serde.key_fingerprint(n)
        try:
            if not new_edge:  # PhaseOne checks the key (after phase I: a copy, or refused)
                return self._ack(self.phase_one.take_key(sender, n, digest))
            key = paillier.public_key_from_n(n)
            paillier.check_key_size(key, allow_insecure=self.identity.allow_insecure_keys)
            return self._ack(await self._new_edges().take_key(
                sender, request.header.round, key, digest))
        except NotReady as exc:
            raise self._not_ready(exc) from None

    @guarded
    async def PutShares(
        self, request: agent_pb2.SharesMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        new_edge = request.header.round > 0  # a new edge's (agent/departure/new_edges.py)
        if new_edge:
            s, sender = self._rejoin_header(request.header, context, Phase.SHARES)
        else:
            s, sender = self._phase_one_header(request.header, context, Phase.SHARES)
        digest = serde.shares_digest(request.batch)
        try:
            if not new_edge and self.phase_one.closed:
                return self._ack(self.phase_one.late("shares", sender, digest))
            owner = self._new_edges() if new_edge else self.phase_one
            ciphertexts = self._ciphertexts(request, owner.expected_shares(),
                                            coefficients=s.problem.N)
            if new_edge:
                return self._ack(await owner.take_shares(sender, request.header.round,
                                                         ciphertexts, digest))
            return self._ack(self.phase_one.take_shares(sender, ciphertexts, digest))
        except NotReady as exc:
            raise self._not_ready(exc) from None

    # ---------------------------------------------------------- the secure sum

    @guarded
    async def PutStats(
        self, request: agent_pb2.StatsMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        s = self._authenticate(context, request.header.sender)
        if "PutStats" not in s.request_limits:  # admit refuses it first; handlers called directly
            raise Reject(StatusCode.FAILED_PRECONDITION, f"run {s.run_id} has no secure sum "
                         f"of column statistics (its scale is {str(s.config.scale)!r})")
        # a new neighbour a departure's decision named floods too, in a later flood's rounds
        record = parse_stats(request, run_id=s.run_id, senders=s.admitted_names,
                             rounds=flood_wire_rounds(s.config.agents), agents=s.config.agents,
                             length=stats_length(s))
        return self._ack(self.secure_sum.take(record))

    # ---------------------------------------------------------------- phase II

    @guarded
    async def PutRound(
        self, request: agent_pb2.RoundMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        return common_pb2.Ack(accepted=True, detail=self._file_round(request, context))

    @guarded_stream(agent_pb2.RoundAck)
    async def StreamRounds(
        self, request: agent_pb2.RoundMessage, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RoundAck:
        """One message of a neighbour's round stream: checked and filed as PutRound does (the
        stream's answer, when the neighbour ends it, is the last message's)."""
        detail = self._file_round(request, context)
        return agent_pb2.RoundAck(round=request.header.round, detail=detail)

    def _file_round(self, request: agent_pb2.RoundMessage,
                    context: grpc.aio.ServicerContext) -> str:
        """Authenticate, then phase II's one intake (validate once, ask its ledger, file an
        accepted message); the acknowledgement's detail (empty for a fresh message)."""
        if not isinstance(request.header, common_pb2.Header):
            raise TypeError(f"expected efpsn.v1.Header, got {type(request.header).__name__}")
        s = self._authenticate(context, request.header.sender)
        try:  # scale standard: phase II starts after the secure sum
            return self._obey(self.phase_two.take_round(
                request, senders=s.round_senders(request.header.round)))
        except NotReady as exc:
            raise self._not_ready(exc) from None

    @guarded
    async def GetRound(
        self, request: agent_pb2.RoundRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RoundReply:
        s = self._authenticate(context, request.header.sender)
        header = records.validate_header(request.header, run_id=s.run_id, phase=Phase.OPTIMIZE)
        t = header.round
        last = self.phase_two.last_round(s)
        if t > last:  # the ledger's: a departure's re-base may extend the cap
            raise WireError(f"round {t} is beyond the run's last round {last}")
        message = self.outbox.get(t)
        if message is not None:
            return round_reply(message, latest_round=self.outbox.produced)
        if t > self.outbox.produced:
            return round_reply(None, latest_round=self.outbox.produced)
        raise Reject(StatusCode.NOT_FOUND, f"round {t} is no longer held by "
                     f"{self.identity.name} (it keeps rounds {self.outbox.held()})")

    @guarded
    async def GetStatus(
        self, request: agent_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.AgentStatus:
        s = self.life.session
        if request.run_id and s is not None and request.run_id != s.run_id:
            shown = s.run_id if self._is_operator(context) else "another run"
            raise Reject(StatusCode.NOT_FOUND,
                         f"this agent is in {shown}, not {_short(request.run_id)}")
        st = self.status
        reply = agent_pb2.AgentStatus(
            name=self.identity.name, phase=int(st.phase), round=st.round,
            total_rounds=s.config.iterations.total if s else 0, loss=math.nan, accuracy=math.nan,
            error=st.error, finished=st.finished,
        )
        names = caller_names(context) if self.identity.tls else None
        if s is not None and (names is None or names & s.neighbour_names):
            # whom it waits for (messages, acknowledgements): lets neighbours name a stall
            reply.waiting_for.extend(sorted(self._waiting()))
        if s is not None:
            self._progress(reply, s, party=names is None or bool(
                names & (s.admitted_names | s.departed.keys() | set(s.assignment.members)))
                or self._is_operator(context))
        if not self._is_operator(context):
            return reply  # liveness only: loss and accuracy are values of this agent's f_i
        reply.run_id = s.run_id if s else ""
        reply.loss, reply.accuracy = st.loss, st.accuracy
        reply.rejections.update(self.rejections.counts)
        if self.phase_two.resumed_from is not None:
            reply.resumed_from_round = self.phase_two.resumed_from
        return reply

    def _progress(self, reply: agent_pb2.AgentStatus, s: Session, *, party: bool) -> None:
        """The run's progress as this agent sees it: counts for everyone; for the run's parties
        (`party`) also the neighbours' names, addresses and when each was last heard, and who
        left. Names and times only, nothing of this agent's data."""
        ledger = self.phase_two.ledger
        reply.last_round = ledger.last if ledger is not None else 0
        reply.neighbour_count, reply.departed_count = len(s.addresses), len(s.departed)
        if not party:
            return
        reply.neighbours.extend(agent_pb2.NeighbourView(
            name=n, address=a, heard_seconds_ago=self.status.heard_ago(n))
            for n, a in sorted(s.addresses.items()))
        reply.departed.extend(sorted(s.departed))

    def _is_operator(self, context: grpc.aio.ServicerContext) -> bool:
        """Under mutual TLS only the operator's certificate (--operator-name, default this
        agent's own name) sees private figures; plaintext (--insecure) has no identities."""
        if not self.identity.tls:
            return True
        names = caller_names(context)
        return bool(names) and self.identity.operator in names
