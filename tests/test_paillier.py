"""Paillier wrapper: pinned tiny-key vectors, fresh randomness, homomorphic sums, validation."""

from __future__ import annotations

import hashlib
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.crypto import paillier
from efpsn.crypto.paillier import PrivateKey, PublicKey

# Mersenne primes 2^31 - 1 and 2^61 - 1: a 92-bit toy modulus with a known factorisation.
P31, P61 = 2**31 - 1, 2**61 - 1


@cache
def toy_keypair() -> tuple[PublicKey, PrivateKey]:
    return paillier.keypair_from_primes(P31, P61, allow_insecure=True)


@cache
def keypair_512() -> tuple[PublicKey, PrivateKey]:
    return paillier.generate_keypair(512, allow_insecure=True)


def recover_obfuscator(c: int, m: int, public_key: PublicKey, private_key: PrivateKey) -> int:
    """r with c = (1 + n m) r^n mod n^2: c mod n = r^n mod n, and x -> x^n is inverted by n^-1."""
    n = public_key.n
    phi = (private_key.p - 1) * (private_key.q - 1)
    r = pow(c % n, pow(n, -1, phi), n)
    assert c == (1 + n * m) * pow(r, n, n * n) % (n * n)
    return r


# --------------------------------------------------------------------------- regression vectors


def test_tiny_key_regression_vector() -> None:
    # n = 11 * 13 = 143, m = 42, r = 23: c = (1 + 143 * 42) * 23^143 mod 143^2 = 9637.
    public_key, private_key = paillier.keypair_from_primes(11, 13, allow_insecure=True)
    assert public_key.n == 143 and public_key.nsquare == 20449
    assert (1 + 143 * 42) * pow(23, 143, 20449) % 20449 == 9637
    assert paillier.decrypt(private_key, 9637) == 42
    assert paillier.fingerprint(public_key) == bytes.fromhex(
        "5e37305c587caf07e99a08e1efd0749fd3bbbb855752e4d568ac2dbfc2025464"
    )
    assert paillier.fingerprint(public_key) == hashlib.sha256(b"\x8f").digest()
    assert paillier.public_key_bytes(public_key) == b"\x8f"


def test_encrypt_matches_the_paillier_formula() -> None:
    public_key, private_key = toy_keypair()
    for m in (0, 1, 123_456_789, public_key.n - 1):
        c = paillier.encrypt(public_key, m)
        recover_obfuscator(c, m, public_key, private_key)
        assert paillier.decrypt(private_key, c) == m


def test_decrypt_of_a_hand_made_ciphertext() -> None:
    public_key, private_key = toy_keypair()
    n, m, r = public_key.n, 987_654_321_987, 1_234_567
    c = (1 + n * m) * pow(r, n, n * n) % (n * n)
    assert paillier.decrypt(private_key, c) == m


def test_fresh_randomness_for_every_ciphertext() -> None:
    public_key, private_key = keypair_512()
    ciphertexts = [paillier.encrypt(public_key, 7) for _ in range(20)]
    assert len(set(ciphertexts)) == 20
    obfuscators = {recover_obfuscator(c, 7, public_key, private_key) for c in ciphertexts}
    assert len(obfuscators) == 20
    assert {paillier.decrypt(private_key, c) for c in ciphertexts} == {7}


# --------------------------------------------------------------------------- homomorphic sums


def test_homomorphic_sum_of_signed_values() -> None:
    public_key, private_key = keypair_512()
    values = [-5, 3, 10**40, -(10**40) - 1]
    cs = [paillier.encrypt(public_key, paillier.from_signed(public_key, v)) for v in values]
    total = paillier.decrypt(private_key, paillier.add(public_key, cs))
    assert paillier.to_signed(public_key, total) == sum(values) == -3
    assert paillier.decrypt(private_key, paillier.add(public_key, cs[:1])) == public_key.n - 5
    with pytest.raises(ValueError, match="at least one ciphertext"):
        paillier.add(public_key, [])


@given(values=st.lists(st.integers(-(2**200), 2**200), min_size=1, max_size=6))
@settings(max_examples=30, deadline=None)
def test_sum_property(values: list[int]) -> None:
    public_key, private_key = keypair_512()
    cs = [paillier.encrypt(public_key, paillier.from_signed(public_key, v)) for v in values]
    plain = paillier.decrypt(private_key, paillier.add(public_key, cs))
    assert paillier.to_signed(public_key, plain) == sum(values)


def test_signed_mapping_extremes() -> None:
    public_key, _ = toy_keypair()
    n, half = public_key.n, (public_key.n - 1) // 2
    assert paillier.from_signed(public_key, half) == half
    assert paillier.from_signed(public_key, -half) == n - half == half + 1
    assert paillier.to_signed(public_key, half) == half
    assert paillier.to_signed(public_key, half + 1) == -half
    assert paillier.to_signed(public_key, n - 1) == -1
    with pytest.raises(ValueError, match=r"\|value\| must be <= \(n-1\)/2"):
        paillier.from_signed(public_key, half + 1)
    with pytest.raises(ValueError, match="0 <= m < n"):
        paillier.to_signed(public_key, n)


# --------------------------------------------------------------------------- keys and validation


def test_generate_keypair_policy() -> None:
    with pytest.raises(ValueError, match="must be >= 2048 bits, got 1024"):
        paillier.generate_keypair(1024)
    with pytest.raises(ValueError, match="even number of bits"):
        paillier.generate_keypair(513, allow_insecure=True)
    with pytest.raises(ValueError, match=">= 64 bits even for tests"):
        paillier.generate_keypair(32, allow_insecure=True)
    with pytest.raises(TypeError, match="bits must be an int"):
        paillier.generate_keypair(2048.0)  # type: ignore[arg-type]
    public_key, private_key = paillier.generate_keypair(256, allow_insecure=True)
    assert paillier.key_bits(public_key) == 256
    assert private_key.public_key == public_key
    assert paillier.MIN_KEY_BITS == 2048
    with pytest.raises(ValueError, match="at least 2048 are required"):
        paillier.check_key_size(public_key)
    paillier.check_key_size(public_key, allow_insecure=True)


def test_keypair_from_primes_validation() -> None:
    with pytest.raises(ValueError, match="distinct"):
        paillier.keypair_from_primes(11, 11, allow_insecure=True)
    with pytest.raises(ValueError, match="q must be an odd prime, got 15"):
        paillier.keypair_from_primes(11, 15, allow_insecure=True)
    with pytest.raises(ValueError, match="gcd"):
        paillier.keypair_from_primes(3, 7, allow_insecure=True)  # 3 divides (7 - 1)
    with pytest.raises(ValueError, match="at least 2048"):
        paillier.keypair_from_primes(P31, P61)


def test_validate_ciphertext() -> None:
    public_key, private_key = toy_keypair()
    n = public_key.n
    paillier.validate_ciphertext(public_key, 1)
    paillier.validate_ciphertext(public_key, n * n - 1)
    for bad in (0, -1, n * n, n * n + 1):
        with pytest.raises(ValueError, match="0 < c < n\\^2"):
            paillier.validate_ciphertext(public_key, bad)
    for shares_factor in (n, P31, 5 * P61):
        with pytest.raises(ValueError, match="gcd"):
            paillier.validate_ciphertext(public_key, shares_factor)
    with pytest.raises(TypeError, match="ciphertext must be an int"):
        paillier.validate_ciphertext(public_key, True)
    with pytest.raises(ValueError, match="0 < c < n\\^2"):
        paillier.decrypt(private_key, n * n)
    with pytest.raises(ValueError, match="0 <= m < n"):
        paillier.encrypt(public_key, -1)
    with pytest.raises(ValueError, match="0 <= m < n"):
        paillier.encrypt(public_key, n)
    with pytest.raises(TypeError, match="PaillierPublicKey"):
        paillier.encrypt(n, 1)  # type: ignore[arg-type]


def test_public_key_wire_round_trip() -> None:
    public_key, _ = keypair_512()
    data = paillier.public_key_bytes(public_key)
    assert len(data) == 64 and data[0] != 0
    again = paillier.public_key_from_n(int.from_bytes(data, "big"))
    assert again == public_key
    assert paillier.fingerprint(again) == paillier.fingerprint(public_key)
    assert paillier.fingerprint(public_key) == paillier.fingerprint_of_n(public_key.n)
    with pytest.raises(ValueError, match="odd product"):
        paillier.public_key_from_n(144)


def test_int_bytes_regression_vectors() -> None:
    assert paillier.int_to_bytes(0) == b"\x00"
    assert paillier.int_to_bytes(255) == b"\xff"
    assert paillier.int_to_bytes(256) == b"\x01\x00"
    with pytest.raises(ValueError, match="non-negative"):
        paillier.int_to_bytes(-1)


@given(st.integers(0, 2**4096))
@settings(max_examples=100, deadline=None)
def test_int_bytes_round_trip(value: int) -> None:
    data = paillier.int_to_bytes(value)
    assert int.from_bytes(data, "big") == value
    assert len(data) == max(1, (value.bit_length() + 7) // 8)
