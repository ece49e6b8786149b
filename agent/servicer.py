"""The agent's gRPC servicer: authenticate, validate, decode, and file into the mailbox.

It never drives the run: phase I and phase II (agent/phase_one.py, agent/phase_two.py) wait on
the mailbox it fills and read the records it keeps.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

import grpc

from agent.phase_two import decode_round
from agent.session import Session
from efpsn import paillier
from efpsn.wire import limits, serde
from efpsn.wire.net import Admission, Reject, guarded, guarded_stream
from efpsn.wire.serde import Phase, WireError
from efpsn.wire.tls import caller_names
from efpsn.wire.v1 import agent_pb2, agent_pb2_grpc, common_pb2

if TYPE_CHECKING:
    from agent.node import AgentNode

StatusCode = grpc.StatusCode


def _short(text: str, limit: int = 64) -> str:
    """repr of (the start of) an untrusted string, for error messages."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _within_run(round_: int, session: Session) -> int:
    """The round, if the run has it (rounds 0..iterations); WireError otherwise."""
    last = session.config.iterations
    if round_ > last:
        raise WireError(f"round {round_} is beyond the run's last round {last}")
    return round_


class AgentService(agent_pb2_grpc.AgentServicer):
    """The gRPC edge: authenticate, validate, decode, drop into the mailbox.

    Every handler checks, before it touches any state: the caller's certificate names the
    claimed sender (mutual TLS), the sender is a neighbour, run id, phase and round window, and
    the payload (shapes, dtypes, finiteness; key size; ciphertext range and key fingerprint). A
    duplicate must repeat the first copy exactly. Refusals are counted (GetStatus.rejections)
    and logged; no exception escapes as UNKNOWN (efpsn.wire.guard.guarded).
    """

    def __init__(self, node: AgentNode) -> None:
        self.node = node
        self.rejections = node.rejections
        self._in_flight: Counter[str] = Counter()

    # ---------------------------------------------------------------- checks

    def admit(self, method: str, context: grpc.aio.ServicerContext) -> Admission:
        """Before a byte of the body is read (efpsn.wire.guard.add_service): the caller's
        certificate must name a neighbour in this run (GetStatus: any certificate the CA
        signed), the body may be at most what `method` can legitimately carry in this run
        (Session.request_limits), and one caller has at most a few calls in flight."""
        names = caller_names(context) if self.node.options.tls is not None else None
        if names is not None and not names:
            raise Reject(StatusCode.UNAUTHENTICATED,
                         "this agent requires mutual TLS: the call carries no client certificate")
        max_bytes = limits.SMALL_REQUEST_BYTES
        if method != "GetStatus":
            s = self._session()
            if names is not None and not names & s.neighbour_names:
                raise Reject(
                    StatusCode.PERMISSION_DENIED,
                    f"the caller's certificate is for {sorted(names)[:4]}, not a neighbour of "
                    f"{self.node.options.name} in its run",  # no run id for outsiders
                )
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

        return Admission(max_bytes, release)

    def _authenticate(self, context: grpc.aio.ServicerContext, claimed: str) -> None:
        """Under mutual TLS the claimed sender must be a name in the caller's certificate."""
        if self.node.options.tls is None:
            return
        names = caller_names(context)
        if not names:
            raise Reject(StatusCode.UNAUTHENTICATED,
                         "this agent requires mutual TLS: the call carries no client certificate")
        if claimed not in names:
            raise Reject(
                StatusCode.PERMISSION_DENIED,
                f"the caller's certificate is for {sorted(names)}, but the message claims to "
                f"come from {_short(claimed)}",
            )

    def _session(self) -> Session:
        session = self.node.session
        if session is None:
            # Not assigned (or not restored) yet: the sender retries UNAVAILABLE with backoff.
            raise Reject(StatusCode.UNAVAILABLE, "agent not assigned to a run yet")
        return session

    def _check_header(
        self, header: common_pb2.Header, context: grpc.aio.ServicerContext, phase: Phase,
        *, round_: int | None = None,
    ) -> tuple[Session, serde.Header]:
        if not isinstance(header, common_pb2.Header):
            raise TypeError(f"expected efpsn.v1.Header, got {type(header).__name__}")
        self._authenticate(context, header.sender)
        s = self._session()
        if header.sender not in s.neighbour_names:
            raise Reject(
                StatusCode.PERMISSION_DENIED,
                f"sender {_short(header.sender)} is not a neighbour of {self.node.options.name} "
                f"in run {s.run_id} (neighbours: {', '.join(sorted(s.neighbour_names))})",
            )
        parsed = serde.validate_header(header, run_id=s.run_id, phase=phase, round=round_)
        return s, parsed

    def _late_phase_one(self, kind: str, sender: str, digest: bytes) -> common_pb2.Ack | None:
        """After a restart phase I is over: a retry of a message the previous process received
        (its ack may have been lost in the crash) is acknowledged if it is identical to what was
        received, as recorded next to the saved mask; anything else is refused."""
        if not self.node.phase_one_restored:
            return None
        if self.node.mailbox.digest(kind, 0, sender) != digest:
            raise Reject(StatusCode.FAILED_PRECONDITION,
                         f"phase I is over at this agent (it resumed from its saved mask), and "
                         f"this {kind} message is not the one it received from {sender}")
        return common_pb2.Ack(accepted=True, detail="duplicate of a phase I message")

    # ---------------------------------------------------------------- phase I

    @guarded
    async def PutPublicKey(
        self, request: agent_pb2.PublicKeyMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        _, header = self._check_header(request.header, context, Phase.KEYS, round_=0)
        n = serde.public_key_from_proto(request.key)
        late = self._late_phase_one("key", header.sender, serde.key_fingerprint(n))
        if late is not None:
            return late
        key = paillier.public_key_from_n(n)
        paillier.check_key_size(key, allow_insecure=self.node.options.allow_insecure_keys)
        fresh = self.node.mailbox.put("key", 0, header.sender, key, serde.key_fingerprint(n))
        return common_pb2.Ack(accepted=True, detail="" if fresh else "duplicate ignored")

    @guarded
    async def PutShares(
        self, request: agent_pb2.SharesMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        s, header = self._check_header(request.header, context, Phase.SHARES, round_=0)
        late = self._late_phase_one("shares", header.sender, serde.shares_digest(request.batch))
        if late is not None:
            return late
        masker = self.node.masker
        if masker is None:
            raise Reject(StatusCode.UNAVAILABLE, "phase I key not ready yet")
        batch = serde.ciphertexts_from_proto(
            request.batch,
            expected_fingerprint=paillier.fingerprint(masker.public_key),
            expected_num_coefficients=s.config.N,
            expected_packed=s.config.packed,
        )
        if len(batch.ciphertexts) != masker.ciphertexts_per_neighbour:
            raise WireError(
                f"expected {masker.ciphertexts_per_neighbour} ciphertexts, "
                f"got {len(batch.ciphertexts)}"
            )
        for i, c in enumerate(batch.ciphertexts):
            try:
                paillier.validate_ciphertext(masker.public_key, c)
            except ValueError as exc:
                raise WireError(f"ciphertext {i}: {exc}") from None
        fresh = self.node.mailbox.put(
            "shares", 0, header.sender, list(batch.ciphertexts), serde.shares_digest(request.batch)
        )
        return common_pb2.Ack(accepted=True, detail="" if fresh else "duplicate ignored")

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
        """Check a round message and file it into the mailbox; the acknowledgement's detail
        (empty for a fresh message). Raises Reject or WireError saying what is wrong."""
        s, header = self._check_header(request.header, context, Phase.OPTIMIZE)
        node = self.node
        t = _within_run(header.round, s)
        current = node.status.round
        if t < current:
            # A retry (or a neighbour's bit-identical replay after its restart) of a round we
            # consumed: acknowledge it if it matches what we got, refuse it otherwise.
            known = node.mailbox.digest("round", t, header.sender)
            if known is None and node.resumed_from is not None and t < node.resumed_from:
                # consumed by this agent's previous process (which reached a later checkpoint,
                # so it had this message); a retry whose ack the crash lost: nothing to do
                return "round consumed before this agent restarted"
            if known is None:
                raise Reject(
                    StatusCode.FAILED_PRECONDITION,
                    f"round {t} is behind this agent (at round {current}) and older than the "
                    f"rounds it remembers",
                )
            if known != serde.round_digest(request):
                raise WireError(
                    f"round {t} from {header.sender} conflicts with the copy already received"
                )
            return "duplicate of a consumed round"
        if t > current + 1:
            # A neighbour ahead of us while we catch up after a restart: let it retry later
            # instead of buffering an unbounded number of rounds.
            raise Reject(
                StatusCode.UNAVAILABLE,
                f"this agent is at round {current}; round {t} is ahead of its window, retry",
            )
        tensors, digest = decode_round(s, request, sender=header.sender, round_=t)
        fresh = node.mailbox.put("round", t, header.sender, tensors, digest)
        return "" if fresh else "duplicate ignored"

    @guarded
    async def GetRound(
        self, request: agent_pb2.RoundRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RoundReply:
        s, header = self._check_header(request.header, context, Phase.OPTIMIZE)
        node = self.node
        t = _within_run(header.round, s)
        message = node.outboxes.sent.get(t)
        if message is not None:
            return serde.round_reply(message, latest_round=node.outboxes.produced)
        if t > node.outboxes.produced:
            return serde.round_reply(None, latest_round=node.outboxes.produced)
        raise Reject(
            StatusCode.NOT_FOUND,
            f"round {t} is no longer held by {node.options.name} (it keeps rounds {node.outboxes.held()})",
        )

    @guarded
    async def GetStatus(
        self, request: agent_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.AgentStatus:
        node = self.node
        s = node.session
        if request.run_id and s is not None and request.run_id != s.run_id:
            shown = s.run_id if self._is_operator(context) else "another run"
            raise Reject(StatusCode.NOT_FOUND,
                         f"this agent is in {shown}, not {_short(request.run_id)}")
        st = node.status
        reply = agent_pb2.AgentStatus(
            name=node.options.name, phase=int(st.phase), round=st.round,
            total_rounds=s.config.iterations if s else 0, loss=math.nan, accuracy=math.nan,
            error=st.error, finished=st.finished,
        )
        names = caller_names(context) if node.options.tls is not None else None
        if s is not None and (names is None or names & s.neighbour_names):
            # whom it waits for (messages, acknowledgements): lets neighbours name a stall
            reply.waiting_for.extend(sorted(set(node.mailbox.waiting_for)
                                            | set(node.peers.unacknowledged)))
        if not self._is_operator(context):
            return reply  # liveness only: loss and accuracy are values of this agent's f_i
        reply.run_id = s.run_id if s else ""
        reply.loss, reply.accuracy = st.loss, st.accuracy
        reply.rejections.update(node.rejections.counts)
        if node.resumed_from is not None:
            reply.resumed_from_round = node.resumed_from
        return reply

    def _is_operator(self, context: grpc.aio.ServicerContext) -> bool:
        """Under mutual TLS only the operator's certificate (--operator-name, default this
        agent's own name) sees private figures; plaintext (--insecure) has no identities."""
        if self.node.options.tls is None:
            return True
        names = caller_names(context)
        return bool(names) and self.node.options.operator in names
