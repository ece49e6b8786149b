"""Phase I masking pinned down: ciphertexts counted (packing really packs), every boundary of
the neighbour and share checks from both sides, and each refusal by type and message."""

from __future__ import annotations

from functools import cache

import gmpy2
import numpy as np
import pytest

from efpsn.crypto import paillier
from efpsn.crypto.encoding import SlotLayout
from efpsn.masks import zero_sum
from efpsn.masks.network import independent_masks, zero_sum_masks, zero_sum_masks_fast
from efpsn.masks.zero_sum import (
    MaskCoefficients,
    Masker,
    NoiseSpec,
    independent_mask,
    noise_generator,
)
from efpsn.topology import Graph

# Ring 0-1-2-3-4-0 plus the chord 0-2: degrees (3, 2, 3, 2, 2), 12 directed edges.
FIVE = Graph(n=5, edges=((0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (0, 2)))
SPEC = NoiseSpec(gamma=1.0, p=1.0, precision=3, num_coefficients=5)
# Two 63-bit moduli p q with n = 1 and n = -1 modulo 2^17 (twice the 65536 neighbours an agent
# may have at most).
N_ONE = (2147483659, 2149878691)
N_MINUS_ONE = (2147483659, 2148103261)


@cache
def keys(bits: int, count: int) -> tuple[tuple[paillier.PublicKey, paillier.PrivateKey], ...]:
    return tuple(paillier.generate_keypair(bits, allow_insecure=True) for _ in range(count))


def rngs(seed: int, n: int) -> list[np.random.Generator]:
    return [np.random.default_rng([seed, i]) for i in range(n)]


class Draws(np.random.Generator):
    """A Generator whose standard normal draws are the given numbers (to place a share
    exactly at a boundary)."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(np.random.PCG64(0))
        self.values = values

    def standard_normal(self, size: object = None, dtype: object = None,
                        out: object = None) -> np.ndarray:
        return np.asarray(self.values, dtype=np.float64).reshape(size)  # type: ignore[arg-type]


class Counting:
    """Counts the encryptions and decryptions phase I performs, and the key sizes used."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.encryptions, self.decryptions, self.key_bits = 0, 0, set()
        encrypt, decrypt = paillier.encrypt, paillier.decrypt

        def counted_encrypt(public_key: paillier.PublicKey, plaintext: int) -> int:
            self.encryptions += 1
            self.key_bits.add(paillier.key_bits(public_key))
            return encrypt(public_key, plaintext)

        def counted_decrypt(private_key: paillier.PrivateKey, ciphertext: int) -> int:
            self.decryptions += 1
            return decrypt(private_key, ciphertext)

        monkeypatch.setattr(paillier, "encrypt", counted_encrypt)
        monkeypatch.setattr(paillier, "decrypt", counted_decrypt)


@pytest.mark.parametrize(("slots", "per_edge"), [(5, 1), (2, 3), (None, 5)])
def test_zero_sum_masks_packs_the_ciphertexts_it_sends(
    monkeypatch: pytest.MonkeyPatch, slots: int | None, per_edge: int
) -> None:
    layout = None if slots is None else SlotLayout(bound=40_000, max_terms=3, slot_bits=19,
                                                   slots=slots)
    counting = Counting(monkeypatch)
    masks = zero_sum_masks(rngs(5, 5), FIVE, SPEC, layout=layout, keypairs=keys(256, 5),
                           allow_insecure=True)
    assert masks == zero_sum_masks_fast(rngs(5, 5), FIVE, SPEC)
    assert counting.encryptions == 12 * per_edge  # one batch per neighbour, both directions
    assert counting.decryptions == 5 * per_edge  # one per plaintext position and agent


def test_zero_sum_masks_generates_keys_of_the_size_asked_for(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = Counting(monkeypatch)
    masks = zero_sum_masks(rngs(1, 2), Graph(2, ((0, 1),)), SPEC, layout=None, key_bits=128,
                           allow_insecure=True)
    assert [sum(column) for column in zip(*(m.numerators for m in masks), strict=True)] == [0] * 5
    assert counting.key_bits == {128}
    with pytest.raises(ValueError, match="^Paillier modulus has 256 bits; at least 2048"):
        zero_sum_masks(rngs(1, 5), FIVE, SPEC, layout=None, keypairs=keys(256, 5))
    with pytest.raises(ValueError) as error:
        zero_sum_masks(rngs(1, 5), FIVE, SPEC, layout=None, keypairs=keys(256, 4),
                       allow_insecure=True)
    assert str(error.value) == "need one key pair per agent (5), got 4"
    for run in (zero_sum_masks, independent_masks):
        kwargs = {"layout": None, "keypairs": keys(256, 5)} if run is zero_sum_masks else {}
        with pytest.raises(ValueError) as error:
            run(rngs(1, 4), FIVE, SPEC, **kwargs)
        assert str(error.value) == "need one rng per agent: graph has 5 agents, got 4 rngs"


def test_a_neighbour_must_be_an_agent_of_the_graph() -> None:
    class Reaching:
        """Agent 0 lists agent n (one past the last); agent n - 1 lists agent 0."""

        n = 3

        def neighbours(self, i: int) -> tuple[int, ...]:
            return {0: (3,), 1: (), 2: (0,)}[i]

    with pytest.raises(ValueError) as error:
        zero_sum_masks_fast(rngs(0, 3), Reaching(), SPEC)
    assert str(error.value) == "agent 0 has neighbour 3 outside 0..2"

    class Looping:
        n = 2

        def neighbours(self, i: int) -> tuple[int, ...]:
            return (0, 1) if i == 1 else (1,)

    with pytest.raises(ValueError) as error:
        zero_sum_masks_fast(rngs(0, 2), Looping(), SPEC)
    assert str(error.value) == "agent 1 lists itself among its neighbours [0, 1]"


def test_the_largest_unpacked_share_is_the_one_whose_sum_still_decrypts() -> None:
    spec = NoiseSpec(gamma=1.0, p=1.0, precision=0, num_coefficients=1)
    own = keys(128, 1)[0]
    for primes in (N_ONE, N_MINUS_ONE):
        neighbour = paillier.keypair_from_primes(*primes, allow_insecure=True)[0]
        # 65536 shares of |z| <= (n - 1) / 2^17 sum to at most (n - 1) / 2
        largest = (neighbour.n - 1) // 2**17  # 65536 neighbours at most
        for z in (largest, -largest):
            masker = Masker(agent=0, neighbours=(1,), spec=spec, rng=Draws([float(z)]),
                            layout=None, keypair=own, allow_insecure=True)
            assert len(masker.outgoing({1: neighbour})[1]) == 1
        masker = Masker(agent=0, neighbours=(1,), spec=spec, rng=Draws([float(largest + 1)]),
                        layout=None, keypair=own, allow_insecure=True)
        with pytest.raises(ValueError) as error:
            masker.outgoing({1: neighbour})
        assert str(error.value) == (
            f"share z_0,1,1 = {largest + 1} is too large for an unpacked sum under a 63-bit "
            "key; lower the precision")


def test_an_agent_has_at_most_max_neighbours() -> None:
    spec = NoiseSpec(gamma=1.0, p=1.0, precision=0, num_coefficients=1)
    common = {"agent": 0, "spec": spec, "rng": np.random.default_rng(0), "layout": None,
              "keypair": keys(128, 1)[0], "allow_insecure": True}
    most = Masker(neighbours=range(1, 2**16 + 1), **common)
    assert len(most.neighbours) == 2**16
    with pytest.raises(ValueError) as error:
        Masker(neighbours=range(1, 2**16 + 2), **common)
    assert str(error.value) == "at most 65536 neighbours, got 65537"


def test_a_layout_fits_a_key_up_to_one_bit_below_its_size() -> None:
    spec = NoiseSpec(gamma=1.0, p=1.0, precision=0, num_coefficients=1)
    keypair = paillier.keypair_from_primes(*N_ONE, allow_insecure=True)  # 63 bits
    fits = SlotLayout(bound=1, max_terms=1, slot_bits=62, slots=1)
    masker = Masker(agent=0, neighbours=(1,), spec=spec, rng=np.random.default_rng(0),
                    layout=fits, keypair=keypair, allow_insecure=True)
    assert masker.ciphertexts_per_neighbour == 1
    too_wide = SlotLayout(bound=1, max_terms=1, slot_bits=63, slots=1)
    with pytest.raises(ValueError) as error:
        Masker(agent=0, neighbours=(1,), spec=spec, rng=np.random.default_rng(0),
               layout=too_wide, keypair=keypair, allow_insecure=True)
    assert str(error.value) == (
        "agent 0's 63-bit key cannot hold the layout's 63-bit plaintexts (1 slots x 63 bits): "
        "plan the layout for key_bits <= 63")
    # a neighbour whose key is too small for the layout: 61 bits
    small = paillier.keypair_from_primes(int(gmpy2.next_prime(2**30)),
                                         int(gmpy2.next_prime(2**30 + 64)),
                                         allow_insecure=True)[0]
    assert paillier.key_bits(small) == 61
    with pytest.raises(ValueError) as error:
        masker.outgoing({1: small})
    assert str(error.value) == (
        "neighbour 1's 61-bit key cannot hold the layout's 62-bit plaintexts (1 slots x 62 "
        "bits): plan the layout for key_bits <= 61")


def test_masker_refusals_by_type_and_message() -> None:
    common = {"agent": 0, "neighbours": (1,), "spec": SPEC, "rng": np.random.default_rng(0),
              "layout": None, "keypair": keys(128, 1)[0], "allow_insecure": True}
    for neighbour in (True, 1.0, -1):
        with pytest.raises(ValueError) as error:
            Masker(**{**common, "neighbours": (neighbour,)})
        assert str(error.value) == f"neighbours must be non-negative ints, got {neighbour!r}"
    with pytest.raises(ValueError) as error:
        Masker(**{**common, "neighbours": (1, 2, 1)})
    assert str(error.value) == "neighbours must be distinct, got [1, 2, 1]"
    for agent in (-1, True, "0"):
        with pytest.raises(ValueError) as error:
            Masker(**{**common, "agent": agent})
        assert str(error.value) == f"agent must be a non-negative int, got {agent!r}"
    for name, value, message in (
        ("spec", {"gamma": 1.0}, "spec must be a NoiseSpec, got dict"),
        ("rng", np.random.RandomState(0), "rng must be a numpy Generator, got RandomState"),
        ("layout", 4, "layout must be a SlotLayout or None, got int"),
        ("keypair", (keys(128, 1)[0][0], "key"), "keypair[1] must be a PrivateKey, got str"),
    ):
        with pytest.raises(TypeError) as type_error:
            Masker(**{**common, name: value})
        assert str(type_error.value) == message
    with pytest.raises(ValueError) as error:
        Masker(**{**common, "keypair": (keys(128, 2)[1][0], keys(128, 1)[0][1])})
    assert str(error.value) == "keypair's private key does not belong to its public key"
    masker = Masker(**common)
    with pytest.raises(TypeError) as type_error:
        masker.outgoing({1: 187})
    assert str(type_error.value) == (
        "public key of neighbour 1 must be a PublicKey, got <class 'int'>")
    sent = masker.outgoing({1: keys(128, 2)[1][0], 7: "not a neighbour: ignored"})
    assert list(sent) == [1] and len(sent[1]) == 5
    good = [paillier.encrypt(masker.public_key, 1) for _ in range(5)]
    with pytest.raises(ValueError) as error:
        masker.finish({1: good, 3: good, "x": good})
    assert str(error.value) == (
        "agent 0 expects ciphertexts from exactly its neighbours [1]; missing [], "
        "unexpected ['x', 3]")  # ordered by repr: mixed types cannot be compared


def test_mask_coefficients_and_independent_masks_refusals() -> None:
    numerators = MaskCoefficients([np.int64(3), -2], 0).numerators  # type: ignore[arg-type]
    assert numerators == (3, -2) and [type(z) for z in numerators] == [int, int]
    with pytest.raises(TypeError, match=r"^numerators\[1\] must be an int, got float$"):
        MaskCoefficients((1, 2.0), 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^precision must be >= 0, got -1$"):
        MaskCoefficients((1,), -1)
    with pytest.raises(TypeError, match="^precision must be an int, got bool$"):
        MaskCoefficients((1,), True)
    for degree in (-1, True, 1.0):
        with pytest.raises(ValueError) as error:
            independent_mask(np.random.default_rng(0), degree=degree, spec=SPEC)
        assert str(error.value) == f"degree must be a non-negative int, got {degree!r}"
    with pytest.raises(TypeError) as type_error:
        independent_mask(np.random.RandomState(0), degree=1, spec=SPEC)
    assert str(type_error.value) == "rng must be a numpy Generator, got RandomState"


def test_noise_spec_and_draws_refuse_wrong_types_by_name() -> None:
    for name, value, message in (
        ("gamma", "1", "gamma must be a real number, got str"),
        ("p", True, "p must be a real number, got bool"),
        ("precision", 1.5, "precision must be an int, got float"),
        ("num_coefficients", "5", "num_coefficients must be an int, got str"),
    ):
        with pytest.raises(TypeError) as error:
            NoiseSpec(**{"gamma": 1.0, "p": 1.0, "precision": 3, "num_coefficients": 5,
                         name: value})
        assert str(error.value) == message
    with pytest.raises(TypeError) as error:
        zero_sum.draw_shares(np.random.RandomState(0), SPEC, (1,))  # type: ignore[arg-type]
    assert str(error.value) == "rng must be a numpy Generator, got RandomState"


def test_a_masker_without_a_key_generates_one_of_the_default_size() -> None:
    masker = Masker(agent=0, neighbours=(1,), spec=SPEC, rng=np.random.default_rng(0),
                    layout=None)
    assert paillier.key_bits(masker.public_key) == 3072


def test_noise_generators_are_private_unless_seeded() -> None:
    seeded = noise_generator(7, 2).standard_normal(4)
    assert seeded.tolist() == np.random.default_rng([7, 2]).standard_normal(4).tolist()
    assert seeded.tolist() != noise_generator(7, 3).standard_normal(4).tolist()
    private = [noise_generator(None, 2).standard_normal(4).tolist() for _ in range(2)]
    assert private[0] != private[1] and seeded.tolist() not in private
    assert zero_sum.noise_generator(None, 0).bit_generator.state != (
        zero_sum.noise_generator(None, 0).bit_generator.state)
