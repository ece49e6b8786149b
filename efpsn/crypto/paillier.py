"""Paillier keys, fingerprints and raw integer encrypt/add/decrypt: the only module using phe."""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Sequence

import gmpy2
from phe import paillier as _phe

__all__ = [
    "DEFAULT_KEY_BITS",
    "MIN_KEY_BITS",
    "PrivateKey",
    "PublicKey",
    "add",
    "check_key_size",
    "decrypt",
    "encrypt",
    "fingerprint",
    "fingerprint_of_n",
    "from_signed",
    "generate_keypair",
    "int_to_bytes",
    "key_bits",
    "keypair_from_primes",
    "public_key_bytes",
    "public_key_from_n",
    "to_signed",
    "validate_ciphertext",
]

PublicKey = _phe.PaillierPublicKey
PrivateKey = _phe.PaillierPrivateKey

MIN_KEY_BITS = 2048  # below this the modulus is factorable with public effort (NIST SP 800-57)
DEFAULT_KEY_BITS = 3072  # ~128-bit security, phe's default too
INSECURE_FLOOR_BITS = 64  # even test keys must leave room for a plaintext


# --------------------------------------------------------------------------- integers <-> bytes
def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def int_to_bytes(value: int) -> bytes:
    """Big-endian bytes of a non-negative int, minimal length (0 is the single byte 0x00)."""
    value = _check_int("value", value)
    if value < 0:
        raise ValueError(f"int_to_bytes needs a non-negative int, got {value}")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


# --------------------------------------------------------------------------- keys
def _check_public_key(public_key: object) -> PublicKey:
    if not isinstance(public_key, PublicKey):
        raise TypeError(f"expected a phe PaillierPublicKey, got {type(public_key).__name__}")
    return public_key


def key_bits(public_key: PublicKey) -> int:
    """Bit length of the modulus n."""
    return _check_public_key(public_key).n.bit_length()


def check_key_size(public_key: PublicKey, *, allow_insecure: bool = False) -> None:
    """ValueError when n is shorter than MIN_KEY_BITS (unless allow_insecure, for tests only)."""
    bits = key_bits(public_key)
    if bits < MIN_KEY_BITS and not allow_insecure:
        raise ValueError(
            f"Paillier modulus has {bits} bits; at least {MIN_KEY_BITS} are required "
            "(allow_insecure=True accepts small test keys)"
        )


def generate_keypair(
    bits: int = DEFAULT_KEY_BITS, *, allow_insecure: bool = False
) -> tuple[PublicKey, PrivateKey]:
    """A fresh key pair with an exactly `bits`-bit modulus n = p q (primes from the OS CSPRNG).

    phe uses g = n + 1 and two primes of bits/2 bits each; `bits` must be even (an odd size would
    make phe's search loop forever) and >= MIN_KEY_BITS unless allow_insecure=True.
    """
    bits = _check_int("bits", bits)
    if bits % 2:
        raise ValueError(f"key size must be an even number of bits, got {bits}")
    if bits < INSECURE_FLOOR_BITS:
        raise ValueError(
            f"key size must be >= {INSECURE_FLOOR_BITS} bits even for tests, got {bits}"
        )
    if bits < MIN_KEY_BITS and not allow_insecure:
        raise ValueError(
            f"key size must be >= {MIN_KEY_BITS} bits, got {bits} "
            "(allow_insecure=True permits small keys in tests)"
        )
    return _phe.generate_paillier_keypair(n_length=bits)


def keypair_from_primes(
    p: int, q: int, *, allow_insecure: bool = False
) -> tuple[PublicKey, PrivateKey]:
    """The key pair with n = p q for two given distinct primes (regression vectors, key storage)."""
    p, q = _check_int("p", p), _check_int("q", q)
    if p == q:
        raise ValueError("p and q must be distinct primes, got p == q")
    for name, value in (("p", p), ("q", q)):
        if value < 3 or not gmpy2.is_prime(value, 50):
            raise ValueError(f"{name} must be an odd prime, got {value}")
    n = p * q
    # g = n + 1 is a valid generator iff gcd(n, (p-1)(q-1)) == 1 (always so for equal-size primes).
    if gmpy2.gcd(n, (p - 1) * (q - 1)) != 1:
        raise ValueError("gcd(p q, (p-1)(q-1)) must be 1 for a Paillier key with g = n + 1")
    public_key = PublicKey(n)
    check_key_size(public_key, allow_insecure=allow_insecure)
    return public_key, PrivateKey(public_key, p, q)


def public_key_from_n(n: int) -> PublicKey:
    """The public key with modulus n (as received from a neighbour). Size policy: check_key_size."""
    n = _check_int("n", n)
    if n < 15 or n % 2 == 0:
        raise ValueError(f"a Paillier modulus is an odd product of two primes >= 15, got {n}")
    return PublicKey(n)


def public_key_bytes(public_key: PublicKey) -> bytes:
    """The wire form of a public key: n, big-endian, minimal length (g = n + 1 is implied)."""
    return int_to_bytes(_check_public_key(public_key).n)


def fingerprint_of_n(n: int) -> bytes:
    """sha256 of n's minimal big-endian bytes (32 bytes): how ciphertexts name their key.

    The single definition: the wire layer (serde.key_fingerprint) uses this function too.
    """
    return hashlib.sha256(int_to_bytes(n)).digest()


def fingerprint(public_key: PublicKey) -> bytes:
    """fingerprint_of_n(public_key.n), to name and pin a key."""
    return fingerprint_of_n(_check_public_key(public_key).n)


# --------------------------------------------------------------------------- ciphertexts
def validate_ciphertext(public_key: PublicKey, ciphertext: int) -> None:
    """ValueError unless 0 < c < n^2 and gcd(c, n) == 1 (c is then a unit of Z*_{n^2})."""
    n = _check_public_key(public_key).n
    c = _check_int("ciphertext", ciphertext)
    if not 0 < c < public_key.nsquare:
        raise ValueError(
            f"ciphertext must satisfy 0 < c < n^2 (a {2 * n.bit_length()}-bit bound), got a "
            f"{c.bit_length()}-bit value{' <= 0' if c <= 0 else ''}"
        )
    if gmpy2.gcd(c, n) != 1:
        raise ValueError("ciphertext shares a factor with n (gcd(c, n) != 1): not a ciphertext")


def encrypt(public_key: PublicKey, plaintext: int) -> int:
    """c = (1 + n m) r^n mod n^2 for 0 <= m < n, with a fresh uniformly random r every call.

    phe's raw_encrypt with r_value=None draws r with random.SystemRandom().randrange(1, n) (the OS
    CSPRNG) on every call; we never pass r_value, so no obfuscator is ever reused (unlike the
    paper's per-agent r_i). g = n + 1 gives g^m = 1 + n m mod n^2, so only r^n needs a powmod.
    """
    n = _check_public_key(public_key).n
    m = _check_int("plaintext", plaintext)
    if not 0 <= m < n:
        raise ValueError(
            f"plaintext must satisfy 0 <= m < n; got a {m.bit_length()}-bit "
            f"{'negative ' if m < 0 else ''}value for a {n.bit_length()}-bit n "
            "(map signed values with from_signed)"
        )
    return int(public_key.raw_encrypt(m))


def add(public_key: PublicKey, ciphertexts: Sequence[int]) -> int:
    """Homomorphic sum: prod_l c_l mod n^2 decrypts to sum_l m_l mod n."""
    _check_public_key(public_key)
    if len(ciphertexts) == 0:
        raise ValueError("add needs at least one ciphertext, got none")
    nsquare = gmpy2.mpz(public_key.nsquare)
    acc = gmpy2.mpz(1)
    for c in ciphertexts:
        validate_ciphertext(public_key, c)
        acc = (acc * c) % nsquare
    return int(acc)


def decrypt(private_key: PrivateKey, ciphertext: int) -> int:
    """The raw plaintext in [0, n) (phe's CRT decryption); to_signed maps it to a signed int."""
    if not isinstance(private_key, PrivateKey):
        raise TypeError(f"expected a phe PaillierPrivateKey, got {type(private_key).__name__}")
    validate_ciphertext(private_key.public_key, ciphertext)
    return int(private_key.raw_decrypt(int(ciphertext)))


def to_signed(public_key: PublicKey, plaintext: int) -> int:
    """Map [0, n) to [-(n-1)/2, (n-1)/2]: residues above (n-1)/2 stand for plaintext - n."""
    n = _check_public_key(public_key).n
    m = _check_int("plaintext", plaintext)
    if not 0 <= m < n:
        raise ValueError(f"plaintext must satisfy 0 <= m < n, got a {m.bit_length()}-bit value")
    return m - n if m > (n - 1) // 2 else m


def from_signed(public_key: PublicKey, value: int) -> int:
    """Inverse of to_signed: a signed int |v| <= (n-1)/2 as its residue modulo n."""
    n = _check_public_key(public_key).n
    v = _check_int("value", value)
    if abs(v) > (n - 1) // 2:
        raise ValueError(
            f"|value| must be <= (n-1)/2 to be recovered by to_signed; got a "
            f"{v.bit_length()}-bit value for a {n.bit_length()}-bit n"
        )
    return v % n
