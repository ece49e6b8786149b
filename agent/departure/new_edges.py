"""A new edge after a departure cut the graph: phase I's seed exchange for it, between its two
ends, before the re-base round (efpsn/masks/seeds.py's SeedExchange, as agent/phases/phase_one.py
runs it; with the paper's fixed mask, efpsn/masks/zero_sum.py's Masker on the new edges,
agent/departure/fixed_terms.py). NewEdges owns both sides of it at one end: the messages the
other end sends (the router hands them over; their own ledger judges them, and each is on disk
before it is acknowledged) and the exchange itself.

Each end makes a fresh Paillier key pair, sends its public key and then its seed for the edge,
encrypted under the other end's key, and decrypts the other end's: the pair (s_ij, s_ji) that
efpsn/departure/remask.py's `new_edge_seeds` draws in the simulator from the same generator
(`rejoin_generator`, given a test noise seed; the OS otherwise). The messages are phase I's
(PutPublicKey, PutShares) with the re-base round in their header; the two ends learned each
other's name and address from the coordinator's decision, and mutual TLS checks the names as
for any neighbour. Nothing of either end's data is involved. The exchange is saved
before anything of it is sent and resumed after a restart (agent/departure/exchange_file.py):
the same messages again, the other end acknowledging copies.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from agent.concurrency import all_or_first_error
from agent.departure.exchange_file import ExchangeState
from agent.departure.fixed_terms import EdgeTerms
from agent.mailbox import Interrupted, Mailbox, NeighbourTimeout
from agent.options import AgentFailure, NotReady
from agent.peers import Peers
from agent.phases.shares import ShareCheck, shares_packed
from agent.session import Session
from agent.state import EXCHANGE, StateStore
from efpsn.crypto import paillier
from efpsn.departure.joins import JOIN_CHECK_EVERY, seed_epoch
from efpsn.departure.remask import add_seeds, rejoin_generator
from efpsn.ledger import Judgement, PhaseOneLedger, Verdict
from efpsn.masks.refresh import FixedMask
from efpsn.masks.seeds import EdgeSeeds, SeedExchange, draw_seeds
from efpsn.masks.zero_sum import MaskCoefficients, Masker
from efpsn.wire import serde
from efpsn.wire.records import Phase

__all__ = ["NewEdges", "exchange_new_seeds"]

log = logging.getLogger("efpsn.agent")


async def exchange_new_seeds(*, session: Session, peers: Peers, mailbox: Mailbox,
                             edges: NewEdges, joiners: Mapping[str, int], rebase_round: int,
                             epoch: int, noise_seed: int | None, allow_insecure_keys: bool,
                             timeout: float, store: StateStore, fixed: bool = False,
                             keys_first: float | None = None,
                             ) -> dict[int, tuple[bytes, bytes]] | Masker:
    """This agent's seeds with each new neighbour (name -> index in `joiners`): index ->
    (s_ij, s_ji); with the paper's fixed mask (`fixed`), the finished Masker of the new edges
    (its shares drawn as efpsn/departure/remask.py's new_edge_shares draws them). `edges` takes
    the new neighbours' messages: it is told what their shares must be. The exchange is saved
    in the state folder before anything is sent (agent/departure/exchange_file.py) and resumed
    from there. `keys_first` (a party that joins): it waits up to that many seconds for every
    new neighbour's key before it sends its own, since a member refuses a party it has not
    heard of, and hears of a join only at its next check round (coordinator/joins.py)."""
    cfg = session.config
    names, neighbours = sorted(joiners), sorted(joiners.values())
    state = await asyncio.to_thread(_state, session, store, joiners, rebase_round=rebase_round,
                                    epoch=epoch, noise_seed=noise_seed, fixed=fixed,
                                    allow_insecure=allow_insecure_keys)
    pair = state.keypair(allow_insecure=allow_insecure_keys)
    exchange: SeedExchange | Masker
    if fixed:  # its shares drawn again from the saved generator seed after a restart
        rng = (rejoin_generator(noise_seed, session.index, epoch) if noise_seed is not None
               else np.random.default_rng(state.entropy))
        exchange = Masker(agent=session.index, neighbours=neighbours,
                          spec=session.problem.noise_spec, rng=rng,
                          layout=session.problem.layout, keypair=pair,
                          allow_insecure=allow_insecure_keys)
    else:
        exchange = SeedExchange(agent=session.index, neighbours=neighbours, keypair=pair,
                                seeds=state.seeds(), allow_insecure=allow_insecure_keys)
    got = state.received()  # what the other ends sent before a restart, acknowledged
    for n, modulus in got["key"].items():
        mailbox.put("key", rebase_round, n, paillier.public_key_from_n(modulus))
    for n, ciphertexts in got["shares"].items():
        mailbox.put("shares", rebase_round, n, ciphertexts)
    packed = shares_packed(cfg)
    edges.expect(names, keep=state.keep, shares=ShareCheck(
        public_key=exchange.public_key, count=exchange.ciphertexts_per_neighbour, packed=packed))
    key = serde.public_key_message(header=peers.header(Phase.KEYS, rebase_round),
                                   n=exchange.public_key.n)
    if keys_first is not None:
        collected = await _collect(mailbox, "key", rebase_round, names, timeout=keys_first)
    await all_or_first_error(peers.send(n, "PutPublicKey", key, timeout=timeout)
                             for n in names)
    if keys_first is None:
        collected = await _collect(mailbox, "key", rebase_round, names, timeout=timeout)
    keys = {joiners[n]: k for n, k in collected.items()}
    outgoing = state.sent()  # a restart sends the very same ciphertexts again
    if outgoing and isinstance(exchange, SeedExchange):
        exchange.restore_outgoing(keys, outgoing)
    else:  # a Masker draws its shares here (a restarted one: the same shares, and its own
        # encryption of them is not sent: the saved ciphertexts are, as before the restart)
        fresh = await asyncio.to_thread(exchange.outgoing, keys)
        if not outgoing:  # on disk before the first of them goes out
            await asyncio.to_thread(state.save_sent, fresh)
            outgoing = fresh
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


def _state(session: Session, store: StateStore, joiners: Mapping[str, int], *,
           rebase_round: int, epoch: int, noise_seed: int | None, fixed: bool,
           allow_insecure: bool) -> ExchangeState:
    """The exchange saved before a restart, or a new one (a fresh key pair; the seeds drawn as
    the replay draws them given a noise seed; the fixed mask's generator seed, from the OS
    as rejoin_generator's, none given a noise seed), saved before anything is sent."""
    where = {"run_id": session.run_id, "epoch": epoch, "rebase_round": rebase_round,
             "joiners": joiners}
    try:
        state = ExchangeState.load(store, allow_insecure=allow_insecure, **where)
    except ValueError as exc:
        raise AgentFailure(f"{session.assignment.name} cannot resume its new edge's seed "
                           f"exchange: {exc}") from None
    if state is not None:
        log.warning("%s resumes the seed exchange of its new edge(s) with %s (saved before it "
                    "was stopped)", session.assignment.name, ", ".join(sorted(joiners)))
        return state
    pair = paillier.generate_keypair(session.config.key_bits, allow_insecure=allow_insecure)
    if fixed:
        entropy = None if noise_seed is not None else secrets.randbits(128)
        return ExchangeState.create(store, keypair=pair, seeds={}, entropy=entropy, **where)
    rng = None if noise_seed is None else rejoin_generator(noise_seed, session.index, epoch)
    return ExchangeState.create(store, keypair=pair,
                                seeds=draw_seeds(sorted(joiners.values()), rng), **where)


def _ignore(kind: str, sender: str, payload: object) -> None:
    """A finished exchange keeps nothing more (its state went with NewEdges.done)."""


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


Keep = Callable[[str, str, object], None]  # (kind, sender, payload): on disk before the ack


class NewEdges:
    """The new edges' phase I at this end: the other ends' messages, taken under their own
    ledger (a copy acknowledged, a different one refused), each on disk before its
    acknowledgement (`keep`), and the exchange that awaits them (`exchange`,
    `exchange_shares`)."""

    def __init__(self, *, peers: Peers, mailbox: Mailbox, store: StateStore,
                 noise_seed: int | None, allow_insecure_keys: bool) -> None:
        self.peers = peers
        self.mailbox = mailbox
        self.store = store  # the exchange while it runs (agent/departure/exchange_file.py)
        self.noise_seed = noise_seed
        self.allow_insecure_keys = allow_insecure_keys
        self.ledger = PhaseOneLedger()
        self._shares: ShareCheck | None = None
        self._keep: dict[str, Keep] = {}  # per new neighbour, once its exchange is saved here

    # ------------------------------------------------------------------ the router's side

    def expect(self, names: list[str], *, keep: Keep, shares: ShareCheck) -> None:
        """From now on these new neighbours' messages are taken (and kept); their shares must
        be under this end's new key."""
        for name in names:
            self._keep[name] = keep
        self._shares = shares

    def expected_shares(self) -> ShareCheck:
        if self._shares is None:  # set with the keep functions: this end is not saved yet
            raise NotReady("its new edge's key is not ready")
        return self._shares

    def _keeper(self, sender: str) -> Keep:
        keep = self._keep.get(sender)
        if keep is None:  # this end's exchange is not saved yet: the sender retries
            raise NotReady("its new edge's key is not ready")
        return keep

    async def take_key(self, sender: str, round_: int, key: paillier.PublicKey,
                       digest: bytes) -> Judgement:
        keep = self._keeper(sender)
        judgement = self.ledger.judge("key", sender, digest)
        if judgement.verdict == Verdict.ACCEPT:
            await asyncio.to_thread(keep, "key", sender, key)
            self.mailbox.put("key", round_, sender, key)
        return judgement

    async def take_shares(self, sender: str, round_: int, ciphertexts: list[int],
                          digest: bytes) -> Judgement:
        keep = self._keeper(sender)
        judgement = self.ledger.judge("shares", sender, digest)
        if judgement.verdict == Verdict.ACCEPT:
            await asyncio.to_thread(keep, "shares", sender, ciphertexts)
            self.mailbox.put("shares", round_, sender, ciphertexts)
        return judgement

    # ------------------------------------------------------------------ the exchange

    def done(self) -> None:
        """The new edges' seeds are saved with the departures: their exchange's state goes
        (a copy of a message of it is still acknowledged: the ledger's duplicate rule)."""
        for name in self._keep:
            self._keep[name] = _ignore
        self.store.discard(EXCHANGE)

    async def exchange(self, session: Session, joiners: Mapping[str, int], *,
                       rebase_round: int, epoch: int, keys_first: float | None = None,
                       ) -> dict[int, tuple[bytes, bytes]]:
        seeds = await self._exchange(session, joiners, rebase_round=rebase_round, epoch=epoch,
                                     fixed=False, keys_first=keys_first)
        assert isinstance(seeds, dict)
        return seeds

    async def exchange_shares(self, session: Session, joiners: Mapping[str, int], *,
                              rebase_round: int, epoch: int,
                              keys_first: float | None = None) -> Masker:
        """The paper's phase I on the new edges: the finished Masker holding their terms."""
        masker = await self._exchange(session, joiners, rebase_round=rebase_round, epoch=epoch,
                                      fixed=True, keys_first=keys_first)
        assert isinstance(masker, Masker)
        return masker

    async def newcomer_mask(self, session: Session, partners: Mapping[str, int], *,
                            rebase_round: int, number: int) -> EdgeSeeds | MaskCoefficients:
        """A party that joins (efpsn/departure/joins.py): the seeds of its new edges, its whole
        phase I (with the paper's fixed mask, the mask their shares make), exchanged for its
        join's `number`; the exchange's state goes once done."""
        epoch = seed_epoch(number)
        # the members hear of the join at their next check round, at most that many rounds on
        wait = session.config.round_timeout_seconds * JOIN_CHECK_EVERY
        if session.config.refresh.refreshed:
            pairs = await self.exchange(session, partners, rebase_round=rebase_round,
                                        epoch=epoch, keys_first=wait)
            result: EdgeSeeds | MaskCoefficients = add_seeds(
                EdgeSeeds(agent=session.index, sent=(), received=()), pairs)
        else:
            terms = EdgeTerms(None)
            terms.add(await self.exchange_shares(session, partners, rebase_round=rebase_round,
                                                 epoch=epoch, keys_first=wait))
            zero = MaskCoefficients((0,) * session.problem.N,
                                    session.problem.noise_spec.precision)
            result = terms.joined(FixedMask(zero), partners.values()).mask
        self.done()
        return result

    async def _exchange(self, session: Session, joiners: Mapping[str, int], *,
                        rebase_round: int, epoch: int, fixed: bool,
                        keys_first: float | None = None,
                        ) -> dict[int, tuple[bytes, bytes]] | Masker:
        start = time.perf_counter()
        seeds = await exchange_new_seeds(
            session=session, peers=self.peers, mailbox=self.mailbox, edges=self,
            joiners=joiners, rebase_round=rebase_round, epoch=epoch, noise_seed=self.noise_seed,
            allow_insecure_keys=self.allow_insecure_keys,
            timeout=session.config.round_timeout_seconds, store=self.store, fixed=fixed,
            keys_first=keys_first)
        log.warning("%s: phase I on the new edge(s) with %s done in %.2f s (seeds under "
                    "Paillier); they mix from round %d", session.assignment.name,
                    ", ".join(sorted(joiners)), time.perf_counter() - start, rebase_round)
        return seeds
