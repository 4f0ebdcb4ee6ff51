from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ONLINE: _ClassVar[NodeState]
    PAUSING: _ClassVar[NodeState]
    PAUSED: _ClassVar[NodeState]
    CLOSING: _ClassVar[NodeState]
    OFFLINE: _ClassVar[NodeState]
ONLINE: NodeState
PAUSING: NodeState
PAUSED: NodeState
CLOSING: NodeState
OFFLINE: NodeState

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "kind", "addr", "state", "max_commit_ts", "safe_ts", "gc_ts", "disk_used_bytes", "disk_free_bytes", "load", "online_ts", "offline_ts", "updated_at_ms", "pending_txns", "metrics_addr", "empty_below_ts")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MAX_COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    SAFE_TS_FIELD_NUMBER: _ClassVar[int]
    GC_TS_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ONLINE_TS_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_TS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PENDING_TXNS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDR_FIELD_NUMBER: _ClassVar[int]
    EMPTY_BELOW_TS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    kind: str
    addr: str
    state: NodeState
    max_commit_ts: int
    safe_ts: int
    gc_ts: int
    disk_used_bytes: int
    disk_free_bytes: int
    load: float
    online_ts: int
    offline_ts: int
    updated_at_ms: int
    pending_txns: int
    metrics_addr: str
    empty_below_ts: int
    def __init__(self, node_id: _Optional[str] = ..., kind: _Optional[str] = ..., addr: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., max_commit_ts: _Optional[int] = ..., safe_ts: _Optional[int] = ..., gc_ts: _Optional[int] = ..., disk_used_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., load: _Optional[float] = ..., online_ts: _Optional[int] = ..., offline_ts: _Optional[int] = ..., updated_at_ms: _Optional[int] = ..., pending_txns: _Optional[int] = ..., metrics_addr: _Optional[str] = ..., empty_below_ts: _Optional[int] = ...) -> None: ...

class GetTSReq(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class GetTSResp(_message.Message):
    __slots__ = ("first", "count")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    first: int
    count: int
    def __init__(self, first: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class GetClusterInfoReq(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterInfoResp(_message.Message):
    __slots__ = ("cluster_id", "revision")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    revision: int
    def __init__(self, cluster_id: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class RegisterNodeReq(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class HeartbeatReq(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class SetNodeStateReq(_message.Message):
    __slots__ = ("node_id", "state")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: NodeState
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ...) -> None: ...

class GetNodeReq(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class ListNodesReq(_message.Message):
    __slots__ = ("kind",)
    KIND_FIELD_NUMBER: _ClassVar[int]
    kind: str
    def __init__(self, kind: _Optional[str] = ...) -> None: ...

class ListNodesResp(_message.Message):
    __slots__ = ("nodes", "revision", "cluster_id")
    NODES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    revision: int
    cluster_id: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., revision: _Optional[int] = ..., cluster_id: _Optional[int] = ...) -> None: ...

class ConsumerInfo(_message.Message):
    __slots__ = ("consumer_id", "checkpoint_ts", "description", "registered_at_ms", "updated_at_ms")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    checkpoint_ts: int
    description: str
    registered_at_ms: int
    updated_at_ms: int
    def __init__(self, consumer_id: _Optional[str] = ..., checkpoint_ts: _Optional[int] = ..., description: _Optional[str] = ..., registered_at_ms: _Optional[int] = ..., updated_at_ms: _Optional[int] = ...) -> None: ...

class UpdateConsumerReq(_message.Message):
    __slots__ = ("consumer",)
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    consumer: ConsumerInfo
    def __init__(self, consumer: _Optional[_Union[ConsumerInfo, _Mapping]] = ...) -> None: ...

class ListConsumersReq(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListConsumersResp(_message.Message):
    __slots__ = ("consumers",)
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerInfo]
    def __init__(self, consumers: _Optional[_Iterable[_Union[ConsumerInfo, _Mapping]]] = ...) -> None: ...

class RemoveConsumerReq(_message.Message):
    __slots__ = ("consumer_id",)
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    def __init__(self, consumer_id: _Optional[str] = ...) -> None: ...

class ReplicationSetting(_message.Message):
    __slots__ = ("from_ts", "replicas", "min_acks")
    FROM_TS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MIN_ACKS_FIELD_NUMBER: _ClassVar[int]
    from_ts: int
    replicas: int
    min_acks: int
    def __init__(self, from_ts: _Optional[int] = ..., replicas: _Optional[int] = ..., min_acks: _Optional[int] = ...) -> None: ...

class ReplicationHistory(_message.Message):
    __slots__ = ("settings",)
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.RepeatedCompositeFieldContainer[ReplicationSetting]
    def __init__(self, settings: _Optional[_Iterable[_Union[ReplicationSetting, _Mapping]]] = ...) -> None: ...

class GetReplicationReq(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetReplicationReq(_message.Message):
    __slots__ = ("replicas", "min_acks", "grace_ms")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MIN_ACKS_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    replicas: int
    min_acks: int
    grace_ms: int
    def __init__(self, replicas: _Optional[int] = ..., min_acks: _Optional[int] = ..., grace_ms: _Optional[int] = ...) -> None: ...

class GetMemberReq(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberInfo(_message.Message):
    __slots__ = ("addr", "leader", "leader_addr", "store", "etcd_endpoint", "tso_limit", "lease_left_ms", "cluster_id")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    ETCD_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TSO_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LEASE_LEFT_MS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    addr: str
    leader: bool
    leader_addr: str
    store: str
    etcd_endpoint: str
    tso_limit: int
    lease_left_ms: int
    cluster_id: int
    def __init__(self, addr: _Optional[str] = ..., leader: _Optional[bool] = ..., leader_addr: _Optional[str] = ..., store: _Optional[str] = ..., etcd_endpoint: _Optional[str] = ..., tso_limit: _Optional[int] = ..., lease_left_ms: _Optional[int] = ..., cluster_id: _Optional[int] = ...) -> None: ...
