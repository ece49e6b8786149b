from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MembershipPoll(_message.Message):
    __slots__ = ("run_id", "sender", "round", "finished", "known")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    sender: str
    round: int
    finished: bool
    known: int
    def __init__(self, run_id: _Optional[str] = ..., sender: _Optional[str] = ..., round: _Optional[int] = ..., finished: _Optional[bool] = ..., known: _Optional[int] = ...) -> None: ...

class Edge(_message.Message):
    __slots__ = ("a", "b")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    a: int
    b: int
    def __init__(self, a: _Optional[int] = ..., b: _Optional[int] = ...) -> None: ...

class JoinNews(_message.Message):
    __slots__ = ("name", "index", "round", "address", "epoch", "edges", "cap", "ends")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    CAP_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    index: int
    round: int
    address: str
    epoch: int
    edges: _containers.RepeatedCompositeFieldContainer[Edge]
    cap: int
    ends: _containers.RepeatedCompositeFieldContainer[Peer]
    def __init__(self, name: _Optional[str] = ..., index: _Optional[int] = ..., round: _Optional[int] = ..., address: _Optional[str] = ..., epoch: _Optional[int] = ..., edges: _Optional[_Iterable[_Union[Edge, _Mapping]]] = ..., cap: _Optional[int] = ..., ends: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ...) -> None: ...

class MembershipNews(_message.Message):
    __slots__ = ("run_id", "joins")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    JOINS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    joins: _containers.RepeatedCompositeFieldContainer[JoinNews]
    def __init__(self, run_id: _Optional[str] = ..., joins: _Optional[_Iterable[_Union[JoinNews, _Mapping]]] = ...) -> None: ...

class SilenceReport(_message.Message):
    __slots__ = ("run_id", "sender", "round", "silent", "epoch", "phase_one", "finished", "last", "capped")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SILENT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PHASE_ONE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    CAPPED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    sender: str
    round: int
    silent: _containers.RepeatedScalarFieldContainer[str]
    epoch: int
    phase_one: bool
    finished: int
    last: int
    capped: bool
    def __init__(self, run_id: _Optional[str] = ..., sender: _Optional[str] = ..., round: _Optional[int] = ..., silent: _Optional[_Iterable[str]] = ..., epoch: _Optional[int] = ..., phase_one: _Optional[bool] = ..., finished: _Optional[int] = ..., last: _Optional[int] = ..., capped: _Optional[bool] = ...) -> None: ...

class Departed(_message.Message):
    __slots__ = ("agent", "round", "rebase_round", "late", "index", "late_index", "phase_one", "stopped", "capped")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REBASE_ROUND_FIELD_NUMBER: _ClassVar[int]
    LATE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PHASE_ONE_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    CAPPED_FIELD_NUMBER: _ClassVar[int]
    agent: str
    round: int
    rebase_round: int
    late: _containers.RepeatedScalarFieldContainer[str]
    index: int
    late_index: _containers.RepeatedScalarFieldContainer[int]
    phase_one: bool
    stopped: int
    capped: int
    def __init__(self, agent: _Optional[str] = ..., round: _Optional[int] = ..., rebase_round: _Optional[int] = ..., late: _Optional[_Iterable[str]] = ..., index: _Optional[int] = ..., late_index: _Optional[_Iterable[int]] = ..., phase_one: _Optional[bool] = ..., stopped: _Optional[int] = ..., capped: _Optional[int] = ...) -> None: ...

class Departures(_message.Message):
    __slots__ = ("run_id", "epoch", "departed", "joining")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_FIELD_NUMBER: _ClassVar[int]
    JOINING_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    epoch: int
    departed: _containers.RepeatedCompositeFieldContainer[Departed]
    joining: _containers.RepeatedCompositeFieldContainer[Peer]
    def __init__(self, run_id: _Optional[str] = ..., epoch: _Optional[int] = ..., departed: _Optional[_Iterable[_Union[Departed, _Mapping]]] = ..., joining: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("name", "address", "input_shape", "classes", "model_fingerprint", "failure")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    input_shape: str
    classes: int
    model_fingerprint: bytes
    failure: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., input_shape: _Optional[str] = ..., classes: _Optional[int] = ..., model_fingerprint: _Optional[bytes] = ..., failure: _Optional[str] = ...) -> None: ...

class RunParametersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Peer(_message.Message):
    __slots__ = ("name", "index", "address", "weight")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    index: int
    address: str
    weight: float
    def __init__(self, name: _Optional[str] = ..., index: _Optional[int] = ..., address: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class RunParameters(_message.Message):
    __slots__ = ("agents", "topology", "task", "algorithm", "mask", "gamma", "p", "precision", "K", "m", "N", "selection", "basis_seed", "iterations", "batch_size", "schedule", "seed", "key_bits", "packed", "partition", "data", "test_fraction", "l2", "eval_every", "round_timeout_seconds", "input_shape", "classes", "scale", "refresh", "clip", "momentum", "stop_every", "tail", "table", "late")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SELECTION_FIELD_NUMBER: _ClassVar[int]
    BASIS_SEED_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    KEY_BITS_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TEST_FRACTION_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    EVAL_EVERY_FIELD_NUMBER: _ClassVar[int]
    ROUND_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    REFRESH_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    STOP_EVERY_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    LATE_FIELD_NUMBER: _ClassVar[int]
    agents: int
    topology: str
    task: str
    algorithm: str
    mask: str
    gamma: float
    p: float
    precision: int
    K: int
    m: int
    N: int
    selection: str
    basis_seed: int
    iterations: int
    batch_size: int
    schedule: str
    seed: int
    key_bits: int
    packed: bool
    partition: str
    data: str
    test_fraction: float
    l2: float
    eval_every: int
    round_timeout_seconds: float
    input_shape: str
    classes: int
    scale: str
    refresh: str
    clip: float
    momentum: float
    stop_every: int
    tail: str
    table: str
    late: str
    def __init__(self, agents: _Optional[int] = ..., topology: _Optional[str] = ..., task: _Optional[str] = ..., algorithm: _Optional[str] = ..., mask: _Optional[str] = ..., gamma: _Optional[float] = ..., p: _Optional[float] = ..., precision: _Optional[int] = ..., K: _Optional[int] = ..., m: _Optional[int] = ..., N: _Optional[int] = ..., selection: _Optional[str] = ..., basis_seed: _Optional[int] = ..., iterations: _Optional[int] = ..., batch_size: _Optional[int] = ..., schedule: _Optional[str] = ..., seed: _Optional[int] = ..., key_bits: _Optional[int] = ..., packed: _Optional[bool] = ..., partition: _Optional[str] = ..., data: _Optional[str] = ..., test_fraction: _Optional[float] = ..., l2: _Optional[float] = ..., eval_every: _Optional[int] = ..., round_timeout_seconds: _Optional[float] = ..., input_shape: _Optional[str] = ..., classes: _Optional[int] = ..., scale: _Optional[str] = ..., refresh: _Optional[str] = ..., clip: _Optional[float] = ..., momentum: _Optional[float] = ..., stop_every: _Optional[int] = ..., tail: _Optional[str] = ..., table: _Optional[str] = ..., late: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("run_id", "index", "name", "neighbours", "self_weight", "num_agents", "members", "join_round", "join_epoch", "edges", "join_cap")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    SELF_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_AGENTS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    JOIN_ROUND_FIELD_NUMBER: _ClassVar[int]
    JOIN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    JOIN_CAP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    index: int
    name: str
    neighbours: _containers.RepeatedCompositeFieldContainer[Peer]
    self_weight: float
    num_agents: int
    members: _containers.RepeatedScalarFieldContainer[str]
    join_round: int
    join_epoch: int
    edges: _containers.RepeatedCompositeFieldContainer[Edge]
    join_cap: int
    def __init__(self, run_id: _Optional[str] = ..., index: _Optional[int] = ..., name: _Optional[str] = ..., neighbours: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ..., self_weight: _Optional[float] = ..., num_agents: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., join_round: _Optional[int] = ..., join_epoch: _Optional[int] = ..., edges: _Optional[_Iterable[_Union[Edge, _Mapping]]] = ..., join_cap: _Optional[int] = ...) -> None: ...

class RunStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_id", "registered", "expected", "names", "assigned", "rejections", "addresses", "departed")
    class RejectionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AddressesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    registered: int
    expected: int
    names: _containers.RepeatedScalarFieldContainer[str]
    assigned: bool
    rejections: _containers.ScalarMap[str, int]
    addresses: _containers.ScalarMap[str, str]
    departed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., registered: _Optional[int] = ..., expected: _Optional[int] = ..., names: _Optional[_Iterable[str]] = ..., assigned: _Optional[bool] = ..., rejections: _Optional[_Mapping[str, int]] = ..., addresses: _Optional[_Mapping[str, str]] = ..., departed: _Optional[_Iterable[str]] = ...) -> None: ...
