"""Phase I at one agent: keys to the neighbours, encrypted shares both ways, the exact mask."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from efpsn import paillier
from efpsn.masking import MaskCoefficients, Masker, independent_mask, noise_generator
from efpsn.wire import serde
from efpsn.wire.serde import Phase

if TYPE_CHECKING:
    from agent.node import AgentNode


async def run_phase_one(node: AgentNode) -> MaskCoefficients:
    """This agent's mask. For zero-sum masks the Masker (efpsn.masking) does the math; this
    function only moves its keys and ciphertexts, and times each step into node.timings."""
    s = node.session
    assert s is not None
    cfg, problem, peers = s.config, s.problem, node.peers
    rng = noise_generator(node.options.insecure_noise_seed, s.index)
    spec = problem.noise_spec
    degree = len(s.addresses)
    if cfg.mask == "none":
        return MaskCoefficients((0,) * spec.num_coefficients, spec.precision)
    if cfg.mask == "independent":
        return independent_mask(rng, degree=degree, spec=spec)
    timeout = cfg.round_timeout_seconds
    node.status.phase = Phase.KEYS
    t0 = time.perf_counter()
    keypair = None
    if node.keypair is not None:  # generated since the run parameters arrived (agent/node.py)
        keypair, node.timings["keygen_seconds"] = await node.keypair
    # The servicer validates incoming shares against this masker's key, so it is set on the
    # node as soon as it exists. Masker checks a given key pair (size, policy, matching halves).
    node.masker = masker = await asyncio.to_thread(
        Masker, agent=s.index, neighbours=sorted(s.names), spec=spec, rng=rng,
        layout=problem.layout, key_bits=cfg.key_bits, keypair=keypair,
        allow_insecure=node.options.allow_insecure_keys,
    )
    node.timings["key_wait_seconds"] = time.perf_counter() - t0  # phase I's share of it
    node.timings.setdefault("keygen_seconds", node.timings["key_wait_seconds"])
    own_key = masker.public_key
    await peers.send_all(
        "PutPublicKey",
        lambda name: serde.public_key_message(header=peers.header(Phase.KEYS, 0), n=own_key.n),
        timeout=timeout,
    )
    keys = await peers.collect("key", 0, timeout=timeout)
    node.status.phase = Phase.SHARES
    t0 = time.perf_counter()
    outgoing = await asyncio.to_thread(masker.outgoing, keys)
    node.timings["encrypt_seconds"] = time.perf_counter() - t0
    index = {name: i for i, name in s.names.items()}
    await peers.send_all(
        "PutShares",
        lambda name: serde.shares_message(
            header=peers.header(Phase.SHARES, 0),
            fingerprint=paillier.fingerprint(keys[index[name]]),
            ciphertexts=outgoing[index[name]], num_coefficients=cfg.N, packed=cfg.packed,
        ),
        timeout=timeout,
    )
    incoming = await peers.collect("shares", 0, timeout=timeout)
    t0 = time.perf_counter()
    mask = await asyncio.to_thread(masker.finish, incoming)
    node.timings["decrypt_seconds"] = time.perf_counter() - t0
    node.timings["encryptions"] = masker.encryptions
    node.timings["decryptions"] = masker.decryptions
    return mask
