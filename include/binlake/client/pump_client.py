"""PumpClient: routes a writer's binlogs to Pumps, coalescing concurrent writes.

* Routing: the prewrite picks a Pump by strategy (``range`` round-robin,
  ``hash`` on start_ts, ``score`` weighted by what Pumps report: load and disk,
  plus this client's own in-flight writes); commit and rollback always go to the
  Pump that took the prewrite.
* Availability (as TiDB's Pump Client): start from the registry's online Pumps,
  follow state changes, mark a Pump unavailable after ``max_failures``
  consecutive failed writes, and probe unavailable online Pumps with an empty
  binlog until one answers.
* Batching: binlogs of concurrent writers bound for the same Pump travel in
  one message on a long-lived ``WriteBinlogStream``, which the Pump stores
  under one fsync. The streams live on one asyncio event loop per client, so a
  binlog crosses one thread hand-off between its caller and the wire (see
  ``PumpConn``).

Replication (``replicas`` R, ``min_acks`` W: the registry's setting in force at
the prewrite's start_ts, else ``ClientSettings``'; see ``binlake.registry.replicas``): a prewrite
goes to R Pumps picked by the strategy (on distinct hosts while there are enough
hosts), and is acknowledged once W of them fsynced it; fewer than W writable
Pumps fail the write with ``errors.NotEnoughReplicas``, never fewer copies. The
"pump" a prewrite returns is then a placement, ``"p1,p3"``: every Pump that may
hold the prewrite, which the commit or rollback goes to (one acknowledgement is
enough for the writer: a holder that missed the commit resolves the
transaction through the writer's status service, to the same commit_ts).
R = 1 is exactly the unreplicated client: the placement is one Pump's id.

Duplicates: when a prewrite's write fails (say the Pump died after storing it
but before answering), the prewrite is retried on another Pump. The first Pump
may still hold it and, after the transaction timeout, resolve it through the
writer's status service to the same commit_ts. Such a transaction then exists
on two Pumps with the same start_ts and commit_ts; readers (``client.reader``)
keep one copy.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import random
import threading
import time
import zlib
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

from binlake import errors, net, rpc
from binlake.client import wire
from binlake.config import ClientSettings
from binlake.proto import binlog_pb2, pump_pb2, pump_pb2_grpc
from binlake.registry.model import NodeRecord, NodeState, ReplicationSetting
from binlake.registry.replicas import setting_at

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRYABLE = (errors.Unavailable, errors.DeadlineExceeded, errors.ResourceExhausted, errors.FailedPrecondition)
# What a commit is retried on, on its own Pump (it cannot move: the prewrite is there).
_COMMIT_RETRYABLE = (errors.Unavailable, errors.DeadlineExceeded, errors.ResourceExhausted)
_RESULT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT.value[0]: errors.InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION.value[0]: errors.FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]: errors.ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE.value[0]: errors.Unavailable,
    grpc.StatusCode.OUT_OF_RANGE.value[0]: errors.OutOfRange,
    grpc.StatusCode.NOT_FOUND.value[0]: errors.NotFound,
}
_ALREADY_EXISTS = grpc.StatusCode.ALREADY_EXISTS.value[0]
# The Pump's batched write stream (pump.proto), called with requests already serialized.
_WRITE_STREAM = "/binlake.pump.Pump/WriteBinlogStream"


class SentGroup:
    """The outcome of several binlogs sent together (``PumpConn.send_group``): one future
    for all of them, settled when the last one is, instead of a future per binlog. Why:
    a source's step sends tens of binlogs at once, and a future each (created, settled
    with a notify on the loop thread, awaited) was a tenth of the source's CPU."""

    __slots__ = ("future", "results", "_left", "_lock")

    def __init__(self, n: int) -> None:
        self.future: concurrent.futures.Future[list[errors.BinlakeError | None]] = concurrent.futures.Future()
        self.results: list[errors.BinlakeError | None | bool] = [False] * n  # False: not settled yet
        self._left = n
        self._lock = threading.Lock()

    def settle(self, index: int, exc: errors.BinlakeError | None) -> None:
        with self._lock:
            if self.results[index] is not False:
                return  # settled already (the first outcome counts, as with a future)
            self.results[index] = exc
            self._left -= 1
            last = self._left == 0
        if last:
            self.future.set_result([r if isinstance(r, errors.BinlakeError) else None for r in self.results])

    def settled(self, index: int) -> bool:
        return self.results[index] is not False

    def unsettled(self) -> list[int]:
        """The indexes still waiting for an outcome."""
        with self._lock:
            return [i for i, r in enumerate(self.results) if r is False]


# The second byte of a commit or rollback binlog (its tp, after the tag): the type, each below 128.
_OUTCOME_TYPES = (bytes([binlog_pb2.COMMIT]), bytes([binlog_pb2.ROLLBACK]))


class _Item:
    """One binlog queued for a Pump; its outcome goes to its own future or, sent in a
    group, to the group's slot ``index``."""

    __slots__ = ("payload", "future", "group", "index", "outcome")

    def __init__(self, payload: bytes, group: SentGroup | None = None, index: int = 0) -> None:
        self.payload = payload
        # A commit or rollback (a Pump answers it without waiting for an fsync), told
        # from the bytes: ``tp`` is field 1, serialized first, and absent (0) in a
        # prewrite. Only the batching looks at it (``PumpConn._take_batch``).
        self.outcome = payload[:1] == wire.BINLOG_TP and payload[1:2] in _OUTCOME_TYPES
        self.group = group
        self.index = index
        self.future: concurrent.futures.Future[None] | None = (
            concurrent.futures.Future() if group is None else None)

    def done(self) -> bool:
        if self.group is not None:
            return self.group.settled(self.index)
        assert self.future is not None
        return self.future.done()

    def ok(self) -> None:
        if self.group is not None:
            self.group.settle(self.index, None)
        else:
            assert self.future is not None
            if not self.future.done():
                self.future.set_result(None)

    def fail(self, exc: errors.BinlakeError) -> None:
        if self.group is not None:
            self.group.settle(self.index, exc)
        else:
            assert self.future is not None
            if not self.future.done():
                self.future.set_exception(exc)


class _LoopThread:
    """One asyncio event loop on its own thread: every Pump connection of a
    PumpClient lives on it (channels, write streams, answers)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def cancel_rest() -> None:
            # Tasks gRPC left behind (e.g. a cancelled call's status) end here,
            # not as "task destroyed but pending" when the loop is closed.
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(cancel_rest(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class PumpConn:
    """One Pump: a channel and a long-lived write stream.

    The path of a binlog has one hand-off each way: the caller's thread queues
    it and, if no send is scheduled, wakes the client's event loop, which sends
    everything queued as one batch on the stream (without waiting for earlier
    batches, up to ``max_inflight_batches`` on the wire); the loop reads the
    answers (which come in order) and settles each caller's future. While
    batches are on the wire new binlogs pile up and leave together, so batches
    grow with load. When the stream breaks, every batch in flight fails with
    Unavailable and the next send opens a new stream.
    """

    def __init__(self, node_id: str, addr: str, settings: ClientSettings, cluster_id: int = 0,
                 loop: _LoopThread | None = None) -> None:
        self.node_id = node_id
        self.addr = addr
        self.settings = settings
        self.cluster_id = cluster_id
        self._own_loop = loop is None
        self._lt = loop or _LoopThread(f"pump-client-{node_id}")
        self._loop = self._lt.loop
        # Guards the queue, inflight, _scheduled and _closed (callers' threads and the loop).
        self._lock = threading.Lock()
        self.inflight = 0
        self._queue: collections.deque[_Item] = collections.deque()
        # True from a caller waking the loop until the loop's sender finds the
        # queue empty; also while the window is full (an answer re-kicks it).
        self._scheduled = False
        self._closed = False
        self._stream: _Stream | None = None  # loop-owned
        self._sender: asyncio.Task[None] | None = None  # loop-owned
        self._batch_ids = itertools.count(1)
        self._channel: grpc.aio.Channel | None = None
        self._lt.run(self._open())

    async def _open(self) -> None:
        self._channel = rpc.aio_channel(self.addr, options=rpc.client_options(self.settings.max_binlog_bytes))
        self.stub = pump_pb2_grpc.PumpStub(self._channel)
        # WriteBinlogStream taking its requests already serialized (``wire.write_binlogs_req``:
        # one copy of the batch, not the protobuf library's two and its buffer growth).
        self._write_stream = self._channel.stream_stream(
            _WRITE_STREAM, request_serializer=None, response_deserializer=pump_pb2.WriteBinlogsResp.FromString)

    def write_stream(self) -> Any:
        """A new WriteBinlogStream call (on the loop) whose requests are serialized bytes."""
        return self._write_stream()

    def send(self, payload: bytes) -> concurrent.futures.Future[None]:
        return self.send_many([payload])[0]

    def send_many(self, payloads: list[bytes]) -> list[concurrent.futures.Future[None]]:
        """``send`` for several binlogs at once: queued together (one wake-up of the
        loop), so they leave together: the prewrites in one batch, stored under one
        fsync, the commits and rollbacks in another (``_take_batch``)."""
        items = [_Item(p) for p in payloads]
        self._enqueue(items)
        return [i.future for i in items if i.future is not None]

    def send_group(self, payloads: list[bytes]) -> SentGroup:
        """``send_many`` with one future for all (``SentGroup.future``): it resolves, once
        every binlog is settled, to each one's failure (None: acknowledged), in order."""
        group = SentGroup(len(payloads))
        if not payloads:
            group.future.set_result([])
            return group
        self._enqueue([_Item(p, group, i) for i, p in enumerate(payloads)])
        return group

    def _enqueue(self, items: list[_Item]) -> None:
        with self._lock:
            if self._closed:
                raise errors.Unavailable(f"client connection to pump {self.node_id} is closed")
            self._queue.extend(items)
            self.inflight += len(items)
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            self._loop.call_soon_threadsafe(self._kick)

    def write(self, payload: bytes) -> None:
        """Send one binlog and wait for its durable acknowledgement."""
        future = self.send(payload)
        try:
            future.result(timeout=self.settings.write_timeout_s)
        except concurrent.futures.TimeoutError:
            self.reset(f"no answer within {self.settings.write_timeout_s:g}s")
            raise errors.DeadlineExceeded(
                f"pump {self.node_id} ({self.addr}) did not acknowledge a write within "
                f"{self.settings.write_timeout_s:g}s"
            ) from None

    # -- on the loop --------------------------------------------------------------
    def _kick(self) -> None:
        if self._sender is None or self._sender.done():
            self._sender = self._loop.create_task(self._send_loop())

    async def _send_loop(self) -> None:
        try:
            await self._send_batches()
        except Exception as exc:  # never leave writers waiting on a sender that died
            log.exception("pump client: sender for pump %s failed", self.node_id)
            with self._lock:
                pending = list(self._queue)
                self._queue.clear()
                self._scheduled = False
            failure = errors.Unavailable(f"write to pump {self.node_id} failed: {exc}")
            for item in pending:
                item.fail(failure)
            self._done(len(pending))

    async def _send_batches(self) -> None:
        settings = self.settings
        while True:
            with self._lock:
                stream = self._stream
                if not self._queue or self._closed:
                    self._scheduled = False
                    return
                if stream is not None and not stream.broken and len(stream.inflight) >= settings.max_inflight_batches:
                    return  # an answer kicks the sender again
                batch = self._take_batch()
            batch_id = next(self._batch_ids)
            req = wire.write_binlogs_req(self.cluster_id, [i.payload for i in batch], batch_id)
            if stream is None or stream.broken:
                try:
                    stream = self._stream = _Stream(self)
                except Exception as exc:
                    failure = errors.Unavailable(f"cannot open a write stream to pump {self.node_id}: {exc}")
                    for item in batch:
                        item.fail(failure)
                    self._done(len(batch))
                    raise
            await stream.send(batch_id, batch, req)

    def _take_batch(self) -> list[_Item]:
        """The next batch (under _lock, the queue not empty): the oldest binlog and
        every queued one of its kind, prewrites or outcomes (commits and rollbacks),
        up to the batch limits; the others keep their places. A Pump answers a batch
        of outcomes without an fsync and a batch holding a prewrite after one
        (``pump.storage``), so a mixed batch would hold its commits for the fsync."""
        settings = self.settings
        queue = self._queue
        first = queue.popleft()
        batch, size, kind = [first], len(first.payload), first.outcome
        skipped: list[_Item] = []
        while queue and len(batch) < settings.max_batch_binlogs:
            item = queue[0]
            if item.outcome is not kind:
                skipped.append(queue.popleft())
                continue
            if size + len(item.payload) > settings.max_batch_bytes:
                break
            batch.append(queue.popleft())
            size += len(item.payload)
        queue.extendleft(reversed(skipped))
        return batch

    def _done(self, n: int) -> None:
        with self._lock:
            self.inflight -= n

    def reset(self, why: str) -> None:
        """Drop the current stream (its batches fail with Unavailable)."""

        def cancel() -> None:
            stream, self._stream = self._stream, None
            if stream is not None:
                stream.cancel(why)

        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(cancel)

    def probe(self, timeout_s: float = 2.0) -> None:
        async def call() -> None:
            await self.stub.WriteBinlog(pump_pb2.WriteBinlogReq(cluster_id=self.cluster_id), timeout=timeout_s)

        try:
            self._lt.run(call(), timeout_s + 1.0)
        except grpc.RpcError as exc:
            raise rpc.from_rpc_error(exc, f"probe of pump {self.node_id}") from None
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            raise errors.Unavailable(f"probe of pump {self.node_id}: {exc or 'no answer'}") from None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
        for item in pending:
            item.fail(errors.Unavailable(f"client connection to pump {self.node_id} closed"))

        async def shut() -> None:
            stream, self._stream = self._stream, None
            if stream is not None:
                stream.cancel("client closed")
                await stream.finished()
            if self._channel is not None:
                await self._channel.close()

        if not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._lt.run(shut(), timeout=5)
        if self._own_loop:
            self._lt.close()


class _Stream:
    """One WriteBinlogStream call and the batches in flight on it (loop-owned)."""

    def __init__(self, conn: PumpConn) -> None:
        self.conn = conn
        self.broken = False
        self.inflight: collections.deque[tuple[int, list[_Item]]] = collections.deque()
        self._call = conn.write_stream()
        self._receiver = conn._loop.create_task(self._receive())

    async def send(self, batch_id: int, batch: list[_Item], req: bytes) -> None:
        if self.broken:
            self._fail(batch, errors.Unavailable(f"write stream to pump {self.conn.node_id} broke"))
            return
        self.inflight.append((batch_id, batch))
        try:
            await self._call.write(req)
        except grpc.RpcError as exc:
            self._break(self._failure(exc))
        except (asyncio.InvalidStateError, grpc.aio.UsageError) as exc:
            self._break(errors.Unavailable(f"write stream to pump {self.conn.node_id} ended: {exc}"))

    def _failure(self, exc: grpc.RpcError) -> errors.BinlakeError:
        failure = rpc.from_rpc_error(exc, f"write to pump {self.conn.node_id} ({self.conn.addr})")
        if not isinstance(failure, _RETRYABLE):
            failure = errors.Unavailable(str(failure))
        return failure

    async def _receive(self) -> None:
        failure: errors.BinlakeError
        try:
            while True:
                resp = await self._call.read()
                if resp is grpc.aio.EOF:
                    failure = errors.Unavailable(f"write stream to pump {self.conn.node_id} ended")
                    break
                if not self.inflight:
                    raise errors.Unavailable(f"pump answered batch {resp.batch_id}, which was not sent")
                batch_id, batch = self.inflight.popleft()
                if resp.batch_id != batch_id:
                    raise errors.Unavailable(f"pump answered batch {resp.batch_id}, expected {batch_id}")
                self._resolve(batch, resp)
                self.conn._kick()
        except grpc.RpcError as exc:
            failure = self._failure(exc)
        except errors.BinlakeError as exc:
            failure = exc
        except asyncio.CancelledError:
            failure = errors.Unavailable(f"write stream to pump {self.conn.node_id} was cancelled")
        except Exception as exc:
            failure = errors.Unavailable(f"write stream to pump {self.conn.node_id} failed: {exc}")
        self._break(failure)

    def _break(self, failure: errors.BinlakeError) -> None:
        if not self.broken:
            self.broken = True
            self._call.cancel()
        stranded = list(self.inflight)
        self.inflight.clear()
        for _bid, batch in stranded:
            self._fail(batch, failure)
        # Binlogs queued meanwhile go out on a new stream.
        self.conn._kick()

    def _resolve(self, batch: list[_Item], resp: pump_pb2.WriteBinlogsResp) -> None:
        for item, res in zip(batch, resp.results, strict=False):
            if res.code == 0 or res.code == _ALREADY_EXISTS:
                # ALREADY_EXISTS: a retry of something stored before - done.
                item.ok()
            else:
                cls = _RESULT_ERRORS.get(res.code, errors.BinlakeError)
                item.fail(cls(f"pump {self.conn.node_id}: {res.message}"))
        for item in batch[len(resp.results):]:
            item.fail(errors.Unavailable(f"pump {self.conn.node_id} answered too few results"))
        self.conn._done(len(batch))

    def _fail(self, batch: list[_Item], exc: errors.BinlakeError) -> None:
        for item in batch:
            item.fail(exc)
        self.conn._done(len(batch))

    def cancel(self, why: str) -> None:
        self._call.cancel()

    async def finished(self) -> None:
        with contextlib.suppress(BaseException):
            await self._receiver


class PumpClient:
    """Writes binlogs to the Pump cluster. Thread-safe; share one per process."""

    def __init__(
        self,
        registry: str | None = None,
        *,
        settings: ClientSettings | None = None,
        pumps: dict[str, str] | None = None,
        registry_client: object | None = None,
    ) -> None:
        if registry is None and pumps is None and registry_client is None and settings is None:
            raise ValueError("PumpClient needs a registry address, settings, or a static pumps mapping")
        if settings is None:
            settings = ClientSettings(registry=registry) if registry is not None else ClientSettings()
        self.settings = settings
        self._lock = threading.RLock()
        self._conns: dict[str, PumpConn] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._failures: dict[str, int] = collections.defaultdict(int)
        self._unavailable: set[str] = set()
        self._rr = itertools.count()
        self._stop = threading.Event()
        self._static = pumps is not None
        self._registry = registry_client
        self._own_registry = False
        self.cluster_id = 0
        self._registry_warned = False
        # The registry's replication history (empty: the settings' replicas/min_acks apply).
        self._replication: list[ReplicationSetting] = []
        self._async: concurrent.futures.ThreadPoolExecutor | None = None
        self._async_pending: set[concurrent.futures.Future[None]] = set()
        # Guards _async and _async_pending only, and is never held while waiting: their
        # callbacks run on the loop thread, and ``_lock`` is held by ``_conn`` while it
        # waits for that loop to open a stream (one lock for both deadlocked them).
        self._async_lock = threading.Lock()
        self._loop = _LoopThread("pump-client-loop")
        if self._static:
            for node_id, addr in (pumps or {}).items():
                net.parse_addr(addr, f"pump {node_id} address")
                self._nodes[node_id] = NodeRecord(node_id=node_id, kind="pump", addr=addr)
        else:
            if self._registry is None:
                from binlake.registry.client import RegistryClient

                self._registry = RegistryClient(registry or self.settings.registry)
                self._own_registry = True
            self.refresh()
        self._threads = [
            threading.Thread(target=self._probe_loop, name="pump-client-probe", daemon=True),
        ]
        if not self._static:
            self._threads.append(threading.Thread(target=self._refresh_loop, name="pump-client-watch", daemon=True))
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ view
    def refresh(self) -> None:
        """Re-read the Pump list from the registry (keeps the cached view if it is unreachable)."""
        if self._static:
            return
        try:
            if not self.cluster_id:
                self.cluster_id, _ = self._registry.cluster_info()  # type: ignore[union-attr]
            nodes, _rev = self._registry.list_nodes("pump")  # type: ignore[union-attr]
            replication = self._registry.get_replication()  # type: ignore[union-attr]
        except errors.BinlakeError as exc:
            if not self._registry_warned:
                log.warning("pump client: registry unreachable, using the cached pump list: %s", exc)
                self._registry_warned = True
            return
        self._registry_warned = False
        with self._lock:
            self._replication = replication
            for node in nodes:
                old = self._nodes.get(node.node_id)
                if old is not None and old.addr != node.addr and node.node_id in self._conns:
                    self._conns.pop(node.node_id).close()
                if old is not None and old.state is not node.state:
                    log.info("pump client: pump %s is now %s", node.node_id, node.state.value)
                self._nodes[node.node_id] = node

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.settings.refresh_interval_s):
            self.refresh()

    def _conn(self, node_id: str) -> PumpConn:
        with self._lock:
            conn = self._conns.get(node_id)
            if conn is not None:
                return conn
            node = self._nodes.get(node_id)
            if node is None:
                raise errors.NotFound(f"pump {node_id} is not known to this client")
        # Opened without the lock: PumpConn waits for the event loop, and callbacks on
        # that loop take the lock (holding it here deadlocked the two).
        fresh = PumpConn(node_id, node.addr, self.settings, self.cluster_id, self._loop)
        with self._lock:
            conn = self._conns.setdefault(node_id, fresh)
        if conn is not fresh:  # another thread opened one meanwhile
            fresh.close()
        return conn

    def _renew(self, node_id: str) -> None:
        """Drop a Pump's connection after a write went unanswered: the next write opens a
        new channel (a new TCP connection). A partition can leave the old connection
        looking alive to gRPC while streams on it go nowhere long after the heal."""
        with self._lock:
            conn = self._conns.pop(node_id, None)
        if conn is not None:
            threading.Thread(target=conn.close, name=f"pump-client-close-{node_id}", daemon=True).start()

    def available(self) -> list[str]:
        """Pumps a prewrite may go to: online and not marked unavailable."""
        with self._lock:
            return sorted(
                n.node_id for n in self._nodes.values()
                if n.state is NodeState.ONLINE and n.node_id not in self._unavailable
            )

    def unavailable(self) -> list[str]:
        with self._lock:
            return sorted(self._unavailable)

    def broadcast(self, binlogs: list[binlog_pb2.Binlog], timeout_s: float = 10.0
                  ) -> dict[str, list[errors.BinlakeError | None]]:
        """Send ``binlogs`` (commits or rollbacks) to every available Pump in one group
        each, and wait up to ``timeout_s`` for them: per Pump, each binlog's failure
        (None: stored). For what a writer cannot route: a rollback whose prewrite's
        Pump it never learned (a Pump without that prewrite answers FailedPrecondition).
        Not through ``_send_together``: that counts each Pump's refusals towards
        marking it unavailable, and here a refusal is the expected answer."""
        if any(b.tp not in (binlog_pb2.COMMIT, binlog_pb2.ROLLBACK) for b in binlogs):
            raise errors.InvalidArgument("broadcast takes COMMIT or ROLLBACK binlogs")
        if not binlogs:
            return {}
        payloads = [b.SerializeToString() for b in binlogs]
        groups: dict[str, SentGroup] = {}
        out: dict[str, list[errors.BinlakeError | None]] = {}
        for node_id in self.available():
            try:
                groups[node_id] = self._conn(node_id).send_group(payloads)
            except errors.BinlakeError as exc:
                out[node_id] = [exc] * len(payloads)
        deadline = time.monotonic() + timeout_s
        for node_id, group in groups.items():
            try:
                out[node_id] = group.future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                out[node_id] = [errors.DeadlineExceeded(f"pump {node_id} did not answer within {timeout_s:g}s")
                                ] * len(payloads)
        return out

    # ------------------------------------------------------------------ routing
    def _pick(self, start_ts: int, exclude: set[str]) -> str | None:
        candidates = [p for p in self.available() if p not in exclude]
        if not candidates:
            return None
        strategy = self.settings.strategy
        if strategy == "hash":
            return candidates[zlib.crc32(start_ts.to_bytes(8, "big")) % len(candidates)]
        if strategy == "score":
            weights = []
            with self._lock:
                for p in candidates:
                    node = self._nodes[p]
                    conn = self._conns.get(p)
                    total = node.disk_used_bytes + node.disk_free_bytes
                    free_frac = node.disk_free_bytes / total if total else 1.0
                    inflight = conn.inflight if conn else 0
                    weights.append(max(free_frac, 0.01) / (1.0 + inflight + node.load / 10_000.0))
            return random.choices(candidates, weights=weights, k=1)[0]
        return candidates[next(self._rr) % len(candidates)]

    def replication_at(self, start_ts: int) -> tuple[int, int]:
        """(R, W) for a prewrite of ``start_ts``: the registry's setting in force at it,
        or this client's settings before the first (or without any)."""
        with self._lock:
            history = self._replication
        default = ReplicationSetting(0, self.settings.replicas, self.settings.acks)
        s = setting_at(history, start_ts, default)
        return s.replicas, s.min_acks

    def _pick_many(self, start_ts: int, exclude: set[str], n: int) -> list[str]:
        """Up to ``n`` distinct Pumps for a replicated prewrite: the strategy's order,
        preferring Pumps on hosts not chosen yet (a host lost takes one copy only)."""
        candidates = [p for p in self.available() if p not in exclude]
        if len(candidates) <= n:
            order = candidates
        else:
            first = self._pick(start_ts, exclude)
            assert first is not None
            i = candidates.index(first)
            order = candidates[i:] + candidates[:i]  # the strategy's choice, then the ring after it
        with self._lock:
            hosts = {p: self._nodes[p].addr.rpartition(":")[0] for p in order}
        chosen: list[str] = []
        seen: set[str] = set()
        for p in order:
            if len(chosen) < n and hosts[p] not in seen:
                chosen.append(p)
                seen.add(hosts[p])
        for p in order:
            if len(chosen) < n and p not in chosen:
                chosen.append(p)
        return chosen

    def holders(self, placement: str) -> list[str]:
        """The Pumps of a placement a prewrite returned (one id when R = 1)."""
        if not isinstance(placement, str) or not placement:
            raise errors.InvalidArgument(f"a pump placement must be a non-empty string, got {placement!r}")
        with self._lock:
            if placement in self._nodes:
                return [placement]
        return placement.split(",")

    def _record_failure(self, node_id: str, exc: errors.BinlakeError) -> None:
        with self._lock:
            self._failures[node_id] += 1
            if self._failures[node_id] >= self.settings.max_failures and node_id not in self._unavailable:
                self._unavailable.add(node_id)
                log.warning("pump client: pump %s marked unavailable after %d failed writes (last: %s)",
                            node_id, self._failures[node_id], exc)

    def _record_success(self, node_id: str) -> None:
        if self._failures.get(node_id):
            with self._lock:
                self._failures[node_id] = 0

    # ------------------------------------------------------------------ writes
    def write_prewrite(self, binlog: binlog_pb2.Binlog) -> str:
        """Store a prewrite on some Pump; return that Pump's id (send the commit there)."""
        if binlog.tp != binlog_pb2.PREWRITE:
            raise errors.InvalidArgument("write_prewrite takes a PREWRITE binlog")
        payload = binlog.SerializeToString()
        self._check_size(payload, binlog.start_ts)
        if self.replication_at(binlog.start_ts)[0] > 1:
            return self._replicated_prewrite(payload, binlog.start_ts, set(), [], [])
        return self._prewrite_payload(payload, binlog.start_ts, set(), [])

    def _replicated_prewrite(self, payload: bytes, start_ts: int, tried: set[str], failures: list[str],
                             acked: list[str]) -> str:
        """Write to R Pumps, replacing failed ones while others are writable, until W
        acknowledged; the placement lists every Pump that acknowledged."""
        r, w = self.replication_at(start_ts)
        while len(acked) < r:
            picks = self._pick_many(start_ts, tried | set(acked), r - len(acked))
            if not picks:
                break
            tried.update(picks)
            failed = self._send_together([payload] * len(picks), picks)
            acked.extend(p for i, p in enumerate(picks) if i not in failed)
            failures.extend(f"{picks[i]}: {exc}" for i, exc in sorted(failed.items()))
            if not failed:
                break
            for exc in failed.values():
                if not isinstance(exc, _RETRYABLE):
                    raise exc
        if len(acked) < w:
            if acked:
                # The writer aborts the transaction: tell the Pumps that took the prewrite
                # now (best effort; else they ask the writer's status service later).
                self.write_commit_async(binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=start_ts), ",".join(acked))
            raise errors.NotEnoughReplicas(
                f"the prewrite of start_ts {start_ts} was acknowledged by {len(acked)} pump(s) "
                f"({', '.join(acked) or 'none'}), fewer than min_acks={w} (replicas={r}); writable pumps: "
                f"{', '.join(self.available()) or 'none'}"
                + (f"; failures: {'; '.join(failures)}" if failures else "")
                + ". The transaction must not commit; bring pumps back or lower min_acks")
        return ",".join(acked)

    def _prewrite_payload(self, payload: bytes, start_ts: int, tried: set[str], failures: list[str]) -> str:
        while True:
            node_id = self._pick(start_ts, tried)
            if node_id is None:
                raise errors.Unavailable(
                    f"no pump accepted the prewrite of start_ts {start_ts}"
                    + (f": {'; '.join(failures)}" if failures else " (no online pump is known)")
                )
            tried.add(node_id)
            try:
                self._conn(node_id).write(payload)
            except _RETRYABLE as exc:
                self._record_failure(node_id, exc)
                failures.append(str(exc))
                continue
            self._record_success(node_id)
            return node_id

    def write_prewrites(self, binlogs: list[binlog_pb2.Binlog]) -> list[str]:
        """``write_prewrite`` for several prewrites at once; returns each one's Pump
        (``write_group`` without commits)."""
        return self.write_group([], [], binlogs)

    def write_commits(self, binlogs: list[binlog_pb2.Binlog], node_ids: list[str]) -> None:
        """``write_commit`` for several commits (or rollbacks) at once, each to its own Pump
        (``write_group`` without prewrites)."""
        self.write_group(binlogs, node_ids, [])

    def write_group(self, commits: list[binlog_pb2.Binlog], node_ids: list[str],
                    prewrites: Sequence[binlog_pb2.Binlog | wire.EncodedPrewrite]) -> list[str]:
        """Commits (or rollbacks), each to the Pump of its prewrite (``node_ids``), and new
        prewrites, each to a Pump picked as ``write_prewrite`` does, all at once: each
        Pump gets its share in one batch (one fsync there). Returns, once every one is
        acknowledged, the Pump of each prewrite. A first attempt that failed is retried
        alone: a prewrite on the other Pumps (``write_prewrite``), a commit on its Pump
        for up to ``commit_retry_s`` (``write_commit``)."""
        if len(commits) != len(node_ids):
            raise ValueError(f"{len(commits)} binlogs but {len(node_ids)} pumps")
        for b in commits:
            if b.tp not in (binlog_pb2.COMMIT, binlog_pb2.ROLLBACK):
                raise errors.InvalidArgument("write_commits takes COMMIT or ROLLBACK binlogs")
        for pw in prewrites:
            if isinstance(pw, binlog_pb2.Binlog) and pw.tp != binlog_pb2.PREWRITE:
                raise errors.InvalidArgument("write_prewrites takes PREWRITE binlogs")
        # An EncodedPrewrite is a PREWRITE already serialized (wire.prewrite).
        pre_payloads = [pw.payload if isinstance(pw, wire.EncodedPrewrite) else pw.SerializeToString()
                        for pw in prewrites]
        for payload, pw in zip(pre_payloads, prewrites, strict=True):
            self._check_size(payload, pw.start_ts)
        if (any(self.replication_at(pw.start_ts)[0] > 1 for pw in prewrites)
                or any(len(self.holders(p)) > 1 for p in node_ids)):
            return self._replicated_group(commits, node_ids, prewrites, pre_payloads)
        picks: list[str] = []
        for pw in prewrites:
            node_id = self._pick(pw.start_ts, set())
            if node_id is None:
                raise errors.Unavailable(f"no pump accepted the prewrite of start_ts {pw.start_ts} "
                                         "(no online pump is known)")
            picks.append(node_id)
        n = len(commits)
        failed = self._send_together([b.SerializeToString() for b in commits] + pre_payloads, node_ids + picks)
        for i, exc in sorted(failed.items()):
            if i < n:
                if not isinstance(exc, _COMMIT_RETRYABLE):
                    raise exc
                self.write_commit(commits[i], node_ids[i])
            else:
                if not isinstance(exc, _RETRYABLE):
                    raise exc
                j = i - n
                picks[j] = self._prewrite_payload(pre_payloads[j], prewrites[j].start_ts, {picks[j]}, [str(exc)])
        return picks

    def _replicated_group(self, commits: list[binlog_pb2.Binlog], placements: list[str],
                          prewrites: Sequence[binlog_pb2.Binlog | wire.EncodedPrewrite],
                          pre_payloads: list[bytes]) -> list[str]:
        """``write_group`` with R > 1: every copy of every binlog in one batch per Pump;
        a prewrite short of R copies is topped up alone, a commit no holder took is
        retried alone."""
        payloads: list[bytes] = []
        targets: list[str] = []
        owner: list[int] = []  # index into commits + prewrites
        for k, (b, placement) in enumerate(zip(commits, placements, strict=True)):
            data = b.SerializeToString()
            for node_id in self.holders(placement):
                payloads.append(data)
                targets.append(node_id)
                owner.append(k)
        n = len(commits)
        for j, pw in enumerate(prewrites):
            for node_id in self._pick_many(pw.start_ts, set(), self.replication_at(pw.start_ts)[0]):
                payloads.append(pre_payloads[j])
                targets.append(node_id)
                owner.append(n + j)
        failed = self._send_together(payloads, targets)
        ok: dict[int, list[str]] = {k: [] for k in range(n + len(prewrites))}
        tried: dict[int, set[str]] = {k: set() for k in ok}
        errs: dict[int, list[str]] = {k: [] for k in ok}
        for i, k in enumerate(owner):
            tried[k].add(targets[i])
            if i in failed:
                exc = failed[i]
                if not isinstance(exc, _RETRYABLE):
                    raise exc
                errs[k].append(f"{targets[i]}: {exc}")
            else:
                ok[k].append(targets[i])
        for k in range(n):
            if not ok[k]:
                self.write_commit(commits[k], placements[k])
        out: list[str] = []
        for j, pw in enumerate(prewrites):
            k = n + j
            if len(ok[k]) < self.replication_at(pw.start_ts)[0]:
                out.append(self._replicated_prewrite(pre_payloads[j], pw.start_ts, tried[k], errs[k], ok[k]))
            else:
                out.append(",".join(ok[k]))
        return out

    def _send_together(self, payloads: list[bytes], node_ids: list[str]) -> dict[int, errors.BinlakeError]:
        """Send every payload to its Pump in one batch per Pump and wait for all; return
        the failures by index (successes count towards the Pumps' health)."""
        by_node: dict[str, list[int]] = {}
        for i, node_id in enumerate(node_ids):
            by_node.setdefault(node_id, []).append(i)
        # One future per Pump for its share (PumpConn.send_group), not one per binlog.
        groups: dict[str, SentGroup] = {}
        failed: dict[int, errors.BinlakeError] = {}
        for node_id, idx in by_node.items():
            try:
                groups[node_id] = self._conn(node_id).send_group([payloads[i] for i in idx])
            except errors.BinlakeError as exc:
                failed.update(dict.fromkeys(idx, exc))
        deadline = time.monotonic() + self.settings.write_timeout_s
        for node_id, group in groups.items():
            idx = by_node[node_id]
            try:
                outcome = group.future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                # Those answered meanwhile keep their outcome; the rest timed out.
                self._renew(node_id)
                late = set(group.unsettled())
                outcome = [errors.DeadlineExceeded(f"pump {node_id} did not acknowledge a write within "
                                                   f"{self.settings.write_timeout_s:g}s") if k in late
                           else r if isinstance(r, errors.BinlakeError) else None
                           for k, r in enumerate(group.results)]
            for i, err in zip(idx, outcome, strict=True):
                if err is not None:
                    failed[i] = err
        for node_id, idx in by_node.items():
            bad = [i for i in idx if i in failed]
            if bad:
                self._record_failure(node_id, failed[bad[0]])
            else:
                self._record_success(node_id)
        return failed

    def write_commit(self, binlog: binlog_pb2.Binlog, node_id: str) -> None:
        """Store a commit (or rollback) on the Pump that took the prewrite,
        retrying that Pump for up to ``commit_retry_s``."""
        if binlog.tp not in (binlog_pb2.COMMIT, binlog_pb2.ROLLBACK):
            raise errors.InvalidArgument("write_commit takes a COMMIT or ROLLBACK binlog")
        payload = binlog.SerializeToString()
        holders = self.holders(node_id)
        if len(holders) > 1:
            self._commit_replicated(binlog, payload, holders)
            return
        deadline = time.monotonic() + self.settings.commit_retry_s
        delay = 0.05
        while True:
            try:
                self._conn(node_id).write(payload)
            except _COMMIT_RETRYABLE as exc:
                self._record_failure(node_id, exc)
                if time.monotonic() + delay > deadline:
                    raise errors.Unavailable(
                        f"pump {node_id} did not acknowledge the {'commit' if binlog.tp == 1 else 'rollback'} "
                        f"of start_ts {binlog.start_ts} within {self.settings.commit_retry_s:g}s ({exc}); "
                        "it will resolve the transaction from the writer's status after its txn timeout"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self._record_success(node_id)
            return

    write_rollback = write_commit

    def _commit_replicated(self, binlog: binlog_pb2.Binlog, payload: bytes, holders: list[str]) -> None:
        """A commit to every holder of its prewrite at once; done when one took it (a
        holder that missed it resolves the transaction through the writer's status
        service, to the same commit_ts). None took it: retry them in turn."""
        failed = self._send_together([payload] * len(holders), holders)
        if len(failed) < len(holders):
            for i, exc in failed.items():
                log.warning("pump client: pump %s missed the commit of start_ts %d (%s); it will resolve "
                            "the transaction from the writer's status", holders[i], binlog.start_ts, exc)
            return
        for exc in failed.values():
            if not isinstance(exc, _COMMIT_RETRYABLE):
                raise exc
        last: errors.BinlakeError | None = None
        for node_id in holders:
            try:
                self.write_commit(binlog, node_id)
                return
            except errors.Unavailable as exc:
                last = exc
        assert last is not None
        raise last

    def write_commit_async(self, binlog: binlog_pb2.Binlog, node_id: str) -> concurrent.futures.Future[None]:
        """``write_commit`` in the background (TiDB does not make a transaction wait
        for its commit binlog either): the upstream already committed, and if
        this never lands the Pump resolves the transaction through the writer's
        status service. The first attempt goes straight onto the Pump's write
        stream (no thread of its own); only a failed attempt is retried, by
        ``write_commit`` on a helper thread. ``flush()`` waits for every one
        still going."""
        if binlog.tp not in (binlog_pb2.COMMIT, binlog_pb2.ROLLBACK):
            raise errors.InvalidArgument("write_commit_async takes a COMMIT or ROLLBACK binlog")
        outer: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._async_lock:
            self._async_pending.add(outer)
        outer.add_done_callback(self._async_done)

        def retry() -> None:
            with self._async_lock:
                if self._async is None:
                    self._async = concurrent.futures.ThreadPoolExecutor(
                        max_workers=16, thread_name_prefix="pump-client-commit")
                future = self._async.submit(self.write_commit, binlog, node_id)

            def chain(f: concurrent.futures.Future[None]) -> None:
                exc = f.exception()
                if exc is None:
                    outer.set_result(None)
                else:
                    outer.set_exception(exc)

            future.add_done_callback(chain)

        def first_done(f: concurrent.futures.Future[None]) -> None:
            # Runs on the client's event loop: only quick work here.
            exc = f.exception()
            if exc is None:
                self._record_success(node_id)
                outer.set_result(None)
            elif isinstance(exc, _COMMIT_RETRYABLE):
                self._record_failure(node_id, exc)
                retry()
            else:
                outer.set_exception(exc)

        holders = self.holders(node_id)
        if len(holders) > 1:
            self._commit_async_replicated(binlog, holders, outer, retry)
            return outer
        try:
            self._conn(node_id).send(binlog.SerializeToString()).add_done_callback(first_done)
        except errors.BinlakeError:
            retry()
        return outer

    def _commit_async_replicated(self, binlog: binlog_pb2.Binlog, holders: list[str],
                                 outer: concurrent.futures.Future[None], retry: Any) -> None:
        """The first attempt of a replicated background commit: sent to every holder;
        ``outer`` succeeds with the first acknowledgement; all failed: ``retry``."""
        payload = binlog.SerializeToString()
        left = [len(holders)]
        guard = threading.Lock()

        def done(node: str, f: concurrent.futures.Future[None]) -> None:
            exc = f.exception()
            if exc is None:
                self._record_success(node)
            elif isinstance(exc, errors.BinlakeError):
                self._record_failure(node, exc)
            with guard:
                left[0] -= 1
                last = left[0] == 0
                first_ok = exc is None and not outer.done()
                if first_ok:
                    outer.set_result(None)
            if last and not outer.done():
                retry()

        for node in holders:
            try:
                self._conn(node).send(payload).add_done_callback(functools.partial(done, node))
            except errors.BinlakeError as exc:
                f: concurrent.futures.Future[None] = concurrent.futures.Future()
                f.set_exception(exc)
                done(node, f)

    def _async_done(self, future: concurrent.futures.Future[None]) -> None:
        with self._async_lock:
            self._async_pending.discard(future)
        exc = future.exception()
        if exc is not None:
            log.warning("pump client: background commit binlog failed: %s", exc)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every background commit binlog to finish (acknowledged or given up)."""
        with self._async_lock:
            pending = list(self._async_pending)
        concurrent.futures.wait(pending, timeout=timeout)

    def _check_size(self, payload: bytes, start_ts: int) -> None:
        if len(payload) > self.settings.max_binlog_bytes:
            raise errors.InvalidArgument(
                f"binlog of start_ts {start_ts} is {len(payload)} bytes, above max_binlog_bytes="
                f"{self.settings.max_binlog_bytes}; split the transaction"
            )

    # ------------------------------------------------------------------ probing
    def _probe_loop(self) -> None:
        while not self._stop.wait(self.settings.probe_interval_s):
            self.probe_unavailable()

    def probe_unavailable(self) -> None:
        """Send an empty binlog to each unavailable Pump the registry calls online;
        take back the ones that answer."""
        with self._lock:
            candidates = [p for p in self._unavailable
                          if p in self._nodes and self._nodes[p].state is NodeState.ONLINE]
        for node_id in candidates:
            try:
                self._conn(node_id).probe()
            except errors.BinlakeError:
                continue
            with self._lock:
                self._unavailable.discard(node_id)
                self._failures[node_id] = 0
            log.info("pump client: pump %s answered a probe; available again", node_id)

    def close(self) -> None:
        self.flush(timeout=self.settings.commit_retry_s + 1)
        if self._async is not None:
            self._async.shutdown(wait=False)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for conn in conns:
            conn.close()
        self._loop.close()
        if self._own_registry:
            self._registry.close()  # type: ignore[union-attr]

    def __enter__(self) -> PumpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
