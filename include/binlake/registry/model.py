"""Node records as the registry stores them, and their protobuf conversion."""

from __future__ import annotations

import dataclasses
import enum

from binlake import errors
from binlake.proto import registry_pb2


class NodeState(enum.StrEnum):
    """binlogctl's node states. A Pump is written to only while ONLINE; it is read
    from in every state until it is OFFLINE and its data is past every window."""

    ONLINE = "online"
    PAUSING = "pausing"
    PAUSED = "paused"
    CLOSING = "closing"
    OFFLINE = "offline"

    def to_proto(self) -> int:
        return int(registry_pb2.NodeState.Value(self.name))

    @classmethod
    def from_proto(cls, value: int) -> NodeState:
        try:
            return cls[registry_pb2.NodeState.Name(value)]
        except ValueError:
            # A peer's message: an unknown number is the peer's mistake, not ours.
            raise errors.InvalidArgument(
                f"unknown node state {value}; expected one of "
                f"{', '.join(f'{s.to_proto()} ({s.value})' for s in cls)}") from None

    @classmethod
    def parse(cls, text: str) -> NodeState:
        try:
            return cls(text.lower())
        except ValueError:
            raise ValueError(
                f"unknown node state {text!r}; expected one of {', '.join(s.value for s in cls)}"
            ) from None


KINDS = ("pump", "writer")


@dataclasses.dataclass
class NodeRecord:
    node_id: str
    kind: str
    addr: str
    state: NodeState = NodeState.ONLINE
    max_commit_ts: int = 0
    safe_ts: int = 0
    gc_ts: int = 0
    disk_used_bytes: int = 0
    disk_free_bytes: int = 0
    load: float = 0.0
    online_ts: int = 0
    offline_ts: int = 0
    updated_at_ms: int = 0
    pending_txns: int = 0
    metrics_addr: str = ""
    # Kept by the registry (registry.proto NodeInfo): the Pump holds no transaction
    # with commit_ts below this; a node's own value is ignored.
    empty_below_ts: int = 0

    def to_proto(self) -> registry_pb2.NodeInfo:
        fields = dataclasses.asdict(self)
        fields["state"] = self.state.to_proto()
        return registry_pb2.NodeInfo(**fields)

    @classmethod
    def from_proto(cls, msg: registry_pb2.NodeInfo) -> NodeRecord:
        fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(cls)}
        fields["state"] = NodeState.from_proto(msg.state)
        return cls(**fields)


@dataclasses.dataclass
class ConsumerRecord:
    """A reader of every Pump (the lake's ingest, a replication task) that holds
    Pump GC at ``checkpoint_ts``: every transaction with a lower commit_ts has
    been consumed, nothing at or above it may be collected for its sake."""

    consumer_id: str
    checkpoint_ts: int = 0
    description: str = ""
    registered_at_ms: int = 0
    updated_at_ms: int = 0

    def to_proto(self) -> registry_pb2.ConsumerInfo:
        return registry_pb2.ConsumerInfo(**dataclasses.asdict(self))

    @classmethod
    def from_proto(cls, msg: registry_pb2.ConsumerInfo) -> ConsumerRecord:
        return cls(**{f.name: getattr(msg, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class ReplicationSetting:
    """A cluster replication setting and the TSO it applies from: prewrites with
    ``start_ts >= from_ts`` are written to ``replicas`` Pumps and acknowledged at
    ``min_acks``. The registry keeps every setting ever made (a history), so a
    window is read with the setting that was in force when it was written
    (``binlake.registry.replicas``)."""

    from_ts: int
    replicas: int
    min_acks: int

    def to_proto(self) -> registry_pb2.ReplicationSetting:
        return registry_pb2.ReplicationSetting(**dataclasses.asdict(self))

    @classmethod
    def from_proto(cls, msg: registry_pb2.ReplicationSetting) -> ReplicationSetting:
        return cls(from_ts=msg.from_ts, replicas=msg.replicas, min_acks=msg.min_acks)
