"""Client of the registry: timestamps (coalesced across threads, as PD's client
does), node registration, heartbeats, state changes and listings.

Errors come out as ``binlake.errors`` types. Idempotent calls (reads, TSO,
heartbeats) retry UNAVAILABLE with a short backoff within the client's timeout,
so a registry restart shows up as a brief stall rather than an error.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from binlake import errors, net, rpc
from binlake.config import MiB
from binlake.proto import registry_pb2, registry_pb2_grpc
from binlake.registry.model import ConsumerRecord, NodeRecord, NodeState
from binlake.tso import MAX_LOGICAL

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_MESSAGE_BYTES = 64 * MiB
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 0.5
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
    """A connection to one registry. Thread-safe; use as a context manager or close()."""

    def __init__(self, addr: str, timeout_s: float = 5.0) -> None:
        net.parse_addr(addr, "registry addr")
        if timeout_s <= 0:
            raise errors.InvalidArgument(f"timeout_s must be > 0, got {timeout_s}")
        self._addr = addr
        self._timeout_s = timeout_s
        options = [
            *rpc.message_options(MAX_MESSAGE_BYTES),
            # gRPC's default reconnect backoff grows to minutes; a registry that
            # comes back should be found again within our retry window.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._channel = rpc.channel(addr, options)
        self._stub = registry_pb2_grpc.RegistryStub(self._channel)
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
        return self._addr

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
        deadline = 2 * self._timeout_s + 1.0
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
        resp = self._call("GetTS", self._stub.GetTS, registry_pb2.GetTSReq(count=count), idempotent=True)
        return int(resp.first)

    # -- cluster and nodes -------------------------------------------------------------

    def cluster_info(self) -> tuple[int, int]:
        """(cluster id, revision)."""
        resp = self._call(
            "GetClusterInfo", self._stub.GetClusterInfo, registry_pb2.GetClusterInfoReq(), idempotent=True
        )
        return int(resp.cluster_id), int(resp.revision)

    def register(self, record: NodeRecord) -> NodeRecord:
        """Register a node (ONLINE from the returned online_ts). Not retried: a retry
        would start another online period."""
        req = registry_pb2.RegisterNodeReq(node=record.to_proto())
        return NodeRecord.from_proto(self._call("RegisterNode", self._stub.RegisterNode, req, idempotent=False))

    def heartbeat(self, record: NodeRecord) -> NodeRecord:
        """Report status; the returned record's state is what the node should do."""
        req = registry_pb2.HeartbeatReq(node=record.to_proto())
        return NodeRecord.from_proto(self._call("Heartbeat", self._stub.Heartbeat, req, idempotent=True))

    def set_state(self, node_id: str, state: NodeState) -> NodeRecord:
        """An operator's state change (pausing, closing, or offline for a writer/dead Pump)."""
        req = registry_pb2.SetNodeStateReq(node_id=node_id, state=NodeState(state).to_proto())  # type: ignore[arg-type]
        return NodeRecord.from_proto(self._call("SetNodeState", self._stub.SetNodeState, req, idempotent=False))

    def get_node(self, node_id: str) -> NodeRecord:
        req = registry_pb2.GetNodeReq(node_id=node_id)
        return NodeRecord.from_proto(self._call("GetNode", self._stub.GetNode, req, idempotent=True))

    def list_nodes(self, kind: str | None = None) -> tuple[list[NodeRecord], int]:
        """Nodes (of ``kind``, or all) sorted by node id, and the registry's revision."""
        req = registry_pb2.ListNodesReq(kind=kind or "")
        resp = self._call("ListNodes", self._stub.ListNodes, req, idempotent=True)
        return [NodeRecord.from_proto(n) for n in resp.nodes], int(resp.revision)

    # -- consumers -------------------------------------------------------------------------

    def update_consumer(self, consumer_id: str, checkpoint_ts: int, description: str = "") -> ConsumerRecord:
        """Register a consumer or move its checkpoint forward (never backwards).
        Retried on UNAVAILABLE: applying it twice changes nothing more."""
        if isinstance(checkpoint_ts, bool) or not isinstance(checkpoint_ts, int) or checkpoint_ts < 0:
            raise errors.InvalidArgument(f"checkpoint_ts must be a TSO >= 0, got {checkpoint_ts!r}")
        info = registry_pb2.ConsumerInfo(consumer_id=consumer_id, checkpoint_ts=checkpoint_ts, description=description)
        req = registry_pb2.UpdateConsumerReq(consumer=info)
        return ConsumerRecord.from_proto(self._call("UpdateConsumer", self._stub.UpdateConsumer, req, idempotent=True))

    def list_consumers(self) -> list[ConsumerRecord]:
        """Every registered consumer, sorted by id."""
        resp = self._call("ListConsumers", self._stub.ListConsumers, registry_pb2.ListConsumersReq(), idempotent=True)
        return [ConsumerRecord.from_proto(c) for c in resp.consumers]

    def remove_consumer(self, consumer_id: str) -> ConsumerRecord:
        """Drop a consumer; it no longer holds any Pump's GC."""
        req = registry_pb2.RemoveConsumerReq(consumer_id=consumer_id)
        return ConsumerRecord.from_proto(self._call("RemoveConsumer", self._stub.RemoveConsumer, req, idempotent=False))

    # -- plumbing ------------------------------------------------------------------------

    def _call(self, name: str, method: Callable[..., T], request: Any, *, idempotent: bool) -> T:
        if self._closed.is_set():
            raise self._closed_error()
        deadline = time.monotonic() + self._timeout_s
        backoff = _FIRST_BACKOFF_S
        while True:
            remaining = deadline - time.monotonic()
            try:
                return method(request, timeout=max(remaining, 0.001))
            except grpc.RpcError as exc:
                if self._closed.is_set():
                    raise self._closed_error() from None
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                retry = idempotent and code == grpc.StatusCode.UNAVAILABLE
                if retry and time.monotonic() + backoff < deadline:
                    log.debug("registry %s: %s unavailable, retrying in %.2fs", self._addr, name, backoff)
                    # Waiting on the closed event lets close() cut the backoff short.
                    if self._closed.wait(backoff):
                        raise self._closed_error() from None
                    backoff = min(backoff * 2, _MAX_BACKOFF_S)
                    continue
                raise self._error(name, exc) from None

    def _error(self, name: str, exc: grpc.RpcError) -> errors.BinlakeError:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        if code == grpc.StatusCode.UNAVAILABLE:
            return rpc.from_rpc_error(exc, f"registry {self._addr} is unreachable")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return rpc.from_rpc_error(exc, f"registry {self._addr} did not answer {name} within {self._timeout_s}s")
        return rpc.from_rpc_error(exc, f"registry {self._addr}")

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
        # Closing the channel cancels an in-flight GetTS, so its leader returns promptly.
        self._channel.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _copy_error(exc: errors.BinlakeError) -> errors.BinlakeError:
    # One failed GetTS fails many callers; each gets its own exception object so
    # their tracebacks do not pile onto a shared one across threads.
    copy = type(exc)(*exc.args)
    if hasattr(exc, "grpc_code"):
        copy.grpc_code = exc.grpc_code  # type: ignore[attr-defined]
    return copy
