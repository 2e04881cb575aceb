from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileEntry(_message.Message):
    __slots__ = ("path", "sha256", "size")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    path: str
    sha256: str
    size: int
    def __init__(self, path: _Optional[str] = ..., sha256: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class IngestOptions(_message.Message):
    __slots__ = ("segment_tokens", "whole", "codec")
    SEGMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WHOLE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    segment_tokens: int
    whole: bool
    codec: str
    def __init__(self, segment_tokens: _Optional[int] = ..., whole: _Optional[bool] = ..., codec: _Optional[str] = ...) -> None: ...

class UploadPlanRequest(_message.Message):
    __slots__ = ("namespace", "kb", "files")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KB_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kb: str
    files: _containers.RepeatedCompositeFieldContainer[FileEntry]
    def __init__(self, namespace: _Optional[str] = ..., kb: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ...) -> None: ...

class FileNeed(_message.Message):
    __slots__ = ("sha256", "offset")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class UploadPlan(_message.Message):
    __slots__ = ("needs",)
    NEEDS_FIELD_NUMBER: _ClassVar[int]
    needs: _containers.RepeatedCompositeFieldContainer[FileNeed]
    def __init__(self, needs: _Optional[_Iterable[_Union[FileNeed, _Mapping]]] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("namespace", "kb", "files", "options")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KB_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kb: str
    files: _containers.RepeatedCompositeFieldContainer[FileEntry]
    options: IngestOptions
    def __init__(self, namespace: _Optional[str] = ..., kb: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ..., options: _Optional[_Union[IngestOptions, _Mapping]] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("sha256", "offset", "data")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    data: bytes
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    chunk: FileChunk
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., chunk: _Optional[_Union[FileChunk, _Mapping]] = ...) -> None: ...

class UploadReply(_message.Message):
    __slots__ = ("namespace", "kb", "files_received", "files_skipped", "status")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KB_FIELD_NUMBER: _ClassVar[int]
    FILES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    FILES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kb: str
    files_received: int
    files_skipped: int
    status: str
    def __init__(self, namespace: _Optional[str] = ..., kb: _Optional[str] = ..., files_received: _Optional[int] = ..., files_skipped: _Optional[int] = ..., status: _Optional[str] = ...) -> None: ...

class KBRef(_message.Message):
    __slots__ = ("namespace", "kb", "variant", "if_none_match")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KB_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    IF_NONE_MATCH_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kb: str
    variant: str
    if_none_match: str
    def __init__(self, namespace: _Optional[str] = ..., kb: _Optional[str] = ..., variant: _Optional[str] = ..., if_none_match: _Optional[str] = ...) -> None: ...

class SegmentInfo(_message.Message):
    __slots__ = ("index", "pack_id", "pack_bytes", "n_tokens", "source", "fp16_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_BYTES_FIELD_NUMBER: _ClassVar[int]
    N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FP16_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    pack_id: str
    pack_bytes: int
    n_tokens: int
    source: str
    fp16_bytes: int
    def __init__(self, index: _Optional[int] = ..., pack_id: _Optional[str] = ..., pack_bytes: _Optional[int] = ..., n_tokens: _Optional[int] = ..., source: _Optional[str] = ..., fp16_bytes: _Optional[int] = ...) -> None: ...

class KBInfo(_message.Message):
    __slots__ = ("namespace", "kb", "status", "error", "model_fingerprint", "n_files", "n_tokens", "segments", "variants", "mode", "updated", "variant", "segments_done", "segments_total", "etag", "not_modified")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KB_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    N_FILES_FIELD_NUMBER: _ClassVar[int]
    N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_DONE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    NOT_MODIFIED_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kb: str
    status: str
    error: str
    model_fingerprint: str
    n_files: int
    n_tokens: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    variants: _containers.RepeatedScalarFieldContainer[str]
    mode: str
    updated: float
    variant: str
    segments_done: int
    segments_total: int
    etag: str
    not_modified: bool
    def __init__(self, namespace: _Optional[str] = ..., kb: _Optional[str] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., n_files: _Optional[int] = ..., n_tokens: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., variants: _Optional[_Iterable[str]] = ..., mode: _Optional[str] = ..., updated: _Optional[float] = ..., variant: _Optional[str] = ..., segments_done: _Optional[int] = ..., segments_total: _Optional[int] = ..., etag: _Optional[str] = ..., not_modified: _Optional[bool] = ...) -> None: ...

class ListKBsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ListKBsReply(_message.Message):
    __slots__ = ("kbs",)
    KBS_FIELD_NUMBER: _ClassVar[int]
    kbs: _containers.RepeatedCompositeFieldContainer[KBInfo]
    def __init__(self, kbs: _Optional[_Iterable[_Union[KBInfo, _Mapping]]] = ...) -> None: ...

class RemoveReply(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class FetchPackRequest(_message.Message):
    __slots__ = ("namespace", "pack_id", "offset", "length")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    pack_id: str
    offset: int
    length: int
    def __init__(self, namespace: _Optional[str] = ..., pack_id: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class FetchHeadsRequest(_message.Message):
    __slots__ = ("namespace", "pack_ids")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACK_IDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    pack_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., pack_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PackHead(_message.Message):
    __slots__ = ("pack_id", "data", "total")
    PACK_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    pack_id: str
    data: bytes
    total: int
    def __init__(self, pack_id: _Optional[str] = ..., data: _Optional[bytes] = ..., total: _Optional[int] = ...) -> None: ...

class PackChunk(_message.Message):
    __slots__ = ("offset", "data", "total")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    total: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total: _Optional[int] = ...) -> None: ...

class FetchTransformRequest(_message.Message):
    __slots__ = ("namespace", "digest")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    digest: str
    def __init__(self, namespace: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...

class JobRequest(_message.Message):
    __slots__ = ("namespace", "kbs", "method", "budget", "codec")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KBS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kbs: _containers.RepeatedScalarFieldContainer[str]
    method: str
    budget: float
    codec: str
    def __init__(self, namespace: _Optional[str] = ..., kbs: _Optional[_Iterable[str]] = ..., method: _Optional[str] = ..., budget: _Optional[float] = ..., codec: _Optional[str] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("namespace", "job_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    job_id: str
    def __init__(self, namespace: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class JobFailure(_message.Message):
    __slots__ = ("kb", "segment", "error")
    KB_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    kb: str
    segment: int
    error: str
    def __init__(self, kb: _Optional[str] = ..., segment: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("job_id", "namespace", "kbs", "method", "budget", "codec", "status", "done", "total", "failures", "variant", "created", "finished", "compress_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KBS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    COMPRESS_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    namespace: str
    kbs: _containers.RepeatedScalarFieldContainer[str]
    method: str
    budget: float
    codec: str
    status: str
    done: int
    total: int
    failures: _containers.RepeatedCompositeFieldContainer[JobFailure]
    variant: str
    created: float
    finished: float
    compress_s: float
    def __init__(self, job_id: _Optional[str] = ..., namespace: _Optional[str] = ..., kbs: _Optional[_Iterable[str]] = ..., method: _Optional[str] = ..., budget: _Optional[float] = ..., codec: _Optional[str] = ..., status: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., failures: _Optional[_Iterable[_Union[JobFailure, _Mapping]]] = ..., variant: _Optional[str] = ..., created: _Optional[float] = ..., finished: _Optional[float] = ..., compress_s: _Optional[float] = ...) -> None: ...

class JobsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class JobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ...) -> None: ...

class AskRequest(_message.Message):
    __slots__ = ("namespace", "kb", "question", "strategy", "top_k", "max_new_tokens", "options", "temperature", "top_p", "seed", "stop")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KB_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kb: str
    question: str
    strategy: str
    top_k: int
    max_new_tokens: int
    options: _containers.ScalarMap[str, str]
    temperature: float
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., kb: _Optional[str] = ..., question: _Optional[str] = ..., strategy: _Optional[str] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class AskDone(_message.Message):
    __slots__ = ("answer", "ttft_s", "tpot_s", "tokens", "segments", "bytes_loaded", "fp16_bytes", "strategy", "prompt_tokens", "recomputed_tokens", "kv_bytes", "sequence_ratio", "finish_reason")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_LOADED_FIELD_NUMBER: _ClassVar[int]
    FP16_BYTES_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_RATIO_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    answer: str
    ttft_s: float
    tpot_s: float
    tokens: int
    segments: _containers.RepeatedScalarFieldContainer[int]
    bytes_loaded: int
    fp16_bytes: int
    strategy: str
    prompt_tokens: int
    recomputed_tokens: int
    kv_bytes: int
    sequence_ratio: float
    finish_reason: str
    def __init__(self, answer: _Optional[str] = ..., ttft_s: _Optional[float] = ..., tpot_s: _Optional[float] = ..., tokens: _Optional[int] = ..., segments: _Optional[_Iterable[int]] = ..., bytes_loaded: _Optional[int] = ..., fp16_bytes: _Optional[int] = ..., strategy: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., recomputed_tokens: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., sequence_ratio: _Optional[float] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class AskEvent(_message.Message):
    __slots__ = ("text", "done")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    text: str
    done: AskDone
    def __init__(self, text: _Optional[str] = ..., done: _Optional[_Union[AskDone, _Mapping]] = ...) -> None: ...
