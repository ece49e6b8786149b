"""Secure summation of the features' column statistics: only the network's totals come out.

Every agent i holds its training features x (n_i rows, d columns; a table's empty number cells
NaN) and the secret seeds phase I shares with each neighbour (efpsn/masks/seeds.py). It encodes
its local vector

    v_i = [n_i, c_1, ..., c_d, sum x_1, ..., sum x_d, sum x_1^2, ..., sum x_d^2]

(c_k its rows where column k holds a value, the sums over those rows) as integers in fixed point
(FRACTION_BITS fractional bits; the counts as integers) modulo M = 2^STAT_BITS, and adds one
uniform mask per edge:

    masked_i = v_i + sum_{j in N(i)} sign_ij u(e_ij)   (mod M),

u(e) the edge's uniform integers mod M read from ChaCha20 (key e, nonce counter 0 || "efps" ||
the flood's epoch, 0 unless a departure restarted it),
e_ij = SHA-256("efpsn stats edge" || s_lo,hi || s_hi,lo) from the two seeds both ends hold, and
sign_ij = +1 when i < j, -1 otherwise. Every edge's two terms cancel mod M, so

    sum_i masked_i = sum_i v_i   (mod M)  exactly,

and a total below M/2 in magnitude decodes exactly: every agent that sums the same masked
vectors gets the same integers, hence the same mean and standard deviation bit for bit.

What one masked vector discloses: nothing to anyone who lacks one of its edges' seeds (a
uniform pad mod M is a one-time pad). Like the optimisation's masks, it does NOT protect an
agent from all of its neighbours together (they hold every seed of its edges) nor from a
coordinator that colludes with them. What the sum discloses, by design, to every agent: the
total sample count and every column's global mean and variance, and how many of its cells hold
a value in all (disclosed by design: the user guide for tables, docs/own-data.md, says so for
`scale standard`). The mean is over the cells that hold a value: every party fills its empty
cells with it, and the standard deviation is the filled column's (scikit-learn's
SimpleImputer(strategy="mean") then StandardScaler, on the pooled rows).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from efpsn.masks.seeds import EdgeSeeds

__all__ = ["FRACTION_BITS", "MODULUS", "STAT_BITS", "Totals", "decode_totals", "edge_key",
           "encode_value", "local_vector", "masked_vector", "stats_mask", "sum_masked"]

STAT_BITS = 1024
"""The modulus M = 2^STAT_BITS of the masked sums."""
MODULUS = 1 << STAT_BITS
FRACTION_BITS = 128
"""Fixed point: a float v travels as round(v 2^FRACTION_BITS), exact for |v| >= 2^-75 to
float64's last bit, and with absolute error 2^-129 below."""
_WORD = STAT_BITS // 8  # bytes of keystream per mask entry
_EDGE_DOMAIN = b"efpsn stats edge"
_NONCE = b"\x00\x00\x00\x00" + b"efps"  # + the flood's epoch, 8 bytes little-endian
_LIMIT = 1 << (STAT_BITS - 2)  # |total| below M/4: room for many agents' worth of headroom


def encode_value(value: float) -> int:
    """round(value 2^FRACTION_BITS) as an int, exactly (ldexp by a power of two is exact, and
    Python's round of a float to an int is exact); ValueError for non-finite values."""
    if not math.isfinite(value):
        raise ValueError(f"a column statistic is not finite ({value}); expected finite features")
    return round(math.ldexp(float(value), FRACTION_BITS))


def local_vector(features: np.ndarray) -> list[int]:
    """v_i of an agent's training features (rows: samples; any trailing shape, flattened; NaN
    an empty cell): [n_i, each column's cells with a value, column sums, column sums of
    squares], the sums over the cells with a value, in fixed point. Not yet masked: it stays
    with the agent."""
    flat = np.asarray(features, dtype=np.float64).reshape(len(features), -1)
    empty = np.isnan(flat)
    if empty.any():
        present = (~empty).sum(axis=0)
        flat = np.where(empty, 0.0, flat)
    else:
        present = np.full(flat.shape[1], len(flat))
    sums = flat.sum(axis=0)
    squares = np.einsum("ij,ij->j", flat, flat)
    out = ([len(flat)] + [int(c) for c in present] + [encode_value(v) for v in sums]
           + [encode_value(v) for v in squares])
    top = max(abs(v) for v in out)
    if top >= _LIMIT:
        raise ValueError(f"features too large for the secure sum of column statistics (a sum "
                         f"of squares reaches 2^{top.bit_length() - FRACTION_BITS}); expected "
                         "features below about 1e100 (rescale them, or give public scales in "
                         "schema.json)")
    return out


def edge_key(low_sent: bytes, high_sent: bytes) -> bytes:
    """The edge's statistics key from the seed the lower-indexed agent sent and the one the
    higher-indexed agent sent (both ends hold both; another domain than the masks' keys)."""
    return hashlib.sha256(_EDGE_DOMAIN + low_sent + high_sent).digest()


def _uniform(key: bytes, length: int, epoch: int = 0) -> list[int]:
    nonce = _NONCE + epoch.to_bytes(8, "little")
    stream = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    data = stream.update(bytes(_WORD * length))
    return [int.from_bytes(data[k * _WORD:(k + 1) * _WORD], "little") for k in range(length)]


def stats_mask(seeds: EdgeSeeds, length: int, epoch: int = 0) -> list[int]:
    """sum_j sign_ij u(e_ij) mod M: agent seeds.agent's pad for a vector of `length` integers.
    `epoch`: a flood started again after `epoch` departure decisions draws fresh pads (the
    stream at nonce epoch), so an agent's vectors of two floods differ by unrelated pads and
    reveal no pad of an edge (hence no departed agent's statistics)."""
    if not isinstance(seeds, EdgeSeeds):
        raise TypeError(f"seeds must be EdgeSeeds, got {type(seeds).__name__}")
    sent, received = dict(seeds.sent), dict(seeds.received)
    pad = [0] * length
    for j in seeds.neighbours:
        low = seeds.agent < j
        key = edge_key(sent[j], received[j]) if low else edge_key(received[j], sent[j])
        for k, u in enumerate(_uniform(key, length, epoch)):
            pad[k] = (pad[k] + u) % MODULUS if low else (pad[k] - u) % MODULUS
    return pad


def masked_vector(features: np.ndarray, seeds: EdgeSeeds | None, epoch: int = 0) -> list[int]:
    """What agent i publishes: its local vector plus its pad, mod M (seeds None: no pad, for
    runs without masks, which promise nothing)."""
    values = local_vector(features)
    if seeds is None:
        return [v % MODULUS for v in values]
    return [(v + u) % MODULUS for v, u in zip(values, stats_mask(seeds, len(values), epoch),
                                             strict=True)]


def sum_masked(vectors: Sequence[Sequence[int]]) -> list[int]:
    """sum_i masked_i mod M, in agent order (the order does not change an integer sum)."""
    if not vectors or len({len(v) for v in vectors}) != 1:
        raise ValueError("expected one masked vector per agent, all of one length")
    total = [0] * len(vectors[0])
    for vector in vectors:
        for k, v in enumerate(vector):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MODULUS:
                raise ValueError(f"a masked statistic must be an integer in [0, 2^{STAT_BITS})")
            total[k] = (total[k] + v) % MODULUS
    return total


@dataclass(frozen=True)
class Totals:
    """The network's totals: sample count, each column's cells with a value (`present`;
    empty: every row's), column sums and sums of squares over them (fixed point)."""

    count: int
    sums: tuple[int, ...]
    squares: tuple[int, ...]
    present: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.present:
            object.__setattr__(self, "present", (self.count,) * len(self.sums))

    def mean(self) -> np.ndarray:
        """Every column's global mean over its cells with a value, the float64 nearest the
        exact quotient (0 for a column without any: nothing to fill with)."""
        return np.array([float(Fraction(s, c << FRACTION_BITS)) if c else 0.0
                         for s, c in zip(self.sums, self.present, strict=True)],
                        dtype=np.float64)

    def std(self) -> np.ndarray:
        """Every column's global standard deviation once its empty cells are filled with the
        mean (population, as scikit-learn's StandardScaler after SimpleImputer), from the exact
        variance (q - s^2 / c) / n rounded once to float64; 1 for a column that never varies
        (it is then only centred, as StandardScaler does)."""
        out = []
        unit = 1 << FRACTION_BITS
        for s, q, c in zip(self.sums, self.squares, self.present, strict=True):
            variance = ((Fraction(q, unit) - Fraction(s, unit) ** 2 / c) / self.count if c
                        else Fraction(0))
            std = math.sqrt(float(variance)) if variance > 0 else 0.0
            out.append(std if std > 0 else 1.0)
        return np.array(out, dtype=np.float64)

    @property
    def filled(self) -> bool:
        """Whether any column has empty cells somewhere in the network."""
        return any(c != self.count for c in self.present)


def decode_totals(total: Sequence[int]) -> Totals:
    """The summed vector (mod M) as Totals; ValueError when it cannot be a sum of statistics
    (a count below 1, a column's present cells outside [0, count], a sum of squares below
    zero, or a length that is not 1 + 3d)."""
    if len(total) < 4 or (len(total) - 1) % 3:
        raise ValueError(f"a summed statistics vector has 1 + 3d entries, got {len(total)}")
    signed = [v - MODULUS if v >= MODULUS // 2 else v for v in total]
    d = (len(signed) - 1) // 3
    count = signed[0]
    present = tuple(signed[1:1 + d])
    sums, squares = tuple(signed[1 + d:1 + 2 * d]), tuple(signed[1 + 2 * d:])
    if count < 1 or any(q < 0 for q in squares) or any(not 0 <= c <= count for c in present):
        raise ValueError("the summed column statistics are inconsistent (a count below 1, a "
                         "column with more values than rows, or a negative sum of squares): "
                         "an agent sent a wrong masked vector")
    return Totals(count=count, sums=sums, squares=squares, present=present)
