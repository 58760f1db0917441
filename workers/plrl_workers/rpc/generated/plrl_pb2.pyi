from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Code]
    INVALID_ARGUMENT: _ClassVar[Code]
    NOT_FOUND: _ClassVar[Code]
    ALREADY_EXISTS: _ClassVar[Code]
    RESOURCE_EXHAUSTED: _ClassVar[Code]
    FAILED_PRECONDITION: _ClassVar[Code]
    UNAVAILABLE: _ClassVar[Code]
OK: Code
INVALID_ARGUMENT: Code
NOT_FOUND: Code
ALREADY_EXISTS: Code
RESOURCE_EXHAUSTED: Code
FAILED_PRECONDITION: Code
UNAVAILABLE: Code

class RegisterRequest(_message.Message):
    __slots__ = ("generator_id",)
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    generator_id: str
    def __init__(self, generator_id: _Optional[str] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("weight_version", "samples_per_prompt", "lease_timeout_s", "session", "incarnation")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    samples_per_prompt: int
    lease_timeout_s: float
    session: str
    incarnation: str
    def __init__(self, weight_version: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ..., lease_timeout_s: _Optional[float] = ..., session: _Optional[str] = ..., incarnation: _Optional[str] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("prompt_id", "text", "answer", "token_ids")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: int
    text: str
    answer: str
    token_ids: bytes
    def __init__(self, prompt_id: _Optional[int] = ..., text: _Optional[str] = ..., answer: _Optional[str] = ..., token_ids: _Optional[bytes] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "prompt", "timeout_s")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompt: Prompt
    timeout_s: float
    def __init__(self, lease_id: _Optional[str] = ..., prompt: _Optional[_Union[Prompt, _Mapping]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("generator_id", "max_prompts", "wait_s", "incarnation", "prompt_ids")
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    generator_id: str
    max_prompts: int
    wait_s: float
    incarnation: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, generator_id: _Optional[str] = ..., max_prompts: _Optional[int] = ..., wait_s: _Optional[float] = ..., incarnation: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("leases", "finished")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    finished: bool
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., finished: _Optional[bool] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("token_ids", "logprobs", "versions", "reward", "finish_reason")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    logprobs: bytes
    versions: bytes
    reward: float
    finish_reason: str
    def __init__(self, token_ids: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ..., versions: _Optional[bytes] = ..., reward: _Optional[float] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class RolloutGroup(_message.Message):
    __slots__ = ("lease_id", "prompt_id", "prompt_token_ids", "samples", "generator_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompt_id: int
    prompt_token_ids: bytes
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    generator_id: str
    def __init__(self, lease_id: _Optional[str] = ..., prompt_id: _Optional[int] = ..., prompt_token_ids: _Optional[bytes] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., generator_id: _Optional[str] = ...) -> None: ...

class SubmitAck(_message.Message):
    __slots__ = ("lease_id", "code", "message")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    code: Code
    message: str
    def __init__(self, lease_id: _Optional[str] = ..., code: _Optional[_Union[Code, str]] = ..., message: _Optional[str] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("generator_id", "incarnation")
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    generator_id: str
    incarnation: str
    def __init__(self, generator_id: _Optional[str] = ..., incarnation: _Optional[str] = ...) -> None: ...

class ParamMeta(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("host", "port", "rank", "world_size", "epoch", "backend")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    rank: int
    world_size: int
    epoch: int
    backend: str
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., epoch: _Optional[int] = ..., backend: _Optional[str] = ...) -> None: ...

class WeightUpdate(_message.Message):
    __slots__ = ("version", "epoch", "params", "bucket_bytes", "group")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    version: int
    epoch: int
    params: _containers.RepeatedCompositeFieldContainer[ParamMeta]
    bucket_bytes: int
    group: GroupInfo
    def __init__(self, version: _Optional[int] = ..., epoch: _Optional[int] = ..., params: _Optional[_Iterable[_Union[ParamMeta, _Mapping]]] = ..., bucket_bytes: _Optional[int] = ..., group: _Optional[_Union[GroupInfo, _Mapping]] = ...) -> None: ...

class PullHint(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Revoke(_message.Message):
    __slots__ = ("lease_ids", "reason")
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("weight_update", "pull", "stop", "revoke")
    WEIGHT_UPDATE_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    weight_update: WeightUpdate
    pull: PullHint
    stop: StopRequest
    revoke: Revoke
    def __init__(self, weight_update: _Optional[_Union[WeightUpdate, _Mapping]] = ..., pull: _Optional[_Union[PullHint, _Mapping]] = ..., stop: _Optional[_Union[StopRequest, _Mapping]] = ..., revoke: _Optional[_Union[Revoke, _Mapping]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("generator_id", "min_version")
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    generator_id: str
    min_version: int
    def __init__(self, generator_id: _Optional[str] = ..., min_version: _Optional[int] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "params", "data")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    version: int
    params: _containers.RepeatedCompositeFieldContainer[ParamMeta]
    data: bytes
    def __init__(self, version: _Optional[int] = ..., params: _Optional[_Iterable[_Union[ParamMeta, _Mapping]]] = ..., data: _Optional[bytes] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Accounting(_message.Message):
    __slots__ = ("issued", "trained", "dropped_by_lag", "leased", "requeued", "buffered", "in_training")
    ISSUED_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BY_LAG_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    IN_TRAINING_FIELD_NUMBER: _ClassVar[int]
    issued: int
    trained: int
    dropped_by_lag: int
    leased: int
    requeued: int
    buffered: int
    in_training: int
    def __init__(self, issued: _Optional[int] = ..., trained: _Optional[int] = ..., dropped_by_lag: _Optional[int] = ..., leased: _Optional[int] = ..., requeued: _Optional[int] = ..., buffered: _Optional[int] = ..., in_training: _Optional[int] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("accounting", "weight_version", "buffer_capacity", "generators", "control_streams", "leases_expired", "leases_revoked", "refused", "source_exhausted", "finished", "leases_migrated", "session", "leases_adopted")
    class RefusedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUFFER_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    GENERATORS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_STREAMS_FIELD_NUMBER: _ClassVar[int]
    LEASES_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    LEASES_REVOKED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LEASES_MIGRATED_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LEASES_ADOPTED_FIELD_NUMBER: _ClassVar[int]
    accounting: Accounting
    weight_version: int
    buffer_capacity: int
    generators: int
    control_streams: int
    leases_expired: int
    leases_revoked: int
    refused: _containers.ScalarMap[str, int]
    source_exhausted: bool
    finished: bool
    leases_migrated: int
    session: str
    leases_adopted: int
    def __init__(self, accounting: _Optional[_Union[Accounting, _Mapping]] = ..., weight_version: _Optional[int] = ..., buffer_capacity: _Optional[int] = ..., generators: _Optional[int] = ..., control_streams: _Optional[int] = ..., leases_expired: _Optional[int] = ..., leases_revoked: _Optional[int] = ..., refused: _Optional[_Mapping[str, int]] = ..., source_exhausted: _Optional[bool] = ..., finished: _Optional[bool] = ..., leases_migrated: _Optional[int] = ..., session: _Optional[str] = ..., leases_adopted: _Optional[int] = ...) -> None: ...
