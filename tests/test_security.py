"""Hostile input and identity: fuzzing the servicers and the ports, and mutual-TLS identity checks.

1. In process: hypothesis drives >= 10,000 malformed or hostile requests into each service
   (AgentService, CoordinatorService), called directly with a fake gRPC context that carries a
   chosen client identity. No call may raise, or end as INTERNAL/UNKNOWN; state stays bounded.
2. At the ports of a live mutual-TLS network (4-ring, agent3 frozen with SIGSTOP meanwhile so the
   run waits): clients without a certificate, with a certificate of another CA, a valid
   non-neighbour, an impersonator, a message for another run; raw TCP garbage, garbage HTTP/2
   frames inside a valid TLS session, random bytes as gRPC requests. Every server stays healthy,
   the refusals are counted in GetStatus/GetRunStatus, and once agent3 resumes (SIGCONT) the run
   finishes bit for bit like the simulator.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import random
import signal
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from fake_context import FakeContext
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import assigned_agents
from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as HPhase
from hypothesis import strategies as st
from localnet import LocalNet

from agent.life import Life
from agent.phases.shares import ShareCheck
from coordinator.registry import Registry, default_names
from coordinator.service import CoordinatorService
from efpsn.crypto import paillier
from efpsn.launch.summary import load_agent_results
from efpsn.masks.zero_sum import Masker
from efpsn.params.config import RunConfig
from efpsn.simulator import run_simulation
from efpsn.wire import records
from efpsn.wire import rounds as wire_rounds
from efpsn.wire.records import Phase
from efpsn.wire.tls import generate_certificates
from efpsn.wire.v1 import agent_pb2, common_pb2, coordinator_pb2, coordinator_pb2_grpc

pytestmark = pytest.mark.timeout(600)

SC = grpc.StatusCode
ALLOWED = {SC.INVALID_ARGUMENT, SC.PERMISSION_DENIED, SC.UNAUTHENTICATED, SC.UNAVAILABLE,
           SC.FAILED_PRECONDITION, SC.NOT_FOUND, SC.DEADLINE_EXCEEDED}
PER_SERVICE = 10_000  # requests per service, at least
RUN = "fuzz-run-0001"
# the paper's DSGD: a round message is one tensor x, which these tests craft by hand
CONFIG = RunConfig.preset("paper", iterations=20, eval_every=10, key_bits=2048, round_timeout_seconds=5.0)
NUM_PARAMS = 7850  # logistic regression on 28x28 digits, 10 classes
CURRENT_ROUND = 5
IDENTITIES = ("plaintext", "no-cert", "agent1", "agent2", "agent3", "agent5", "intruder")
COUNTS: collections.Counter[str] = collections.Counter()
CODES: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


# ----------------------------------------------------------------------------- fake context


def _auth(identity: str, pems: dict[str, bytes]) -> dict[str, list[bytes]]:
    if identity == "plaintext":
        return {}
    auth = {"transport_security_type": [b"ssl"]}
    if identity != "no-cert":
        auth["x509_pem_cert"] = [pems[identity]]
    return auth


class Harness:
    """One event loop, one agent (agent1 of a 5-ring in phase II round 5), one coordinator."""

    def __init__(self, folder: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._context = assigned_agents(folder, CONFIG, run_id=RUN, names=("agent1",),
                                        serve=(), round_=0)
        self.parts = self.loop.run_until_complete(self._context.__aenter__())["agent1"]
        names = ["agent1", "agent2", "agent3", "agent4", "agent5", "coordinator", "intruder"]
        self.pems = {n: (folder / "tls" / f"{n}.pem").read_bytes() for n in names}
        problem = self.parts.session.problem
        self.coefficients = problem.N
        self.masker = Masker(agent=0, neighbours=[1, 4], spec=problem.noise_spec,
                             rng=np.random.default_rng(0), layout=problem.layout, key_bits=2048)
        self.agent = self.parts.service
        self.parts.phase_one.expect(ShareCheck(public_key=self.masker.public_key,
                                               count=self.masker.ciphertexts_per_neighbour,
                                               packed=True))
        x = torch.linspace(-1, 1, NUM_PARAMS, dtype=torch.float64)
        for t in range(CURRENT_ROUND + 1):
            mine = wire_rounds.message_to_proto({"x": x + t}, header=records.make_header(
                run_id=RUN, sender="agent1", round=t, phase=Phase.OPTIMIZE))
            self.parts.outbox.remember(t, mine.SerializeToString())
        # neighbours' messages of earlier rounds were consumed: only their digests remain
        self.valid_rounds: list[agent_pb2.RoundMessage] = []
        for t in range(CURRENT_ROUND + 2):
            for sender in ("agent2", "agent5"):
                pb = wire_rounds.message_to_proto({"x": x * (t + 1)}, header=records.make_header(
                    run_id=RUN, sender=sender, round=t, phase=Phase.OPTIMIZE))
                self.valid_rounds.append(pb)
                if t < CURRENT_ROUND:
                    self.parts.phase_two.ledger.judge(sender, t, wire_rounds.round_digest(
                        pb, seed=self.parts.phase_two.ledger.seed))
            if t < CURRENT_ROUND:
                self.parts.phase_two.ledger.advance(t + 1)
        self.valid_rounds.sort(key=lambda pb: (pb.header.sender, pb.header.round))
        self.parts.status.life.advance(CURRENT_ROUND)
        # phase I material: the agent's own key, a neighbour-sized valid key, crafted ciphertexts
        own = self.masker.public_key
        self.own_fp = paillier.fingerprint(own)
        self.p = self.masker._private_key.p
        other_pub, _ = paillier.generate_keypair(2048)
        small_pub, _ = paillier.generate_keypair(1024, allow_insecure=True)
        self.key_ns = [other_pub.n, small_pub.n, own.n, other_pub.n + 1, 2**2048 - 1,
                       2**16400 + 1, 15, 3]
        n2 = own.n * own.n
        self.ciphertexts = [0, 1, n2 - 1, n2, n2 + 1, self.p, self.p * 12345, own.n,
                            paillier.encrypt(own, 42), paillier.encrypt(own, 0), 2**8200]
        self.registry = Registry(CONFIG, run_id=RUN, expected_names=default_names(5))
        self.coordinators = [
            CoordinatorService(self.registry, register_timeout=0.0, tls_required=True),
            CoordinatorService(Registry(CONFIG, run_id=RUN), register_timeout=0.0,
                               tls_required=False),
            # a run whose seat agent5 joins later: its Join checks the caller first too
            CoordinatorService(Registry(CONFIG.replace(late="agent5"), run_id=RUN,
                                        expected_names=default_names(5)),
                               register_timeout=0.0, tls_required=True),
        ]

    def close(self) -> None:
        self.loop.run_until_complete(self._context.__aexit__(None, None, None))
        self.loop.close()

    def call(self, service: str, method: Any, request: Any, identity: str) -> Any:
        context = FakeContext(_auth(identity, self.pems), remaining=0.0)
        COUNTS[service] += 1
        gate = method.__self__.gatekeeper()  # the servicer's admission

        async def admitted_call() -> Any:  # as the server's interceptor (Gatekeeper) admits
            async with gate.admitted(method.__name__, context):
                return await method(request, context)

        try:
            reply = self.loop.run_until_complete(admitted_call())
        except grpc.aio.AbortError:
            assert context.code in ALLOWED, (method.__name__, context.code, context.details)
            assert context.details, "a refusal must say what was wrong"
            CODES[service][context.code.name] += 1
            return None
        CODES[service]["OK"] += 1
        return reply


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    h = Harness(tmp_path_factory.mktemp("fuzz"))
    yield h
    h.close()


# ----------------------------------------------------------------------------- strategies

# Weighted towards what passes the first checks, so that the deeper ones are reached often:
# neighbours' identities, this run, the right phase, rounds around the agent's window.
identities = st.one_of(st.sampled_from(["agent2", "agent5"]), st.sampled_from(IDENTITIES))
names = st.one_of(st.sampled_from(["agent2", "agent5"]),
                  st.sampled_from(["agent1", "agent3", "intruder", "", "agent2 ", "x" * 300]),
                  st.text(max_size=20))
run_ids = st.one_of(st.just(RUN), st.just(RUN),
                    st.sampled_from([RUN + "x", "", "other-run"]), st.text(max_size=20))
rounds = st.one_of(st.integers(0, 8), st.sampled_from([19, 20, 21, 2**63, 2**64 - 1]),
                   st.integers(0, 2**64 - 1))
phases = st.sampled_from([0, 1, 2, 3, 4, 5, -1, 2**31 - 1])


@st.composite
def headers(draw: st.DrawFn, phase: int | None = None) -> common_pb2.Header:
    ph = phase if phase is not None and draw(st.integers(0, 3)) else draw(phases)
    return common_pb2.Header(run_id=draw(run_ids), sender=draw(names), round=draw(rounds),
                             phase=ph)


def claim(data: st.DataObject, request: Any, who: str) -> Any:
    """Most of the time the message claims to come from the caller's certificate name."""
    if who not in ("plaintext", "no-cert") and data.draw(st.integers(0, 9)) < 7:
        request.header.sender = who
    return request


_BLOBS = {
    "ok": np.linspace(-3, 3, NUM_PARAMS).astype("<f8").tobytes(),
    "nan": np.full(NUM_PARAMS, np.nan).astype("<f8").tobytes(),
    "inf": np.full(NUM_PARAMS, -np.inf).astype("<f8").tobytes(),
    "short": b"\x00" * (NUM_PARAMS * 8 - 1),
    "f32": np.zeros(NUM_PARAMS, dtype="<f4").tobytes(),
    "empty": b"",
}


@st.composite
def tensors(draw: st.DrawFn) -> common_pb2.Tensor:
    dtype = draw(st.sampled_from(["float64", "float32", "int64", "float16", "complex128", ""])
                 | st.text(max_size=8))
    shape = draw(st.sampled_from([[NUM_PARAMS], [], [0], [NUM_PARAMS, 1], [-1], [2**62, 2**62],
                                  [1] * 40])
                 | st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4))
    data = draw(st.sampled_from(list(_BLOBS.values())) | st.binary(max_size=64))
    return common_pb2.Tensor(dtype=dtype, shape=shape, data=data)


@st.composite
def round_messages(draw: st.DrawFn, h: Harness) -> agent_pb2.RoundMessage:
    kind = draw(st.integers(0, 3))
    if kind == 0:  # a valid message of a neighbour, possibly replayed under another header
        pb = agent_pb2.RoundMessage()
        pb.CopyFrom(draw(st.sampled_from(h.valid_rounds)))
        if draw(st.booleans()):
            pb.header.CopyFrom(draw(headers(Phase.OPTIMIZE)))
        return pb
    if kind == 1:  # a valid message with a mutated byte somewhere
        data = bytearray(draw(st.sampled_from(h.valid_rounds)).SerializeToString())
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        try:
            return agent_pb2.RoundMessage.FromString(bytes(data))
        except Exception:  # noqa: BLE001 - unparsable bytes never reach a handler
            return agent_pb2.RoundMessage(header=draw(headers(Phase.OPTIMIZE)))
    tensor_names = st.sampled_from(["x", "y", "", "x "]) | st.text(max_size=5)
    named = draw(st.lists(st.builds(agent_pb2.NamedTensor, name=tensor_names, tensor=tensors()),
                          max_size=3))
    return agent_pb2.RoundMessage(header=draw(headers(Phase.OPTIMIZE)), tensors=named)


@st.composite
def key_messages(draw: st.DrawFn, h: Harness) -> agent_pb2.PublicKeyMessage:
    if draw(st.booleans()):
        n = draw(st.sampled_from(h.key_ns))
        data = n.to_bytes(max(1, (n.bit_length() + 7) // 8), "big")
        if draw(st.booleans()):
            data = b"\x00" + data
    else:
        data = draw(st.binary(max_size=300))
    fp = hashlib.sha256(data).digest() if draw(st.booleans()) else draw(st.binary(max_size=40))
    return agent_pb2.PublicKeyMessage(header=draw(headers(Phase.KEYS)),
                                      key=common_pb2.PaillierPublicKey(n=data, fingerprint=fp))


@st.composite
def share_messages(draw: st.DrawFn, h: Harness) -> agent_pb2.SharesMessage:
    count = draw(st.sampled_from([1, 0, 2, 10]))
    cts = []
    for _ in range(count):
        if draw(st.booleans()):
            c = draw(st.sampled_from(h.ciphertexts))
            cts.append(c.to_bytes(max(1, (c.bit_length() + 7) // 8), "big"))
        else:
            cts.append(draw(st.binary(max_size=40)))
    batch = common_pb2.CiphertextBatch(
        key_fingerprint=draw(st.sampled_from([h.own_fp, b"\x00" * 32, b""])
                             | st.binary(max_size=40)),
        ciphertexts=cts, num_coefficients=draw(st.sampled_from([h.coefficients, 0, 1, 2**32 - 1])),
        packed=draw(st.booleans()),
    )
    return agent_pb2.SharesMessage(header=draw(headers(Phase.SHARES)), batch=batch)


# The three agent properties make 1 + 2 + 2 calls per example each: >= 10,000 requests in all.
FUZZ = settings(max_examples=PER_SERVICE // 5 + 50, deadline=None, database=None,
                phases=[HPhase.explicit, HPhase.generate],
                suppress_health_check=list(HealthCheck))


# ----------------------------------------------------------------------------- in process


def _round(h: Harness, sender: str, t: int, x: torch.Tensor | None = None, *,
           run: str = RUN, dtype: torch.dtype = torch.float64) -> agent_pb2.RoundMessage:
    x = torch.zeros(NUM_PARAMS, dtype=torch.float64) if x is None else x
    return wire_rounds.message_to_proto({"x": x.to(dtype)}, header=records.make_header(
        run_id=run, sender=sender, round=t, phase=Phase.OPTIMIZE))


def _shares(h: Harness, cts: list[int], fp: bytes | None = None) -> agent_pb2.SharesMessage:
    return agent_pb2.SharesMessage(
        header=records.make_header(run_id=RUN, sender="agent2", round=0, phase=Phase.SHARES),
        batch=common_pb2.CiphertextBatch(
            key_fingerprint=h.own_fp if fp is None else fp,
            ciphertexts=[c.to_bytes((c.bit_length() + 7) // 8 or 1, "big") for c in cts],
            num_coefficients=h.coefficients, packed=True))


def _key(n: int, *, good_fp: bool = True) -> agent_pb2.PublicKeyMessage:
    data = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return agent_pb2.PublicKeyMessage(
        header=records.make_header(run_id=RUN, sender="agent2", round=0, phase=Phase.KEYS),
        key=common_pb2.PaillierPublicKey(
            n=data, fingerprint=hashlib.sha256(data).digest() if good_fp else b"\x01" * 32))


def test_each_check_refuses_with_a_message_saying_what_was_wrong(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    h = Harness(tmp_path_factory.mktemp("checks"))
    a = h.agent
    nan = torch.zeros(NUM_PARAMS, dtype=torch.float64)
    nan[17] = float("nan")
    wrong_shape = wire_rounds.message_to_proto(
        {"x": torch.zeros(3, dtype=torch.float64)}, header=records.make_header(
            run_id=RUN, sender="agent2", round=5, phase=Phase.OPTIMIZE))
    own_n = h.masker.public_key.n
    cases = [
        # (method, request, caller identity, code, words in the message)
        (a.PutRound, _round(h, "agent2", 5), "no-cert", "UNAUTHENTICATED", "client certificate"),
        (a.PutRound, _round(h, "agent2", 5), "agent5", "PERMISSION_DENIED", "certificate is for"),
        (a.PutRound, _round(h, "agent3", 5), "agent3", "PERMISSION_DENIED", "not a neighbour"),
        (a.PutRound, _round(h, "agent2", 5, run="other"), "agent2", "INVALID_ARGUMENT", "run"),
        (a.PutRound, _round(h, "agent2", 5, nan), "agent2", "INVALID_ARGUMENT", "non-finite"),
        (a.PutRound, wrong_shape, "agent2", "INVALID_ARGUMENT", "shape"),
        (a.PutRound, _round(h, "agent2", 5, dtype=torch.float32), "agent2", "INVALID_ARGUMENT",
         "float64"),
        (a.PutRound, _round(h, "agent2", 21), "agent2", "INVALID_ARGUMENT", "last round 20"),
        (a.PutRound, _round(h, "agent2", 9), "agent2", "UNAVAILABLE", "ahead of its window"),
        (a.PutRound, h.valid_rounds[3], "agent2", "OK", ""),  # identical retry of round 3
        (a.PutRound, _round(h, "agent2", 3), "agent2", "INVALID_ARGUMENT", "conflicts"),
        (a.PutRound, _round(h, "agent2", 5), "agent2", "OK", ""),
        (a.PutRound, _round(h, "agent2", 5, torch.ones(NUM_PARAMS, dtype=torch.float64)),
         "agent2", "INVALID_ARGUMENT", "already received"),
        (a.GetRound, agent_pb2.RoundRequest(header=records.make_header(
            run_id=RUN, sender="agent3", round=2, phase=Phase.OPTIMIZE)), "agent3",
         "PERMISSION_DENIED", "not a neighbour"),
        (a.PutPublicKey, _key(h.key_ns[1]), "agent2", "INVALID_ARGUMENT", "2048"),
        (a.PutPublicKey, _key(h.key_ns[0], good_fp=False), "agent2", "INVALID_ARGUMENT",
         "fingerprint"),
        (a.PutShares, _shares(h, [h.p * 3]), "agent2", "INVALID_ARGUMENT", "gcd"),
        (a.PutShares, _shares(h, [own_n * own_n]), "agent2", "INVALID_ARGUMENT", "n^2"),
        (a.PutShares, _shares(h, [h.ciphertexts[8]], fp=b"\x02" * 32), "agent2",
         "INVALID_ARGUMENT", "under key"),
        (a.PutShares, _shares(h, [h.ciphertexts[8]]), "agent2", "OK", ""),
        (a.PutShares, _shares(h, [h.ciphertexts[9]]), "agent2", "INVALID_ARGUMENT",
         "already received"),
    ]
    got = []
    for method, request, who, _, _ in cases:
        context = FakeContext(_auth(who, h.pems), remaining=0.0)
        try:
            h.loop.run_until_complete(method(request, context))
            got.append(("OK", ""))
        except grpc.aio.AbortError:
            got.append((context.code.name, context.details))
    for (method, _, who, code, words), (got_code, details) in zip(cases, got, strict=True):
        assert (got_code, words in details) == (code, True), (method.__name__, who, details)
    # pulls: a round it holds, a round it has not reached, garbage bytes
    reply = h.loop.run_until_complete(a.GetRound(agent_pb2.RoundRequest(
        header=records.make_header(run_id=RUN, sender="agent2", round=2, phase=Phase.OPTIMIZE)),
        FakeContext(_auth("agent2", h.pems), remaining=0.0)))
    assert reply.available and reply.message.header.round == 2
    reply = h.loop.run_until_complete(a.GetRound(agent_pb2.RoundRequest(
        header=records.make_header(run_id=RUN, sender="agent2", round=7, phase=Phase.OPTIMIZE)),
        FakeContext(_auth("agent2", h.pems), remaining=0.0)))
    assert not reply.available and reply.latest_round == CURRENT_ROUND
    from efpsn.wire.guard import Undecodable

    context = FakeContext(_auth("agent2", h.pems), remaining=0.0)
    with pytest.raises(grpc.aio.AbortError):
        h.loop.run_until_complete(a.PutRound(Undecodable("efpsn.v1.RoundMessage", "bad"),
                                             context))
    assert context.code == SC.INVALID_ARGUMENT and "not a valid" in context.details
    counted = dict(h.agent.rejections.counts)
    assert counted["PERMISSION_DENIED"] == 3 and counted["UNAUTHENTICATED"] == 1

    # After a restart (mask and phase I digests reloaded, resumed at round 5, no memory of the
    # rounds before): retries the crash may have left unacknowledged are acked, others refused.
    phase_one = h.parts.phase_one
    phase_one.ledger.restore(phase_one.ledger.received())
    phase_one.expect(None)
    h.parts.phase_two.open(h.parts.session, resumed_from=CURRENT_ROUND,
                           last=CONFIG.iterations.total)
    life = Life()  # a restarted process's life: assigned, resumed at round 5
    life.assign(h.parts.session)
    life.optimizing(CURRENT_ROUND)
    h.parts.status.life = h.parts.peers.life = life  # one per process

    def outcome(method: Any, request: Any) -> tuple[str, str]:
        context = FakeContext(_auth("agent2", h.pems), remaining=0.0)
        try:
            ack = h.loop.run_until_complete(method(request, context))
            return "OK", ack.detail
        except grpc.aio.AbortError:
            return context.code.name, context.details

    assert outcome(a.PutShares, _shares(h, [h.ciphertexts[8]])) == (
        "OK", "duplicate of a phase I message")
    code, details = outcome(a.PutShares, _shares(h, [h.ciphertexts[9]]))
    assert code == "FAILED_PRECONDITION" and "not the one it received" in details
    assert outcome(a.PutRound, _round(h, "agent2", 2)) == (
        "OK", "round consumed before this agent restarted")
    h.parts.phase_two.ledger.resumed_from = None  # type: ignore[union-attr]
    code, details = outcome(a.PutRound, _round(h, "agent2", 2))
    assert code == "FAILED_PRECONDITION" and "older than the rounds it remembers" in details
    h.close()


@pytest.mark.slow
def test_fuzz_agent_service_in_process(harness: Harness) -> None:
    h = harness
    agent = h.agent
    before = COUNTS["agent"]

    @FUZZ
    @given(data=st.data(), who=identities)
    def put_round(data: st.DataObject, who: str) -> None:
        h.call("agent", agent.PutRound, claim(data, data.draw(round_messages(h)), who), who)

    @FUZZ
    @given(data=st.data(), who=identities)
    def phase_one(data: st.DataObject, who: str) -> None:
        h.call("agent", agent.PutPublicKey, claim(data, data.draw(key_messages(h)), who), who)
        h.call("agent", agent.PutShares, claim(data, data.draw(share_messages(h)), who), who)

    @FUZZ
    @given(data=st.data(), header=headers(Phase.OPTIMIZE), who=identities, run=run_ids)
    def pulls_and_status(data: st.DataObject, header: common_pb2.Header, who: str,
                         run: str) -> None:
        request = claim(data, agent_pb2.RoundRequest(header=header), who)
        h.call("agent", agent.GetRound, request, who)
        h.call("agent", agent.GetStatus, agent_pb2.StatusRequest(run_id=run), who)

    started = time.perf_counter()
    put_round()
    phase_one()
    pulls_and_status()
    sent = COUNTS["agent"] - before
    codes = dict(CODES["agent"])
    print(f"\nagent servicer fuzz: {sent} requests in {time.perf_counter() - started:.1f}s; "
          f"outcomes {codes}; rejections counted by the agent {dict(h.agent.rejections.counts)}")
    assert sent >= PER_SERVICE
    assert "INTERNAL" not in h.agent.rejections.counts and "UNKNOWN" not in codes
    # every outcome class was reached, including acceptance of a neighbour's valid message
    for code in ("OK", "INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED"):
        assert codes.get(code, 0) > 0, codes
    # the agent's state is still its own: bounded buffers, same round, same history
    parts = h.parts
    assert parts.status.round == CURRENT_ROUND and parts.phase_two.ledger.position == CURRENT_ROUND
    assert parts.mailbox.size() <= 2 * 2 + 2 * 2  # rounds 5-6 and phase I, per neighbour
    assert [t for t in range(CURRENT_ROUND + 3) if parts.outbox.get(t) is not None] == list(
        range(CURRENT_ROUND + 1))
    assert sum(h.agent.rejections.counts.values()) == sum(v for k, v in codes.items()
                                                          if k != "OK")


@pytest.mark.slow
def test_fuzz_coordinator_service_in_process(harness: Harness) -> None:
    h = harness
    before = COUNTS["coordinator"]
    addresses = st.sampled_from(["127.0.0.1:50051", "agent1:1", ":1", "h:0", "h:65536", "h:-1",
                                 "[::1]:80", "a" * 300 + ":1", ""]) | st.text(max_size=30)

    @settings(FUZZ, max_examples=PER_SERVICE // 2 + 100)
    @given(name=names | st.sampled_from(sorted(default_names(5))), address=addresses,
           who=identities, which=st.integers(0, 2))
    def register(name: str, address: str, who: str, which: int) -> None:
        service = h.coordinators[which]
        request = coordinator_pb2.RegisterRequest(name=name, address=address)
        h.call("coordinator", service.Register, request, who)
        h.call("coordinator", service.Join, request, who)  # a party asking to join
        h.call("coordinator", service.GetRunStatus, coordinator_pb2.RunStatusRequest(), who)

    started = time.perf_counter()
    register()
    sent = COUNTS["coordinator"] - before
    codes = dict(CODES["coordinator"])
    counted = [dict(c.rejections.counts) for c in h.coordinators]
    print(f"\ncoordinator servicer fuzz: {sent} requests in {time.perf_counter() - started:.1f}s;"
          f" outcomes {codes}; rejections counted {counted}")
    assert sent >= PER_SERVICE
    assert all("INTERNAL" not in c for c in counted) and "UNKNOWN" not in codes
    assert codes.get("PERMISSION_DENIED", 0) > 0 and codes.get("INVALID_ARGUMENT", 0) > 0
    # only expected names that proved their identity ever got into the TLS registry, and no
    # join was decided for a caller that is not the late seat's party
    assert set(h.registry.addresses) <= default_names(5)
    late = h.coordinators[2]
    assert set(late.registry.addresses) <= default_names(5)
    assert all(name == "agent5" for _, _, name in late.joins.decided)


# ----------------------------------------------------------------------------- live network

LIVE = RunConfig(agents=4, iterations=60, eval_every=20, key_bits=2048,
                 round_timeout_seconds=150.0)
LIVE_SEED = 5
GARBAGE_TCP = 2000  # raw connections per port
GARBAGE_H2 = 500  # TLS sessions (valid certificate) carrying garbage HTTP/2 frames, per port
GARBAGE_GRPC = 5000  # random-byte gRPC requests per port
IDENTITY_REPEATS = 10


def _creds(tls_dir: Path, name: str, *, other: Path | None = None) -> grpc.ChannelCredentials:
    ca = (tls_dir / "ca.pem").read_bytes()
    base = other or tls_dir
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=(base / f"{name}.key").read_bytes(),
        certificate_chain=(base / f"{name}.pem").read_bytes())


async def _unary(address: str, creds: grpc.ChannelCredentials | None, server_name: str,
                 method: str, payloads: list[bytes], *, parallel: int = 16
                 ) -> collections.Counter[str]:
    """Send raw request bytes to `method`; count the status codes that come back."""
    options = [("grpc.ssl_target_name_override", server_name)] if creds else []
    channel = (grpc.aio.secure_channel(address, creds, options=options) if creds
               else grpc.aio.insecure_channel(address))
    out: collections.Counter[str] = collections.Counter()
    call = channel.unary_unary(method)  # no serializers: bytes travel as they are
    sem = asyncio.Semaphore(parallel)

    async def one(data: bytes) -> None:
        async with sem:
            try:
                await call(data, timeout=10)
                out["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                out[exc.code().name] += 1

    try:
        await asyncio.gather(*(one(p) for p in payloads))
    finally:
        await channel.close()
    return out


def _server_reaction(s: socket.socket, *, wait: float, h2: bool = False) -> str:
    """How the server reacted to what we sent: 'goaway' (h2: it sent an HTTP/2 GOAWAY frame),
    'closed' (it closed or reset the connection), 'answered' (it sent something else and kept
    the connection open for `wait` seconds), 'silent' (nothing at all)."""
    s.settimeout(wait)
    received = b""
    try:
        while chunk := s.recv(4096):
            received += chunk
            if h2 and _has_goaway(received):
                return "goaway"
        return "closed"
    except (ConnectionError, ssl.SSLError):
        return "closed"
    except TimeoutError:
        return "answered" if received else "silent"


def _has_goaway(data: bytes) -> bool:
    """Whether the HTTP/2 frames in `data` (server side: no preface) include a GOAWAY (type 7)."""
    while len(data) >= 9:
        length, kind = int.from_bytes(data[:3], "big"), data[3]
        if kind == 7:
            return True
        data = data[9 + length:]
    return False


def _garbage_tcp(port: int, rng: random.Random, count: int) -> collections.Counter[str]:
    """Raw garbage (random bytes, some behind an HTTP or TLS prefix): how the server reacted to
    what cannot be the start of a TLS handshake (plaintext HTTP/1.1 and HTTP/2: it must close
    those at once)."""
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            prefix = rng.choice([b"", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x02\x00",
                                 b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"])
            data = prefix + rng.randbytes(rng.randint(0, 2048))
            try:
                s.sendall(data)
            except ConnectionError:
                seen["closed"] += 1
                continue
            if not prefix.startswith((b"PRI", b"GET")):
                # bare random bytes or a TLS record header: the server may wait for the rest
                # of a record (or an SSLv2 hello) before it can tell; not judged
                seen["not judged"] += 1
                continue
            seen[_server_reaction(s, wait=10.0)] += 1
    return seen


def _garbage_h2(port: int, tls_dir: Path, server_name: str, rng: random.Random,
                count: int) -> collections.Counter[str]:
    """Garbage HTTP/2 frames inside TLS sessions with a valid certificate: how it went."""
    ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    ctx.load_cert_chain(tls_dir / "intruder.pem", tls_dir / "intruder.key")
    ctx.set_alpn_protocols(["h2"])
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            try:
                s = ctx.wrap_socket(raw, server_hostname=server_name)
            except (OSError, ssl.SSLError):
                seen["tls refused"] += 1
                continue
            with s:
                frames = b"".join(
                    len(body := rng.randbytes(rng.randint(0, 64))).to_bytes(3, "big")
                    + bytes([rng.randint(0, 10), rng.randint(0, 255)])
                    + rng.randint(0, 2**31 - 1).to_bytes(4, "big") + body
                    for _ in range(rng.randint(1, 8)))
                try:
                    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frames)
                except (OSError, ssl.SSLError):
                    seen["closed"] += 1
                    continue
                seen[_server_reaction(s, wait=2.0, h2=True)] += 1
    return seen


def _healthy(address: str, creds: grpc.ChannelCredentials, server_name: str) -> str:
    with grpc.secure_channel(address, creds,
                             options=[("grpc.ssl_target_name_override", server_name)]) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("live")
    seen: dict[str, Any] = {"folder": folder}
    rng = random.Random(int(os.environ.get("EFPSN_FUZZ_SEED", "1234")))
    other_ca = folder / "other-ca"
    generate_certificates(other_ca, ["agent2", "agent1"])  # same names, another CA
    started = time.monotonic()
    with LocalNet(folder, LIVE, noise_seed=LIVE_SEED) as net:
        net.start_all()
        tls_dir = net.tls_dir
        net.wait_round("agent1", 3)
        net.signal("agent3", signal.SIGSTOP)  # the run now waits for agent3
        time.sleep(0.5)
        status = net.status("agent1")
        assert status is not None
        run_id, at_round = status.run_id, status.round
        seen["frozen_at"] = at_round
        a1, coord = net.address("agent1"), net.address("coordinator")
        t0 = time.monotonic()

        def rounds_message(sender: str, run: str) -> bytes:
            x = torch.zeros(NUM_PARAMS, dtype=torch.float64)
            return wire_rounds.message_to_proto({"x": x}, header=records.make_header(
                run_id=run, sender=sender, round=at_round, phase=Phase.OPTIMIZE)
            ).SerializeToString()

        put, pull = "/efpsn.v1.Agent/PutRound", "/efpsn.v1.Agent/GetRound"
        stream = "/efpsn.v1.Agent/StreamRounds"  # called with one message: a unary call
        register = "/efpsn.v1.Coordinator/Register"
        ca = (tls_dir / "ca.pem").read_bytes()
        no_cert = grpc.ssl_channel_credentials(root_certificates=ca)
        wrong_ca = _creds(tls_dir, "agent2", other=other_ca)
        n = IDENTITY_REPEATS
        cases = {
            # (target, credentials, server name, method, request bytes)
            "no client certificate": (a1, no_cert, "agent1", put,
                                      rounds_message("agent2", run_id)),
            "certificate of another CA": (a1, wrong_ca, "agent1", put,
                                          rounds_message("agent2", run_id)),
            "plaintext client": (a1, None, "agent1", put, rounds_message("agent2", run_id)),
            "non-neighbour agent3 (valid certificate)": (
                a1, _creds(tls_dir, "agent3"), "agent1", put, rounds_message("agent3", run_id)),
            "non-neighbour agent3 pulling": (
                a1, _creds(tls_dir, "agent3"), "agent1", pull,
                agent_pb2.RoundRequest(header=records.make_header(
                    run_id=run_id, sender="agent3", round=0, phase=Phase.OPTIMIZE)
                ).SerializeToString()),
            "intruder claiming to be agent2": (
                a1, _creds(tls_dir, "intruder"), "agent1", put, rounds_message("agent2", run_id)),
            "non-neighbour agent3 opening a round stream": (
                a1, _creds(tls_dir, "agent3"), "agent1", stream, rounds_message("agent3", run_id)),
            "intruder streaming as agent2": (
                a1, _creds(tls_dir, "intruder"), "agent1", stream,
                rounds_message("agent2", run_id)),
            "agent2 streaming a message for another run": (
                a1, _creds(tls_dir, "agent2"), "agent1", stream, rounds_message("agent2", "other")),
            "agent2 with a message for another run": (
                a1, _creds(tls_dir, "agent2"), "agent1", put, rounds_message("agent2", "other")),
            "register without a client certificate": (
                coord, no_cert, "coordinator", register,
                coordinator_pb2.RegisterRequest(name="agent1", address="127.0.0.1:1")
                .SerializeToString()),
            "register as agent1 with intruder's certificate": (
                coord, _creds(tls_dir, "intruder"), "coordinator", register,
                coordinator_pb2.RegisterRequest(name="agent1", address="127.0.0.1:1")
                .SerializeToString()),
            "register an unexpected name (intruder, own certificate)": (
                coord, _creds(tls_dir, "intruder"), "coordinator", register,
                coordinator_pb2.RegisterRequest(name="intruder", address="127.0.0.1:1")
                .SerializeToString()),
        }
        identity: dict[str, dict[str, int]] = {}
        for label, (target, creds, server, method, body) in cases.items():
            identity[label] = dict(asyncio.run(
                _unary(target, creds, server, method, [body] * n, parallel=1)))
        seen["identity"] = identity

        # garbage at the ports
        intruder = _creds(tls_dir, "intruder")
        agent2 = _creds(tls_dir, "agent2")
        port_counts: dict[str, dict[str, Any]] = {}
        for name, target, methods, creds_list in (
            ("agent1", a1, [put, pull, stream, "/efpsn.v1.Agent/PutShares",
                            "/efpsn.v1.Agent/PutPublicKey", "/efpsn.v1.Agent/GetStatus"],
             [intruder, agent2]),
            ("coordinator", coord, [register, "/efpsn.v1.Coordinator/GetRunStatus"],
             [intruder, _creds(tls_dir, "agent4")]),
        ):
            port = int(target.rsplit(":", 1)[1])
            tcp = _garbage_tcp(port, rng, GARBAGE_TCP)
            h2 = _garbage_h2(port, tls_dir, name, rng, GARBAGE_H2)
            grpc_codes: collections.Counter[str] = collections.Counter()
            per = GARBAGE_GRPC // (len(methods) * len(creds_list))
            for method in methods:
                for creds in creds_list:
                    payloads = [rng.randbytes(rng.randint(0, 200)) for _ in range(per)]
                    grpc_codes += asyncio.run(_unary(target, creds, name, method, payloads))
            port_counts[name] = {"tcp": dict(tcp), "h2": dict(h2), "grpc": dict(grpc_codes),
                                 "methods": len(methods),
                                 "grpc_sent": per * len(methods) * len(creds_list),
                                 "grpc_total": sum(grpc_codes.values()),
                                 "health": _healthy(target, intruder, name)}
        seen["ports"] = port_counts
        seen["attack_seconds"] = time.monotonic() - t0
        after = net.status("agent1")
        seen["agent1_status"] = after
        seen["agent1_alive"] = net.procs["agent1"].poll() is None
        with grpc.secure_channel(coord, _creds(tls_dir, "coordinator"), options=[
                ("grpc.ssl_target_name_override", "coordinator")]) as ch:
            seen["coordinator_status"] = coordinator_pb2_grpc.CoordinatorStub(ch).GetRunStatus(
                coordinator_pb2.RunStatusRequest(), timeout=10)
        net.signal("agent3", signal.SIGCONT)  # the run goes on
        seen["agent_rc"] = net.wait_agents(timeout=400)
        seen["logs"] = {n: net.log(n) for n in ["coordinator", *net.names]}
    seen["wall_seconds"] = time.monotonic() - started
    print(f"\nlive: frozen at round {at_round}; attack {seen['attack_seconds']:.1f}s; identity "
          f"{identity}; ports {port_counts}; "
          f"agent1 rejections {after.rejections if after else None};"
          f" coordinator rejections {dict(seen['coordinator_status'].rejections)}; "
          f"wall {seen['wall_seconds']:.1f}s")
    return seen


@pytest.mark.process
def test_identity_rejections_are_refused_and_counted(live: dict[str, Any]) -> None:
    ident = live["identity"]
    n = IDENTITY_REPEATS
    # the TLS handshake refuses these: the call never reaches the application
    for label in ("no client certificate", "certificate of another CA", "plaintext client",
                  "register without a client certificate"):
        assert ident[label] == {"UNAVAILABLE": n}, (label, ident[label])
    for label in ("non-neighbour agent3 (valid certificate)", "non-neighbour agent3 pulling",
                  "intruder claiming to be agent2", "non-neighbour agent3 opening a round stream",
                  "intruder streaming as agent2",
                  "register as agent1 with intruder's certificate",
                  "register an unexpected name (intruder, own certificate)"):
        assert ident[label] == {"PERMISSION_DENIED": n}, (label, ident[label])
    assert ident["agent2 with a message for another run"] == {"INVALID_ARGUMENT": n}
    assert ident["agent2 streaming a message for another run"] == {"INVALID_ARGUMENT": n}
    # ... and the servers counted what reached them (the garbage came on top)
    agent1 = live["agent1_status"].rejections
    assert agent1["PERMISSION_DENIED"] >= 5 * n and agent1["INVALID_ARGUMENT"] >= 2 * n
    coordinator = dict(live["coordinator_status"].rejections)
    assert coordinator["PERMISSION_DENIED"] >= 2 * n


@pytest.mark.process
def test_port_garbage_leaves_servers_healthy(live: dict[str, Any]) -> None:
    for name, counts in live["ports"].items():
        assert counts["health"] == "SERVING", name
        # plaintext HTTP at a TLS port: every such connection closed by the server
        assert set(counts["tcp"]) == {"closed", "not judged"}, counts["tcp"]
        assert sum(counts["tcp"].values()) == GARBAGE_TCP
        assert counts["tcp"]["closed"] > GARBAGE_TCP // 3  # about half the connections
        # garbage HTTP/2 behind a valid certificate: TLS let it through, and the server
        # answered every session by ending it (GOAWAY and/or closing)
        assert set(counts["h2"]) <= {"closed", "goaway"}, counts["h2"]
        assert sum(counts["h2"].values()) == GARBAGE_H2
        # random request bytes: every call answered, none crashed a handler (UNKNOWN,
        # INTERNAL). The outsider's calls are refused by certificate before their bodies are
        # read (PERMISSION_DENIED; only GetStatus, and the coordinator's GetRunStatus, admit
        # any CA-signed name), a member's are refused as invalid, or UNAVAILABLE ("retry")
        # past the per-caller cap of calls in flight (the helper sends 16 at a time)
        assert counts["grpc_total"] == counts["grpc_sent"] >= GARBAGE_GRPC * 0.9
        assert set(counts["grpc"]) <= {"INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAVAILABLE",
                                       "OK"}, counts
        per_method_and_caller = counts["grpc_sent"] // (2 * counts["methods"])
        refused_unread = per_method_and_caller * (counts["methods"] - 1)
        assert counts["grpc"].get("PERMISSION_DENIED", 0) >= refused_unread, counts
        assert counts["grpc"].get("UNAVAILABLE", 0) <= 0.05 * counts["grpc_sent"], counts
        assert counts["grpc"].get("OK", 0) <= 0.01 * counts["grpc_sent"], counts
        assert counts["grpc"]["INVALID_ARGUMENT"] >= 0.4 * counts["grpc_sent"], counts
    # the servers counted the refusals themselves (the identity cases came on top)
    agent1 = live["agent1_status"].rejections
    assert agent1["INVALID_ARGUMENT"] >= live["ports"]["agent1"]["grpc"]["INVALID_ARGUMENT"]
    coordinator = dict(live["coordinator_status"].rejections)
    assert coordinator["INVALID_ARGUMENT"] >= (
        live["ports"]["coordinator"]["grpc"]["INVALID_ARGUMENT"])
    assert live["agent1_alive"]
    assert live["agent1_status"].error == ""
    assert "INTERNAL" not in live["agent1_status"].rejections
    assert "INTERNAL" not in dict(live["coordinator_status"].rejections)


@pytest.mark.process
def test_run_finishes_bitwise_after_the_attack(live: dict[str, Any]) -> None:
    names = [f"agent{i}" for i in range(1, LIVE.agents + 1)]
    assert live["agent_rc"] == {n: 0 for n in names}, {
        n: t[-2000:] for n, t in live["logs"].items()}
    results, xs = load_agent_results(live["folder"], names)
    sim = run_simulation(LIVE, noise_seed=LIVE_SEED)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    numerators = [[int(v) for v in r["debug_mask_numerators"]] for r in results]
    assert [sum(col) for col in zip(*numerators, strict=True)] == [0] * len(numerators[0])
    assert len(numerators[0]) == sim.masks[0].num_coefficients
