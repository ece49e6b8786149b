"""Paillier pinned down: each refusal by type and exact message, and each boundary from both
sides (key sizes, the generator condition in both orders, plaintext and ciphertext ranges)."""

from __future__ import annotations

import math
from functools import cache

import gmpy2
import pytest

from efpsn.crypto import paillier
from efpsn.crypto.paillier import PrivateKey, PublicKey


@cache
def key_of_bits(bits: int) -> tuple[PublicKey, PrivateKey]:
    """A key pair whose modulus has exactly `bits` bits, from the two primes just above
    sqrt(2^(bits - 1)) (deterministic, and quick to find)."""
    p = int(gmpy2.next_prime(math.isqrt(2 ** (bits - 1)) + 1))
    q = int(gmpy2.next_prime(p))
    return paillier.keypair_from_primes(p, q, allow_insecure=True)


def refusal(error: type[Exception], call: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(error) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return str(info.value)


def test_the_generator_condition_holds_in_both_orders() -> None:
    # n + 1 generates Z*_{n^2} iff gcd(pq, (p-1)(q-1)) == 1: 5 divides 11 - 1, whichever
    # prime is named first; 11 and 17 (10 and 16 share no factor with 187) are fine
    message = "gcd(p q, (p-1)(q-1)) must be 1 for a Paillier key with g = n + 1"
    for p, q in ((5, 11), (11, 5), (3, 7), (7, 3)):
        assert refusal(ValueError, paillier.keypair_from_primes, p, q,
                       allow_insecure=True) == message
    public_key, private_key = paillier.keypair_from_primes(17, 11, allow_insecure=True)
    n = public_key.n
    assert n == 187
    # c = (1 + n m) r^n mod n^2 with r = 2 (coprime to n), m = 100
    assert paillier.decrypt(private_key, (1 + n * 100) * pow(2, n, n * n) % (n * n)) == 100


def test_primes_are_checked_by_name() -> None:
    assert refusal(ValueError, paillier.keypair_from_primes, 2, 7,
                   allow_insecure=True) == "p must be an odd prime, got 2"
    assert refusal(ValueError, paillier.keypair_from_primes, 9, 7,
                   allow_insecure=True) == "p must be an odd prime, got 9"
    assert refusal(ValueError, paillier.keypair_from_primes, 7, 1,
                   allow_insecure=True) == "q must be an odd prime, got 1"
    assert refusal(TypeError, paillier.keypair_from_primes, 7.0, 11,
                   allow_insecure=True) == "p must be an int, got float"
    assert refusal(TypeError, paillier.keypair_from_primes, 7, True,
                   allow_insecure=True) == "q must be an int, got bool"


def test_the_smallest_secure_key_is_accepted_and_one_bit_less_is_not() -> None:
    public_key, _ = key_of_bits(2048)
    assert paillier.key_bits(public_key) == 2048
    paillier.check_key_size(public_key)
    short, _ = key_of_bits(2047)
    assert refusal(ValueError, paillier.check_key_size, short) == (
        "Paillier modulus has 2047 bits; at least 2048 are required (allow_insecure=True "
        "accepts small test keys)")
    paillier.check_key_size(short, allow_insecure=True)
    # keypair_from_primes applies the same policy, and passes allow_insecure on
    primes = key_of_bits(2047)[1]
    with pytest.raises(ValueError, match="^Paillier modulus has 2047 bits; at least 2048"):
        paillier.keypair_from_primes(primes.p, primes.q)


def test_generated_keys_have_exactly_the_bits_asked_for() -> None:
    public_key, private_key = paillier.generate_keypair(2048)  # the smallest secure size
    assert paillier.key_bits(public_key) == 2048
    assert private_key.public_key == public_key
    assert paillier.key_bits(paillier.generate_keypair(64, allow_insecure=True)[0]) == 64
    assert paillier.key_bits(paillier.generate_keypair()[0]) == 3072  # ~128-bit security
    assert refusal(ValueError, paillier.generate_keypair, 2046) == (
        "key size must be >= 2048 bits, got 2046 (allow_insecure=True permits small keys in "
        "tests)")
    assert refusal(ValueError, paillier.generate_keypair, 62, allow_insecure=True) == (
        "key size must be >= 64 bits even for tests, got 62")
    assert refusal(ValueError, paillier.generate_keypair, 2049) == (
        "key size must be an even number of bits, got 2049")
    assert refusal(TypeError, paillier.generate_keypair, True) == "bits must be an int, got bool"


def test_a_received_modulus_is_refused_unless_odd_and_at_least_15() -> None:
    assert paillier.public_key_from_n(15).n == 15
    for bad in (13, 14, 16, -15):
        assert refusal(ValueError, paillier.public_key_from_n, bad) == (
            f"a Paillier modulus is an odd product of two primes >= 15, got {bad}")
    assert refusal(TypeError, paillier.public_key_from_n, 15.0) == "n must be an int, got float"


def test_keys_of_other_types_are_refused_by_name() -> None:
    for call in (paillier.key_bits, paillier.public_key_bytes, paillier.fingerprint):
        assert refusal(TypeError, call, 187) == "expected a phe PaillierPublicKey, got int"
    public_key, _ = key_of_bits(64)
    assert refusal(TypeError, paillier.decrypt, public_key, 1) == (
        "expected a phe PaillierPrivateKey, got PaillierPublicKey")
    assert refusal(TypeError, paillier.add, 187, [1]) == (
        "expected a phe PaillierPublicKey, got int")


def test_plaintext_and_ciphertext_ranges_are_refused_with_their_sizes() -> None:
    public_key, private_key = key_of_bits(64)
    n = public_key.n
    assert paillier.decrypt(private_key, paillier.encrypt(public_key, n - 1)) == n - 1
    assert refusal(ValueError, paillier.encrypt, public_key, -1) == (
        "plaintext must satisfy 0 <= m < n; got a 1-bit negative value for a 64-bit n "
        "(map signed values with from_signed)")
    assert refusal(ValueError, paillier.encrypt, public_key, n) == (
        "plaintext must satisfy 0 <= m < n; got a 64-bit value for a 64-bit n "
        "(map signed values with from_signed)")
    assert refusal(ValueError, paillier.validate_ciphertext, public_key, 0) == (
        "ciphertext must satisfy 0 < c < n^2 (a 128-bit bound), got a 0-bit value <= 0")
    assert refusal(ValueError, paillier.validate_ciphertext, public_key, n * n) == (
        "ciphertext must satisfy 0 < c < n^2 (a 128-bit bound), got a "
        f"{(n * n).bit_length()}-bit value")
    assert refusal(ValueError, paillier.validate_ciphertext, public_key, private_key.p) == (
        "ciphertext shares a factor with n (gcd(c, n) != 1): not a ciphertext")
    assert refusal(ValueError, paillier.add, public_key, [1, n * n]) == (
        "ciphertext must satisfy 0 < c < n^2 (a 128-bit bound), got a "
        f"{(n * n).bit_length()}-bit value")
    assert refusal(ValueError, paillier.to_signed, public_key, n) == (
        "plaintext must satisfy 0 <= m < n, got a 64-bit value")
    assert refusal(ValueError, paillier.to_signed, public_key, -1) == (
        "plaintext must satisfy 0 <= m < n, got a 1-bit value")
    half = (n - 1) // 2
    assert refusal(ValueError, paillier.from_signed, public_key, -half - 1) == (
        f"|value| must be <= (n-1)/2 to be recovered by to_signed; got a "
        f"{(half + 1).bit_length()}-bit value for a 64-bit n")
    assert refusal(TypeError, paillier.to_signed, public_key, 1.0) == (
        "plaintext must be an int, got float")
    assert refusal(TypeError, paillier.from_signed, public_key, 1.0) == (
        "value must be an int, got float")
    assert refusal(TypeError, paillier.int_to_bytes, 1.0) == "value must be an int, got float"
    assert refusal(ValueError, paillier.int_to_bytes, -1) == (
        "int_to_bytes needs a non-negative int, got -1")


def test_a_homomorphic_sum_multiplies_every_ciphertext_modulo_n_squared() -> None:
    public_key, private_key = key_of_bits(64)
    n = public_key.n
    values = [n - 1, n - 2, 3, 5]  # the plain sum wraps modulo n
    ciphertexts = [paillier.encrypt(public_key, m) for m in values]
    total = paillier.add(public_key, ciphertexts)
    assert 0 < total < n * n
    assert total == math.prod(ciphertexts) % (n * n)
    assert paillier.decrypt(private_key, total) == sum(values) % n == 5
