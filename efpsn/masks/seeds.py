"""Phase I with seeds: one Paillier-encrypted 256-bit seed per neighbour, as a sans-I/O machine.

Agent i draws a fresh secret seed s_ij for every neighbour j, encrypts it under j's Paillier key
(one ciphertext per neighbour, whatever N is) and decrypts the seeds s_ji its neighbours sent.
Both ends of edge (i, j) then hold s_ij and s_ji, and expand them every period into the same
noise integers (efpsn/masks/keystream.py); agent i's numerators sum_j (z(s_ij) - z(s_ji)) cancel
over the network exactly (efpsn/masks/refresh.py turns them into masks per round).

Production draws seeds with the `secrets` module; a noise seed (simulations and tests only,
never private) draws them from efpsn.masks.zero_sum.noise_generator(noise_seed, agent) instead, 32
bytes per neighbour in ascending order, so a networked run can be compared with the simulator.
"""

from __future__ import annotations

import json
import numbers
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from efpsn.crypto import paillier
from efpsn.masks.keystream import SEED_BYTES, period_noises
from efpsn.masks.network import checked_neighbours
from efpsn.masks.zero_sum import (
    GraphLike,
    MaskingStateError,
    NoiseSpec,
    noise_generator,
    sorted_neighbours,
)

__all__ = [
    "SEEDS_FORMAT",
    "EdgeSeeds",
    "SeedExchange",
    "draw_seeds",
    "exchange_seeds",
    "exchange_seeds_fast",
]

SEEDS_FORMAT = "efpsn-edge-seeds/1"
"""The `format` field of the JSON document EdgeSeeds.to_json writes."""
MIN_SEED_KEY_BITS = 8 * SEED_BYTES + 2  # a seed is a plaintext: 0 <= s < 2^256 < n


def draw_seeds(
    neighbours: Sequence[int], rng: np.random.Generator | None = None
) -> dict[int, bytes]:
    """A fresh 32-byte seed per neighbour, neighbours ascending.

    rng None (production): secrets.token_bytes. An rng (test hook): rng.bytes(32) per neighbour
    in ascending order, reproducible and NOT secret.
    """
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator or None, got {type(rng).__name__}")
    draw = secrets.token_bytes if rng is None else rng.bytes
    return {j: bytes(draw(SEED_BYTES)) for j in sorted_neighbours(neighbours)}


def _check_seed_map(name: str, seeds: Mapping[int, bytes]) -> tuple[tuple[int, bytes], ...]:
    out = []
    for j in sorted_neighbours(list(seeds)):
        seed = seeds[j]
        if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
            what = f"{len(seed)} bytes" if isinstance(seed, bytes) else type(seed).__name__
            raise ValueError(f"{name}[{j}] must be {SEED_BYTES} bytes, got {what}")
        out.append((j, seed))
    return tuple(out)


@dataclass(frozen=True)
class EdgeSeeds:
    """Agent `agent`'s result of phase I with seeds: per neighbour j, s_ij (sent) and s_ji.

    Secret: it stays with the agent (crash-safe state 0600, deleted at the end), never in a log.
    `sent` and `received` are (neighbour, seed) pairs in ascending neighbour order, over the same
    neighbours.
    """

    agent: int
    sent: tuple[tuple[int, bytes], ...]
    received: tuple[tuple[int, bytes], ...]

    def __post_init__(self) -> None:
        if isinstance(self.agent, bool) or not isinstance(self.agent, numbers.Integral) or (
            self.agent < 0
        ):
            raise ValueError(f"agent must be a non-negative int, got {self.agent!r}")
        sent = _check_seed_map("sent", dict(self.sent))
        received = _check_seed_map("received", dict(self.received))
        if len(sent) != len(self.sent) or len(received) != len(self.received):
            raise ValueError("sent and received must name each neighbour once")
        if [j for j, _ in sent] != [j for j, _ in received]:
            raise ValueError(
                f"sent and received must cover the same neighbours, got {[j for j, _ in sent]} "
                f"and {[j for j, _ in received]}"
            )
        if any(j == self.agent for j, _ in sent):
            raise ValueError(f"agent {self.agent} lists itself among its neighbours")
        object.__setattr__(self, "agent", int(self.agent))
        object.__setattr__(self, "sent", sent)
        object.__setattr__(self, "received", received)

    def __repr__(self) -> str:  # never print a seed
        return f"EdgeSeeds(agent={self.agent}, neighbours={list(self.neighbours)}, seeds=<secret>)"

    @property
    def neighbours(self) -> tuple[int, ...]:
        return tuple(j for j, _ in self.sent)

    def numerators(self, period: int, spec: NoiseSpec) -> np.ndarray:
        """sum_j (z(s_ij, period) - z(s_ji, period)) as int64 of shape (N,).

        Integer sums do not depend on the order of the streams; int64 is exact because every
        |z| < 2^52 and RefreshedMask checks 2 deg(i) * max|z| < 2^63.
        """
        rows = period_noises([seed for _, seed in self.sent + self.received], period, spec)
        return rows[:len(self.sent)].sum(axis=0) - rows[len(self.sent):].sum(axis=0)

    def to_json(self) -> str:
        """The seeds as a small JSON document (the agent's crash-safe state; no pickle):

        {"format": "efpsn-edge-seeds/1", "agent": i,
         "sent": {"j": "<64 hex digits>", ...}, "received": {"j": "<64 hex digits>", ...}}
        """
        return json.dumps({
            "format": SEEDS_FORMAT,
            "agent": self.agent,
            "sent": {str(j): s.hex() for j, s in self.sent},
            "received": {str(j): s.hex() for j, s in self.received},
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, *, agent: int | None = None,
                  neighbours: Sequence[int] | None = None) -> EdgeSeeds:
        """Parse to_json's document; ValueError naming what is wrong.

        `agent` and `neighbours`, when given, must match the document (a restarted agent checks
        it reloads its own seeds for its own edges).
        """
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"edge seeds: not JSON ({err})") from None
        if not isinstance(doc, dict) or doc.get("format") != SEEDS_FORMAT:
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"edge seeds: expected format {SEEDS_FORMAT!r}, got {got!r}")
        if set(doc) != {"format", "agent", "sent", "received"}:
            raise ValueError(f"edge seeds: expected keys format, agent, sent, received; got "
                             f"{sorted(doc)}")
        parsed = {name: _parse_seed_object(name, doc[name]) for name in ("sent", "received")}
        seeds = cls(agent=doc["agent"], sent=tuple(parsed["sent"].items()),
                    received=tuple(parsed["received"].items()))
        if agent is not None and seeds.agent != agent:
            raise ValueError(f"edge seeds belong to agent {seeds.agent}, expected agent {agent}")
        if neighbours is not None and seeds.neighbours != sorted_neighbours(neighbours):
            raise ValueError(f"edge seeds are for neighbours {list(seeds.neighbours)}, expected "
                             f"{sorted(neighbours)}")
        return seeds


def _parse_seed_object(name: str, value: object) -> dict[int, bytes]:
    if not isinstance(value, dict):
        raise ValueError(  # noqa: TRY004 - a malformed document, not a wrong argument type
            f"edge seeds: {name} must be an object, got {type(value).__name__}")
    out: dict[int, bytes] = {}
    for key, text in value.items():
        if not (isinstance(key, str) and key.isdigit() and key == str(int(key))):
            raise ValueError(f"edge seeds: {name} keys must be neighbour numbers, got {key!r}")
        if not isinstance(text, str) or len(text) != 2 * SEED_BYTES:
            raise ValueError(f"edge seeds: {name}[{key}] must be {2 * SEED_BYTES} hex digits")
        try:
            out[int(key)] = bytes.fromhex(text)
        except ValueError:
            raise ValueError(f"edge seeds: {name}[{key}] is not hexadecimal") from None
    return out


class SeedExchange:
    """Phase I with seeds for one agent, without I/O: keys and ints in, EdgeSeeds out.

    Lifecycle (as efpsn.masks.zero_sum.Masker): construct with the agent's key pair -> publish
    `public_key` -> outgoing(neighbours' public keys) -> {j: [one ciphertext]} ->
    finish({j: [the one ciphertext j sent]}) -> EdgeSeeds. A seed s travels as the plaintext
    int.from_bytes(s, "big") < 2^256 < n, encrypted with fresh randomness.
    """

    def __init__(
        self,
        *,
        agent: int,
        neighbours: Sequence[int],
        keypair: tuple[paillier.PublicKey, paillier.PrivateKey],
        rng: np.random.Generator | None = None,
        allow_insecure: bool = False,
        seeds: Mapping[int, bytes] | None = None,
    ) -> None:
        self.neighbours = sorted_neighbours(neighbours, agent=agent)
        self.agent = sorted_neighbours([agent])[0]  # a non-negative int
        self.allow_insecure = bool(allow_insecure)
        public_key, private_key = keypair
        if not isinstance(private_key, paillier.PrivateKey) or private_key.public_key != public_key:
            raise ValueError("keypair's private key does not belong to its public key")
        self._public_key, self._private_key = public_key, private_key
        self._check_key(self._public_key, f"agent {self.agent}")
        # `seeds` (a restart, agent/departure/exchange_file.py): the ones drawn before it, not new
        # ones
        self._seeds = draw_seeds(self.neighbours, rng) if seeds is None else dict(
            _check_seed_map("seeds", seeds))
        if sorted(self._seeds) != list(self.neighbours):
            raise ValueError(f"seeds are for neighbours {sorted(self._seeds)}, expected "
                             f"{list(self.neighbours)}")
        self._sent: dict[int, list[int]] | None = None
        self._sent_to: dict[int, bytes] = {}
        self._result: EdgeSeeds | None = None
        self.encryptions = 0
        self.decryptions = 0

    ciphertexts_per_neighbour = 1

    @property
    def public_key(self) -> paillier.PublicKey:
        """This agent's Paillier public key, to publish to every neighbour."""
        return self._public_key

    def _check_key(self, key: object, who: str) -> None:
        if not isinstance(key, paillier.PublicKey):
            raise TypeError(f"public key of {who} must be a PublicKey, got {type(key).__name__}")
        paillier.check_key_size(key, allow_insecure=self.allow_insecure)
        if paillier.key_bits(key) < MIN_SEED_KEY_BITS:
            raise ValueError(f"{who}'s {paillier.key_bits(key)}-bit key cannot carry a "
                             f"{8 * SEED_BYTES}-bit seed: need >= {MIN_SEED_KEY_BITS} bits")

    def outgoing(self, public_keys: Mapping[int, paillier.PublicKey]) -> dict[int, list[int]]:
        """Encrypt s_ij under each neighbour j's key: {j: [ciphertext]}.

        Keys of non-neighbours are ignored. Calling again with the same keys returns the same
        ciphertexts (safe to retransmit); with other keys it is refused.
        """
        missing = [j for j in self.neighbours if j not in public_keys]
        if missing:
            raise ValueError(f"agent {self.agent} needs the public keys of neighbours "
                             f"{list(self.neighbours)}; missing {missing}")
        for j in self.neighbours:
            self._check_key(public_keys[j], f"neighbour {j}")
        prints = {j: paillier.fingerprint(public_keys[j]) for j in self.neighbours}
        if self._sent is None:
            self._sent = {
                j: [paillier.encrypt(public_keys[j], int.from_bytes(self._seeds[j], "big"))]
                for j in self.neighbours
            }
            self.encryptions += len(self.neighbours)
            self._sent_to = prints
        elif prints != self._sent_to:
            raise MaskingStateError(f"agent {self.agent}: outgoing() was already called with "
                                    "different neighbour keys")
        return {j: list(cs) for j, cs in self._sent.items()}

    @property
    def seeds(self) -> dict[int, bytes]:
        """s_ij per neighbour j, as drawn (secret: what a restart must draw again)."""
        return dict(self._seeds)

    def restore_outgoing(self, public_keys: Mapping[int, paillier.PublicKey],
                         sent: Mapping[int, Sequence[int]]) -> None:
        """A restart: the ciphertexts outgoing() gave before it (already sent, perhaps
        received), so that a retransmission repeats them exactly; they must be one per
        neighbour, under its key."""
        if self._sent is not None:
            raise MaskingStateError(f"agent {self.agent}: outgoing() was already called")
        for j in self.neighbours:
            self._check_key(public_keys[j], f"neighbour {j}")
            if len(sent[j]) != 1:
                raise ValueError(f"expected 1 ciphertext for neighbour {j}, got {len(sent[j])}")
            paillier.validate_ciphertext(public_keys[j], sent[j][0])
        self._sent = {j: [int(sent[j][0])] for j in self.neighbours}
        self._sent_to = {j: paillier.fingerprint(public_keys[j]) for j in self.neighbours}

    def drop(self, gone: Iterable[int]) -> None:
        """Neighbours that left in phase I (before finish): their seeds were drawn (so the
        others' seeds stay the replay's, efpsn/departure/remask.py's drop_seeds of
        exchange_seeds_fast's) but are neither sent nor awaited; EdgeSeeds holds no pair with
        them."""
        if self._result is not None:
            raise MaskingStateError(f"agent {self.agent}: drop() comes before finish()")
        gone = set(gone)
        self.neighbours = tuple(j for j in self.neighbours if j not in gone)
        self._seeds = {j: s for j, s in self._seeds.items() if j not in gone}
        if self._sent is not None:
            self._sent = {j: c for j, c in self._sent.items() if j not in gone}
        self._sent_to = {j: p for j, p in self._sent_to.items() if j not in gone}

    def finish(self, incoming: Mapping[int, Sequence[int]]) -> EdgeSeeds:
        """Decrypt the one ciphertext from each neighbour; ValueError on anything else.

        Refused: senders other than exactly the neighbours, a count other than one, a
        ciphertext outside 0 < c < n^2 or not a unit, a plaintext of more than 256 bits.
        """
        if self._sent is None or self._result is not None:
            raise MaskingStateError(f"agent {self.agent}: finish() comes once, after outgoing()")
        unexpected = sorted(set(incoming) - set(self.neighbours), key=repr)
        missing = [j for j in self.neighbours if j not in incoming]
        if missing or unexpected:
            raise ValueError(f"agent {self.agent} expects a seed from exactly its neighbours "
                             f"{list(self.neighbours)}; missing {missing}, unexpected {unexpected}")
        received = {}
        for j in self.neighbours:
            ciphertexts = list(incoming[j])
            if len(ciphertexts) != 1:
                raise ValueError(f"agent {self.agent} expects 1 ciphertext (a seed) from "
                                 f"neighbour {j}, got {len(ciphertexts)}")
            try:
                plaintext = paillier.decrypt(self._private_key, ciphertexts[0])
            except ValueError as err:
                raise ValueError(f"the seed ciphertext from neighbour {j}: {err}") from None
            self.decryptions += 1
            if plaintext.bit_length() > 8 * SEED_BYTES:
                raise ValueError(f"the seed from neighbour {j} has {plaintext.bit_length()} "
                                 f"bits, expected at most {8 * SEED_BYTES}")
            received[j] = plaintext.to_bytes(SEED_BYTES, "big")
        self._result = EdgeSeeds(agent=self.agent, sent=tuple(self._seeds.items()),
                                 received=tuple(received.items()))
        return self._result


def _generators(n: int, noise_seed: int | None) -> list[np.random.Generator | None]:
    return [None if noise_seed is None else noise_generator(noise_seed, i) for i in range(n)]


def exchange_seeds_fast(graph: GraphLike, *, noise_seed: int | None) -> list[EdgeSeeds]:
    """Every agent's EdgeSeeds without encryption: what exchange_seeds yields for the same
    noise seed (agent i's seeds drawn as SeedExchange draws them)."""
    nbrs = checked_neighbours(graph, None)
    drawn = [draw_seeds(nbrs[i], rng) for i, rng in enumerate(_generators(graph.n, noise_seed))]
    return [
        EdgeSeeds(agent=i, sent=tuple(drawn[i].items()),
                  received=tuple((j, drawn[j][i]) for j in nbrs[i]))
        for i in range(graph.n)
    ]


def exchange_seeds(
    graph: GraphLike,
    keypairs: Sequence[tuple[paillier.PublicKey, paillier.PrivateKey]],
    *,
    noise_seed: int | None,
    allow_insecure: bool = False,
) -> list[EdgeSeeds]:
    """The real Paillier phase I with seeds between in-process SeedExchanges, agent i holding
    keypairs[i] (tests and the simulator's --protocol paillier)."""
    if len(keypairs) != graph.n:
        raise ValueError(f"exchange_seeds needs {graph.n} key pairs (one per agent), got "
                         f"{len(keypairs)}")
    nbrs = checked_neighbours(graph, None)
    agents = [SeedExchange(agent=i, neighbours=nbrs[i], rng=rng, keypair=keypairs[i],
                           allow_insecure=allow_insecure)
              for i, rng in enumerate(_generators(graph.n, noise_seed))]
    keys = {i: a.public_key for i, a in enumerate(agents)}
    sent = [a.outgoing(keys) for a in agents]
    return [a.finish({j: sent[j][i] for j in nbrs[i]}) for i, a in enumerate(agents)]
