from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    KEYS: _ClassVar[Phase]
    SHARES: _ClassVar[Phase]
    OPTIMIZE: _ClassVar[Phase]
    DONE: _ClassVar[Phase]
    STATS: _ClassVar[Phase]
PHASE_UNSPECIFIED: Phase
KEYS: Phase
SHARES: Phase
OPTIMIZE: Phase
DONE: Phase
STATS: Phase

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("run_id", "sender", "round", "phase")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    sender: str
    round: int
    phase: Phase
    def __init__(self, run_id: _Optional[str] = ..., sender: _Optional[str] = ..., round: _Optional[int] = ..., phase: _Optional[_Union[Phase, str]] = ...) -> None: ...

class PaillierPublicKey(_message.Message):
    __slots__ = ("n", "fingerprint")
    N_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    n: bytes
    fingerprint: bytes
    def __init__(self, n: _Optional[bytes] = ..., fingerprint: _Optional[bytes] = ...) -> None: ...

class CiphertextBatch(_message.Message):
    __slots__ = ("key_fingerprint", "ciphertexts", "num_coefficients", "packed")
    KEY_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXTS_FIELD_NUMBER: _ClassVar[int]
    NUM_COEFFICIENTS_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    key_fingerprint: bytes
    ciphertexts: _containers.RepeatedScalarFieldContainer[bytes]
    num_coefficients: int
    packed: bool
    def __init__(self, key_fingerprint: _Optional[bytes] = ..., ciphertexts: _Optional[_Iterable[bytes]] = ..., num_coefficients: _Optional[int] = ..., packed: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("accepted", "detail")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    detail: str
    def __init__(self, accepted: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...
