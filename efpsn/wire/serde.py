"""Conversions between efpsn.v1 protobuf messages and plain Python, NumPy and torch values.

Tensors and Paillier values live here; the torch-free records (headers, run parameters,
assignments, WireError) live in efpsn.wire.records and are imported from there.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from efpsn.crypto import paillier
from efpsn.wire import limits
from efpsn.wire.records import UINT32_END, WireError
from efpsn.wire.v1 import agent_pb2, common_pb2

FINGERPRINT_BYTES = 32  # sha256


# --------------------------------------------------------------------------------------- tensors

# Wire dtype name -> (little-endian NumPy dtype, torch dtype). Nothing else may travel.
_DTYPES: dict[str, tuple[np.dtype, torch.dtype]] = {
    "float64": (np.dtype("<f8"), torch.float64),
    "float32": (np.dtype("<f4"), torch.float32),
    "int64": (np.dtype("<i8"), torch.int64),
}
WIRE_DTYPES: tuple[str, ...] = tuple(_DTYPES)
_NATIVE: dict[str, np.dtype] = {name: wire.newbyteorder("=") for name, (wire, _) in _DTYPES.items()}
_TORCH_TO_WIRE: dict[torch.dtype, str] = {t: name for name, (_, t) in _DTYPES.items()}


def tensor_to_proto(value: torch.Tensor | np.ndarray) -> common_pb2.Tensor:
    """Encode a float64/float32/int64 tensor as raw little-endian C-order bytes plus dtype and shape."""
    name, array = wire_array(value)
    return common_pb2.Tensor(dtype=name, shape=list(array.shape), data=array.tobytes(order="C"))


def wire_array(value: torch.Tensor | np.ndarray) -> tuple[str, np.ndarray]:
    """A tensor's wire dtype name and its values as a C-contiguous little-endian array (the
    tensor's own memory when it already is one: no copy)."""
    if isinstance(value, torch.Tensor):
        name = _TORCH_TO_WIRE.get(value.dtype)
        if name is None:
            raise WireError(f"tensor dtype must be one of {WIRE_DTYPES}, got {value.dtype}")
        array = value.detach().cpu().resolve_conj().resolve_neg().contiguous().numpy()
    elif isinstance(value, np.ndarray):
        name = value.dtype.name  # byte-order independent: '>f8' is also "float64"
        if name not in _DTYPES or value.dtype.kind not in "fi":
            raise WireError(f"array dtype must be one of {WIRE_DTYPES}, got {value.dtype}")
        array = value
    else:
        raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(value).__name__}")
    wire = np.ascontiguousarray(array).astype(_DTYPES[name][0], copy=False)
    return name, wire.reshape(array.shape)  # ascontiguousarray makes a 0-d array 1-d


def tensor_from_proto(
    pb: common_pb2.Tensor,
    *,
    max_elements: int = limits.MAX_TENSOR_ELEMENTS,
    expected_shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """Decode and validate a Tensor; the result is a fresh, writable CPU tensor (never a view)."""
    if not isinstance(pb, common_pb2.Tensor):
        raise TypeError(f"expected efpsn.v1.Tensor, got {type(pb).__name__}")
    return tensor_from_parts(pb.dtype, pb.shape, pb.data, max_elements=max_elements,
                              expected_shape=expected_shape)


def tensor_from_parts(dtype: str, dims: Sequence[int], data: bytes, *, max_elements: int,
                       expected_shape: Sequence[int] | None) -> torch.Tensor:
    """tensor_from_proto on fields already read (each read of a bytes field copies it): a
    fresh, writable tensor (array_from_parts's checks, then one copy)."""
    view = array_from_parts(dtype, dims, data, max_elements=max_elements,
                            expected_shape=expected_shape)
    return torch.from_numpy(view.copy())  # a copy of a read-only array is writable


def array_from_parts(dtype: str, dims: Sequence[int], data: bytes, *, max_elements: int,
                     expected_shape: Sequence[int] | None) -> np.ndarray:
    """A tensor's fields checked (dtype, dimensions, element cap, expected shape, byte count)
    and its values as a READ-ONLY array in native byte order over `data` itself: no copy on a
    little-endian host (a copy, made read-only too, where bytes must be swapped). The array
    holds a reference to `data`, so the bytes live as long as the array; a write into it
    raises ValueError (a received message is the sender's, read and never changed)."""
    if dtype not in _DTYPES:
        raise WireError(f"tensor dtype must be one of {WIRE_DTYPES}, got {dtype!r}")
    wire_dtype = _DTYPES[dtype][0]
    shape = tuple(int(d) for d in dims)
    if len(shape) > limits.MAX_TENSOR_DIMS:
        raise WireError(f"tensor has {len(shape)} dimensions, more than {limits.MAX_TENSOR_DIMS}")
    if any(d < 0 for d in shape):
        raise WireError(f"tensor shape must have non-negative dimensions, got {list(shape)}")
    count = math.prod(shape)  # exact Python int: no overflow however large the dimensions
    if count > max_elements:
        raise WireError(
            f"tensor of shape {list(shape)} has {count} elements, more than the cap {max_elements}"
        )
    if expected_shape is not None and shape != tuple(expected_shape):
        raise WireError(f"tensor shape must be {list(expected_shape)}, got {list(shape)}")
    expected_bytes = count * wire_dtype.itemsize
    if len(data) != expected_bytes:
        raise WireError(
            f"tensor data must be {expected_bytes} bytes ({count} x {dtype} for shape "
            f"{list(shape)}), got {len(data)}"
        )
    native = _NATIVE[dtype]
    if count == 0:
        array = np.empty(shape, dtype=native)
    else:
        array = np.frombuffer(data, dtype=wire_dtype).reshape(shape)
        if wire_dtype != native:  # a big-endian host: swapped into a native copy
            array = array.astype(native)
    array.setflags(write=False)
    return array


# ---------------------------------------------------------------------------------- big integers


def int_to_bytes(value: int) -> bytes:
    """Unsigned big-endian bytes of minimal length; zero is b"\\x00" (paillier.int_to_bytes)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    if value < 0:
        raise WireError(f"only non-negative integers travel on the wire, got {value}")
    return paillier.int_to_bytes(value)


def int_from_bytes(data: bytes, *, max_bytes: int | None = None) -> int:
    """Inverse of int_to_bytes; rejects empty input, leading zero bytes and oversize input."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise WireError("integer must be at least one byte long, got empty bytes")
    if max_bytes is not None and len(data) > max_bytes:
        raise WireError(f"integer must be at most {max_bytes} bytes long, got {len(data)}")
    if len(data) > 1 and data[0] == 0:
        raise WireError(f"integer encoding of {len(data)} bytes is not minimal (leading zero byte)")
    return int.from_bytes(data, "big")


key_fingerprint = paillier.fingerprint_of_n  # sha256 of n's minimal big-endian bytes


def public_key_to_proto(n: int) -> common_pb2.PaillierPublicKey:
    """Encode a Paillier public key (given by its modulus n) with its fingerprint."""
    _check_modulus(n, max_bits=limits.MAX_KEY_BITS)
    data = int_to_bytes(n)
    return common_pb2.PaillierPublicKey(n=data, fingerprint=hashlib.sha256(data).digest())


def public_key_from_proto(
    pb: common_pb2.PaillierPublicKey, *, max_bits: int = limits.MAX_KEY_BITS
) -> int:
    """Decode a public key to its modulus n, checking the encoding and the fingerprint."""
    if not isinstance(pb, common_pb2.PaillierPublicKey):
        raise TypeError(f"expected efpsn.v1.PaillierPublicKey, got {type(pb).__name__}")
    try:
        n = int_from_bytes(pb.n, max_bytes=(max_bits + 7) // 8)
    except WireError as exc:
        raise WireError(f"public key n (at most {max_bits} bits): {exc}") from None
    _check_modulus(n, max_bits=max_bits)
    if len(pb.fingerprint) != FINGERPRINT_BYTES:
        raise WireError(
            f"key fingerprint must be {FINGERPRINT_BYTES} bytes, got {len(pb.fingerprint)}"
        )
    if hashlib.sha256(pb.n).digest() != pb.fingerprint:
        raise WireError("key fingerprint is not sha256 of n: the key was corrupted or forged")
    return n


def _check_modulus(n: int, *, max_bits: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"Paillier modulus n must be an int, got {type(n).__name__}")
    if n < 3 or n % 2 == 0:
        raise WireError(f"Paillier modulus n must be an odd integer >= 3, got {n}")
    if n.bit_length() > max_bits:
        raise WireError(f"Paillier modulus has {n.bit_length()} bits, more than {max_bits}")


@dataclass(frozen=True)
class CiphertextBatch:
    """Plain form of efpsn.v1.CiphertextBatch."""

    key_fingerprint: bytes
    ciphertexts: tuple[int, ...]
    num_coefficients: int
    packed: bool


def ciphertexts_to_proto(
    fingerprint: bytes, cts: Sequence[int], *, num_coefficients: int, packed: bool
) -> common_pb2.CiphertextBatch:
    """Encode ciphertexts under the key with this fingerprint (big-endian, minimal length)."""
    batch = CiphertextBatch(bytes(fingerprint), tuple(cts), num_coefficients, packed)
    _check_batch(batch)
    return common_pb2.CiphertextBatch(
        key_fingerprint=batch.key_fingerprint,
        ciphertexts=[int_to_bytes(c) for c in batch.ciphertexts],
        num_coefficients=num_coefficients,
        packed=packed,
    )


def ciphertexts_from_proto(
    pb: common_pb2.CiphertextBatch,
    *,
    expected_fingerprint: bytes | None = None,
    expected_num_coefficients: int | None = None,
    expected_packed: bool | None = None,
    max_ciphertext_bytes: int = limits.MAX_CIPHERTEXT_BYTES,
) -> CiphertextBatch:
    """Decode a CiphertextBatch; range checks against n^2 belong to the Paillier layer."""
    if not isinstance(pb, common_pb2.CiphertextBatch):
        raise TypeError(f"expected efpsn.v1.CiphertextBatch, got {type(pb).__name__}")
    if expected_fingerprint is not None and pb.key_fingerprint != expected_fingerprint:
        raise WireError(
            "ciphertexts are under key "
            f"{pb.key_fingerprint.hex()[:16]}..., expected {expected_fingerprint.hex()[:16]}..."
        )
    if expected_num_coefficients is not None and pb.num_coefficients != expected_num_coefficients:
        raise WireError(
            f"batch must carry {expected_num_coefficients} coefficients, got {pb.num_coefficients}"
        )
    if expected_packed is not None and pb.packed != expected_packed:
        raise WireError(f"batch packed must be {expected_packed}, got {pb.packed}")
    cts = []
    for i, data in enumerate(pb.ciphertexts):
        try:
            cts.append(int_from_bytes(data, max_bytes=max_ciphertext_bytes))
        except WireError as exc:
            raise WireError(f"ciphertext {i}: {exc}") from None
    batch = CiphertextBatch(pb.key_fingerprint, tuple(cts), pb.num_coefficients, pb.packed)
    _check_batch(batch)
    return batch


def _check_batch(batch: CiphertextBatch) -> None:
    if len(batch.key_fingerprint) != FINGERPRINT_BYTES:
        raise WireError(
            f"key fingerprint must be {FINGERPRINT_BYTES} bytes, got {len(batch.key_fingerprint)}"
        )
    n_coef = batch.num_coefficients
    if isinstance(n_coef, bool) or not isinstance(n_coef, int) or not 1 <= n_coef < UINT32_END:
        raise WireError(f"num_coefficients must be an int in [1, 2^32), got {n_coef!r}")
    if not isinstance(batch.packed, bool):
        raise TypeError(f"packed must be a bool, got {type(batch.packed).__name__}")
    count = len(batch.ciphertexts)
    if batch.packed and not 1 <= count <= n_coef:
        raise WireError(f"a packed batch of {n_coef} coefficients needs 1..{n_coef} ciphertexts, "
                        f"got {count}")
    if not batch.packed and count != n_coef:
        raise WireError(f"an unpacked batch needs one ciphertext per coefficient ({n_coef}), "
                        f"got {count}")
    for i, c in enumerate(batch.ciphertexts):
        if isinstance(c, bool) or not isinstance(c, int):
            raise TypeError(f"ciphertext {i} must be an int, got {type(c).__name__}")
        if c <= 0:
            raise WireError(f"ciphertext {i} must be positive, got {c}")



# ------------------------------------------------------------------------------ agent messages


def public_key_message(*, header: common_pb2.Header, n: int) -> agent_pb2.PublicKeyMessage:
    """PublicKeyMessage carrying the Paillier modulus n."""
    return agent_pb2.PublicKeyMessage(header=header, key=public_key_to_proto(n))


def shares_message(
    *,
    header: common_pb2.Header,
    fingerprint: bytes,
    ciphertexts: Sequence[int],
    num_coefficients: int,
    packed: bool,
) -> agent_pb2.SharesMessage:
    """SharesMessage carrying ciphertexts under the recipient's key."""
    batch = ciphertexts_to_proto(
        fingerprint, ciphertexts, num_coefficients=num_coefficients, packed=packed
    )
    return agent_pb2.SharesMessage(header=header, batch=batch)


def shares_digest(pb: common_pb2.CiphertextBatch) -> bytes:
    """sha256 of a CiphertextBatch as sent (deterministic serialization)."""
    if not isinstance(pb, common_pb2.CiphertextBatch):
        raise TypeError(f"expected efpsn.v1.CiphertextBatch, got {type(pb).__name__}")
    return hashlib.sha256(pb.SerializeToString(deterministic=True)).digest()
