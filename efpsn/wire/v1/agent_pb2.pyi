from efpsn.wire.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PublicKeyMessage(_message.Message):
    __slots__ = ("header", "key")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    key: _common_pb2.PaillierPublicKey
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., key: _Optional[_Union[_common_pb2.PaillierPublicKey, _Mapping]] = ...) -> None: ...

class SharesMessage(_message.Message):
    __slots__ = ("header", "batch")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    batch: _common_pb2.CiphertextBatch
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., batch: _Optional[_Union[_common_pb2.CiphertextBatch, _Mapping]] = ...) -> None: ...

class MaskedStats(_message.Message):
    __slots__ = ("agent", "values")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    agent: int
    values: bytes
    def __init__(self, agent: _Optional[int] = ..., values: _Optional[bytes] = ...) -> None: ...

class StatsMessage(_message.Message):
    __slots__ = ("header", "vectors")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    vectors: _containers.RepeatedCompositeFieldContainer[MaskedStats]
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., vectors: _Optional[_Iterable[_Union[MaskedStats, _Mapping]]] = ...) -> None: ...

class NamedTensor(_message.Message):
    __slots__ = ("name", "tensor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    tensor: _common_pb2.Tensor
    def __init__(self, name: _Optional[str] = ..., tensor: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class RoundMessage(_message.Message):
    __slots__ = ("header", "tensors", "stop")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    tensors: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    stop: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ..., stop: _Optional[_Iterable[int]] = ...) -> None: ...

class RoundAck(_message.Message):
    __slots__ = ("round", "detail")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    round: int
    detail: str
    def __init__(self, round: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class RoundRequest(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ...) -> None: ...

class RoundReply(_message.Message):
    __slots__ = ("available", "message", "latest_round")
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LATEST_ROUND_FIELD_NUMBER: _ClassVar[int]
    available: bool
    message: RoundMessage
    latest_round: int
    def __init__(self, available: _Optional[bool] = ..., message: _Optional[_Union[RoundMessage, _Mapping]] = ..., latest_round: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class AgentStatus(_message.Message):
    __slots__ = ("run_id", "name", "phase", "round", "total_rounds", "loss", "accuracy", "error", "finished", "rejections", "resumed_from_round", "waiting_for", "neighbour_count", "departed_count", "last_round", "neighbours", "departed")
    class RejectionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOUR_COUNT_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    phase: _common_pb2.Phase
    round: int
    total_rounds: int
    loss: float
    accuracy: float
    error: str
    finished: bool
    rejections: _containers.ScalarMap[str, int]
    resumed_from_round: int
    waiting_for: _containers.RepeatedScalarFieldContainer[str]
    neighbour_count: int
    departed_count: int
    last_round: int
    neighbours: _containers.RepeatedCompositeFieldContainer[NeighbourView]
    departed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ..., phase: _Optional[_Union[_common_pb2.Phase, str]] = ..., round: _Optional[int] = ..., total_rounds: _Optional[int] = ..., loss: _Optional[float] = ..., accuracy: _Optional[float] = ..., error: _Optional[str] = ..., finished: _Optional[bool] = ..., rejections: _Optional[_Mapping[str, int]] = ..., resumed_from_round: _Optional[int] = ..., waiting_for: _Optional[_Iterable[str]] = ..., neighbour_count: _Optional[int] = ..., departed_count: _Optional[int] = ..., last_round: _Optional[int] = ..., neighbours: _Optional[_Iterable[_Union[NeighbourView, _Mapping]]] = ..., departed: _Optional[_Iterable[str]] = ...) -> None: ...

class NeighbourView(_message.Message):
    __slots__ = ("name", "address", "heard_seconds_ago")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEARD_SECONDS_AGO_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    heard_seconds_ago: float
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., heard_seconds_ago: _Optional[float] = ...) -> None: ...
