"""A new edge's seed exchange between two agents of a 5-ring that were not neighbours
(agent/rejoin.py, the servicer's rejoin path), in process over mutual TLS: before either knows
the decision, the other is refused as a stranger (or asked to retry while a decision is
awaited); once both know, they exchange seeds under fresh Paillier keys and get exactly the
simulator's (efpsn/departure_masks.py, new_edge_seeds); a new neighbour's round messages are
taken from the re-base round on only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from harness import InProcessAgent, assigned_agents, message

from agent.rejoin import exchange_new_seeds
from efpsn import paillier
from efpsn.config import RunConfig
from efpsn.departure_masks import new_edge_seeds
from efpsn.wire import records, serde
from efpsn.wire.records import Phase
from efpsn.wire.tls import TlsConfig
from efpsn.wire.v1 import agent_pb2

pytestmark = pytest.mark.timeout(300)

RUN = "rejoin-run-0001"
CONFIG = RunConfig(iterations=40, eval_every=20, key_bits=2048, round_timeout_seconds=10.0)
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
            one.service.deciding = True  # a decision is awaited: a stranger may be new
            waiting = await _call(tmp_path, one, "agent3", "PutPublicKey", _key(three, REBASE))
            assert waiting.startswith("UNAVAILABLE: awaiting the coordinator's decision")
            one.service.deciding = False
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
                                   service=a.service, joiners={other: index},
                                   rebase_round=REBASE, epoch=EPOCH, noise_seed=NOISE_SEED,
                                   allow_insecure_keys=False, timeout=20.0,
                                   folder=tmp_path / a.name)
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
