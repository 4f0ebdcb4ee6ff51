"""The Pump's transport-free logic: check and store writes, serve windows, and
know its own state. ``pump.server`` wraps it in gRPC; ``pump.node`` runs the
background duties (registry heartbeats, fake binlogs, missing-commit
resolution, GC)."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Generator

from google.protobuf.message import DecodeError

from binlake import errors, tso
from binlake.proto import binlog_pb2
from binlake.pump.storage import Entry, Part, Results, Storage
from binlake.registry.model import NodeState
from binlake.window import Readiness, Window, gone_error, readiness, waiting_error

log = logging.getLogger(__name__)

# done(results, None) once stored, or done(None, error) when storage failed.
WriteDone = Callable[[Results | None, BaseException | None], None]

_TYPES = {binlog_pb2.PREWRITE: "prewrite", binlog_pb2.COMMIT: "commit", binlog_pb2.ROLLBACK: "rollback"}


class PendingWrite:
    """A write queued for group commit; ``result()`` waits for its fsync."""

    __slots__ = ("_results", "_slots", "_future")

    def __init__(self, results: list[errors.BinlakeError | None], slots: list[int],
                 future: concurrent.futures.Future[list[errors.BinlakeError | None]] | None) -> None:
        self._results = results
        self._slots = slots
        self._future = future

    def result(self, timeout: float | None = None) -> list[errors.BinlakeError | None]:
        if self._future is not None:
            for slot, res in zip(self._slots, self._future.result(timeout), strict=True):
                self._results[slot] = res
            self._future = None
        return self._results


class PumpService:
    def __init__(
        self,
        storage: Storage,
        *,
        node_id: str,
        max_binlog_bytes: int,
        stop_write_at_free_bytes: int,
        read_batch_txns: int = 256,
        read_batch_bytes: int = 4 << 20,
    ) -> None:
        self.storage = storage
        self.node_id = node_id
        self.max_binlog_bytes = max_binlog_bytes
        self.stop_write_at_free_bytes = stop_write_at_free_bytes
        self.read_batch_txns = read_batch_txns
        self.read_batch_bytes = read_batch_bytes
        self.cluster_id = 0
        # Writes are refused until the node registered (a window planner must
        # know this Pump before it holds any transaction).
        self.registered = False
        self.state = NodeState.ONLINE
        self.closing = False
        self._disk_free = storage.disk_free_bytes()
        self._disk_checked = time.monotonic()
        self._disk_lock = threading.Lock()

    # ------------------------------------------------------------------ checks
    def disk_free(self) -> int:
        now = time.monotonic()
        if now - self._disk_checked >= 1.0:
            with self._disk_lock:
                if now - self._disk_checked >= 1.0:
                    self._disk_free = self.storage.disk_free_bytes()
                    self._disk_checked = now
        return self._disk_free

    def _check_accepts_prewrites(self) -> None:
        if self.closing:
            raise errors.Unavailable(f"pump {self.node_id} is shutting down; write to another pump")
        if not self.registered:
            raise errors.Unavailable(f"pump {self.node_id} is starting (not registered yet); retry shortly")
        if self.state is not NodeState.ONLINE:
            raise errors.FailedPrecondition(
                f"pump {self.node_id} is {self.state.value} and takes no new transactions; "
                "write to an online pump"
            )
        free = self.disk_free()
        if free < self.stop_write_at_free_bytes:
            raise errors.ResourceExhausted(
                f"pump {self.node_id} refuses writes: {free} bytes free on its data disk, below "
                f"stop_write_at_free_bytes={self.stop_write_at_free_bytes}; free disk space or add a pump "
                "(reads are still served)"
            )

    def _check_cluster(self, cluster_id: int) -> None:
        if cluster_id and self.cluster_id and cluster_id != self.cluster_id:
            raise errors.FailedPrecondition(
                f"cluster id {cluster_id} does not match pump {self.node_id}'s cluster {self.cluster_id}; "
                "the writer and this pump use different registries"
            )

    def parse(self, payload: bytes, what: str = "payload") -> Entry:
        """Check one binlog's bytes and fields; raise InvalidArgument/ResourceExhausted."""
        if len(payload) > self.max_binlog_bytes:
            raise errors.InvalidArgument(
                f"{what} is {len(payload)} bytes, above max_binlog_bytes={self.max_binlog_bytes}; "
                "split the transaction or raise the limit on every pump and client"
            )
        try:
            b = binlog_pb2.Binlog.FromString(payload)
        except DecodeError as exc:
            raise errors.InvalidArgument(f"{what} is not a serialized binlake Binlog: {exc}") from None
        if b.tp not in _TYPES:
            raise errors.InvalidArgument(f"{what}: unknown binlog type {b.tp}")
        if not 0 < b.start_ts <= tso.MAX_TS:
            raise errors.InvalidArgument(f"{what}: start_ts must be a positive TSO, got {b.start_ts}")
        if b.tp == binlog_pb2.PREWRITE:
            if not b.prewrite_key:
                raise errors.InvalidArgument(
                    f"{what}: prewrite for start_ts {b.start_ts} has no prewrite_key "
                    "(the id of the writer that can say whether it committed)"
                )
            if b.commit_ts:
                raise errors.InvalidArgument(f"{what}: a prewrite carries no commit_ts (got {b.commit_ts})")
            try:
                binlog_pb2.PrewriteValue.FromString(b.prewrite_value)
            except DecodeError as exc:
                raise errors.InvalidArgument(
                    f"{what}: prewrite_value of start_ts {b.start_ts} is not a PrewriteValue: {exc}"
                ) from None
        elif b.tp == binlog_pb2.COMMIT:
            if b.commit_ts <= b.start_ts:
                raise errors.InvalidArgument(
                    f"{what}: commit_ts {b.commit_ts} must be greater than start_ts {b.start_ts}"
                )
        return Entry(b, payload)

    # ------------------------------------------------------------------ writes
    def probe(self, cluster_id: int = 0) -> None:
        self._check_cluster(cluster_id)
        self._check_accepts_prewrites()

    def write(self, payloads: list[bytes], cluster_id: int = 0) -> Results:
        """Store binlogs durably; one result per payload (None = stored)."""
        return self.write_async(payloads, cluster_id).result()

    def write_async(self, payloads: list[bytes], cluster_id: int = 0) -> PendingWrite:
        """Check the binlogs and queue the good ones for the next group commit."""
        results, entries, slots = self._check_writes(payloads, cluster_id)
        future = self.storage.submit(entries) if entries else None
        return PendingWrite(results, slots, future)

    def write_cb(self, payloads: list[bytes], cluster_id: int, done: WriteDone, *, may_lead: bool = True) -> None:
        """Check the binlogs, queue the good ones, and call ``done(results, None)``
        once they are durable (from the thread that commits their group, often this
        one, or at once when nothing needs storing), or ``done(None, error)`` if storage failed.
        Raises (before queueing anything) what refuses the whole batch."""
        results, entries, slots = self._check_writes(payloads, cluster_id)
        if not entries:
            done(results, None)
            return

        def stored(res: Results | None, exc: BaseException | None) -> None:
            if res is None:
                done(None, exc)
                return
            for slot, r in zip(slots, res, strict=True):
                results[slot] = r
            done(results, None)

        self.storage.submit_cb(entries, stored, may_lead=may_lead)

    def _check_writes(self, payloads: list[bytes], cluster_id: int) -> tuple[Results, list[Entry], list[int]]:
        self._check_cluster(cluster_id)
        results: Results = [None] * len(payloads)
        entries: list[Entry] = []
        slots: list[int] = []
        prewrite_refusal: errors.BinlakeError | None = None
        for i, payload in enumerate(payloads):
            what = "payload" if len(payloads) == 1 else f"payload #{i}"
            try:
                entry = self.parse(payload, what)
            except errors.BinlakeError as exc:
                results[i] = exc
                continue
            if entry.tp == binlog_pb2.PREWRITE:
                if prewrite_refusal is None:
                    try:
                        self._check_accepts_prewrites()
                    except errors.BinlakeError as exc:
                        prewrite_refusal = exc
                if prewrite_refusal is not None:
                    results[i] = prewrite_refusal
                    continue
            elif self.closing:
                results[i] = errors.Unavailable(f"pump {self.node_id} is shutting down; retry the commit")
                continue
            entries.append(entry)
            slots.append(i)
        return results, entries, slots

    def write_internal(self, binlog: binlog_pb2.Binlog) -> errors.BinlakeError | None:
        """A binlog the Pump writes itself (fake binlog, resolved outcome)."""
        return self.storage.write([Entry(binlog, binlog.SerializeToString(), internal=True)])[0]

    # ------------------------------------------------------------------ reads
    def pull(
        self, start_ts: int, end_ts: int, *, wait: bool = False, wait_timeout_s: float = 30.0,
        max_txns: int = 0, max_bytes: int = 0, parts: bool = False, keys_only: bool = False,
    ) -> Generator[list[binlog_pb2.Binlog] | Part, None, None]:
        """The window's transactions in batches (``Storage.serve_window``: ``parts``,
        ``keys_only``), once this Pump can serve it whole (or after ``wait``)."""
        window = Window(start_ts, end_ts)
        if max_txns < 0 or max_bytes < 0:
            raise errors.InvalidArgument("batch limits must be >= 0 (0 = server default)")
        safe, gc_ts = self.storage.safe_ts, self.storage.gc_ts
        state = readiness(window, safe, gc_ts)
        if state is Readiness.WAITING and not wait:
            # Writes acknowledged before this call may still be on their way into the
            # index (milliseconds): a window they close is served, not refused.
            self.storage.wait_indexed(timeout=1.0)
            safe, gc_ts = self.storage.safe_ts, self.storage.gc_ts
            state = readiness(window, safe, gc_ts)
        if state is Readiness.GONE:
            raise gone_error(window, self.node_id, gc_ts)
        if state is Readiness.WAITING:
            if not wait:
                raise waiting_error(window, self.node_id, safe)
            if not self.storage.wait_safe(end_ts, wait_timeout_s):
                raise errors.DeadlineExceeded(
                    f"pump {self.node_id}'s safe ts {tso.format_ts(self.storage.safe_ts)} did not reach the "
                    f"window end {end_ts} within {wait_timeout_s:g}s"
                )
        yield from self.storage.serve_window(
            start_ts, end_ts,
            max_txns=max_txns or self.read_batch_txns,
            max_bytes=max_bytes or self.read_batch_bytes,
            parts=parts, keys_only=keys_only,
        )

    def accepting_writes(self) -> bool:
        try:
            self._check_accepts_prewrites()
        except errors.BinlakeError:
            return False
        return True
