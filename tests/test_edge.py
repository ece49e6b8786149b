"""The gRPC edge of a real agent server (mutual TLS, in process): callers are admitted by their
certificate before a byte of the body is read, bodies are capped per method (compressed ones by
their decompressed size), health checks refuse garbage by name, and GetStatus shows private
figures only to the agent's operator."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from harness import InProcessAgent, assigned_agents

from agent.options import RefusedByNeighbour
from coordinator.registry import Registry, default_names
from efpsn.params.config import RunConfig
from efpsn.wire import limits, records, rounds
from efpsn.wire.records import Phase
from efpsn.wire.status_client import fetch_status
from efpsn.wire.tls import TlsConfig, generate_certificates
from efpsn.wire.v1 import agent_pb2

pytestmark = pytest.mark.timeout(300)

RUN = "edge-run-0001"
# the paper's DSGD: a round message is one tensor x, which these tests craft by hand
CONFIG = RunConfig.preset("paper", iterations=20, eval_every=10, key_bits=2048, round_timeout_seconds=5.0)
NUM_PARAMS = 7850
PUT = "/efpsn.v1.Agent/PutRound"


class Served:
    """agent1 of a 5-ring at phase II round 3, served over mutual TLS on a loopback port, and
    its neighbour agent2 (not served) with its own client side."""

    def __init__(self, folder: Path, agents: dict[str, InProcessAgent]) -> None:
        self.folder, self.agents = folder, agents
        self.agent = agents["agent1"]
        assert self.agent.server is not None
        self.port = self.agent.server.port

    def creds(self, name: str) -> grpc.ChannelCredentials:
        tls = TlsConfig.from_dir(self.folder / "tls", name)
        return tls.channel_credentials()

    async def call(self, who: str, method: str, bodies: list[bytes], *,
                   compression: grpc.Compression | None = None,
                   parallel: int = 4) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        sem = asyncio.Semaphore(parallel)
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{self.port}", self.creds(who),
            options=[("grpc.ssl_target_name_override", "agent1"),
                     ("grpc.max_send_message_length", -1)],
        ) as channel:
            rpc = channel.unary_unary(method)

            async def one(body: bytes) -> None:
                async with sem:
                    try:
                        await rpc(body, timeout=30, compression=compression)
                        out["OK"] += 1
                    except grpc.aio.AioRpcError as exc:
                        out[exc.code().name] += 1
                        out["detail:" + (exc.details() or "")[:60]] += 0

            await asyncio.gather(*(one(b) for b in bodies))
        return out


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[Served]:
    async with assigned_agents(tmp_path, CONFIG, run_id=RUN, names=("agent1", "agent2"),
                               serve=("agent1",), round_=3) as agents:
        agents["agent1"].status.loss, agents["agent1"].status.accuracy = 0.25, 0.875
        yield Served(tmp_path, agents)


def run_served(tmp_path: Path, scenario: Callable[[Served], Awaitable[None]]) -> None:
    async def main() -> None:
        async with serving(tmp_path) as served:
            await scenario(served)

    asyncio.run(main())


def _round(sender: str, t: int, x: torch.Tensor) -> bytes:
    return rounds.message_to_proto({"x": x}, header=records.make_header(
        run_id=RUN, sender=sender, round=t, phase=Phase.OPTIMIZE)).SerializeToString()


def _empty_entries(count: int) -> bytes:
    """A RoundMessage of `count` empty tensor entries: tiny per byte, huge once parsed."""
    return b"\x12\x00" * count


def test_outsider_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    run_served(tmp_path, _outsider_is_refused_before_its_body_is_read)


async def _outsider_is_refused_before_its_body_is_read(served: Served) -> None:
    garbage = [b"\xff\xfe not a protobuf", _empty_entries(1024 * 1024)]
    got = await served.call("mallory", PUT, garbage)
    # garbage would be INVALID_ARGUMENT if it were parsed first: it is never read
    assert got["PERMISSION_DENIED"] == 2, got
    got = await served.call("mallory", "/efpsn.v1.Agent/GetRound", [b"\xff" * 100])
    assert got["PERMISSION_DENIED"] == 1, got
    assert served.agent.mailbox.size() == 0


def test_bodies_are_capped_per_method_and_by_decompressed_size(tmp_path: Path) -> None:
    run_served(tmp_path, _bodies_are_capped_per_method_and_by_decompressed_size)


async def _bodies_are_capped_per_method_and_by_decompressed_size(served: Served) -> None:
    limit = served.agent.session.request_limits["PutRound"]
    assert NUM_PARAMS * 8 < limit < NUM_PARAMS * 8 + 4096
    big = torch.zeros(4 * NUM_PARAMS, dtype=torch.float64)
    got = await served.call("agent2", PUT, [_round("agent2", 4, big)])
    assert got["INVALID_ARGUMENT"] == 1 and any("larger than the" in k for k in got), got
    # a gzip bomb: 20 MB of empty entries, ~20 kB on the wire, refused by its decompressed size
    got = await served.call("agent2", PUT, [_empty_entries(10 * 1024 * 1024)],
                            compression=grpc.Compression.Gzip)
    assert got["RESOURCE_EXHAUSTED"] == 1, got
    # within the caps, a real message of the neighbour is still accepted, compressed or not
    x = torch.linspace(-1, 1, NUM_PARAMS, dtype=torch.float64)
    got = await served.call("agent2", PUT, [_round("agent2", 4, x)],
                            compression=grpc.Compression.Gzip)
    assert got["OK"] == 1, got
    assert served.agent.mailbox.has("round", 4, "agent2")


def test_health_and_reflection_refuse_garbage_by_name(tmp_path: Path) -> None:
    run_served(tmp_path, _health_and_reflection_refuse_garbage_by_name)


async def _health_and_reflection_refuse_garbage_by_name(served: Served) -> None:
    got = await served.call("mallory", "/grpc.health.v1.Health/Check",
                            [b"\xff\xff\xff", b"\x0a\xff", b"\x08"] * 20)
    assert got["INVALID_ARGUMENT"] == 60 and got["UNKNOWN"] == 0, got
    assert served.agent.service.rejections.counts["INVALID_ARGUMENT"] == 60
    async with grpc.aio.secure_channel(
            f"127.0.0.1:{served.port}", served.creds("mallory"),
            options=[("grpc.ssl_target_name_override", "agent1")]) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # reflection too: garbage ends the stream with INVALID_ARGUMENT, a real query works
        info = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in info(iter([b"\xff\xff\xff"]), timeout=10):
                pass
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        query = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
        listed = [reflection_pb2.ServerReflectionResponse.FromString(r)
                  async for r in info(iter([query]), timeout=10)]
        assert "efpsn.v1.Agent" in [s.name for s in listed[0].list_services_response.service]


def test_statistics_outside_a_standard_run_are_refused_unread(tmp_path: Path) -> None:
    run_served(tmp_path, _statistics_outside_a_standard_run_are_refused_unread)


async def _statistics_outside_a_standard_run_are_refused_unread(served: Served) -> None:
    assert "PutStats" not in served.agent.session.request_limits  # scale none: no secure sum
    got = await served.call("agent2", "/efpsn.v1.Agent/PutStats", [b"\xff" * 4096])
    assert got["FAILED_PRECONDITION"] == 1, got  # never parsed (garbage: INVALID_ARGUMENT)
    assert served.agent.mailbox.size() == 0


def test_status_shows_private_figures_only_to_the_operator(tmp_path: Path) -> None:
    run_served(tmp_path, _status_shows_private_figures_only_to_the_operator)


async def _status_shows_private_figures_only_to_the_operator(served: Served) -> None:
    address = f"127.0.0.1:{served.port}"
    tls_dir = served.folder / "tls"
    own = await fetch_status("agent1", address, tls=TlsConfig.from_dir(tls_dir, "agent1"))
    assert own is not None and (own.loss, own.accuracy, own.run_id) == (0.25, 0.875, RUN)
    for outsider in ("mallory", "coordinator", "agent2"):
        seen = await fetch_status("agent1", address, tls=TlsConfig.from_dir(tls_dir, outsider))
        assert seen is not None and seen.round == 3 and seen.phase == Phase.OPTIMIZE
        assert math.isnan(seen.loss) and math.isnan(seen.accuracy), outsider
        assert seen.run_id == "" and seen.rejections == {}
    service = served.agent.service
    service.identity = dataclasses.replace(service.identity, operator="ops")
    ops = await fetch_status("agent1", address, tls=TlsConfig.from_dir(tls_dir, "ops"))
    assert ops is not None and ops.loss == 0.25
    again = await fetch_status("agent1", address, tls=TlsConfig.from_dir(tls_dir, "agent1"))
    assert again is not None and math.isnan(again.loss)


def test_status_shows_the_runs_progress_to_its_parties_and_counts_to_outsiders(
        tmp_path: Path) -> None:
    run_served(tmp_path, _status_shows_the_runs_progress_to_its_parties)


async def _status_shows_the_runs_progress_to_its_parties(served: Served) -> None:
    address = f"127.0.0.1:{served.port}"
    tls_dir = served.folder / "tls"
    served.agent.status.hear("agent2")  # agent2 was heard just now; agent5 never
    # agent3: a party of the run, not agent1's neighbour; agent2 its neighbour
    for party in ("agent3", "agent2"):
        seen = await fetch_status("agent1", address, tls=TlsConfig.from_dir(tls_dir, party))
        assert seen is not None and [v.name for v in seen.neighbours] == ["agent2", "agent5"]
        heard = {v.name: v.heard_ago for v in seen.neighbours}
        assert heard["agent5"] is None and 0 <= heard["agent2"] < 5, heard
        assert (seen.neighbour_count, seen.departed_count, seen.departed) == (2, 0, ())
        assert seen.last_round == 20 and seen.rounds_left == 17 and math.isnan(seen.loss)
    # not a party (a certificate of the CA, not a name in the run): the counts only
    for outsider in ("mallory", "coordinator"):
        seen = await fetch_status("agent1", address, tls=TlsConfig.from_dir(tls_dir, outsider))
        assert seen is not None and seen.neighbours == () and seen.departed == ()
        assert (seen.neighbour_count, seen.last_round, seen.round) == (2, 20, 3), outsider


def test_request_limits_follow_the_run() -> None:
    from agent.session import legitimate_request_bytes

    small = legitimate_request_bytes(CONFIG, {"x": (NUM_PARAMS,)}, coefficients=11)
    tracked = legitimate_request_bytes(CONFIG, {"x": (13_426,), "y": (13_426,)},
                                       coefficients=11)
    assert small["PutRound"] < 70_000 and 214_816 < tracked["PutRound"] < 220_000
    assert small["PutShares"] >= 11 * 2 * CONFIG.key_bits // 8
    assert max(small.values()) <= limits.AGENT_RECEIVE_BYTES


def test_duplicate_tensor_names_are_found_in_linear_time() -> None:
    """30,000 names with one duplicate took seconds with names.count per name (quadratic)."""
    import time

    from efpsn.wire.v1 import common_pb2

    names = [f"t{i:06d}" for i in range(30_000)]
    names.append(names[-1])
    pb = agent_pb2.RoundMessage(
        header=records.make_header(run_id=RUN, sender="agent2", round=1, phase=Phase.OPTIMIZE),
        tensors=[agent_pb2.NamedTensor(name=n, tensor=common_pb2.Tensor()) for n in names])
    started = time.thread_time()  # CPU time of this thread: other processes' load does not count
    with pytest.raises(records.WireError, match=r"unique, got duplicates \['t029999'\]"):
        rounds.message_from_proto(pb)
    assert time.thread_time() - started < 1.5  # linear: about 0.01 s; quadratic: seconds
    # with the run's shapes, a wrong count is refused before any name is looked at
    with pytest.raises(records.WireError, match="got 30001 tensors"):
        rounds.message_from_proto(pb, expected_shapes={"x": (NUM_PARAMS,)})


def test_two_names_at_one_address_are_refused_at_registration() -> None:
    registry = Registry(CONFIG, run_id=RUN, expected_names=default_names(5))
    registry.register("agent1", "10.0.0.1:50051")
    with pytest.raises(ValueError, match="already registered by 'agent1'"):
        registry.register("agent2", "10.0.0.1:50051")
    registry.register("agent1", "10.0.0.1:50052")  # moving agent1 frees its old address
    registry.register("agent2", "10.0.0.1:50051")
    assert registry.addresses == {"agent1": "10.0.0.1:50052", "agent2": "10.0.0.1:50051"}


def test_run_status_shows_names_and_run_id_only_to_members(tmp_path: Path) -> None:
    from coordinator.service import CoordinatorService
    from efpsn.wire.v1 import coordinator_pb2

    generate_certificates(tmp_path / "tls", ["coordinator", "agent1", "mallory"])
    pems = {n: (tmp_path / "tls" / f"{n}.pem").read_bytes()
            for n in ("coordinator", "agent1", "mallory")}

    class Context:
        def __init__(self, who: str) -> None:
            self.who = who

        def auth_context(self) -> dict[str, list[bytes]]:
            return {"transport_security_type": [b"ssl"], "x509_pem_cert": [pems[self.who]]}

    registry = Registry(CONFIG, run_id=RUN, expected_names=default_names(5))
    registry.register("agent1", "127.0.0.1:40001")
    service = CoordinatorService(registry, register_timeout=0.0, tls_required=True,
                                 operator_names=frozenset({"coordinator"}))

    def status(who: str) -> coordinator_pb2.RunStatus:
        return asyncio.run(service.GetRunStatus(coordinator_pb2.RunStatusRequest(),
                                                Context(who)))

    for insider in ("coordinator", "agent1"):
        seen = status(insider)
        assert (seen.run_id, list(seen.names), seen.registered) == (RUN, ["agent1"], 1)
    outsider = status("mallory")
    assert (outsider.run_id, list(outsider.names), outsider.registered) == ("", [], 1)


def test_a_call_cancelled_while_its_body_is_read_frees_the_callers_slot() -> None:
    """Else a neighbour whose calls time out mid-send would be locked out after a few."""
    import logging

    from efpsn.wire.guard import Admission, Gatekeeper, RejectionLog, Unread, guarded

    class Service:
        def __init__(self) -> None:
            self.rejections = RejectionLog(logging.getLogger("test"), "test")
            self.in_flight = 0

        def admit(self, method: str, context: Any) -> Admission:
            self.in_flight += 1
            return Admission(1024, lambda: setattr(self, "in_flight", self.in_flight - 1))

        @guarded
        async def PutRound(self, request: Any, context: Any) -> str:
            return "ok"

    class Context:
        def __init__(self, body: bytes | None) -> None:
            self.body = body

        async def read(self) -> bytes:
            if self.body is None:
                raise asyncio.CancelledError
            return self.body

    service = Service()
    gate = Gatekeeper("efpsn.v1.Agent", service.admit, rejections=service.rejections)
    unread = Unread(agent_pb2.RoundMessage)

    async def call(context: Context) -> str:
        async with gate.admitted("PutRound", context):  # as the server's interceptor does
            assert service.in_flight == 1
            return await service.PutRound(unread, context)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(call(Context(None)))
    assert service.in_flight == 0
    assert asyncio.run(call(Context(b""))) == "ok"
    assert service.in_flight == 0


def test_a_caller_ahead_of_us_is_not_counted_or_logged_as_a_refusal(
        caplog: pytest.LogCaptureFixture) -> None:
    """A neighbour that calls before this agent is assigned or has its phase I key (the normal
    race at start-up) gets UNAVAILABLE and retries; only a real refusal is counted and logged
    (result.json's rejections, the agent's log)."""
    import logging

    from efpsn.wire.guard import Reject, RejectionLog, guarded

    class Service:
        def __init__(self) -> None:
            self.rejections = RejectionLog(logging.getLogger("test.edge"), "agent1")

        @guarded
        async def PutPublicKey(self, request: Any, context: Any) -> str:
            raise Reject(grpc.StatusCode.UNAVAILABLE, f"not {request} yet", early=request != "real")

    class Aborted(Exception):
        pass

    class Context:
        async def abort(self, code: grpc.StatusCode, detail: str) -> None:
            raise Aborted(code, detail)

    service = Service()
    with caplog.at_level(logging.INFO):
        for request in ("assigned", "ready", "real"):
            with pytest.raises(Aborted) as info:
                asyncio.run(service.PutPublicKey(request, Context()))
            assert info.value.args == (grpc.StatusCode.UNAVAILABLE, f"not {request} yet")
    assert service.rejections.counts == {"UNAVAILABLE": 1}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == [
        "agent1: refused PutPublicKey: UNAVAILABLE: not real yet"]


def test_a_neighbours_reply_is_capped_at_a_round_message(tmp_path: Path) -> None:
    """A GetRound reply bigger than a round message of this run is refused by gRPC unread."""

    async def scenario(served: Served) -> None:
        agent1 = served.agent
        limit = agent1.session.request_limits["PutRound"]
        for t, size in ((1, NUM_PARAMS), (2, 40 * NUM_PARAMS)):
            pb = rounds.message_to_proto({"x": torch.zeros(size, dtype=torch.float64)},
                                         header=records.make_header(run_id=RUN, sender="agent1",
                                                                  round=t, phase=Phase.OPTIMIZE))
            agent1.outbox.remember(t, pb.SerializeToString())
        # agent2's client side pulls from agent1, as a restarted agent does
        peers = served.agents["agent2"].peers
        loop = asyncio.get_running_loop()
        message = await peers.pull("agent1", 1, deadline=loop.time() + 10)
        assert message is not None and message.header.round == 1
        assert len(agent1.outbox.get(1) or b"") < limit
        with pytest.raises(RefusedByNeighbour) as info:
            await peers.pull("agent1", 2, deadline=loop.time() + 10)
        assert info.value.code == "RESOURCE_EXHAUSTED"

    run_served(tmp_path, scenario)


def test_a_caller_has_at_most_a_few_calls_in_flight(tmp_path: Path) -> None:
    """Round streams hold their caller's slots while open: past the cap a neighbour's next call
    waits its turn (UNAVAILABLE, retried), and a slot freed lets it in again."""

    async def scenario(served: Served) -> None:
        cap = 4  # calls one caller may have in flight at an agent
        request = agent_pb2.RoundRequest(header=records.make_header(
            run_id=RUN, sender="agent2", round=3, phase=Phase.OPTIMIZE))
        async with grpc.aio.secure_channel(
                f"127.0.0.1:{served.port}", served.creds("agent2"),
                options=[("grpc.ssl_target_name_override", "agent1")]) as channel:
            streams = [channel.stream_unary("/efpsn.v1.Agent/StreamRounds")() for _ in range(cap)]
            get = channel.unary_unary("/efpsn.v1.Agent/GetRound",
                                      request_serializer=agent_pb2.RoundRequest.SerializeToString)

            async def answer() -> tuple[str, str]:
                try:
                    await get(request, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    return exc.code().name, exc.details() or ""
                return "OK", ""

            async with asyncio.timeout(20):  # until the server has admitted every stream
                while (got := await answer())[0] != "UNAVAILABLE":
                    await asyncio.sleep(0.02)
            assert got == ("UNAVAILABLE",
                           f"{cap} calls from 'agent2' are already in flight: retry later")
            # another caller is not held up by agent2's calls
            assert (await served.call("agent3", "/efpsn.v1.Agent/GetRound", [
                request.SerializeToString()]))["UNAVAILABLE"] == 0
            await streams[0].done_writing()
            await streams[0]
            assert (await answer())[0] == "OK"
            for stream in streams[1:]:  # every one of the `cap` streams had been admitted
                await stream.done_writing()
                assert isinstance(await stream, bytes)

    run_served(tmp_path, scenario)
