"""Secure neighbourhood aggregation: per-receiver message masks that cancel at the receiver.

The algorithms use their neighbours' messages only through sums sum_i w_ji m_i
(efpsn.algorithms.base.mix), so receiver j needs the aggregate of its neighbours' messages,
never one of them. Sender i sends j the integer vector

    E_ij(t) = q_ij(t) + r_ij(t)  mod 2^64,   q_ij = rint(w_ij m_i 2^F)  (int64, |q| < 2^62 / deg),

with a mask r_ij(t) = sum over the other neighbours k of j of s_ik PRF(seed_ik^(j), t), where
s_ik = +1 if i < k else -1. Each unordered pair {i, k} of j's neighbours contributes +PRF once
and -PRF once, so sum_{i in N(j)} r_ij(t) = 0 mod 2^64 exactly, every round: j adds its
neighbours' vectors mod 2^64, reads the sum as int64 and gets sum_i q_ij exactly, then multiplies
by 2^-F (`decode`). A receiver of degree 1 gets its one neighbour's message unmasked (the sum
over no other neighbour is 0): that neighbour is not protected from it.

Seeds: every agent holds an X25519 key pair; i and k (both neighbours of j, hence at most two
hops apart) agree on the shared secret X25519(sk_i, pk_k) = X25519(sk_k, pk_i) without a message
of their own (the public keys come with the topology), and seed_ik^(j) = HKDF-SHA256(secret,
info = DOMAIN || run id || j): one 256-bit ChaCha20 key per pair and receiver. PRF(seed, t) is
the ChaCha20 keystream under the nonce counter 0 || b"efag" || t (8 bytes, little endian), read
as little-endian uint64 words (the construction of efpsn/masks/keystream.py, another domain tag).

Quantisation keeps the algorithms' mass: the sender keeps, of its own message, exactly what it
did not send, m_i - sum_j q_ji 2^-F (`kept`), instead of w_ii m_i. Summed over the agents every
message then mixes to exactly its total (in exact arithmetic, as with a doubly stochastic W),
so gradient tracking's invariant sum_i y_i = sum_i g_i survives the rounding to 2^-F: the only
change to the iterates is a zero-sum rounding of at most 2^-(F+1) per coordinate and neighbour.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "DOMAIN",
    "FRACTION_BITS",
    "KEY_BYTES",
    "PairSeed",
    "agree_seeds",
    "check_symmetric",
    "decode",
    "dequantise",
    "encode",
    "generate_private_key",
    "mask_stream",
    "public_key_bytes",
    "quantise",
    "sum_words",
    "unprotected",
]

DOMAIN = b"efpsn/aggregate/v1"
FRACTION_BITS = 36
"""F: messages travel as multiples of 2^-36 (about 1.5e-11); |w m| must stay below
2^62 / (2^F deg) (2^25 / deg, about 3.4e7 / deg), which `quantise` checks."""
KEY_BYTES = 32
_NONCE_TAG = b"efag"
_WORD = np.dtype("<u8")


def _check_bits(bits: int) -> int:
    if not isinstance(bits, int) or isinstance(bits, bool) or not 0 <= bits <= 52:
        raise ValueError(f"fraction bits must be an int in [0, 52], got {bits!r}")
    return bits


def quantise(values: np.ndarray, weight: float, *, bits: int = FRACTION_BITS,
             fan_in: int = 1) -> np.ndarray:
    """rint((weight * values) * 2^bits) as int64 (each float operation exact up to the one
    rounding of weight * values; rint rounds half to even). ValueError (naming the bound) when
    a value is not finite or `fan_in` of them could overflow int64 when summed."""
    _check_bits(bits)
    scaled = (np.asarray(values, dtype=np.float64) * float(weight)) * float(2.0 ** bits)
    limit = float(2 ** 62) / max(1, fan_in)
    peak = float(np.max(np.abs(scaled), initial=0.0))
    if not math.isfinite(peak) or peak >= limit:
        raise ValueError(f"a message value times its weight ({peak / 2.0 ** bits:.3g}) does not "
                         f"fit the fixed point 2^-{bits} for {fan_in} neighbours: "
                         f"|w m| must stay below {limit / 2.0 ** bits:.3g}")
    return np.rint(scaled).astype(np.int64)


def dequantise(q: np.ndarray, *, bits: int = FRACTION_BITS) -> np.ndarray:
    """int64 -> float64 times 2^-bits."""
    return np.asarray(q, dtype=np.int64).astype(np.float64) * float(2.0 ** -_check_bits(bits))


@dataclass(frozen=True)
class PairSeed:
    """The seed sender `agent` shares with `other` for receiver `receiver`; `sign` +1 when
    agent < other (its stream is added), -1 otherwise (subtracted)."""

    receiver: int
    other: int
    sign: int
    seed: bytes

    def __post_init__(self) -> None:
        if self.sign not in (1, -1) or len(self.seed) != KEY_BYTES:
            raise ValueError(f"need sign +-1 and a {KEY_BYTES}-byte seed")


def generate_private_key() -> X25519PrivateKey:
    """A fresh X25519 key (the agent's own randomness, never the run's public seed)."""
    return X25519PrivateKey.generate()


def public_key_bytes(key: X25519PrivateKey) -> bytes:
    """The 32 raw bytes of the key's public half (what the coordinator distributes)."""
    return key.public_key().public_bytes(serialization.Encoding.Raw,
                                         serialization.PublicFormat.Raw)


def _seed(secret: bytes, run_id: bytes, receiver: int) -> bytes:
    info = DOMAIN + b"|" + run_id + b"|" + receiver.to_bytes(8, "little")
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def agree_seeds(agent: int, key: X25519PrivateKey, public_keys: Mapping[int, bytes],
                neighbours: Mapping[int, Sequence[int]], *, run_id: bytes
                ) -> dict[int, tuple[PairSeed, ...]]:
    """For each neighbour j of `agent`: the seeds it shares with j's other neighbours, by
    receiver j (an empty tuple when j has no other neighbour). `neighbours[v]` lists v's
    neighbours (the public topology); `public_keys[k]` is k's raw X25519 public key."""
    if agent not in neighbours:
        raise ValueError(f"agent {agent} is not in the topology")
    secrets: dict[int, bytes] = {}
    out: dict[int, tuple[PairSeed, ...]] = {}
    for j in sorted(neighbours[agent]):
        if agent not in neighbours[j]:
            raise ValueError(f"the topology is not symmetric: {agent} -> {j} but not back")
        seeds = []
        for k in sorted(set(neighbours[j]) - {agent}):
            if k not in secrets:
                if k not in public_keys:
                    raise ValueError(f"no public key of agent {k} (a neighbour of {j})")
                peer = X25519PublicKey.from_public_bytes(bytes(public_keys[k]))
                secrets[k] = key.exchange(peer)
            seeds.append(PairSeed(receiver=j, other=k, sign=1 if agent < k else -1,
                                  seed=_seed(secrets[k], run_id, j)))
        out[j] = tuple(seeds)
    return out


def mask_stream(seed: bytes, t: int, words: int) -> np.ndarray:
    """PRF(seed, t): `words` little-endian uint64 words of the ChaCha20 keystream."""
    if len(seed) != KEY_BYTES:
        raise ValueError(f"a seed has {KEY_BYTES} bytes, got {len(seed)}")
    if not 0 <= t < 2**64 or words < 0:
        raise ValueError(f"need 0 <= t < 2^64 and words >= 0, got {t}, {words}")
    nonce = (0).to_bytes(4, "little") + _NONCE_TAG + t.to_bytes(8, "little")
    encryptor = Cipher(algorithms.ChaCha20(seed, nonce), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * words)), dtype=_WORD).copy()


def _mask(seeds: Sequence[PairSeed], t: int, words: int) -> np.ndarray:
    """r_ij(t): the signed sum of the pair streams, mod 2^64."""
    total = np.zeros(words, dtype=np.uint64)
    for s in seeds:
        stream = mask_stream(s.seed, t, words)
        total = total + stream if s.sign > 0 else total - stream  # uint64 wraps mod 2^64
    return total


def encode(q: np.ndarray, seeds: Sequence[PairSeed], t: int) -> np.ndarray:
    """E = q + r(t) mod 2^64 (uint64), q the int64 fixed-point message for one receiver."""
    q = np.ascontiguousarray(q, dtype=np.int64)
    return q.view(np.uint64) + _mask(seeds, t, q.size).reshape(q.shape)


def sum_words(received: Sequence[np.ndarray]) -> np.ndarray:
    """The receiver's sum of its neighbours' vectors, mod 2^64, read as int64."""
    if not received:
        raise ValueError("nothing received to sum")
    total = np.zeros_like(np.asarray(received[0], dtype=np.uint64))
    for words in received:
        if words.shape != total.shape:
            raise ValueError(f"the neighbours' vectors differ in shape: {words.shape} vs "
                             f"{total.shape}")
        total = total + np.asarray(words, dtype=np.uint64)
    return total.view(np.int64)


def decode(received: Sequence[np.ndarray], *, bits: int = FRACTION_BITS) -> np.ndarray:
    """sum_i w_ji m_i as float64, from the neighbours' masked vectors."""
    return dequantise(sum_words(received), bits=bits)


def check_symmetric(weights: np.ndarray) -> None:
    """Sender i encodes with w_ij and receiver j mixes with w_ji: they must be equal."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or not np.array_equal(w, w.T):
        raise ValueError("secure aggregation needs a symmetric mixing matrix (w_ij == w_ji)")


def unprotected(neighbours: Mapping[int, Sequence[int]]) -> list[tuple[int, int]]:
    """(sender, receiver) pairs whose messages travel unmasked: the receiver has one
    neighbour, so its aggregate is that neighbour's message."""
    return sorted((i, j) for j, nb in neighbours.items() if len(nb) == 1 for i in nb)
