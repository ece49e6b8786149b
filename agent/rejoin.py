"""A new edge after a departure cut the graph: phase I's seed exchange for it, between its two
ends, before the re-base round (efpsn/seeds.py's SeedExchange, as agent/phase_one.py runs it;
with the paper's fixed mask, efpsn/masking.py's Masker on the new edges, agent/fixed_terms.py).

Each end makes a fresh Paillier key pair, sends its public key and then its seed for the edge,
encrypted under the other end's key, and decrypts the other end's: the pair (s_ij, s_ji) that
efpsn/departure_masks.py's `new_edge_seeds` draws in the simulator from the same generator
(`rejoin_generator`, given a test noise seed; the OS otherwise). The messages are phase I's
(PutPublicKey, PutShares) with the re-base round in their header; the two ends learned each
other's name and address from the coordinator's decision, and mutual TLS checks the names as
for any neighbour. Nothing of either end's data is involved.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from agent.concurrency import all_or_first_error
from agent.mailbox import Interrupted, Mailbox, NeighbourTimeout
from agent.options import AgentFailure
from agent.peers import Peers
from agent.phase_one import shares_packed
from agent.servicer import AgentService, ShareCheck
from agent.session import Session
from efpsn import paillier
from efpsn.departure_masks import rejoin_generator
from efpsn.masking import Masker
from efpsn.seeds import EdgeSeeds, SeedExchange
from efpsn.wire import serde
from efpsn.wire.records import Phase

__all__ = ["Rejoin", "exchange_new_seeds"]

log = logging.getLogger("efpsn.agent")


async def exchange_new_seeds(*, session: Session, peers: Peers, mailbox: Mailbox,
                             service: AgentService, joiners: Mapping[str, int], rebase_round: int,
                             epoch: int, noise_seed: int | None, allow_insecure_keys: bool,
                             timeout: float, fixed: bool = False,
                             ) -> dict[int, tuple[bytes, bytes]] | Masker:
    """This agent's seeds with each new neighbour (name -> index in `joiners`): index ->
    (s_ij, s_ji); with the paper's fixed mask (`fixed`), the finished Masker of the new edges
    (its shares drawn as efpsn/departure_masks.py's new_edge_shares draws them). `service` is
    told the key the new neighbours' shares must be under."""
    cfg = session.config
    pair = await asyncio.to_thread(paillier.generate_keypair, cfg.key_bits,
                                   allow_insecure=allow_insecure_keys)
    rng = None if noise_seed is None else rejoin_generator(noise_seed, session.index, epoch)
    exchange: SeedExchange | Masker
    if fixed:
        exchange = Masker(agent=session.index, neighbours=sorted(joiners.values()),
                          spec=session.problem.noise_spec,
                          rng=rejoin_generator(noise_seed, session.index, epoch),
                          layout=session.problem.layout, keypair=pair,
                          allow_insecure=allow_insecure_keys)
    else:
        exchange = SeedExchange(agent=session.index, neighbours=sorted(joiners.values()),
                                keypair=pair, rng=rng, allow_insecure=allow_insecure_keys)
    packed = shares_packed(cfg)
    service.rejoin_shares = ShareCheck(public_key=exchange.public_key,
                                       count=exchange.ciphertexts_per_neighbour, packed=packed)
    names = sorted(joiners)
    key = serde.public_key_message(header=peers.header(Phase.KEYS, rebase_round),
                                   n=exchange.public_key.n)
    await all_or_first_error(peers.send(n, "PutPublicKey", key, timeout=timeout)
                             for n in names)
    keys = {joiners[n]: k for n, k in (await _collect(mailbox, "key", rebase_round, names,
                                                      timeout=timeout)).items()}
    outgoing = await asyncio.to_thread(exchange.outgoing, keys)
    header = peers.header(Phase.SHARES, rebase_round)
    await all_or_first_error(
        peers.send(n, "PutShares", serde.shares_message(
            header=header, fingerprint=paillier.fingerprint(keys[joiners[n]]),
            ciphertexts=outgoing[joiners[n]], num_coefficients=session.problem.N,
            packed=packed), timeout=timeout)
        for n in names)
    incoming = await _collect(mailbox, "shares", rebase_round, names, timeout=timeout)
    finished = await asyncio.to_thread(exchange.finish,
                                       {joiners[n]: c for n, c in incoming.items()})
    if isinstance(exchange, Masker):
        return exchange
    assert isinstance(finished, EdgeSeeds)
    received = dict(finished.received)
    return {j: (s, received[j]) for j, s in finished.sent}


async def _collect(mailbox: Mailbox, kind: str, round_: int, names: list[str], *,
                   timeout: float) -> dict[str, Any]:
    """The new neighbours' messages; a round stream that broke meanwhile (the departed
    agent's, typically) is mended by the next round's exchange, not here: wait on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await mailbox.collect(kind, round_, names,
                                         timeout=max(0.0, deadline - loop.time()))
        except Interrupted:
            continue
        except NeighbourTimeout as exc:
            raise AgentFailure(f"the new edge's seed exchange: {exc}",
                               blame=exc.missing[0]) from None


class Rejoin:
    """What agent/departing.py's Silence needs of the network for new edges: tell the servicer
    a decision is awaited (a new neighbour may call a moment before this agent hears it), and
    run the seed exchange."""

    def __init__(self, *, session: Session, peers: Peers, mailbox: Mailbox,
                 service: AgentService, noise_seed: int | None,
                 allow_insecure_keys: bool) -> None:
        self.session = session
        self.peers = peers
        self.mailbox = mailbox
        self.service = service
        self.noise_seed = noise_seed
        self.allow_insecure_keys = allow_insecure_keys

    def deciding(self, awaited: bool) -> None:
        self.service.deciding = awaited

    async def exchange(self, joiners: Mapping[str, int], *, rebase_round: int,
                       epoch: int) -> dict[int, tuple[bytes, bytes]]:
        seeds = await self._exchange(joiners, rebase_round=rebase_round, epoch=epoch,
                                     fixed=False)
        assert isinstance(seeds, dict)
        return seeds

    async def exchange_shares(self, joiners: Mapping[str, int], *, rebase_round: int,
                              epoch: int) -> Masker:
        """The paper's phase I on the new edges: the finished Masker holding their terms."""
        masker = await self._exchange(joiners, rebase_round=rebase_round, epoch=epoch,
                                      fixed=True)
        assert isinstance(masker, Masker)
        return masker

    async def _exchange(self, joiners: Mapping[str, int], *, rebase_round: int, epoch: int,
                        fixed: bool) -> dict[int, tuple[bytes, bytes]] | Masker:
        start = time.perf_counter()
        seeds = await exchange_new_seeds(
            session=self.session, peers=self.peers, mailbox=self.mailbox, service=self.service,
            joiners=joiners, rebase_round=rebase_round, epoch=epoch, noise_seed=self.noise_seed,
            allow_insecure_keys=self.allow_insecure_keys,
            timeout=self.session.config.round_timeout_seconds, fixed=fixed)
        log.warning("%s: phase I on the new edge(s) with %s done in %.2f s (seeds under "
                    "Paillier); they mix from round %d", self.session.assignment.name,
                    ", ".join(sorted(joiners)), time.perf_counter() - start, rebase_round)
        return seeds
