"""Pump storage: value log + index + sorter behind one group-committing writer.

Write path: request threads hand parsed binlogs to ``submit``; one writer
thread drains everything queued, validates it in order, appends the records
to the value log, issues one fsync for the whole group, then updates the index
(one LevelDB batch that also moves ``Mhead``) and the sorter, and only then
resolves each request. A binlog is acknowledged only after its fsync.

Crash recovery: the index may lag the log (its batch is written after the
fsync, without a sync of its own); on open, every record after ``Mhead`` is
replayed. Replay is idempotent, so nothing is indexed twice.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import pathlib
import queue
import shutil
import threading
import time
from collections.abc import Iterator

import plyvel

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.pump import index as ix
from binlake.pump.sorter import SafeTs
from binlake.pump.vlog import Pointer, ValueLog

log = logging.getLogger(__name__)

PREWRITE = binlog_pb2.PREWRITE
COMMIT = binlog_pb2.COMMIT
ROLLBACK = binlog_pb2.ROLLBACK


@dataclasses.dataclass(slots=True)
class Entry:
    """One binlog on its way to disk: the parsed message and its exact bytes."""

    binlog: binlog_pb2.Binlog
    payload: bytes
    # Written by the Pump itself (fake binlog, resolved commit/rollback).
    internal: bool = False


@dataclasses.dataclass
class WriteStats:
    binlogs: int = 0
    bytes: int = 0
    fsyncs: int = 0
    groups: int = 0


class _Request:
    __slots__ = ("entries", "future", "nbytes")

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.future: concurrent.futures.Future[list[errors.BinlakeError | None]] = concurrent.futures.Future()
        self.nbytes = sum(len(e.payload) for e in entries)


class _ReadersGate:
    """Readers share; GC's segment removal is exclusive (so no read hits a deleted file)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0

    def __enter__(self) -> None:
        with self._cond:
            self._readers += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    def exclusive(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._readers == 0, timeout)


class Storage:
    """Durable, sorted binlog storage of one Pump."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        segment_bytes: int = 512 << 20,
        fsync: bool = True,
        max_group_bytes: int = 16 << 20,
    ) -> None:
        self.dir = pathlib.Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_group_bytes = max_group_bytes
        try:
            self.index = ix.Index(self.dir / "index")
        except plyvel.IOError as exc:
            raise errors.FailedPrecondition(
                f"cannot open the index in {self.dir / 'index'}: {exc} "
                "(is another Pump using this data dir?)"
            ) from None
        self.vlog = ValueLog(self.dir / "vlog", segment_bytes=segment_bytes, fsync=fsync)
        self.sorter = SafeTs(bound=self.index.get_u64(ix.META_BOUND))
        self.sorter.max_commit_ts = self.index.get_u64(ix.META_MAX_COMMIT)
        self.gc_ts = self.index.get_u64(ix.META_GC)
        self.stats = WriteStats()
        self._state_lock = threading.Condition()
        self._gate = _ReadersGate()
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._closed = False
        self._fatal: BaseException | None = None
        self._recover()
        self._writer = threading.Thread(target=self._run, name="pump-writer", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        self._head: tuple[int, int] | None = None
        for start_ts, ptr in self.index.pending():
            self.sorter.prewrite(start_ts, ptr, recovered=True)
        head = self.index.head() or (self.vlog.segments()[0] if self.vlog.segments() else 1, 0)
        replayed = 0
        wb = self.index.db.write_batch()
        for ptr, payload in self.vlog.scan(*head):
            binlog = binlog_pb2.Binlog.FromString(payload)
            self._apply(wb, binlog, ptr, replay=True)
            replayed += 1
        self._put_meta(wb)
        wb.write()
        if replayed:
            log.info("recovered %d value-log records past the index head", replayed)
        log.info(
            "storage open: %d pending txns, safe ts %d, max commit ts %d, gc ts %d",
            len(self.sorter.pending), self.sorter.safe_ts, self.sorter.max_commit_ts, self.gc_ts,
        )

    # ------------------------------------------------------------------ state
    @property
    def safe_ts(self) -> int:
        return self.sorter.safe_ts

    @property
    def max_commit_ts(self) -> int:
        return self.sorter.max_commit_ts

    @property
    def pending_count(self) -> int:
        return len(self.sorter.pending)

    def is_pending(self, start_ts: int) -> bool:
        return start_ts in self.sorter.pending

    def pending_older_than(self, age_s: float) -> list[tuple[int, binlog_pb2.Binlog]]:
        """(start_ts, prewrite binlog) of transactions pending longer than ``age_s``."""
        with self._state_lock:
            old = self.sorter.pending.older_than(age_s, time.monotonic())
        return [(ts, binlog_pb2.Binlog.FromString(self.vlog.read(ptr))) for ts, ptr in old]

    def storage_bytes(self) -> int:
        idx = sum(f.stat().st_size for f in (self.dir / "index").iterdir() if f.is_file())
        return self.vlog.size_bytes() + idx

    def disk_free_bytes(self) -> int:
        return shutil.disk_usage(self.dir).free

    def wait_safe(self, ts: int, timeout: float) -> bool:
        """Block until safe_ts >= ts or the timeout passes."""
        with self._state_lock:
            return self._state_lock.wait_for(lambda: self.sorter.safe_ts >= ts or self._closed, timeout) and (
                self.sorter.safe_ts >= ts
            )

    # ------------------------------------------------------------------ writes
    def submit(self, entries: list[Entry]) -> concurrent.futures.Future[list[errors.BinlakeError | None]]:
        """Queue binlogs for the next group commit. The future's result has one
        item per entry: None (stored durably) or the error that refused it."""
        if self._fatal is not None:
            raise errors.Unavailable(f"pump storage stopped after a fatal error: {self._fatal}")
        if self._closed:
            raise errors.Unavailable("pump storage is closed")
        req = _Request(entries)
        self._queue.put(req)
        return req.future

    def write(self, entries: list[Entry], timeout: float | None = None) -> list[errors.BinlakeError | None]:
        return self.submit(entries).result(timeout)

    def _run(self) -> None:
        while True:
            req = self._queue.get()
            if req is None:
                return
            group = [req]
            size = req.nbytes
            stop = False
            while size < self.max_group_bytes:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                group.append(more)
                size += more.nbytes
            try:
                self._commit_group(group)
            except BaseException as exc:
                log.critical("pump storage write failed; refusing further writes: %s", exc, exc_info=True)
                self._fatal = exc
                for r in group:
                    if not r.future.done():
                        r.future.set_exception(errors.Unavailable(f"pump storage write failed: {exc}"))
                self._drain_after_fatal()
                return
            if stop:
                return

    def _drain_after_fatal(self) -> None:
        while True:
            try:
                r = self._queue.get_nowait()
            except queue.Empty:
                return
            if r is not None:
                r.future.set_exception(errors.Unavailable(f"pump storage write failed: {self._fatal}"))

    def _commit_group(self, group: list[_Request]) -> None:
        # 1. Validate in arrival order against stored state plus this group's own effects.
        overlay: dict[int, tuple[str, int]] = {}
        accepted: list[Entry] = []
        results: list[list[errors.BinlakeError | None]] = []
        for req in group:
            res: list[errors.BinlakeError | None] = []
            for entry in req.entries:
                err = self._validate(entry, overlay)
                res.append(err)
                if err is None:
                    accepted.append(entry)
            results.append(res)
        # 2. Append and fsync once.
        if accepted:
            pointers = self.vlog.append([e.payload for e in accepted])
            fsyncs = self.vlog.sync()
            # 3. Index and sorter.
            wb = self.index.db.write_batch()
            with self._state_lock:
                for entry, ptr in zip(accepted, pointers, strict=True):
                    self._apply(wb, entry.binlog, ptr)
                self._put_meta(wb)
                wb.write()
                self._state_lock.notify_all()
            self.stats.binlogs += len(accepted)
            self.stats.bytes += sum(len(e.payload) for e in accepted)
            self.stats.fsyncs += fsyncs
            self.stats.groups += 1
        for req, res in zip(group, results, strict=True):
            req.future.set_result(res)

    def _validate(self, entry: Entry, overlay: dict[int, tuple[str, int]]) -> errors.BinlakeError | None:
        b = entry.binlog
        start = b.start_ts
        state = overlay.get(start)
        if state is None:
            if start in self.sorter.pending:
                state = ("P", 0)
            else:
                raw = self.index.db.get(ix.txn_key(start))
                if raw is not None:
                    outcome, commit_ts, _ = ix.decode_txn(raw)
                    state = (outcome, commit_ts)
        if b.tp == PREWRITE:
            if state is not None:
                return errors.AlreadyExists(f"prewrite for start_ts {start} is already stored on this pump")
            overlay[start] = ("P", 0)
            return None
        if b.tp == COMMIT:
            if b.start_ts == b.commit_ts and entry.internal:
                return None  # fake binlog
            if state is None:
                return errors.FailedPrecondition(
                    f"commit for start_ts {start} has no prewrite on this pump; "
                    "a commit must go to the pump that took the prewrite"
                )
            if state[0] == "C":
                if state[1] == b.commit_ts:
                    return errors.AlreadyExists(
                        f"commit for start_ts {start} is already stored with commit_ts {b.commit_ts}"
                    )
                return errors.FailedPrecondition(
                    f"duplicate commit for start_ts {start}: already committed with commit_ts {state[1]}, "
                    f"this one says {b.commit_ts}"
                )
            if state[0] == "R":
                return errors.FailedPrecondition(f"commit for start_ts {start}, which was rolled back")
            overlay[start] = ("C", b.commit_ts)
            return None
        # ROLLBACK
        if state is None:
            return errors.FailedPrecondition(f"rollback for start_ts {start} has no prewrite on this pump")
        if state[0] == "R":
            return errors.AlreadyExists(f"rollback for start_ts {start} is already stored")
        if state[0] == "C":
            return errors.FailedPrecondition(
                f"rollback for start_ts {start}, which already committed with commit_ts {state[1]}"
            )
        overlay[start] = ("R", 0)
        return None

    def _apply(self, wb: plyvel.WriteBatch, b: binlog_pb2.Binlog, ptr: Pointer, *, replay: bool = False) -> None:
        """Index one durable record and update the sorter."""
        start = b.start_ts
        if b.tp == PREWRITE:
            if replay and (start in self.sorter.pending or self.index.db.get(ix.txn_key(start))):
                return
            wb.put(ix.wait_key(start), ptr.pack())
            self.sorter.prewrite(start, ptr)
        elif b.tp == COMMIT and b.start_ts == b.commit_ts:
            self.sorter.fake(b.commit_ts)
        elif b.tp in (COMMIT, ROLLBACK):
            prewrite = self.sorter.pending.location(start)
            if prewrite is None:
                if not replay:
                    raise AssertionError(f"validated outcome for start_ts {start} without a pending prewrite")
                return
            wb.delete(ix.wait_key(start))
            if b.tp == COMMIT:
                wb.put(ix.txn_key(start), ix.encode_committed(b.commit_ts, prewrite))
                if b.commit_ts >= self.gc_ts:
                    wb.put(ix.commit_key(b.commit_ts, start), prewrite.pack())
                self.sorter.commit(start, b.commit_ts)
            else:
                wb.put(ix.txn_key(start), ix.encode_rolled_back(prewrite))
                wb.put(ix.rollback_key(start), b"")
                self.sorter.rollback(start)
        self._head = (ptr.segment, ptr.end)

    def _put_meta(self, wb: plyvel.WriteBatch) -> None:
        head = self._head or self.vlog.head
        wb.put(ix.META_HEAD, ix.HEAD.pack(*head))
        wb.put(ix.META_BOUND, ix.U64.pack(self.sorter.bound))
        wb.put(ix.META_MAX_COMMIT, ix.U64.pack(self.sorter.max_commit_ts))

    # ------------------------------------------------------------------ reads
    def read_window(
        self, start_ts: int, end_ts: int, *, max_txns: int = 256, max_bytes: int = 4 << 20
    ) -> Iterator[list[binlog_pb2.Binlog]]:
        """Complete transactions with commit_ts in [start_ts, end_ts), in
        (commit_ts, start_ts) order, in batches. The caller checks safe/GC ts."""
        with self._gate:
            if start_ts < self.gc_ts:
                raise errors.OutOfRange(
                    f"window start {start_ts} is below this pump's GC ts {self.gc_ts}"
                )
            batch: list[binlog_pb2.Binlog] = []
            size = 0
            for commit_ts, _start, ptr in self.index.commits(start_ts, end_ts):
                b = binlog_pb2.Binlog.FromString(self.vlog.read(ptr))
                b.tp = COMMIT
                b.commit_ts = commit_ts
                b.prewrite_key = b""
                batch.append(b)
                size += ptr.length
                if len(batch) >= max_txns or size >= max_bytes:
                    yield batch
                    batch, size = [], 0
            if batch:
                yield batch

    # ------------------------------------------------------------------ GC
    def gc(self, gc_ts: int) -> dict[str, int]:
        """Forget every transaction committed (or rolled back) below ``gc_ts`` and
        delete value-log segments nothing live points into. ``gc_ts`` is clamped
        to the safe ts, and never moves backwards."""
        gc_ts = min(gc_ts, self.safe_ts)
        if gc_ts <= self.gc_ts:
            return {"gc_ts": self.gc_ts, "txns": 0, "segments": 0}
        removed_txns = 0
        wb = self.index.db.write_batch()
        for key, _ in self.index.db.iterator(start=ix.P_COMMIT, stop=ix.P_COMMIT + ix.U64.pack(gc_ts)):
            _commit_ts, start = ix.decode_commit_key(key)
            wb.delete(key)
            wb.delete(ix.txn_key(start))
            removed_txns += 1
        for key, _ in self.index.db.iterator(start=ix.P_ROLLBACK, stop=ix.P_ROLLBACK + ix.U64.pack(gc_ts)):
            wb.delete(key)
            wb.delete(ix.txn_key(ix.U64.unpack_from(key, 1)[0]))
            removed_txns += 1
        wb.put(ix.META_GC, ix.U64.pack(gc_ts))
        with self._state_lock:
            wb.write()
            self.gc_ts = gc_ts
        # The oldest segment anything live still points into (pending prewrites,
        # committed transactions above gc_ts) or the replay head.
        live = [self.vlog.head[0]]
        head = self.index.head()
        if head:
            live.append(head[0])
        live += [ptr.segment for _, ptr in self.index.pending()]
        for _k, v in self.index.db.iterator(prefix=ix.P_COMMIT):
            live.append(Pointer.unpack(v).segment)
        removed_segments: list[int] = []
        if self._gate.exclusive(timeout=30.0):
            removed_segments = self.vlog.remove_below(min(live))
        log.info("gc to ts %d: %d txns, %d segments removed", gc_ts, removed_txns, len(removed_segments))
        return {"gc_ts": gc_ts, "txns": removed_txns, "segments": len(removed_segments)}

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._writer.join(timeout=30)
        with self._state_lock:
            self._state_lock.notify_all()
        self.vlog.close()
        self.index.close()
