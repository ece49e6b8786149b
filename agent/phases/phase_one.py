"""Phase I at one agent: keys to the neighbours, encrypted shares both ways, the exact mask (or,
with refreshed masks, one encrypted seed each way: the edge seeds every period's noise comes from).

PhaseOne owns the phase: its key pair (made as soon as the run parameters are known), what the
neighbours send (judged by its ledger, efpsn/ledger.py's PhaseOneLedger, and filed in the
mailbox: the router hands it the decoded messages), its run, and its result on disk (the mask
or the seeds, through the state store). The math is efpsn/masks/zero_sum.py's Masker
(efpsn/masks/seeds.py's SeedExchange); this module moves their keys and ciphertexts through the
client side (agent/peers.py) and times each step. A neighbour silent past the departure
deadline is the membership's to handle (agent/membership.py: `link`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agent.life import Stage
from agent.mailbox import Mailbox
from agent.membership import PhaseOneMembership
from agent.options import AgentFailure, NotReady
from agent.peers import Peers
from agent.phases.shares import ShareCheck, shares_packed
from agent.session import Session
from agent.state import StateError, StateStore
from efpsn.crypto import paillier
from efpsn.departure.remask import drop_seeds
from efpsn.ledger import Judgement, PhaseOneLedger, Verdict
from efpsn.masks.seeds import EdgeSeeds, SeedExchange
from efpsn.masks.zero_sum import MaskCoefficients, Masker, independent_mask
from efpsn.params.config import RunConfig

__all__ = ["PhaseOne", "PhaseOneResult"]

PhaseOneResult = MaskCoefficients | EdgeSeeds
Received = dict[str, dict[str, bytes]]  # kind -> sender -> digest of what it sent


class PhaseOne:
    """Phase I at one agent (see the module's docstring)."""

    def __init__(self, *, name: str, peers: Peers, mailbox: Mailbox, store: StateStore,
                 allow_insecure_keys: bool = False) -> None:
        self.name = name
        self.peers = peers
        self.mailbox = mailbox
        self.store = store
        self.allow_insecure_keys = allow_insecure_keys
        self.ledger = PhaseOneLedger()
        self._shares: ShareCheck | None = None
        self._keypair: asyncio.Future[tuple[Any, float]] | None = None
        # the fixed mask's Masker: its per-edge terms outlive phase I (departures)
        self.masker: Masker | None = None

    # ------------------------------------------------------------------ the key pair

    def make_keys(self, config: RunConfig) -> None:
        """Start making this agent's Paillier key pair (zero-sum masks only); the run awaits
        it. The key depends on nothing but the run's key size: making it while this agent
        loads its data and waits for the others takes it off the run's critical path."""
        if config.mask != "zero-sum" or self._keypair is not None:
            return

        def generate() -> tuple[Any, float]:
            start = time.perf_counter()
            keypair = paillier.generate_keypair(config.key_bits,
                                                allow_insecure=self.allow_insecure_keys)
            return keypair, time.perf_counter() - start

        self._keypair = asyncio.ensure_future(asyncio.to_thread(generate))

    def abandon_keys(self) -> None:
        """The agent ends: a key pair still being made is dropped (its outcome retrieved)."""
        if self._keypair is not None and not self._keypair.cancel():
            self._keypair.exception()

    # ------------------------------------------------------------------ what comes in

    @property
    def closed(self) -> bool:
        return self.ledger.closed

    def take_key(self, sender: str, n: int, digest: bytes) -> Judgement:
        """A neighbour's public key (its modulus `n`): judged and filed; after phase I, a
        retry is acknowledged when identical to what was received, refused otherwise."""
        if self.ledger.closed:
            return self.ledger.judge("key", sender, digest)
        key = paillier.public_key_from_n(n)
        paillier.check_key_size(key, allow_insecure=self.allow_insecure_keys)
        judgement = self.ledger.judge("key", sender, digest)
        if judgement.verdict == Verdict.ACCEPT:
            self.mailbox.put("key", 0, sender, key)
        return judgement

    def expect(self, shares: ShareCheck | None) -> None:
        """What a neighbour's shares must be from now on (None: not known yet)."""
        self._shares = shares

    def expected_shares(self) -> ShareCheck:
        """What a neighbour's shares must be (NotReady until this agent's key exists)."""
        if self._shares is None:
            raise NotReady("phase I key not ready yet")
        return self._shares

    def take_shares(self, sender: str, ciphertexts: list[int], digest: bytes) -> Judgement:
        """A neighbour's ciphertexts (checked against expected_shares() at the edge)."""
        judgement = self.ledger.judge("shares", sender, digest)
        if judgement.verdict == Verdict.ACCEPT:
            self.mailbox.put("shares", 0, sender, ciphertexts)
        return judgement

    def late(self, kind: str, sender: str, digest: bytes) -> Judgement:
        """A retry after phase I ended here (its acknowledgement may have been lost in a
        crash): a copy of what was received, or refused."""
        return self.ledger.judge(kind, sender, digest)

    # ------------------------------------------------------------------ the run

    async def run(self, session: Session, *, link: PhaseOneMembership,
                  entered: Callable[[Stage], None], rng: np.random.Generator,
                  timings: dict[str, float],
                  seed_rng: np.random.Generator | None = None) -> PhaseOneResult:
        """This agent's mask, or with refreshed masks its edge seeds; `entered(Stage.KEYS)`,
        `entered(Stage.SHARES)` as it gets there. seed_rng: the test hook's seeds (None:
        secrets). `link` sends and collects, and decides what a silent neighbour means. Once it
        returns, phase I is over here: a neighbour's retry is acknowledged when identical to
        what was received, refused otherwise."""
        try:
            return await self._run(session, link=link, entered=entered, rng=rng,
                                   timings=timings, seed_rng=seed_rng)
        finally:
            self.ledger.close()

    async def _run(self, session: Session, *, link: PhaseOneMembership,
                   entered: Callable[[Stage], None], rng: np.random.Generator,
                   timings: dict[str, float],
                   seed_rng: np.random.Generator | None) -> PhaseOneResult:
        cfg, problem = session.config, session.problem
        spec = problem.noise_spec
        if cfg.mask == "none":
            return MaskCoefficients((0,) * spec.num_coefficients, spec.precision)
        if cfg.mask == "independent":
            return independent_mask(rng, degree=len(session.addresses), spec=spec)
        entered(Stage.KEYS)
        t0 = time.perf_counter()
        pair = None
        if self._keypair is not None:
            pair, timings["keygen_seconds"] = await self._keypair
        # Masker and SeedExchange check a given key pair (size, policy, matching halves).
        masker: Masker | SeedExchange
        if cfg.refresh.refreshed:
            if pair is None:
                pair = await asyncio.to_thread(paillier.generate_keypair, cfg.key_bits,
                                               allow_insecure=self.allow_insecure_keys)
            masker = SeedExchange(agent=session.index, neighbours=sorted(session.names),
                                  keypair=pair, rng=seed_rng,
                                  allow_insecure=self.allow_insecure_keys)
        else:
            masker = await asyncio.to_thread(
                Masker, agent=session.index, neighbours=sorted(session.names), spec=spec,
                rng=rng, layout=problem.layout, key_bits=cfg.key_bits, keypair=pair,
                allow_insecure=self.allow_insecure_keys)
        self.masker = masker if isinstance(masker, Masker) else None
        self.expect(ShareCheck(public_key=masker.public_key,
                               count=masker.ciphertexts_per_neighbour, packed=shares_packed(cfg)))
        timings["key_wait_seconds"] = time.perf_counter() - t0  # phase I's share of it
        timings.setdefault("keygen_seconds", timings["key_wait_seconds"])
        link.masker = masker  # a departure drops the neighbour from it
        await self.peers.send_public_key(masker.public_key, timeout=link.deadline,
                                         via=link.send_all)
        keys = await link.collect("key")
        entered(Stage.SHARES)
        t0 = time.perf_counter()
        outgoing = await asyncio.to_thread(masker.outgoing, keys)
        timings["encrypt_seconds"] = time.perf_counter() - t0
        await self.peers.send_shares(
            {name: (keys[j], outgoing[j]) for j, name in session.names.items()},
            num_coefficients=problem.N, packed=shares_packed(cfg), timeout=link.deadline,
            via=link.send_all)
        incoming = await link.collect("shares")
        t0 = time.perf_counter()
        mask = await asyncio.to_thread(masker.finish, incoming)
        timings["decrypt_seconds"] = time.perf_counter() - t0
        timings["encryptions"] = masker.encryptions
        timings["decryptions"] = masker.decryptions
        return mask

    # ------------------------------------------------------------------ its result on disk

    def save(self, result: PhaseOneResult, *, run_id: str, timings: dict[str, float]) -> None:
        """Phase I's result, saved with its statistics and the digests of what it received (a
        restart tells a retry from a different message by them)."""
        received = self.ledger.received()
        if isinstance(result, EdgeSeeds):
            self.store.save_seeds(result.to_json(), run_id=run_id, stats=dict(timings),
                                  received=received)
        else:
            self.store.save_mask(result, run_id=run_id, stats=dict(timings), received=received)

    def reload(self, session: Session, *, left: Callable[[Session], set[int]]
               ) -> tuple[PhaseOneResult, dict[str, float]]:
        """A restart: the saved result (a resumed agent never redraws its mask or its seeds)
        and phase I's statistics; what it received is judged as before (copies acknowledged).
        `left(session)`: the neighbours that left in phase I itself, whose seeds the saved
        ones lack (the membership's answer: agent/membership.py)."""
        result, stats, received = self._load(session, left=left)
        self.ledger.restore(received)
        return result, stats

    def _load(self, session: Session, *, left: Callable[[Session], set[int]]
              ) -> tuple[PhaseOneResult, dict[str, float], Received]:
        store, name = self.store, self.name
        coefficients = session.problem.N
        try:
            if session.config.refresh.refreshed:
                saved_seeds = store.load_seeds(run_id=session.run_id)
                if saved_seeds is None:
                    raise StateError(f"no edge seeds in {store.seeds_path}")
                text, stats, received = saved_seeds
                seeds = EdgeSeeds.from_json(text, agent=session.index)
                gone = left(session)
                if seeds.neighbours not in (tuple(sorted(session.names)),
                                            tuple(sorted(set(session.names) - gone))):
                    raise ValueError(f"edge seeds are for neighbours {list(seeds.neighbours)}, "
                                     f"expected {sorted(session.names)}")
                # one that left during the secure sum after phase I: phase II ran without its
                # seed
                return drop_seeds(seeds, gone), stats, received
            saved = store.load_mask(run_id=session.run_id)
        except (StateError, ValueError) as exc:
            raise AgentFailure(f"{name} cannot resume: {exc}") from None
        if saved is None or saved.mask.num_coefficients != coefficients:
            raise AgentFailure(f"{name} cannot resume: no usable mask for {coefficients} "
                               f"coefficients in {store.mask_path}")
        return saved.mask, saved.stats, saved.received
