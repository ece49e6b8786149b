"""Phase I at one agent: keys to the neighbours, encrypted shares both ways, the exact mask.

The math is efpsn/masking.py's Masker; this module only moves its keys and ciphertexts through
the client side (agent/peers.py) and times each step."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from agent.peers import Peers
from agent.session import Session
from agent.status import Status
from efpsn.masking import MaskCoefficients, Masker, independent_mask
from efpsn.wire.records import Phase

__all__ = ["run_phase_one"]


async def run_phase_one(*, session: Session, peers: Peers, status: Status,
                        rng: np.random.Generator, timings: dict[str, float],
                        keypair: Awaitable[tuple[Any, float]] | None,
                        on_masker: Callable[[Masker], None],
                        allow_insecure_keys: bool = False) -> MaskCoefficients:
    """This agent's mask. `keypair` (generated since the run parameters arrived, with its
    generation time) is awaited when the zero-sum protocol needs it; `on_masker` is told the
    Masker as soon as it exists, so incoming shares can be checked against its key."""
    cfg, problem = session.config, session.problem
    spec = problem.noise_spec
    if cfg.mask == "none":
        return MaskCoefficients((0,) * spec.num_coefficients, spec.precision)
    if cfg.mask == "independent":
        return independent_mask(rng, degree=len(session.addresses), spec=spec)
    timeout = cfg.round_timeout_seconds
    status.phase = Phase.KEYS
    t0 = time.perf_counter()
    pair = None
    if keypair is not None:
        pair, timings["keygen_seconds"] = await keypair
    # Masker checks a given key pair (size, policy, matching halves).
    masker = await asyncio.to_thread(
        Masker, agent=session.index, neighbours=sorted(session.names), spec=spec, rng=rng,
        layout=problem.layout, key_bits=cfg.key_bits, keypair=pair,
        allow_insecure=allow_insecure_keys)
    on_masker(masker)
    timings["key_wait_seconds"] = time.perf_counter() - t0  # phase I's share of it
    timings.setdefault("keygen_seconds", timings["key_wait_seconds"])
    await peers.send_public_key(masker.public_key, timeout=timeout)
    keys = await peers.collect("key", 0, timeout=timeout)
    status.phase = Phase.SHARES
    t0 = time.perf_counter()
    outgoing = await asyncio.to_thread(masker.outgoing, keys)
    timings["encrypt_seconds"] = time.perf_counter() - t0
    await peers.send_shares({name: (keys[j], outgoing[j]) for j, name in session.names.items()},
                            num_coefficients=problem.N, packed=cfg.packed, timeout=timeout)
    incoming = await peers.collect("shares", 0, timeout=timeout)
    t0 = time.perf_counter()
    mask = await asyncio.to_thread(masker.finish, incoming)
    timings["decrypt_seconds"] = time.perf_counter() - t0
    timings["encryptions"] = masker.encryptions
    timings["decryptions"] = masker.decryptions
    return mask
