"""Client of the registry: timestamps (coalesced across threads, as PD's client
does), node registration, heartbeats, state changes and listings.

Errors come out as ``binlake.errors`` types. Idempotent calls (reads, TSO,
heartbeats) retry UNAVAILABLE with a short backoff within the client's timeout,
so a registry restart shows up as a brief stall rather than an error.

Given a registry group (``a:8230,b:8230,c:8230``), the client follows its
leader: it calls the member that last answered; a follower's refusal names the
leader (trailing metadata), and the client goes there at once; an unreachable
or silent member sends it to the next one. Through a failover it keeps trying
for ``failover_s`` (one lease plus an election takes about 3 s), then fails
with one line naming every member and the last error.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any, TypeVar

import grpc

from binlake import errors, net, rpc
from binlake.config import MiB
from binlake.proto import registry_pb2, registry_pb2_grpc
from binlake.registry.model import ConsumerRecord, NodeRecord, NodeState, ReplicationSetting
from binlake.tso import MAX_LOGICAL

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_MESSAGE_BYTES = 64 * MiB
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 0.5
# How long a call to a registry group keeps looking for a leader: a lease (3 s),
# the election after it and the new leader's first fenced write, with room.
FAILOVER_S = 15.0
# A group waits at most this long between rounds over its members: the new
# leader should be found within a poll of its election, not a backoff later.
_GROUP_MAX_BACKOFF_S = 0.1
# One attempt against one member of a group: a stopped or partitioned member
# does not answer at all, and the call must move on to the others.
_GROUP_ATTEMPT_S = 2.0
# Metadata keys of a follower's refusal (see registry.proto, GetMember).
LEADER_KEY = rpc.LEADER_METADATA_KEY
NOT_LEADER_KEY = rpc.NOT_LEADER_METADATA_KEY
# The most timestamps one GetTS may carry (the server's limit).
_MAX_TS_BATCH = MAX_LOGICAL


class _TSWaiter:
    """One get_ts caller waiting for a round's leader to hand it a timestamp."""

    __slots__ = ("done", "error", "promoted", "ts")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ts = 0
        self.error: errors.BinlakeError | None = None
        # Set (with done) when this caller is to lead the next round.
        self.promoted = False


class RegistryClient:
    """A connection to one registry, or to a registry group's leader (``addr`` is
    ``HOST:PORT[,HOST:PORT...]``). Thread-safe; use as a context manager or close()."""

    def __init__(self, addr: str, timeout_s: float = 5.0, *, failover_s: float | None = None) -> None:
        self._addrs = net.parse_addr_list(addr, "registry address")
        if timeout_s <= 0:
            raise errors.InvalidArgument(f"timeout_s must be > 0, got {timeout_s}")
        if failover_s is not None and failover_s <= 0:
            raise errors.InvalidArgument(f"failover_s must be > 0, got {failover_s}")
        self._addr = ",".join(self._addrs)
        self._timeout_s = timeout_s
        # A group's calls retry through a failover; a lone registry keeps the
        # old window (its restart is a stall of about a second).
        self._window_s = failover_s if failover_s is not None else (
            max(timeout_s, FAILOVER_S) if len(self._addrs) > 1 else timeout_s)
        self._options = [
            *rpc.message_options(MAX_MESSAGE_BYTES),
            # gRPC's default reconnect backoff grows to minutes; a registry that
            # comes back should be found again within our retry window.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._stubs_lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, registry_pb2_grpc.RegistryStub] = {}
        # The member calls go to first: the last one that answered as leader.
        self._current = self._addrs[0]
        self._closed = threading.Event()
        # get_ts coalescing: callers queue here; the round's leader drains the
        # queue with a single GetTS per round and hands out first + i.
        self._ts_cond = threading.Condition()
        self._ts_queue: list[_TSWaiter] = []
        # True while some caller leads a round (see get_ts).
        self._ts_leading = False
        # get_ts_async requests not yet handed to a round, and the thread that does.
        self._async_ts: list[concurrent.futures.Future[int]] = []
        self._dispatcher: threading.Thread | None = None

    @property
    def addr(self) -> str:
        """The address list as given (one HOST:PORT for a lone registry)."""
        return self._addr

    @property
    def addrs(self) -> list[str]:
        return list(self._addrs)

    @property
    def leader(self) -> str:
        """The member the next call goes to first (the last leader seen)."""
        with self._stubs_lock:
            return self._current

    def _stub(self, addr: str) -> registry_pb2_grpc.RegistryStub:
        with self._stubs_lock:
            stub = self._stubs.get(addr)
            if stub is None:
                channel = rpc.channel(addr, self._options)
                self._channels[addr] = channel
                stub = self._stubs[addr] = registry_pb2_grpc.RegistryStub(channel)
            return stub

    def _follow(self, addr: str) -> None:
        with self._stubs_lock:
            self._current = addr

    # -- timestamps ----------------------------------------------------------------

    def get_ts(self) -> int:
        """One fresh timestamp. Concurrent callers share one RPC (PD's batching):
        the first caller leads a round - one GetTS for everyone queued - and hands
        the lead to a waiting caller, so a lone caller pays no thread hand-off and
        16 callers at once cost about one round trip."""
        waiter = _TSWaiter()
        with self._ts_cond:
            if self._closed.is_set():
                raise self._closed_error()
            self._ts_queue.append(waiter)
            lead = not self._ts_leading
            if lead:
                self._ts_leading = True
        if lead:
            self._lead_round()
        return self._await(waiter)

    def _await(self, waiter: _TSWaiter) -> int:
        """Wait for ``waiter``'s timestamp, leading a round when promoted to."""
        # A round may retry through a failover (the window), and a waiter may wait
        # for the round before its own.
        deadline = 2 * self._window_s + 1.0
        while True:
            if not waiter.done.wait(deadline):
                with self._ts_cond:
                    if waiter in self._ts_queue:
                        self._ts_queue.remove(waiter)
                    if waiter.promoted:
                        self._pass_lead()
                raise errors.DeadlineExceeded(f"registry {self._addr}: no timestamp within {deadline:.1f}s")
            if waiter.promoted:
                # Our turn to lead the next round (which includes us).
                waiter.promoted = False
                waiter.done.clear()
                self._lead_round()
                continue
            break
        if waiter.error is not None:
            raise _copy_error(waiter.error)
        return waiter.ts

    def get_ts_async(self) -> concurrent.futures.Future[int]:
        """A timestamp requested now and delivered later, for a caller that has
        other work to do meanwhile (a writer's start_ts while its statements
        run). Requests queued together share one round with each other and with
        concurrent ``get_ts`` callers; one dispatcher thread carries them, so
        the caller never waits on the registry until it reads the future."""
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._ts_cond:
            if self._closed.is_set():
                raise self._closed_error()
            self._async_ts.append(future)
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch_async, name="registry-tso", daemon=True)
                self._dispatcher.start()
            self._ts_cond.notify_all()
        return future

    def _dispatch_async(self) -> None:
        while True:
            with self._ts_cond:
                self._ts_cond.wait_for(lambda: bool(self._async_ts) or self._closed.is_set())
                if self._closed.is_set():
                    pending, self._async_ts = self._async_ts, []
                    for f in pending:
                        f.set_exception(self._closed_error())
                    return
                batch, self._async_ts = self._async_ts, []
                waiters = [_TSWaiter() for _ in batch]
                self._ts_queue.extend(waiters)
                lead = not self._ts_leading
                if lead:
                    self._ts_leading = True
            if lead:
                self._lead_round()
            for future, waiter in zip(batch, waiters, strict=True):
                try:
                    future.set_result(self._await(waiter))
                except errors.BinlakeError as exc:
                    future.set_exception(exc)

    def _lead_round(self) -> None:
        with self._ts_cond:
            batch = self._ts_queue[:_MAX_TS_BATCH]
            del self._ts_queue[:_MAX_TS_BATCH]
        if batch:
            try:
                first = self.get_ts_batch(len(batch))
            except errors.BinlakeError as exc:
                for w in batch:
                    w.error = exc
            except Exception as exc:  # never leave callers hanging
                log.exception("registry %s: timestamp request failed", self._addr)
                for w in batch:
                    w.error = errors.BinlakeError(f"registry {self._addr}: timestamp request failed: {exc}")
            else:
                for i, w in enumerate(batch):
                    w.ts = first + i
        with self._ts_cond:
            self._pass_lead()
        for w in batch:
            w.done.set()

    def _pass_lead(self) -> None:
        """Hand the lead to the next queued caller, or give it up (holding _ts_cond)."""
        if self._ts_queue and not self._closed.is_set():
            nxt = self._ts_queue[0]
            nxt.promoted = True
            nxt.done.set()
        else:
            self._ts_leading = False

    def get_ts_batch(self, count: int) -> int:
        """Reserve ``count`` consecutive timestamps with one RPC; return the first."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0 or count >= 1 << 32:
            # The server judges the range; this only keeps protobuf from raising.
            raise errors.InvalidArgument(f"count must be an integer in [1, {_MAX_TS_BATCH}], got {count!r}")
        resp = self._call("GetTS", registry_pb2.GetTSReq(count=count), idempotent=True)
        return int(resp.first)

    # -- cluster and nodes -------------------------------------------------------------

    def cluster_info(self) -> tuple[int, int]:
        """(cluster id, revision)."""
        resp = self._call("GetClusterInfo", registry_pb2.GetClusterInfoReq(), idempotent=True
        )
        return int(resp.cluster_id), int(resp.revision)

    def register(self, record: NodeRecord) -> NodeRecord:
        """Register a node (ONLINE from the returned online_ts). Not retried: a retry
        would start another online period."""
        req = registry_pb2.RegisterNodeReq(node=record.to_proto())
        return NodeRecord.from_proto(self._call("RegisterNode", req, idempotent=False))

    def heartbeat(self, record: NodeRecord) -> NodeRecord:
        """Report status; the returned record's state is what the node should do."""
        req = registry_pb2.HeartbeatReq(node=record.to_proto())
        return NodeRecord.from_proto(self._call("Heartbeat", req, idempotent=True))

    def set_state(self, node_id: str, state: NodeState) -> NodeRecord:
        """An operator's state change (pausing, closing, or offline for a writer/dead Pump)."""
        req = registry_pb2.SetNodeStateReq(node_id=node_id, state=NodeState(state).to_proto())  # type: ignore[arg-type]
        return NodeRecord.from_proto(self._call("SetNodeState", req, idempotent=False))

    def get_node(self, node_id: str) -> NodeRecord:
        req = registry_pb2.GetNodeReq(node_id=node_id)
        return NodeRecord.from_proto(self._call("GetNode", req, idempotent=True))

    def list_nodes(self, kind: str | None = None) -> tuple[list[NodeRecord], int]:
        """Nodes (of ``kind``, or all) sorted by node id, and the registry's revision."""
        req = registry_pb2.ListNodesReq(kind=kind or "")
        resp = self._call("ListNodes", req, idempotent=True)
        return [NodeRecord.from_proto(n) for n in resp.nodes], int(resp.revision)

    # -- consumers -------------------------------------------------------------------------

    def update_consumer(self, consumer_id: str, checkpoint_ts: int, description: str = "") -> ConsumerRecord:
        """Register a consumer or move its checkpoint forward (never backwards).
        Retried on UNAVAILABLE: applying it twice changes nothing more."""
        if isinstance(checkpoint_ts, bool) or not isinstance(checkpoint_ts, int) or checkpoint_ts < 0:
            raise errors.InvalidArgument(f"checkpoint_ts must be a TSO >= 0, got {checkpoint_ts!r}")
        info = registry_pb2.ConsumerInfo(consumer_id=consumer_id, checkpoint_ts=checkpoint_ts, description=description)
        req = registry_pb2.UpdateConsumerReq(consumer=info)
        return ConsumerRecord.from_proto(self._call("UpdateConsumer", req, idempotent=True))

    def list_consumers(self) -> list[ConsumerRecord]:
        """Every registered consumer, sorted by id."""
        resp = self._call("ListConsumers", registry_pb2.ListConsumersReq(), idempotent=True)
        return [ConsumerRecord.from_proto(c) for c in resp.consumers]

    def remove_consumer(self, consumer_id: str) -> ConsumerRecord:
        """Drop a consumer; it no longer holds any Pump's GC."""
        req = registry_pb2.RemoveConsumerReq(consumer_id=consumer_id)
        return ConsumerRecord.from_proto(self._call("RemoveConsumer", req, idempotent=False))

    # -- replication ---------------------------------------------------------------------

    def get_replication(self) -> list[ReplicationSetting]:
        """The cluster's replication settings, oldest first (empty: R = W = 1)."""
        resp = self._call("GetReplication", registry_pb2.GetReplicationReq(), idempotent=True)
        return [ReplicationSetting.from_proto(r) for r in resp.settings]

    def set_replication(self, replicas: int, min_acks: int, grace_ms: int) -> list[ReplicationSetting]:
        """Append a setting applying ``grace_ms`` from now; returns the history."""
        for name, value in (("replicas", replicas), ("min_acks", min_acks), ("grace_ms", grace_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise errors.InvalidArgument(f"{name} must be a non-negative integer, got {value!r}")
        req = registry_pb2.SetReplicationReq(replicas=replicas, min_acks=min_acks, grace_ms=grace_ms)
        resp = self._call("SetReplication", req, idempotent=False)
        return [ReplicationSetting.from_proto(r) for r in resp.settings]

    # -- plumbing ------------------------------------------------------------------------

    def member(self, addr: str, timeout_s: float | None = None) -> registry_pb2.MemberInfo:
        """GetMember of one member (leader or follower): who it is and who leads."""
        try:
            info: registry_pb2.MemberInfo = self._stub(addr).GetMember(
                registry_pb2.GetMemberReq(), timeout=timeout_s or self._timeout_s)
            return info
        except grpc.RpcError as exc:
            raise rpc.from_rpc_error(exc, f"registry {addr}") from None

    def _call(self, name: str, request: Any, *, idempotent: bool) -> Any:
        if self._closed.is_set():
            raise self._closed_error()
        group = len(self._addrs) > 1
        deadline = time.monotonic() + self._window_s
        backoff = _FIRST_BACKOFF_S
        target = self.leader
        failures: dict[str, str] = {}
        while True:
            remaining = deadline - time.monotonic()
            attempt = min(remaining, _GROUP_ATTEMPT_S) if group else remaining
            try:
                result = getattr(self._stub(target), name)(request, timeout=max(attempt, 0.001))
            except grpc.RpcError as exc:
                if self._closed.is_set():
                    raise self._closed_error() from None
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                refused, hint = _not_leader(exc)
                if not (refused or code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)):
                    raise self._error(name, exc, target) from None
                # A follower's refusal did nothing, so even a non-idempotent call may
                # go to the leader; a call that may have run is retried only when
                # it is idempotent, or when the connection never opened.
                sent = not refused and not _never_sent(exc)
                if sent and not idempotent:
                    raise self._error(name, exc, target) from None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED and not group:
                    raise self._error(name, exc, target) from None
                if hint and hint != target and hint not in failures:
                    # Straight to the leader the follower named, no backoff (once per
                    # member and call: two stale hints must not bounce us around).
                    nxt, pause = hint, 0.0
                elif group:
                    nxt = self._addrs[(self._addrs.index(target) + 1) % len(self._addrs)] \
                        if target in self._addrs else self._addrs[0]
                    # A full round without a leader: wait before the next one.
                    pause = backoff if nxt == self._addrs[0] else 0.0
                else:
                    # One address given: back to it (a hint it gave may have been stale).
                    nxt, pause = self._addrs[0], backoff
                failures[target] = exc.details() if hasattr(exc, "details") else str(exc)
                if time.monotonic() + pause >= deadline:
                    raise self._gave_up(name, exc, target, failures) from None
                log.debug("registry %s: %s failed (%s), trying %s", target, name, code.name, nxt)
                if pause and self._closed.wait(pause):
                    raise self._closed_error() from None
                if pause:
                    backoff = min(backoff * 2, _GROUP_MAX_BACKOFF_S if group else _MAX_BACKOFF_S)
                target = nxt
                continue
            if target != self.leader:
                log.info("registry group: following the leader %s", target)
                self._follow(target)
            return result

    def _gave_up(self, name: str, exc: grpc.RpcError, target: str,
                 failures: dict[str, str]) -> errors.BinlakeError:
        if len(self._addrs) == 1:
            return self._error(name, exc, target)
        tried = "; ".join(f"{a}: {d}" for a, d in failures.items())
        err = errors.Unavailable(
            f"no registry leader answered {name} within {self._window_s:.0f}s among {self._addr} ({tried}); "
            "check that the registries run and that their etcd has a quorum")
        err.grpc_code = grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        return err

    def _error(self, name: str, exc: grpc.RpcError, target: str | None = None) -> errors.BinlakeError:
        addr = target or self._addr
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        if code == grpc.StatusCode.UNAVAILABLE:
            return rpc.from_rpc_error(exc, f"registry {addr} is unreachable")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return rpc.from_rpc_error(exc, f"registry {addr} did not answer {name} within {self._timeout_s}s")
        return rpc.from_rpc_error(exc, f"registry {addr}")

    def _closed_error(self) -> errors.Unavailable:
        return errors.Unavailable(f"registry client for {self._addr} is closed")

    def close(self) -> None:
        """Fail waiting get_ts callers and close the channel."""
        with self._ts_cond:
            if self._closed.is_set():
                return
            self._closed.set()
            queued, self._ts_queue = self._ts_queue, []
            self._ts_cond.notify_all()  # the async dispatcher fails its queue and ends
        for w in queued:
            w.error = self._closed_error()
            w.done.set()
        # Closing the channels cancels an in-flight GetTS, so its leader returns promptly.
        with self._stubs_lock:
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            channel.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _not_leader(exc: grpc.RpcError) -> tuple[bool, str]:
    """(whether a registry refused as a follower, the leader it named or '')."""
    try:
        metadata = exc.trailing_metadata() or ()
    except Exception:  # a transport error carries no call metadata
        return False, ""
    values = {k: v for k, v in metadata}
    if NOT_LEADER_KEY in values or LEADER_KEY in values:
        return True, str(values.get(LEADER_KEY, ""))
    return False, ""


def _never_sent(exc: grpc.RpcError) -> bool:
    # gRPC fails a call with UNAVAILABLE before sending it when no connection
    # could be made; such a call is safe to send elsewhere.
    detail = (exc.details() if hasattr(exc, "details") else "") or ""
    return "failed to connect" in detail.lower() or "connection refused" in detail.lower()


def _copy_error(exc: errors.BinlakeError) -> errors.BinlakeError:
    # One failed GetTS fails many callers; each gets its own exception object so
    # their tracebacks do not pile onto a shared one across threads.
    copy = type(exc)(*exc.args)
    if hasattr(exc, "grpc_code"):
        copy.grpc_code = exc.grpc_code  # type: ignore[attr-defined]
    return copy
