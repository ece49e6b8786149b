"""Phase I at one agent: keys to the neighbours, encrypted shares both ways, the exact mask (or,
with refreshed masks, one encrypted seed each way: the edge seeds every period's noise comes from).

The math is efpsn/masks/zero_sum.py's Masker (efpsn/masks/seeds.py's SeedExchange); this module only moves
their keys and ciphertexts through the client side (agent/peers.py) and times each step."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from agent.life import Life
from agent.peers import Peers
from agent.phase_one_leave import PhaseOneDepartures
from agent.session import Session
from efpsn.crypto import paillier
from efpsn.masks.seeds import EdgeSeeds, SeedExchange
from efpsn.masks.zero_sum import MaskCoefficients, Masker, independent_mask
from efpsn.params.config import RunConfig

__all__ = ["run_phase_one", "shares_packed"]


def shares_packed(config: RunConfig) -> bool:
    """The `packed` flag of this run's shares: a seed (refreshed masks) is one plaintext
    carrying many values, so it travels as a packed batch of one ciphertext."""
    return config.packed or config.refresh.refreshed


async def run_phase_one(*, session: Session, peers: Peers, life: Life,
                        rng: np.random.Generator, timings: dict[str, float],
                        keypair: Awaitable[tuple[Any, float]] | None,
                        on_masker: Callable[[Masker | SeedExchange], None],
                        allow_insecure_keys: bool = False,
                        seed_rng: np.random.Generator | None = None,
                        leave: PhaseOneDepartures | None = None,
                        ) -> MaskCoefficients | EdgeSeeds:
    """This agent's mask, or with refreshed masks its edge seeds. `keypair` (generated since
    the run parameters arrived, with its generation time) is awaited when the zero-sum protocol
    needs it; `on_masker` is told the Masker (SeedExchange) as soon as it exists, so incoming
    shares can be checked against its key. seed_rng: the test hook's seeds (None: secrets).
    `leave`: a neighbour silent past the departure deadline is reported and, when the
    coordinator declares it gone, phase I finishes without it (agent/phase_one_leave.py);
    None: the silence stops this agent after the round timeout."""
    cfg, problem = session.config, session.problem
    spec = problem.noise_spec
    if cfg.mask == "none":
        return MaskCoefficients((0,) * spec.num_coefficients, spec.precision)
    if cfg.mask == "independent":
        return independent_mask(rng, degree=len(session.addresses), spec=spec)
    timeout = cfg.round_timeout_seconds
    life.keys()
    t0 = time.perf_counter()
    pair = None
    if keypair is not None:
        pair, timings["keygen_seconds"] = await keypair
    # Masker and SeedExchange check a given key pair (size, policy, matching halves).
    masker: Masker | SeedExchange
    if cfg.refresh.refreshed:
        if pair is None:
            pair = await asyncio.to_thread(paillier.generate_keypair, cfg.key_bits,
                                           allow_insecure=allow_insecure_keys)
        masker = SeedExchange(agent=session.index, neighbours=sorted(session.names),
                              keypair=pair, rng=seed_rng, allow_insecure=allow_insecure_keys)
    else:
        masker = await asyncio.to_thread(
            Masker, agent=session.index, neighbours=sorted(session.names), spec=spec, rng=rng,
            layout=problem.layout, key_bits=cfg.key_bits, keypair=pair,
            allow_insecure=allow_insecure_keys)
    on_masker(masker)
    timings["key_wait_seconds"] = time.perf_counter() - t0  # phase I's share of it
    timings.setdefault("keygen_seconds", timings["key_wait_seconds"])
    via = None if leave is None else leave.send_all

    async def collect(kind: str) -> dict[int, Any]:
        if leave is None:
            return await peers.collect(kind, 0, timeout=timeout)
        return await leave.collect(kind)

    if leave is not None:
        leave.masker = masker  # a departure drops the neighbour from it
    await peers.send_public_key(masker.public_key, timeout=timeout, via=via)
    keys = await collect("key")
    life.shares()
    t0 = time.perf_counter()
    outgoing = await asyncio.to_thread(masker.outgoing, keys)
    timings["encrypt_seconds"] = time.perf_counter() - t0
    await peers.send_shares({name: (keys[j], outgoing[j]) for j, name in session.names.items()},
                            num_coefficients=problem.N, packed=shares_packed(cfg),
                            timeout=timeout, via=via)
    incoming = await collect("shares")
    t0 = time.perf_counter()
    mask = await asyncio.to_thread(masker.finish, incoming)
    timings["decrypt_seconds"] = time.perf_counter() - t0
    timings["encryptions"] = masker.encryptions
    timings["decryptions"] = masker.decryptions
    return mask
