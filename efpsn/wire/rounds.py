"""Phase II's round messages on the wire: encoding, the one validation at the edge, digests.

A neighbour's round message is checked here, once, wherever it arrives (PutRound, the round
stream, a GetRound reply): header (run, phase, sender, round), tensor names, shapes, dtype
float64 and finiteness. What passes inward is a plain `RoundRecord`; whether the agent takes
it (window, duplicates) is efpsn/ledger.py's to decide.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from efpsn.optimize.stopping import CEILING, FLOOR, STOP_KEY, TERMS
from efpsn.wire import limits
from efpsn.wire.records import Phase, WireError, make_header, validate_header
from efpsn.wire.serde import array_from_parts, tensor_to_proto, wire_array
from efpsn.wire.v1 import agent_pb2

__all__ = [
    "RoundRecord",
    "decode_round_message",
    "encode_round",
    "message_from_proto",
    "message_to_proto",
    "parse_round",
    "round_digest",
    "round_reply",
    "round_request",
]


@dataclass(frozen=True)
class RoundRecord:
    """A neighbour's round message that passed every wire check: who sent it, for which round,
    its float64 tensors by name as READ-ONLY arrays over the received bytes (no copy: a write
    raises ValueError; the stop integers, under STOP_KEY, a read-only int64 array), and the
    keyed digest of its content (header excluded)."""

    sender: str
    round: int
    tensors: dict[str, np.ndarray]
    digest: bytes


def message_to_proto(
    message: Mapping[str, torch.Tensor | np.ndarray], *, header: Any
) -> agent_pb2.RoundMessage:
    """Encode an algorithm's outbox {name: tensor} as a RoundMessage, tensors sorted by name
    (the stop rule's integers, under STOP_KEY, go in RoundMessage.stop)."""
    stop = _stop_values(message)
    names = sorted(name for name in message if name != STOP_KEY)
    for name in names:
        if not isinstance(name, str) or not name:
            raise WireError(f"tensor names must be non-empty strings, got {name!r}")
    tensors = [
        agent_pb2.NamedTensor(name=name, tensor=tensor_to_proto(message[name]))
        for name in names
    ]
    return agent_pb2.RoundMessage(header=header, tensors=tensors, stop=stop)


def _stop_values(message: Mapping[str, Any]) -> list[int]:
    """The stop integers of an outbox (empty: none), checked as a receiver checks them."""
    values = message.get(STOP_KEY)
    if values is None:
        return []
    out = [int(v) for v in values.tolist()]
    _check_stop(out)
    return out


def _check_stop(values: Sequence[int]) -> None:
    if values and (len(values) != TERMS or not all(FLOOR <= v <= CEILING for v in values)):
        raise WireError(f"stop must be empty or {TERMS} integers in [{FLOOR}, {CEILING}], got "
                        f"{_few(list(values))}")


def encode_round(message: Mapping[str, torch.Tensor], *, run_id: str, sender: str,
                 round_: int) -> bytes:
    """My round message, serialized once for every neighbour (and kept for replays): the bytes
    message_to_proto(...).SerializeToString() gives (tests/test_wire.py checks it), written
    straight from the tensors' memory, so the 63 KB of a round are copied once, not three
    times (into bytes, into the message, into its serialization)."""
    header = make_header(run_id=run_id, sender=sender, round=round_, phase=Phase.OPTIMIZE)
    parts: list[bytes | memoryview] = []
    _put(parts, 1, [header.SerializeToString()])
    stop = _stop_values(message)
    for name in sorted(name for name in message if name != STOP_KEY):
        if not isinstance(name, str) or not name:
            raise WireError(f"tensor names must be non-empty strings, got {name!r}")
        dtype, array = wire_array(message[name])
        key = (name, dtype, array.shape)
        head = _HEADS.get(key)
        if head is None:
            head = _named_tensor_head(name, dtype, array.shape, array.nbytes)
            if len(_HEADS) >= 256:  # bounded: a run's messages have a few fixed tensors
                _HEADS.clear()
            _HEADS[key] = head
        parts.append(head)
        if array.size:
            parts.append(memoryview(array).cast("B"))
    if stop:  # packed sint32: zigzag varints
        _put(parts, 3, [b"".join(_varint((v << 1) ^ (v >> 31)) for v in stop)])
    return b"".join(parts)


# (name, dtype, shape) -> the bytes of a NamedTensor field up to its data: the same every round
_HEADS: dict[tuple[str, str, tuple[int, ...]], bytes] = {}


def _named_tensor_head(name: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    """A RoundMessage's tensors field (2) holding NamedTensor(name, Tensor(dtype, shape,
    data of `nbytes`)), written up to where the data's bytes go (none: an empty data field is
    absent in proto3)."""
    tensor = _field(1, dtype.encode())
    if shape:  # proto3: a repeated field is packed, an empty one absent
        tensor += _field(2, b"".join(_varint(d) for d in shape))
    if nbytes:
        tensor += _varint(3 << 3 | 2) + _varint(nbytes)
    named = _field(1, name.encode()) + _varint(2 << 3 | 2) + _varint(len(tensor) + nbytes) + tensor
    return _varint(2 << 3 | 2) + _varint(len(named) + nbytes) + named


def _field(field: int, value: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(field << 3 | 2) + _varint(len(value)) + value


def _put(out: list[bytes | memoryview], field: int, value: list[bytes | memoryview]) -> None:
    """Append a length-delimited protobuf field (wire type 2) made of `value`'s pieces."""
    out.append(_varint(field << 3 | 2) + _varint(sum(len(v) for v in value)))
    out.extend(value)


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def parse_round(pb: agent_pb2.RoundMessage, *, run_id: str, senders: Collection[str],
                shapes: Mapping[str, Sequence[int]], seed: int,
                round_: int | None = None) -> RoundRecord:
    """Every wire check of a neighbour's round message, in one pass over its bytes: header
    (this run, phase OPTIMIZE, a sender in `senders`, round `round_` if given), exactly the
    tensors of `shapes` with those shapes, float64, finite; its digest keyed by `seed` (the
    receiving ledger's, RoundLedger.seed). WireError says what is wrong. The tensors are
    read-only views of the received bytes (RoundRecord)."""
    header = validate_header(pb.header, run_id=run_id, phase=Phase.OPTIMIZE, senders=senders,
                             round=round_)
    arrays, digest = decode_round_message(pb, seed=seed, expected_shapes=shapes)
    with np.errstate(over="ignore", invalid="ignore"):  # once for the message's tensors
        for name, array in arrays.items():
            if array.dtype != np.float64:
                raise WireError(f"tensor {name!r} must be float64, got {array.dtype}")
            if not _finite(array):
                raise WireError(f"tensor {name!r} has non-finite entries")
    if pb.stop:
        stop = np.array(pb.stop, dtype=np.int64)
        stop.setflags(write=False)
        arrays[STOP_KEY] = stop
    return RoundRecord(sender=header.sender, round=header.round, tensors=arrays, digest=digest)


def _finite(values: np.ndarray) -> bool:
    """No NaN or infinity: a finite sum of squares proves it in one pass (BLAS's dot, faster
    than numpy's pairwise sum: a NaN or an infinity makes the dot NaN or infinite); a dot that
    overflows on finite values (beyond about 1e154) gets the full check. Call it where numpy's
    overflow and invalid warnings are off (np.errstate, once per message in parse_round)."""
    flat = values.reshape(-1)
    return math.isfinite(np.dot(flat, flat)) or bool(np.isfinite(values).all())


def message_from_proto(
    pb: agent_pb2.RoundMessage,
    *,
    max_elements: int = limits.MAX_TENSOR_ELEMENTS,
    expected_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, torch.Tensor]:
    """Decode a RoundMessage's tensors into {name: tensor} ordered by name.

    Names must be non-empty, unique and sorted. With expected_shapes, the names must be exactly
    its keys and every tensor must have the given shape. The tensors are fresh and writable.
    """
    arrays = _decode_round(pb, max_elements=max_elements, expected_shapes=expected_shapes,
                           digest=None, view=False)
    return {name: torch.from_numpy(array) for name, array in arrays.items()}


def decode_round_message(
    pb: agent_pb2.RoundMessage,
    *,
    seed: int,
    max_elements: int = limits.MAX_TENSOR_ELEMENTS,
    expected_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[dict[str, np.ndarray], bytes]:
    """message_from_proto's checks and round_digest(pb, seed=seed) in one pass over the tensors'
    bytes; the tensors as read-only arrays over the bytes read from `pb` (no copy:
    serde.array_from_parts)."""
    digest = _digester(seed)
    arrays = _decode_round(pb, max_elements=max_elements, expected_shapes=expected_shapes,
                           digest=digest, view=True)
    return arrays, digest.digest()


def _decode_round(pb: agent_pb2.RoundMessage, *, max_elements: int,
                  expected_shapes: Mapping[str, Sequence[int]] | None,
                  digest: Any, view: bool) -> dict[str, np.ndarray]:
    """The tensors as arrays: read-only views of their bytes (`view`), else fresh copies."""
    if not isinstance(pb, agent_pb2.RoundMessage):
        raise TypeError(f"expected efpsn.v1.RoundMessage, got {type(pb).__name__}")
    _check_stop(pb.stop)
    if expected_shapes is not None and len(pb.tensors) != len(expected_shapes):
        raise WireError(f"message must carry tensors {sorted(expected_shapes)}, got "
                        f"{len(pb.tensors)} tensors")
    names = [named.name for named in pb.tensors]
    if not all(names):
        raise WireError("tensor names must be non-empty")
    if len(set(names)) != len(names):  # linear: a message may carry millions of names
        counts = collections.Counter(names)
        duplicates = sorted(name for name, count in counts.items() if count > 1)
        raise WireError(f"tensor names must be unique, got duplicates {_few(duplicates)}")
    if any(a > b for a, b in itertools.pairwise(names)):
        raise WireError(f"tensors must be sorted by name, got {_few(names)}")
    if expected_shapes is not None and set(names) != set(expected_shapes):
        raise WireError(f"message must carry tensors {sorted(expected_shapes)}, got {names}")
    out: dict[str, np.ndarray] = {}
    for named in pb.tensors:
        shape = None if expected_shapes is None else expected_shapes[named.name]
        tensor = named.tensor
        dtype, dims, data = tensor.dtype, tensor.shape, tensor.data
        try:
            array = array_from_parts(dtype, dims, data, max_elements=max_elements,
                                     expected_shape=shape)
            out[named.name] = array if view else array.copy()
        except WireError as exc:
            raise WireError(f"tensor {named.name!r}: {exc}") from None
        if digest is not None and expected_shapes is not None:  # the run's names and shapes
            digest.update(_digest_head(named.name, dtype, array.shape, len(data)))
            digest.update(data)
        elif digest is not None:
            _digest_tensor(digest, named.name, dtype, dims, data)
    if digest is not None:
        _digest_stop(digest, pb.stop)
    return out


def _few(names: Sequence[str], shown: int = 8) -> str:
    """At most `shown` names, for error messages about untrusted lists."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{list(names[:shown])}{more}"


def round_digest(pb: agent_pb2.RoundMessage, *, seed: int) -> bytes:
    """The digest of a RoundMessage's tensors (names, dtypes, shapes, bytes) and stop integers,
    header excluded, keyed by `seed`: two copies of one (run, sender, round) message are taken
    for the same message iff their digests under one seed agree.

    XXH3-128 with the receiving agent's secret 64-bit seed (RoundLedger.seed), not sha256
    (61 us per 126 KB message; this, 2 us): the ledger only compares a copy with the first
    copy of the same (sender, round) it received, and a collision would only let a
    conflicting copy from that (authenticated) sender be acknowledged as a duplicate and
    dropped, the first copy being what the agent uses either way. The seed, drawn per ledger
    and never sent or saved, keeps a neighbour from choosing colliding copies by the hash's
    structure; the fixed 256-byte prefix puts every digest on XXH3's long-input path (its
    17-240-byte path has published seed-independent near-collisions, a tiny model's message
    would be that short)."""
    if not isinstance(pb, agent_pb2.RoundMessage):
        raise TypeError(f"expected efpsn.v1.RoundMessage, got {type(pb).__name__}")
    h = _digester(seed)
    for named in pb.tensors:
        tensor = named.tensor
        _digest_tensor(h, named.name, tensor.dtype, tensor.shape, tensor.data)
    _digest_stop(h, pb.stop)
    return h.digest()


_PREFIX = b"efpsn.v1.RoundMessage digest".ljust(256, b"\0")


def _digester(seed: int) -> Any:
    """A fresh keyed XXH3-128 state, the prefix fed (see round_digest)."""
    return xxhash.xxh3_128(_PREFIX, seed=seed)


def _digest_stop(h: Any, stop: Sequence[int]) -> None:
    """Feed the stop integers (none: nothing, so messages without them digest as before)."""
    if stop:
        h.update(b"stop" + b",".join(b"%d" % v for v in stop))


def _digest_tensor(h: Any, name: str, dtype: str, dims: Sequence[int], data: bytes) -> None:
    """Feed one named tensor to a round digest: every field length-prefixed, so no two
    different messages feed the same bytes (the small fields in one update, then the data)."""
    h.update(_head_of(name, dtype, dims, len(data)))
    h.update(data)


def _head_of(name: str, dtype: str, dims: Sequence[int], nbytes: int) -> bytes:
    """What _digest_tensor feeds before a tensor's data: its name, dtype and dimensions, each
    length-prefixed, and the data's length."""
    fields = [name.encode(), dtype.encode(), b",".join(b"%d" % d for d in dims)]
    return (b"".join(len(part).to_bytes(8, "big") + part for part in fields)
            + nbytes.to_bytes(8, "big"))


def _digest_head(name: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    """_head_of, kept for (name, dtype, shape): the same every round of a run, whose names and
    shapes are its own (decode with expected shapes only: no outsider fills this; bounded)."""
    key = (name, dtype, shape, nbytes)
    head = _DIGEST_HEADS.get(key)
    if head is None:
        head = _head_of(name, dtype, shape, nbytes)
        if len(_DIGEST_HEADS) >= 256:
            _DIGEST_HEADS.clear()
        _DIGEST_HEADS[key] = head
    return head


_DIGEST_HEADS: dict[tuple[str, str, tuple[int, ...], int], bytes] = {}


def round_request(*, header: Any) -> agent_pb2.RoundRequest:
    """RoundRequest for Agent.GetRound: header.sender is the requester, header.round the round."""
    return agent_pb2.RoundRequest(header=header)


def round_reply(message: bytes | None, *, latest_round: int) -> agent_pb2.RoundReply:
    """RoundReply: the stored message (its serialized bytes, exactly as sent), or
    available=false when that round is not reached yet."""
    latest = max(0, latest_round)
    if message is None:
        return agent_pb2.RoundReply(available=False, latest_round=latest)
    return agent_pb2.RoundReply(available=True, message=agent_pb2.RoundMessage.FromString(message),
                                latest_round=latest)
