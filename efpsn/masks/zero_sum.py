"""Phase I at one agent: exact zero-sum noise over Paillier as a sans-I/O state machine, and
the baseline mask modes of one agent. Every agent's masks at once (the simulator) are
efpsn/masks/network.py's."""

from __future__ import annotations

import math
import numbers
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from efpsn.crypto import paillier
from efpsn.crypto.encoding import SlotLayout, decode_fixed, encode_fixed

__all__ = [
    "MAX_NEIGHBOURS",
    "GraphLike",
    "MaskCoefficients",
    "Masker",
    "MaskingStateError",
    "NoiseSpec",
    "draw_shares",
    "independent_mask",
    "noise_generator",
    "sorted_neighbours",
]

# Without packing, each coefficient travels as z mod n and the receiver decrypts a sum of deg(i)
# of them; to_signed recovers it exactly while |sum| <= (n-1)/2. Senders therefore refuse
# |z| > (n-1) / (2 MAX_NEIGHBOURS) and receivers refuse more than MAX_NEIGHBOURS senders.
MAX_NEIGHBOURS = 1 << 16


class GraphLike(Protocol):
    """What masking needs from efpsn.topology.Graph."""

    n: int

    def neighbours(self, i: int) -> tuple[int, ...]: ...


class MaskingStateError(RuntimeError):
    """A Masker method was called out of order (outgoing before finish, each once)."""


@dataclass(frozen=True, kw_only=True)
class NoiseSpec:
    """Public noise parameters: sigma_k^2 = gamma / k^p for k = 1..N, precision P (10^-P units).

    The basis index k is 1-based as in Theorem 4.1. Algorithm 1 of the paper indexes from 0,
    which would give sigma_0^2 = gamma / 0^p, a division by zero; array position k-1 holds
    coefficient k.
    """

    gamma: float
    p: float
    precision: int
    num_coefficients: int

    def __post_init__(self) -> None:
        for name in ("gamma", "p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        for name, minimum in (("precision", 0), ("num_coefficients", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {value}")
            object.__setattr__(self, name, int(value))

    def sigma2(self) -> np.ndarray:
        """sigma_k^2 = gamma / k^p for k = 1..N (float64, position k-1)."""
        k = np.arange(1, self.num_coefficients + 1, dtype=np.float64)
        return self.gamma / k**self.p


def sorted_neighbours(neighbours: Sequence[int], *, agent: int | None = None) -> tuple[int, ...]:
    """Neighbours as a strictly ascending tuple of distinct non-negative ints."""
    out = []
    for j in neighbours:
        if isinstance(j, bool) or not isinstance(j, numbers.Integral) or j < 0:
            raise ValueError(f"neighbours must be non-negative ints, got {j!r}")
        out.append(int(j))
    if len(set(out)) != len(out):
        raise ValueError(f"neighbours must be distinct, got {list(neighbours)}")
    if agent is not None and agent in out:
        raise ValueError(f"agent {agent} lists itself among its neighbours {sorted(out)}")
    return tuple(sorted(out))


def draw_shares(
    rng: np.random.Generator, spec: NoiseSpec, neighbours: Sequence[int]
) -> dict[int, list[int]]:
    """z_ijk = floor(10^P eta_ijk), eta_ijk ~ N(0, sigma_k^2), for each neighbour j.

    Draw order (fixes the integers given the rng state): a single
    rng.standard_normal((deg, N)) call, row r for the r-th neighbour in ascending order, column
    k-1 for coefficient k; i.e. neighbours ascending, then k ascending. eta = sqrt(sigma_k^2) * draw
    in float64, then encode_fixed (exact floor). The dict iterates neighbours ascending.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    order = sorted_neighbours(neighbours)
    draws = rng.standard_normal((len(order), spec.num_coefficients))
    eta = draws * np.sqrt(spec.sigma2())[None, :]
    return {j: encode_fixed(eta[r], precision=spec.precision) for r, j in enumerate(order)}


@dataclass(frozen=True)
class MaskCoefficients:
    """One agent's eta_bar_i as exact integers: eta_bar_ik = numerators[k-1] / 10^precision."""

    numerators: tuple[int, ...]
    precision: int

    def __post_init__(self) -> None:
        numerators = tuple(self.numerators)
        for index, z in enumerate(numerators):
            if isinstance(z, bool) or not isinstance(z, numbers.Integral):
                raise TypeError(f"numerators[{index}] must be an int, got {type(z).__name__}")
        object.__setattr__(self, "numerators", tuple(int(z) for z in numerators))
        if isinstance(self.precision, bool) or not isinstance(self.precision, numbers.Integral):
            raise TypeError(f"precision must be an int, got {type(self.precision).__name__}")
        if self.precision < 0:
            raise ValueError(f"precision must be >= 0, got {self.precision}")

    @property
    def num_coefficients(self) -> int:
        return len(self.numerators)

    def values(self) -> np.ndarray:
        """eta_bar_i = numerators / 10^P as float64 (each correctly rounded)."""
        return decode_fixed(self.numerators, precision=self.precision)


def _check_layout_fits(layout: SlotLayout, public_key: paillier.PublicKey, who: str) -> None:
    bits = paillier.key_bits(public_key)
    # Every packed plaintext and every sum of <= max_terms of them is < 2^capacity_bits <= n.
    if layout.capacity_bits > bits - 1:
        raise ValueError(
            f"{who}'s {bits}-bit key cannot hold the layout's {layout.capacity_bits}-bit "
            f"plaintexts ({layout.slots} slots x {layout.slot_bits} bits): plan the layout for "
            f"key_bits <= {bits}"
        )


class Masker:
    """Phase I for one agent (Algorithm 1, lines 1-11) without I/O: keys and ints in, ints out.

    Lifecycle: construct (generates or takes the key pair) -> publish `public_key` ->
    outgoing(neighbours' public keys) -> ciphertexts to send to each neighbour ->
    finish(ciphertexts received from each neighbour) -> MaskCoefficients.

    With a SlotLayout the deg(i) * N shares travel packed, deg(i) * ceil(N / slots) encryptions
    and ceil(N / slots) decryptions; with layout=None one ciphertext per coefficient, negatives
    as residues mod n (deg(i) * N encryptions, N decryptions). The numerators are
    sum_j z_ijk - s_ik computed from the integers actually sent, so sum_i numerators_k == 0
    exactly for every k and every precision. All agents must use the same layout, planned with
    max_terms >= the largest degree in the graph.
    """

    def __init__(
        self,
        *,
        agent: int,
        neighbours: Sequence[int],
        spec: NoiseSpec,
        rng: np.random.Generator,
        layout: SlotLayout | None,
        key_bits: int | None = None,
        keypair: tuple[paillier.PublicKey, paillier.PrivateKey] | None = None,
        allow_insecure: bool = False,
    ) -> None:
        if isinstance(agent, bool) or not isinstance(agent, numbers.Integral) or agent < 0:
            raise ValueError(f"agent must be a non-negative int, got {agent!r}")
        if not isinstance(spec, NoiseSpec):
            raise TypeError(f"spec must be a NoiseSpec, got {type(spec).__name__}")
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
        if layout is not None and not isinstance(layout, SlotLayout):
            raise TypeError(f"layout must be a SlotLayout or None, got {type(layout).__name__}")
        self.agent = int(agent)
        self.neighbours = sorted_neighbours(neighbours, agent=self.agent)
        if len(self.neighbours) > MAX_NEIGHBOURS:
            raise ValueError(f"at most {MAX_NEIGHBOURS} neighbours, got {len(self.neighbours)}")
        if layout is not None and len(self.neighbours) > layout.max_terms:
            raise ValueError(
                f"agent {self.agent} has {len(self.neighbours)} neighbours but the layout sums at "
                f"most max_terms={layout.max_terms}: plan it with the graph's max degree"
            )
        self.spec = spec
        self.layout = layout
        self.allow_insecure = bool(allow_insecure)
        self._rng = rng
        if keypair is None:
            bits = paillier.DEFAULT_KEY_BITS if key_bits is None else key_bits
            keypair = paillier.generate_keypair(bits, allow_insecure=self.allow_insecure)
        else:
            public_key, private_key = keypair
            if not isinstance(private_key, paillier.PrivateKey):
                raise TypeError(
                    f"keypair[1] must be a PrivateKey, got {type(private_key).__name__}"
                )
            if private_key.public_key != public_key:
                raise ValueError("keypair's private key does not belong to its public key")
            if key_bits is not None and paillier.key_bits(public_key) != key_bits:
                raise ValueError(
                    f"key_bits={key_bits} but the given key pair has "
                    f"{paillier.key_bits(public_key)} bits"
                )
            paillier.check_key_size(public_key, allow_insecure=self.allow_insecure)
        self._public_key, self._private_key = keypair
        if layout is not None:
            _check_layout_fits(layout, self._public_key, f"agent {self.agent}")
        self._drawn_for = self.neighbours  # shares are drawn for these, whoever leaves
        self.departed: frozenset[int] = frozenset()  # neighbours that left in phase I
        self._shares: dict[int, list[int]] | None = None
        self._sent: dict[int, list[int]] | None = None
        self._sent_to: dict[int, bytes] = {}
        self._incoming: dict[int, list[int]] = {}
        self._result: MaskCoefficients | None = None
        self.encryptions = 0
        self.decryptions = 0

    @property
    def public_key(self) -> paillier.PublicKey:
        """This agent's Paillier public key, to publish to every neighbour."""
        return self._public_key

    @property
    def ciphertexts_per_neighbour(self) -> int:
        """How many ciphertexts travel on each edge in each direction."""
        n = self.spec.num_coefficients
        return n if self.layout is None else self.layout.num_plaintexts(n)

    def _encrypt_shares(self, j: int, key: paillier.PublicKey, shares: list[int]) -> list[int]:
        if self.layout is not None:
            plaintexts = self.layout.pack(shares)  # biased, non-negative, < 2^capacity_bits < n
        else:
            limit = (key.n - 1) // (2 * MAX_NEIGHBOURS)
            for k, z in enumerate(shares, start=1):
                if abs(z) > limit:
                    raise ValueError(
                        f"share z_{self.agent},{j},{k} = {z} is too large for an unpacked sum "
                        f"under a {paillier.key_bits(key)}-bit key; lower the precision"
                    )
            plaintexts = [paillier.from_signed(key, z) for z in shares]  # negatives as n - |z|
        self.encryptions += len(plaintexts)
        return [paillier.encrypt(key, m) for m in plaintexts]

    def outgoing(self, public_keys: Mapping[int, paillier.PublicKey]) -> dict[int, list[int]]:
        """Draw the shares z_ijk and encrypt them under each neighbour j's key: {j: ciphertexts}.

        Keys for agents that are not neighbours are ignored. Calling again with the same keys
        returns the same ciphertexts (safe to retransmit); the shares are drawn only once.
        """
        missing = [j for j in self.neighbours if j not in public_keys]
        if missing:
            raise ValueError(
                f"agent {self.agent} needs the public keys of neighbours {list(self.neighbours)}; "
                f"missing {missing}"
            )
        keys = {j: public_keys[j] for j in self.neighbours}
        for j, key in keys.items():
            if not isinstance(key, paillier.PublicKey):
                raise TypeError(f"public key of neighbour {j} must be a PublicKey, got {type(key)}")
            paillier.check_key_size(key, allow_insecure=self.allow_insecure)
            if self.layout is not None:
                _check_layout_fits(self.layout, key, f"neighbour {j}")
        prints = {j: paillier.fingerprint(key) for j, key in keys.items()}
        if self._sent is not None:
            if prints != self._sent_to:
                raise MaskingStateError(
                    f"agent {self.agent}: outgoing() was already called with different neighbour "
                    "keys; the shares cannot be re-encrypted under new keys"
                )
            return {j: list(cs) for j, cs in self._sent.items()}
        drawn = draw_shares(self._rng, self.spec, self._drawn_for)
        self._shares = {j: drawn[j] for j in self.neighbours}
        self._sent = {j: self._encrypt_shares(j, keys[j], self._shares[j]) for j in self.neighbours}
        self._sent_to = prints
        return {j: list(cs) for j, cs in self._sent.items()}

    def drop(self, gone: Iterable[int]) -> None:
        """Neighbours that left in phase I: their shares are drawn (the others' stay the
        replay's), never sent nor awaited; the mask is PairShares.without's (departure_masks)."""
        if self._result is not None:
            raise MaskingStateError(f"agent {self.agent}: drop() comes before finish()")
        self.departed |= set(gone) & set(self._drawn_for)
        self.neighbours = tuple(j for j in self.neighbours if j not in self.departed)
        if self._shares is not None and self._sent is not None:  # after outgoing()
            self._shares = {j: self._shares[j] for j in self.neighbours}
            self._sent = {j: self._sent[j] for j in self.neighbours}
        self._sent_to = {j: p for j, p in self._sent_to.items() if j in self.neighbours}

    def finish(self, incoming: Mapping[int, Sequence[int]]) -> MaskCoefficients:
        """Sum, decrypt and subtract: numerator_k = sum_j z_ijk - s_ik with s_ik = sum_j z_jik.

        `incoming[j]` is the list of ciphertexts neighbour j sent to this agent. Per plaintext
        position the deg(i) ciphertexts are multiplied (a homomorphic sum) and decrypted once.
        """
        if self._shares is None:
            raise MaskingStateError(f"agent {self.agent}: call outgoing() before finish()")
        if self._result is not None:
            raise MaskingStateError(f"agent {self.agent}: finish() was already called")
        expected, got = set(self.neighbours), set(incoming)
        if expected != got:
            raise ValueError(
                f"agent {self.agent} expects ciphertexts from exactly its neighbours "
                f"{sorted(expected)}; missing {sorted(expected - got)}, "
                f"unexpected {sorted(got - expected, key=repr)}"
            )
        count = self.ciphertexts_per_neighbour
        for j in self.neighbours:
            if len(incoming[j]) != count:
                raise ValueError(
                    f"agent {self.agent} expects {count} ciphertexts from neighbour {j}, "
                    f"got {len(incoming[j])}"
                )
            for q, c in enumerate(incoming[j]):
                try:
                    paillier.validate_ciphertext(self._public_key, c)
                except ValueError as err:
                    raise ValueError(f"ciphertext {q} from neighbour {j}: {err}") from None
        self._incoming = {j: list(incoming[j]) for j in self.neighbours}
        n_coef, deg = self.spec.num_coefficients, len(self.neighbours)
        if deg == 0:
            received = [0] * n_coef
        else:
            plaintexts = []
            for q in range(count):
                column = [incoming[j][q] for j in self.neighbours]  # ascending, deterministic
                plaintexts.append(
                    paillier.decrypt(self._private_key, paillier.add(self._public_key, column))
                )
            self.decryptions += count
            if self.layout is not None:
                received = self.layout.unpack_sum(plaintexts, terms=deg, count=n_coef)
            else:
                received = [paillier.to_signed(self._public_key, m) for m in plaintexts]
        sent = [sum(column) for column in zip(*self._shares.values(), strict=True)] or [0] * n_coef
        self._result = MaskCoefficients(
            tuple(s - r for s, r in zip(sent, received, strict=True)), self.spec.precision
        )
        return self._result

    def edge_terms(self, j: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(z_ij, z_ji) of neighbour j's edge after finish(): the shares this agent drew for j
        and j's shares, decrypted alone (ceil(N / slots) decryptions). Both were this agent's
        to read since phase I; a neighbour that left for good is dropped from the mask by
        subtracting z_ij - z_ji (efpsn/departure/remask.py)."""
        if self._result is None or self._shares is None:
            raise MaskingStateError(f"agent {self.agent}: edge_terms() needs finish() first")
        if j not in self._incoming:
            raise ValueError(f"agent {self.agent} has no edge with {j}")
        plaintexts = [paillier.decrypt(self._private_key, c) for c in self._incoming[j]]
        self.decryptions += len(plaintexts)
        n_coef = self.spec.num_coefficients
        if self.layout is not None:
            received = self.layout.unpack_sum(plaintexts, terms=1, count=n_coef)
        else:
            received = [paillier.to_signed(self._public_key, m) for m in plaintexts]
        return tuple(self._shares[j]), tuple(int(r) for r in received)


def independent_mask(
    rng: np.random.Generator, *, degree: int, spec: NoiseSpec
) -> MaskCoefficients:
    """One agent's independent_masks entry: floor(10^P eta_k), eta_k ~ N(0, 2 degree sigma_k^2).

    A single rng.standard_normal(N) call, k ascending, scaled by sqrt(2 degree sigma_k^2).
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    if isinstance(degree, bool) or not isinstance(degree, numbers.Integral) or degree < 0:
        raise ValueError(f"degree must be a non-negative int, got {degree!r}")
    eta = rng.standard_normal(spec.num_coefficients) * np.sqrt(2 * int(degree) * spec.sigma2())
    return MaskCoefficients(tuple(encode_fixed(eta, precision=spec.precision)), spec.precision)


def noise_generator(noise_seed: int | None, agent: int) -> np.random.Generator:
    """Agent i's private noise source.

    None (production) draws 128 bits from the OS. A seed makes masks reproducible: useful for
    the simulator and for tests comparing a networked run with it, and NOT private.
    """
    if noise_seed is None:
        return np.random.default_rng(secrets.randbits(128))
    return np.random.default_rng([noise_seed, agent])
