"""The registry's logic, free of any transport: TSO allocation, node registration,
heartbeats and the node state machine (binlogctl's states).

The gRPC servicer in ``binlake.registry.server`` is a thin shell around
``RegistryService``; tests drive this class directly.

State machine. Between two registrations a node's state only moves forward
along ONLINE -> PAUSING -> PAUSED -> CLOSING -> OFFLINE: a heartbeat never
undoes what an operator asked (a PAUSING node reporting ONLINE stays PAUSING,
and the reply tells it to pause), and an OFFLINE node must register again to
come back. Operators may ask for PAUSING and CLOSING; PAUSED and OFFLINE are
reported by the node itself once it has drained, except that an operator may
mark a writer, or a Pump that stopped heartbeating, OFFLINE directly.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

from binlake import errors, net, tso
from binlake.registry.model import KINDS, ConsumerRecord, NodeRecord, NodeState, ReplicationSetting
from binlake.registry.store import RegistryStore

MAX_NODE_ID_LEN = 128
MAX_DESCRIPTION_LEN = 1024
# The most timestamps one GetTS may ask for: one millisecond's logical space.
MAX_TS_COUNT = tso.MAX_LOGICAL
# A Pump silent for this long is dead, and an operator may mark it OFFLINE.
DEAD_AFTER_MS = 60_000
# Replication settings: at most this many copies, and how far ahead a change may apply.
MAX_REPLICAS = 16
MAX_GRACE_MS = 3_600_000

# How far along the lifecycle each state is; see the module docstring.
_RANK = {
    NodeState.ONLINE: 0,
    NodeState.PAUSING: 1,
    NodeState.PAUSED: 2,
    NodeState.CLOSING: 3,
    NodeState.OFFLINE: 4,
}

# Reported status fields a heartbeat copies verbatim (addresses are checked separately).
_STATUS_INT_FIELDS = (
    "max_commit_ts",
    "safe_ts",
    "gc_ts",
    "disk_used_bytes",
    "disk_free_bytes",
    "pending_txns",
)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Leadership(Protocol):
    """What a registry group's election tells the service (``election.Election``)."""

    def is_leader(self) -> bool: ...

    def leader_addr(self) -> str: ...


class RegistryService:
    """TSO plus node records, over a ``RegistryStore``. Thread-safe."""

    def __init__(
        self,
        store: RegistryStore,
        tso_window_ms: int = 3000,
        clock_ms: Callable[[], int] | None = None,
        *,
        self_addr: str = "",
        leadership: Leadership | None = None,
    ) -> None:
        self._store = store
        self._clock_ms = clock_ms or _wall_ms
        self._tso_window_ms = tso_window_ms
        self.self_addr = self_addr
        # For a member of a registry group: only the leader serves, and only
        # while its lease is valid; its allocator exists only while it leads.
        self._leadership = leadership
        self._tso: tso.TSOAllocator | None = None if leadership is not None else self._new_allocator()
        # Serialises read-modify-write of node records (heartbeat vs operator),
        # and makes a listing and its revision agree. TSO has its own lock.
        self._nodes_lock = threading.Lock()

    def _new_allocator(self) -> tso.TSOAllocator:
        # The allocator persists its high-water mark through the store before it
        # hands out any ts below it, so timestamps never repeat across restarts
        # nor across leaders (it starts above the mark the last one saved).
        return tso.TSOAllocator(
            self._store.load_tso_limit,
            self._store.save_tso_limit,
            window_ms=self._tso_window_ms,
            clock_ms=self._clock_ms,
        )

    # -- leadership (a registry group on etcd) -------------------------------------

    def become_leader(self) -> None:
        """Load the saved mark and save a new one above it (a fenced write) before
        serving a single TSO: the new leader starts above everything handed out."""
        self._tso = self._new_allocator()

    def step_down(self) -> None:
        self._tso = None

    def tso_limit(self) -> int:
        """The high-water mark in memory (0 when this member does not lead)."""
        allocator = self._tso
        return allocator.limit if allocator is not None else 0

    def check_leader(self) -> None:
        """NotLeader (naming the leader) unless this member may serve now."""
        leadership = self._leadership
        if leadership is None:
            return
        if leadership.is_leader() and self._tso is not None:
            return
        leader = leadership.leader_addr()
        if leader and leader != self.self_addr:
            raise errors.NotLeader(
                f"registry {self.self_addr} is a follower; the leader is {leader}", leader=leader)
        raise errors.NotLeader(
            f"registry {self.self_addr} is a follower and no leader is elected yet (an election takes up to "
            "one lease, 3 s); retry, or check that the etcd store has a quorum")

    def _allocate(self, count: int) -> int:
        self.check_leader()
        allocator = self._tso
        if allocator is None:
            raise errors.NotLeader(f"registry {self.self_addr} stopped leading")
        first = allocator.allocate(count)
        # Checked again after: a TSO leaves only while the lease (counted from
        # the keepalive's start, so ending before etcd's) is still valid.
        self.check_leader()
        return first

    @property
    def store(self) -> RegistryStore:
        return self._store

    # -- TSO -------------------------------------------------------------------

    def get_ts(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive timestamps; return the first."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise errors.InvalidArgument(f"count must be an integer, got {type(count).__name__}")
        if not 1 <= count <= MAX_TS_COUNT:
            raise errors.InvalidArgument(f"count must be in [1, {MAX_TS_COUNT}], got {count}")
        return self._allocate(count)

    def cluster_info(self) -> tuple[int, int]:
        """(cluster id, revision)."""
        with self._nodes_lock:
            return self._store.cluster_id(), self._store.revision()

    # -- node reports ----------------------------------------------------------------

    def register(self, record: NodeRecord) -> NodeRecord:
        """Announce a node: it is ONLINE from a fresh TSO on. Re-registering (a restart,
        or a node coming back after OFFLINE) starts a new online period."""
        _check_node_id(record.node_id)
        if record.kind not in KINDS:
            raise errors.InvalidArgument(
                f"node {record.node_id}: kind must be one of {', '.join(KINDS)}, got {record.kind!r}"
            )
        _check_addresses(record)
        _check_status(record)
        with self._nodes_lock:
            old = self._store.get_node(record.node_id)
            if old is not None and old.kind != record.kind:
                raise errors.FailedPrecondition(
                    f"node id {record.node_id} is already registered as a {old.kind}; "
                    f"a {record.kind} needs a different node id"
                )
            # Stamped while holding the lock, so online_ts order equals registration order.
            online_ts = self._allocate(1)
            stored = dataclasses.replace(
                record,
                state=NodeState.ONLINE,
                online_ts=online_ts,
                offline_ts=0,
                updated_at_ms=self._clock_ms(),
                empty_below_ts=_empty_below(old, record),
            )
            self._store.put_node(stored)
            return stored

    def heartbeat(self, record: NodeRecord) -> NodeRecord:
        """Store a node's status report; the returned record's state is what the
        node should do (e.g. PAUSING: stop accepting writes and pause)."""
        _check_node_id(record.node_id)
        reported = NodeState(record.state)
        _check_addresses(record)
        _check_status(record)
        with self._nodes_lock:
            stored = self._store.get_node(record.node_id)
            if stored is None:
                raise errors.NotFound(
                    f"node {record.node_id} is not registered; a node registers when it starts "
                    "(restart it if it was removed)"
                )
            updated = dataclasses.replace(
                stored,
                addr=record.addr,
                metrics_addr=record.metrics_addr,
                load=float(record.load),
                updated_at_ms=self._clock_ms(),
                **{name: getattr(record, name) for name in _STATUS_INT_FIELDS},
                empty_below_ts=_empty_below(stored, record),
            )
            # The stored state is what the operator asked or the node last reported;
            # a report can only move it forward (see the module docstring).
            new_state = max(stored.state, reported, key=_RANK.__getitem__)
            if new_state is NodeState.OFFLINE and stored.state is not NodeState.OFFLINE:
                # Stamped once: the first time the node is seen offline.
                updated.offline_ts = self._allocate(1)
            updated.state = new_state
            self._store.put_node(updated)
            return updated

    # -- operators ---------------------------------------------------------------

    def set_state(self, node_id: str, state: NodeState | str) -> NodeRecord:
        """An operator's request: PAUSING or CLOSING (or OFFLINE for a writer or a dead Pump)."""
        _check_node_id(node_id)
        target = _parse_state(state)
        if target is NodeState.ONLINE:
            raise errors.InvalidArgument(
                f"node {node_id} cannot be set online by an operator: "
                "restart the node to bring it online (it registers itself)"
            )
        with self._nodes_lock:
            record = self._store.get_node(node_id)
            if record is None:
                raise errors.NotFound(f"node {node_id} is not registered; {self._known_nodes()}")
            current = record.state
            if current is target:
                # Asking again for the state a node is already in changes nothing.
                return record
            if target is NodeState.PAUSING:
                if current is NodeState.PAUSED:
                    return record
                if current is not NodeState.ONLINE:
                    raise _illegal(record, target, "only an online node can be paused")
            elif target is NodeState.CLOSING:
                if current is NodeState.OFFLINE:
                    return record
            elif target is NodeState.PAUSED:
                raise _illegal(
                    record,
                    target,
                    "a node reports paused itself once it has paused; set it pausing to ask it to pause",
                )
            elif target is NodeState.OFFLINE:
                self._check_may_force_offline(record)
            record = dataclasses.replace(record, state=target)
            if target is NodeState.OFFLINE:
                record.offline_ts = self._allocate(1)
            # updated_at_ms stays: it records the node's own reports, not ours.
            self._store.put_node(record)
            return record

    def _check_may_force_offline(self, record: NodeRecord) -> None:
        if record.kind == "writer":
            # A writer holds no data anyone reads later, so an operator may drop it.
            return
        silent_ms = self._clock_ms() - record.updated_at_ms
        if silent_ms > DEAD_AFTER_MS:
            # A dead Pump will never report OFFLINE itself.
            return
        raise _illegal(
            record,
            NodeState.OFFLINE,
            f"the pump is alive (last heartbeat {silent_ms / 1000:.1f}s ago) and reports offline "
            "itself once its data is drained; set it closing (offline-pump) instead, or wait until "
            f"it has been silent for more than {DEAD_AFTER_MS // 1000}s",
        )

    def _known_nodes(self) -> str:
        ids = sorted(r.node_id for r in self._store.list_nodes(None))
        if not ids:
            return "no nodes are registered"
        shown = ", ".join(ids[:20])
        more = f" and {len(ids) - 20} more" if len(ids) > 20 else ""
        return f"registered nodes: {shown}{more}"

    # -- reads -------------------------------------------------------------------

    def get_node(self, node_id: str) -> NodeRecord:
        _check_node_id(node_id)
        record = self._store.get_node(node_id)
        if record is None:
            raise errors.NotFound(f"node {node_id} is not registered")
        return record

    def list_nodes(self, kind: str | None = None) -> tuple[list[NodeRecord], int]:
        """Nodes (of ``kind``; None or "" = every kind) sorted by node id, and the revision."""
        if kind and kind not in KINDS:
            raise errors.InvalidArgument(f"kind must be one of {', '.join(KINDS)} (or empty), got {kind!r}")
        with self._nodes_lock:
            nodes = self._store.list_nodes(kind or None)
            revision = self._store.revision()
        nodes.sort(key=lambda r: r.node_id)
        return nodes, revision


    # -- consumers (hold Pump GC at their checkpoint) ---------------------------------

    def update_consumer(self, consumer_id: str, checkpoint_ts: int, description: str = "") -> ConsumerRecord:
        """Register ``consumer_id`` or move its checkpoint forward. A checkpoint below
        the stored one is ignored (a late or repeated report), so the stored
        checkpoint never moves backwards; an empty description keeps the stored one."""
        _check_node_id(consumer_id, "consumer id")
        if isinstance(checkpoint_ts, bool) or not isinstance(checkpoint_ts, int) or not 0 <= checkpoint_ts <= tso.MAX_TS:
            raise errors.InvalidArgument(
                f"consumer {consumer_id}: checkpoint_ts must be a TSO in [0, 2^63), got {checkpoint_ts!r}"
            )
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_LEN:
            raise errors.InvalidArgument(
                f"consumer {consumer_id}: description must be a string of at most {MAX_DESCRIPTION_LEN} characters"
            )
        with self._nodes_lock:
            now = self._clock_ms()
            old = self._store.get_consumer(consumer_id)
            if old is None:
                record = ConsumerRecord(consumer_id, checkpoint_ts, description, now, now)
            else:
                record = dataclasses.replace(
                    old, checkpoint_ts=max(old.checkpoint_ts, checkpoint_ts),
                    description=description or old.description, updated_at_ms=now,
                )
            self._store.put_consumer(record)
            return record

    def list_consumers(self) -> list[ConsumerRecord]:
        """Every consumer, sorted by id."""
        with self._nodes_lock:
            consumers = self._store.list_consumers()
        return sorted(consumers, key=lambda c: c.consumer_id)

    # -- replication (replicas R, min_acks W, with the TSO each applies from) -------------

    def get_replication(self) -> list[ReplicationSetting]:
        """Every replication setting, oldest first (empty: R = W = 1 everywhere)."""
        with self._nodes_lock:
            return self._store.list_replication()

    def set_replication(self, replicas: int, min_acks: int, grace_ms: int) -> list[ReplicationSetting]:
        """Append a setting applying from a TSO ``grace_ms`` ahead of now (writers
        re-read the setting meanwhile); returns the whole history. Invariant: from_ts
        strictly increases along the history, so each TSO has exactly one setting."""
        for name, value, low, high in (("replicas", replicas, 1, MAX_REPLICAS),
                                       ("min_acks", min_acks, 1, MAX_REPLICAS),
                                       ("grace_ms", grace_ms, 0, MAX_GRACE_MS)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise errors.InvalidArgument(f"{name} must be an integer in [{low}, {high}], got {value!r}")
        if min_acks > replicas:
            raise errors.InvalidArgument(
                f"min_acks={min_acks} is above replicas={replicas}: a write cannot be acknowledged by more "
                "Pumps than it is written to")
        with self._nodes_lock:
            now = self._allocate(1)
            from_ts = tso.compose(tso.physical_ms(now) + grace_ms)
            history = self._store.list_replication()
            if history and from_ts <= history[-1].from_ts:
                raise errors.FailedPrecondition(
                    f"a replication setting already applies from {tso.format_ts(history[-1].from_ts)}, later "
                    "than this one would; wait until then or give a longer grace")
            setting = ReplicationSetting(from_ts, replicas, min_acks)
            self._store.add_replication(setting)
            return [*history, setting]

    def remove_consumer(self, consumer_id: str) -> ConsumerRecord:
        """Drop a consumer (an operator's decision): it no longer holds GC."""
        _check_node_id(consumer_id, "consumer id")
        with self._nodes_lock:
            record = self._store.get_consumer(consumer_id)
            if record is None or not self._store.delete_consumer(consumer_id):
                known = ", ".join(sorted(c.consumer_id for c in self._store.list_consumers())) or "none"
                raise errors.NotFound(f"consumer {consumer_id} is not registered (registered: {known})")
            return record


def create_replication(store: RegistryStore, replicas: int, min_acks: int, *,
                       write: bool = True) -> list[ReplicationSetting]:
    """The replication a cluster is created with (``binlake registry --replicas``):
    on a store that never served (no TSO, node or setting yet) it is recorded
    applying from ts 0, so every window, the DDL history from ts 0 included, is
    read with it. On a store that has served, the setting in force must already
    be this one (nothing is written): otherwise FailedPrecondition, since a
    setting cannot apply to what was written before it. ``write=False``: only check
    (``binlake up`` before it starts the registry that writes it)."""
    for name, value in (("replicas", replicas), ("min_acks", min_acks)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
            raise errors.InvalidArgument(f"{name} must be an integer in [1, {MAX_REPLICAS}], got {value!r}")
    if min_acks > replicas:
        raise errors.InvalidArgument(f"min_acks={min_acks} is above replicas={replicas}")
    wanted = ReplicationSetting(0, replicas, min_acks)
    # Asked before any RegistryService opens the store (its allocator saves a TSO limit at once).
    history = store.list_replication()
    fresh = not history and store.load_tso_limit() == 0 and not store.list_nodes(None)
    if fresh and (replicas, min_acks) != (1, 1):
        if not write:
            return [wanted]
        try:
            store.add_replication(wanted)
        except errors.Unavailable:
            history = store.list_replication()  # another member of the group wrote it first
        else:
            return [wanted]
    current = history[-1] if history else ReplicationSetting(0, 1, 1)
    if (current.replicas, current.min_acks) != (replicas, min_acks):
        raise errors.FailedPrecondition(
            f"registry store {store.describe()} already serves a cluster with replicas="
            f"{current.replicas} min_acks={current.min_acks}; --replicas/--min-acks set a cluster's "
            f"replication only when its store is created: drop them (or give replicas={current.replicas} "
            f"min_acks={current.min_acks}), or change it with binlake ctl replication")
    return history


def _empty_below(stored: NodeRecord | None, report: NodeRecord) -> int:
    """``NodeRecord.empty_below_ts`` after ``report``: a Pump that has stored no
    transaction (max_commit_ts 0) and collected none (gc_ts 0: a Pump whose GC
    removed binlogs had stored them) holds none below its safe ts, now or later
    (``pump.sorter``: every one routed to it below the safe ts is stored, and any
    other commits above it); once it has stored one the value stays. The Pump reads
    its safe ts before its max commit ts, so the pair never claims more."""
    kept = stored.empty_below_ts if stored is not None else 0
    if (stored or report).kind == "pump" and report.max_commit_ts == 0 and report.gc_ts == 0:
        return max(kept, report.safe_ts)
    return kept


def _parse_state(state: NodeState | str) -> NodeState:
    if isinstance(state, NodeState):
        return state
    if isinstance(state, str):
        try:
            return NodeState.parse(state)
        except ValueError as exc:
            raise errors.InvalidArgument(str(exc)) from None
    raise errors.InvalidArgument(f"state must be a NodeState, got {type(state).__name__}")


def _illegal(record: NodeRecord, target: NodeState, why: str) -> errors.FailedPrecondition:
    return errors.FailedPrecondition(
        f"cannot set {record.kind} {record.node_id} from {record.state.value} to {target.value}: {why}"
    )


def _check_node_id(node_id: str, what: str = "node id") -> None:
    if not isinstance(node_id, str) or not node_id:
        raise errors.InvalidArgument(f"{what} must be a non-empty string")
    if len(node_id) > MAX_NODE_ID_LEN:
        raise errors.InvalidArgument(
            f"{what} {node_id[:32]!r}... is {len(node_id)} characters; at most {MAX_NODE_ID_LEN} are allowed"
        )
    if not node_id.isprintable() or any(c.isspace() for c in node_id):
        raise errors.InvalidArgument(
            f"{what} {node_id!r} must be printable characters without whitespace"
        )


def _check_addresses(record: NodeRecord) -> None:
    _check_addr(record.addr, f"node {record.node_id} addr")
    if record.metrics_addr:
        _check_addr(record.metrics_addr, f"node {record.node_id} metrics_addr")


def _check_addr(addr: str, what: str) -> None:
    _, port = net.parse_addr(addr, what)
    if port == 0:
        # Port 0 is fine to listen on, but others cannot reach it: a node
        # must report the port it actually bound.
        raise errors.InvalidArgument(f"{what} {addr!r}: port must be > 0 (report the bound port)")


def _check_status(record: NodeRecord) -> None:
    for name in _STATUS_INT_FIELDS:
        value = getattr(record, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise errors.InvalidArgument(f"node {record.node_id}: {name} must be an integer >= 0, got {value!r}")
    load = record.load
    if isinstance(load, bool) or not isinstance(load, int | float) or not math.isfinite(load) or load < 0:
        raise errors.InvalidArgument(f"node {record.node_id}: load must be a finite number >= 0, got {load!r}")
