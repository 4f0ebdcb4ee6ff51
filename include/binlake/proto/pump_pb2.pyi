from binlake.proto import binlog_pb2 as _binlog_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WriteBinlogReq(_message.Message):
    __slots__ = ("cluster_id", "payload")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    payload: bytes
    def __init__(self, cluster_id: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class WriteBinlogResp(_message.Message):
    __slots__ = ("errmsg",)
    ERRMSG_FIELD_NUMBER: _ClassVar[int]
    errmsg: str
    def __init__(self, errmsg: _Optional[str] = ...) -> None: ...

class WriteBinlogsReq(_message.Message):
    __slots__ = ("cluster_id", "payloads", "batch_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    payloads: _containers.RepeatedScalarFieldContainer[bytes]
    batch_id: int
    def __init__(self, cluster_id: _Optional[int] = ..., payloads: _Optional[_Iterable[bytes]] = ..., batch_id: _Optional[int] = ...) -> None: ...

class WriteResult(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class WriteBinlogsResp(_message.Message):
    __slots__ = ("results", "batch_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[WriteResult]
    batch_id: int
    def __init__(self, results: _Optional[_Iterable[_Union[WriteResult, _Mapping]]] = ..., batch_id: _Optional[int] = ...) -> None: ...

class PullBinlogsReq(_message.Message):
    __slots__ = ("start_ts", "end_ts", "wait", "wait_timeout_ms", "batch_max_txns", "batch_max_bytes", "keys_only", "accept_parts")
    START_TS_FIELD_NUMBER: _ClassVar[int]
    END_TS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_MAX_TXNS_FIELD_NUMBER: _ClassVar[int]
    BATCH_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEYS_ONLY_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_PARTS_FIELD_NUMBER: _ClassVar[int]
    start_ts: int
    end_ts: int
    wait: bool
    wait_timeout_ms: int
    batch_max_txns: int
    batch_max_bytes: int
    keys_only: bool
    accept_parts: bool
    def __init__(self, start_ts: _Optional[int] = ..., end_ts: _Optional[int] = ..., wait: _Optional[bool] = ..., wait_timeout_ms: _Optional[int] = ..., batch_max_txns: _Optional[int] = ..., batch_max_bytes: _Optional[int] = ..., keys_only: _Optional[bool] = ..., accept_parts: _Optional[bool] = ...) -> None: ...

class PullBinlogsResp(_message.Message):
    __slots__ = ("binlogs", "node_id", "part")
    BINLOGS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    binlogs: _containers.RepeatedCompositeFieldContainer[_binlog_pb2.Binlog]
    node_id: str
    part: BinlogPart
    def __init__(self, binlogs: _Optional[_Iterable[_Union[_binlog_pb2.Binlog, _Mapping]]] = ..., node_id: _Optional[str] = ..., part: _Optional[_Union[BinlogPart, _Mapping]] = ...) -> None: ...

class BinlogPart(_message.Message):
    __slots__ = ("start_ts", "commit_ts", "offset", "total_bytes", "data")
    START_TS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    start_ts: int
    commit_ts: int
    offset: int
    total_bytes: int
    data: bytes
    def __init__(self, start_ts: _Optional[int] = ..., commit_ts: _Optional[int] = ..., offset: _Optional[int] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class StatusReq(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResp(_message.Message):
    __slots__ = ("node_id", "state", "safe_ts", "max_commit_ts", "gc_ts", "pending_txns", "storage_bytes", "disk_free_bytes", "accepting_writes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SAFE_TS_FIELD_NUMBER: _ClassVar[int]
    MAX_COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    GC_TS_FIELD_NUMBER: _ClassVar[int]
    PENDING_TXNS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTING_WRITES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: str
    safe_ts: int
    max_commit_ts: int
    gc_ts: int
    pending_txns: int
    storage_bytes: int
    disk_free_bytes: int
    accepting_writes: bool
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[str] = ..., safe_ts: _Optional[int] = ..., max_commit_ts: _Optional[int] = ..., gc_ts: _Optional[int] = ..., pending_txns: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., accepting_writes: _Optional[bool] = ...) -> None: ...
