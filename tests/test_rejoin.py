"""A new edge's seed exchange between two agents of a 5-ring that were not neighbours
(agent/departure/new_edges.py, the servicer's rejoin path), in process over mutual TLS: before
either knows the decision, the other is refused as a stranger (or asked to retry while a decision is
awaited); once both know, they exchange seeds under fresh Paillier keys and get exactly the
simulator's (efpsn/departure/remask.py, new_edge_seeds); a new neighbour's round messages are
taken from the re-base round on only. An end stopped in the middle of the exchange resumes it
from its state folder (agent/departure/exchange_file.py) and both ends still get the simulator's
seeds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from harness import InProcessAgent, assigned_agents, message

from agent.departure.exchange_file import ExchangeState
from agent.departure.new_edges import NewEdges, exchange_new_seeds
from agent.mailbox import Mailbox
from agent.state import EXCHANGE, StateStore
from efpsn.crypto import paillier
from efpsn.departure.remask import new_edge_seeds, new_edge_shares
from efpsn.params.config import RunConfig
from efpsn.wire import records, serde
from efpsn.wire.records import Phase
from efpsn.wire.tls import TlsConfig
from efpsn.wire.v1 import agent_pb2

pytestmark = pytest.mark.timeout(300)

RUN = "rejoin-run-0001"
CONFIG = RunConfig(iterations=40, eval_every=20, key_bits=2048, round_timeout_seconds=10.0)
FIXED = RunConfig(iterations=40, eval_every=20, key_bits=2048, round_timeout_seconds=10.0,
                  refresh="never")  # the paper's fixed mask
REBASE, NOISE_SEED, EPOCH = 11, 7, 1  # the agents are at round 10


async def _call(folder: Path, agent: InProcessAgent, caller: str, method: str,
                request: object) -> str:
    """The status of one call to `agent` made with `caller`'s certificate ("OK" or the code)."""
    creds = TlsConfig.from_dir(folder / "tls", caller).channel_credentials()
    async with grpc.aio.secure_channel(agent.address, creds, options=[
            ("grpc.ssl_target_name_override", agent.name)]) as channel:
        rpc = channel.unary_unary(f"/efpsn.v1.Agent/{method}",
                                  request_serializer=lambda m: m.SerializeToString())
        try:
            await rpc(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return "OK"


def _key(agent: InProcessAgent, round_: int) -> agent_pb2.PublicKeyMessage:
    public, _ = paillier.generate_keypair(2048)
    return serde.public_key_message(header=records.make_header(
        run_id=RUN, sender=agent.name, round=round_, phase=Phase.KEYS), n=public.n)


def test_two_strangers_become_neighbours_with_the_simulators_seeds(tmp_path: Path) -> None:
    async def main() -> None:
        async with assigned_agents(tmp_path, CONFIG, run_id=RUN, names=("agent1", "agent3"),
                                   serve=("agent1", "agent3"), round_=10) as agents:
            one, three = agents["agent1"], agents["agent3"]
            # prepare: agent1 and agent3 of a 5-ring are not neighbours
            assert "agent3" not in one.session.admitted_names
            refused = await _call(tmp_path, one, "agent3", "PutPublicKey", _key(three, REBASE))
            assert refused.startswith("PERMISSION_DENIED"), refused
            one.membership.awaiting_decision(True)  # a decision is awaited: a stranger may be new
            waiting = await _call(tmp_path, one, "agent3", "PutPublicKey", _key(three, REBASE))
            assert waiting.startswith("UNAVAILABLE: awaiting the coordinator's decision")
            one.membership.awaiting_decision(False)
            # execute: the decision names them to each other (index, address, re-base round)
            one.session.joining["agent3"] = (2, three.address, REBASE)
            three.session.joining["agent1"] = (0, one.address, REBASE)
            wrong = await _call(tmp_path, one, "agent3", "PutPublicKey", _key(three, REBASE - 1))
            assert wrong.startswith("INVALID_ARGUMENT"), wrong  # not the re-base round
            early = await _call(tmp_path, one, "agent3", "PutRound",
                                message(one, REBASE - 1, sender="agent3"))
            assert early.startswith("INVALID_ARGUMENT"), early  # no rounds before R
            seeds = await asyncio.gather(*(
                exchange_new_seeds(session=a.session, peers=a.peers, mailbox=a.mailbox,
                                   edges=a.membership.new_edges, joiners={other: index},
                                   rebase_round=REBASE, epoch=EPOCH, noise_seed=NOISE_SEED,
                                   allow_insecure_keys=False, timeout=20.0,
                                   store=StateStore(tmp_path / a.name))
                for a, other, index in ((one, "agent3", 2), (three, "agent1", 0))))
            # assert: the pairs the simulator draws for the new edge (0, 2), both ends agreeing
            expected = new_edge_seeds([(0, 2)], noise_seed=NOISE_SEED, epoch=EPOCH)
            assert seeds[0] == expected[0] and seeds[1] == expected[2]
            assert seeds[0][2] == seeds[1][0][::-1]  # (s_13, s_31) and (s_31, s_13)
            # from the re-base round on, a new neighbour's round messages are taken
            assert await _call(tmp_path, one, "agent3", "PutRound",
                               message(one, REBASE, sender="agent3")) == "OK"
            assert one.mailbox.has("round", REBASE, "agent3")
            one.session.join("agent3")
            assert one.session.names[2] == "agent3" and "agent3" in one.session.neighbour_names

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [False, True], ids=["seeds", "fixed-mask"])
def test_an_end_stopped_in_its_exchange_resumes_it_from_its_state_folder(
        tmp_path: Path, fixed: bool) -> None:
    """agent1 saves its exchange before sending anything (agent/departure/exchange_file.py), keeps
    agent3's key on disk before acknowledging it and its own ciphertexts before sending them, then
    dies before its shares go out (here: its PutShares raises). A new process (a fresh mailbox and
    ledger, nothing in memory) reloads the exchange from its folder, sends its key again (a
    duplicate agent3 acknowledges) and the saved ciphertexts, and both ends get the
    simulator's seeds (with the paper's fixed mask, its shares z_13 and z_31), agent3 having
    waited in its own exchange throughout."""
    config = FIXED if fixed else CONFIG

    async def main() -> None:
        async with assigned_agents(tmp_path, config, run_id=RUN, names=("agent1", "agent3"),
                                   serve=("agent1", "agent3"), round_=10) as agents:
            one, three = agents["agent1"], agents["agent3"]
            one.session.joining["agent3"] = (2, three.address, REBASE)
            three.session.joining["agent1"] = (0, one.address, REBASE)
            folder = tmp_path / "agent1-state"

            def run(a: InProcessAgent, other: str, index: int, mailbox: Mailbox,
                    where: Path) -> Any:
                return exchange_new_seeds(
                    session=a.session, peers=a.peers, mailbox=mailbox,
                    edges=a.membership.new_edges, joiners={other: index}, rebase_round=REBASE,
                    epoch=EPOCH, noise_seed=NOISE_SEED, allow_insecure_keys=False,
                    timeout=30.0, store=StateStore(where), fixed=fixed)

            send = one.peers.send

            async def killed(name: str, method: str, request: Any, **kw: Any) -> None:
                if method == "PutShares":
                    raise RuntimeError("killed before its shares went out")
                await send(name, method, request, **kw)

            one.peers.send = killed  # type: ignore[method-assign]
            # a process that dies takes its unfinished calls with it; this one lives on in the
            # test, so its calls in flight (agent3's shares, maybe, being written to disk) end
            # before the new process reads the folder, as they would before a restart
            old = one.membership.new_edges
            inflight: set[asyncio.Future[Any]] = set()

            def tracked(take: Any) -> Any:
                async def call(*args: Any, **kw: Any) -> Any:
                    task = asyncio.ensure_future(take(*args, **kw))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                    return await task
                return call

            old.take_key = tracked(old.take_key)  # type: ignore[method-assign]
            old.take_shares = tracked(old.take_shares)  # type: ignore[method-assign]
            waiting = asyncio.create_task(run(three, "agent1", 0, three.mailbox,
                                              tmp_path / "agent3-state"))
            with pytest.raises(RuntimeError, match="killed"):
                await run(one, "agent3", 2, one.mailbox, folder)
            # a new process: nothing of the exchange in memory
            one.peers.send = send  # type: ignore[method-assign]
            fresh = Mailbox()
            one.peers.mailbox = fresh
            one.membership.new_edges = NewEdges(  # type: ignore[attr-defined]
                peers=one.peers, mailbox=fresh, store=StateStore(folder), noise_seed=NOISE_SEED,
                allow_insecure_keys=False)
            await asyncio.gather(*inflight, return_exceptions=True)
            saved = json.loads((folder / EXCHANGE).read_text())
            assert (folder / EXCHANGE).stat().st_mode & 0o777 == 0o600
            assert saved["joiners"] == {"agent3": 2} and list(saved["sent"]) == ["2"]
            assert list(saved["received"]["key"]) == ["agent3"]
            resumed = await run(one, "agent3", 2, fresh, folder)
            other = await waiting
            if fixed:  # the shares z_13, z_31 both ends hold: the replay's
                shares = new_edge_shares([(0, 2)], one.session.problem.noise_spec,
                                         noise_seed=NOISE_SEED, epoch=EPOCH)
                assert resumed.edge_terms(2) == shares[0][2]
                assert other.edge_terms(0) == shares[2][0]
            else:
                expected = new_edge_seeds([(0, 2)], noise_seed=NOISE_SEED, epoch=EPOCH)
                assert resumed == expected[0] and other == expected[2]

    asyncio.run(main())


def test_the_saved_exchange_reloads_only_for_its_own_decision(tmp_path: Path) -> None:
    # prepare: an exchange saved for agent4 at epoch 1, re-base round 46
    pair = paillier.generate_keypair(1024, allow_insecure=True)
    where = {"run_id": "r", "epoch": 1, "rebase_round": 46, "joiners": {"agent4": 3}}
    store = StateStore(tmp_path)
    state = ExchangeState.create(store, keypair=pair, seeds={3: b"\x05" * 32}, **where)
    state.keep("key", "agent4", pair[0])
    state.save_sent({3: [12345]})
    # execute / assert: reloaded, the same key pair, seeds and messages (JSON integers)
    again = ExchangeState.load(store, allow_insecure=True, **where)
    assert again is not None and again.keypair(allow_insecure=True)[0] == pair[0]
    assert again.seeds() == {3: b"\x05" * 32} and again.sent() == {3: [12345]}
    assert again.received() == {"key": {"agent4": pair[0].n}, "shares": {}}
    assert (tmp_path / EXCHANGE).stat().st_mode & 0o777 == 0o600
    # another decision's exchange is not this one: it starts afresh
    assert ExchangeState.load(store, allow_insecure=True, **{**where, "epoch": 2}) is None
    with pytest.raises(ValueError, match="belongs to run"):
        ExchangeState.load(store, allow_insecure=True, **{**where, "run_id": "other"})
    text = (tmp_path / EXCHANGE).read_text()
    (tmp_path / EXCHANGE).write_text(text.replace('"fingerprint": "', '"fingerprint": "00'))
    with pytest.raises(ValueError, match="damaged"):
        ExchangeState.load(store, allow_insecure=True, **where)
    store.discard(EXCHANGE)
    assert ExchangeState.load(store, allow_insecure=True, **where) is None
    # the fixed mask's: the generator seed its shares are drawn from (none: a noise seed's)
    ExchangeState.create(store, keypair=pair, seeds={}, entropy=2**127 + 5, **where)
    fixed = ExchangeState.load(store, allow_insecure=True, **where)
    assert fixed is not None and fixed.entropy == 2**127 + 5 and fixed.seeds() == {}
