"""Pump storage: value log + index + sorter, with group commit done by the
writing threads themselves.

Write path:

1. *Group commit, by the submitting threads (leader/follower), pipelined*: a
   submission (``submit_cb``/``submit``/``write``) is appended to the pending
   list. If no append is running, the submitting thread becomes the *leader*:
   it takes everything pending, validates each binlog in arrival order against
   the transaction states kept in memory (no index reads on this path), appends
   the accepted records to the value log and gives the leadership up. Then,
   with no leadership held, it **acknowledges** the group: a group of commits
   and rollbacks at once (made durable by a later fsync, see *Durability*
   below), a group holding a prewrite after an fsync that covers it, which this
   thread begins itself unless one begun after the append is already running
   (``_sync_to``; its callbacks run on the thread whose fsync covered it).
   *Pipelined*: while one group's fsync runs, the next group is validated and
   appended, and a group of commits acknowledged, by its own thread: the
   commits of one write stream need not wait for the prewrites' fsync of
   another, and two groups' fsyncs may overlap (each covers everything appended
   before it began). Submissions that find a leader at work just append
   themselves: the leader's next group carries them. A leader appends the group
   holding its own request; if more piled up meanwhile it hands the leadership
   to the storage's committer thread (so no caller is kept leading other
   callers' groups) and goes on to its acknowledgement. A submitter that must
   not wait in a commit (``may_lead=False``: a write stream's reader whose
   client has another batch on the wire) hands it to the committer thread at
   once, so the reader takes the next batch while this one is fsynced.
2. *Indexing* follows behind, on an indexer thread of its own: every
   ``INDEX_MAX_LAG_S`` (at once when the backlog reaches
   ``INDEX_BATCH_RECORDS`` records or a reader waits for it) it applies the
   acknowledged records, in value-log order, to the LevelDB index (one batch
   that also moves ``Mhead``) and to the sorter, and only then publishes the new
   safe ts and max commit ts. Readers see a window only once the index covers
   it, so a window at or below the safe ts is always complete.

Durability (TiDB Binlog's rule: only the prewrite is fsynced before the writer
is answered). Invariants, enforced in ``_append_group`` and ``_sync_to``:

* A group holding a prewrite is fsynced before any of it is acknowledged: an
  acknowledged prewrite survives a power loss, so a Pump never forgets a
  transaction whose writer went on to fetch a commit_ts. So is a group holding
  a refused duplicate prewrite (its original may still be on its way to disk),
  and one whose commit or rollback was checked against a prewrite no fsync
  covers yet (``_unsynced_pre``): nothing is acknowledged on the strength of a
  record a power loss could take.
* A group of commits and rollbacks alone (``sync_commits=False``, the default)
  is appended and acknowledged without an fsync of its own; the next fsync
  begun covers it (the value log is written in order, and an fsync makes every
  record written before it began durable), or the committer thread's fsync at
  most ``COMMIT_SYNC_DELAY_S`` later, or at once when a reader waits for the index.
* Nothing reaches the indexer (the index, the sorter, the published safe ts
  and max commit ts, hence any window a reader is served) before an fsync
  covers it. So no published state rests on bytes a power loss can take.

A commit lost by a power loss before its fsync leaves its prewrite pending
after the restart (the log is replayed up to its last good record, a prefix
of what was written). The Pump then asks the writer's status service after
``txn_timeout_s``, exactly as for a commit that never came, and stores the
commit with the commit_ts the writer answers: the one the writer committed
with, so nothing acknowledged is lost and nothing is served with a different
commit_ts. Until then the pending prewrite holds the safe ts below its
commit_ts, so no window that should hold the transaction is served without it.
``sync_commits=True`` fsyncs every group before acknowledging (for writers
whose status service does not outlive their last commit).

Why the submitting thread commits and not a writer thread of its own: with one
writer thread every acknowledgement cost two thread hand-offs under one GIL
(request thread to writer, writer to the answering thread), and the writer,
indexing whenever it found no request waiting, held the GIL just when the
answering thread needed it to send the acknowledgement. With one client stream
per Pump (the PumpClient's default) the gRPC thread that read the batch now
fsyncs it itself; the only hand-off left is the one to the thread that answers,
as with a Pump that stores nothing. The indexer runs on a timer, in batches,
not after every group: it takes the GIL at most 20 times a second instead of after
every acknowledgement.

Why acknowledging before indexing is safe: the value log is the source of
truth and the index lags it by design (its batch is written without a sync of
its own even when it is written first). On open, every record after ``Mhead``
is replayed, idempotently, so whatever the index had not caught up with
when the process died is rebuilt before the first new write is taken. The
sorter is driven in log order by the indexing stage alone, so the safe ts computed
from the index always describes a prefix of the log (see ``pump.sorter``).
Leaders are one at a time (``_leading``), so value-log order and the order of
the transaction-state memory are one order; fsyncs may overlap, but each hands
the indexer a prefix of the records no earlier fsync handed it, under one lock,
so the index backlog is in that order too.

The leader's memory of transaction states: ``_open`` holds every pending
start_ts (prewrite durable, no outcome yet); ``_done`` the outcomes of recently
finished transactions; every finished transaction with start_ts above
``_done_floor`` is in ``_done`` (or was collected by GC), so only a binlog for
an older start_ts (a retry of a transaction that finished long ago) costs an
index read. ``_done`` keeps an entry until the index holds it, so that
read always finds what memory forgot.

``write`` is the blocking form used by the Pump's own writes and tests: it
returns once the binlogs are durable *and* indexed (visible to reads and the
safe ts).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import pathlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator

import plyvel

from binlake import errors, failpoint
from binlake.proto import binlog_pb2
from binlake.pump import index as ix
from binlake.pump.sorter import SafeTs
from binlake.pump.vlog import Pointer, ValueLog

log = logging.getLogger(__name__)

PREWRITE = binlog_pb2.PREWRITE
COMMIT = binlog_pb2.COMMIT
ROLLBACK = binlog_pb2.ROLLBACK

# Failpoint in the indexing stage, after a group's fsync and acknowledgement
# and before the index batch covering it: a crash there must lose nothing acknowledged.
FAILPOINT_BEFORE_INDEX = "pump-before-index-batch"

# Failpoint after a group of commits/rollbacks was appended and acknowledged
# without an fsync: the value log is cut back to its last fsync before the
# process dies (what a power loss takes); the restart must resolve the cut
# commits through the writers' status services to the same commit_ts.
FAILPOINT_POWER_LOSS = "pump-power-loss"

# Failpoint between two of GC's delete batches: the GC ts is already stored and
# enforced, so a crash there serves no hole; the next GC removes the leftovers.
FAILPOINT_GC_AFTER_BATCH = "pump-gc-after-batch"

# GC deletes the index keys of at most this many transactions per LevelDB batch
# (a batch is held in memory whole until written).
GC_BATCH_KEYS = 10_000
# The resolver reads at most this many pending transactions' keys at a time.
RESOLVE_BATCH = 1_000

# Commits and rollbacks appended without an fsync of their own are fsynced by
# the committer thread this long after the first of them at the latest (a
# prewrite's group usually comes first and covers them).
COMMIT_SYNC_DELAY_S = 0.005
# While appends came within this long, the committer thread looks for such
# commits every COMMIT_SYNC_DELAY_S instead of being woken for each group of them.
COMMITTER_IDLE_S = 1.0

# The indexer indexes the acknowledged backlog this long after its first record
# at the latest, at once when it holds this many records or a reader waits.
INDEX_BATCH_RECORDS = 4096
INDEX_MAX_LAG_S = 0.05
# The indexer gives up the GIL after this many records of a batch.
INDEX_YIELD_EVERY = 64

# How many finished transactions the leaders remember (see the module docstring).
DONE_MEMORY = 200_000
# Transaction states in the leaders' memory: (kind, value) with value the
# commit_ts for _C, _ROLLED_BACK for _R, _PENDING for _P.
_P, _C, _R = 0, 1, 2
_PENDING = 0
_ROLLED_BACK = -1

Results = list[errors.BinlakeError | None]
# Called from the committing thread once the request's binlogs are durable (or
# refused): (one result per entry, None) or (None, the fatal error).
Callback = Callable[[Results | None, BaseException | None], None]


class Entry:
    """One binlog on its way to disk: the parsed message and its exact bytes.

    The fields the write path and the indexer test (type, start and commit ts)
    are read from the message once, here: a protobuf field read costs several
    times a slot's, and each is tested about ten times on the way."""

    __slots__ = ("binlog", "payload", "internal", "tp", "start_ts", "commit_ts")

    def __init__(self, binlog: binlog_pb2.Binlog, payload: bytes, internal: bool = False) -> None:
        self.binlog = binlog
        self.payload = payload
        # Written by the Pump itself (fake binlog, resolved commit/rollback).
        self.internal = internal
        self.tp: int = binlog.tp
        self.start_ts: int = binlog.start_ts
        self.commit_ts: int = binlog.commit_ts

    def __repr__(self) -> str:
        return f"Entry(tp={self.tp}, start_ts={self.start_ts}, commit_ts={self.commit_ts}, {len(self.payload)} bytes)"


@dataclasses.dataclass
class WriteStats:
    binlogs: int = 0
    bytes: int = 0
    fsyncs: int = 0
    groups: int = 0
    index_batches: int = 0


@dataclasses.dataclass(frozen=True)
class Part:
    """A slice of one served transaction too large for one message: ``data`` is
    bytes ``[offset, offset + len(data))`` of its stored prewrite (a serialized
    Binlog) of ``total`` bytes; the reader joins the parts, parses them and sets
    the commit (``client.reader``)."""

    start_ts: int
    commit_ts: int
    data: bytes
    offset: int
    total: int


class _Request:
    __slots__ = ("entries", "callback", "nbytes", "seq")

    def __init__(self, entries: list[Entry], callback: Callback) -> None:
        self.entries = entries
        self.callback = callback
        self.nbytes = sum([len(e.payload) for e in entries])
        # Sequence number of the last record written up to and including this
        # request (set by its leader): indexed once _indexed_seq reaches it.
        self.seq = 0


class _IndexWork:
    """Durable, acknowledged records waiting for the index, in log order."""

    __slots__ = ("entries", "pointers", "seq", "head")

    def __init__(self, entries: list[Entry], pointers: list[Pointer], seq: int, head: tuple[int, int]) -> None:
        self.entries = entries
        self.pointers = pointers
        self.seq = seq
        self.head = head


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
        sync_commits: bool = False,
    ) -> None:
        if max_group_bytes < 1:
            raise ValueError(f"max_group_bytes must be >= 1, got {max_group_bytes}")
        self.dir = pathlib.Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_group_bytes = max_group_bytes
        self.sync_commits = sync_commits
        try:
            self.index = ix.Index(self.dir / "index")
        except plyvel.IOError as exc:
            raise errors.FailedPrecondition(
                f"cannot open the index in {self.dir / 'index'}: {exc} "
                "(is another Pump using this data dir?)"
            ) from None
        try:
            self.vlog = ValueLog(self.dir / "vlog", segment_bytes=segment_bytes, fsync=fsync)
        except BaseException:
            self.index.close()
            raise
        self.sorter = SafeTs(bound=self.index.get_u64(ix.META_BOUND))
        self.sorter.max_commit_ts = self.index.get_u64(ix.META_MAX_COMMIT)
        self.gc_ts = self.index.get_u64(ix.META_GC)
        self.stats = WriteStats()
        # Guards the sorter, the published safe/max commit ts and index batches;
        # notified whenever an index batch was published.
        self._state_lock = threading.Condition()
        self._gate = _ReadersGate()
        # Guards the pending submissions, the leadership and _closed; notified
        # when the leadership is handed to the committer thread or given up.
        self._lead_cv = threading.Condition(lead_lock := threading.Lock())
        # The committer thread waits on this one (same lock), woken only when it has
        # something to do: a handed leadership, commits to fsync, a close. Not on
        # every leadership release: that was two thread wake-ups per transaction.
        self._commit_cv = threading.Condition(lead_lock)
        # The committer waits with no timeout (nothing unsynced when it looked, and
        # no append for COMMITTER_IDLE_S); _last_append: when the last group was appended.
        self._committer_idle = False
        self._last_append = 0.0
        self._pending: collections.deque[_Request] = collections.deque()
        # True while a thread commits (only one at a time: see the module docstring).
        self._leading = False
        # The leadership was handed to the committer thread, which has not taken it yet.
        self._handed = False
        # The fsync stage (under _lead_cv; see "Pipelined" in the module docstring).
        # _unsynced: appended records no fsync covers yet, in log order;
        # _unsynced_since: when the first of them was appended; _sync_now: a
        # reader waits for them. _unsynced_pre: start_ts -> seq of the prewrites
        # among them (an outcome checked against one waits for its fsync).
        # _awaiting: (seq, requests, results) of groups acknowledged once an fsync
        # covers seq, in seq order. _sync_begun: the seq the newest fsync begun
        # covers; _synced_seq: every record up to it is durable.
        self._unsynced: list[_IndexWork] = []
        self._unsynced_since = 0.0
        self._unsynced_pre: dict[int, int] = {}
        self._sync_now = False
        self._awaiting: collections.deque[tuple[int, list[_Request], list[Results]]] = collections.deque()
        self._sync_begun = 0
        self._synced_seq = 0
        self._syncs_running = 0
        # Tests only (the power-loss failpoint): no fsync begins any more.
        self._syncs_frozen = False
        # Guards the index backlog; notified when it should be indexed now.
        self._index_cv = threading.Condition()
        # Durable, acknowledged records the index does not reflect yet, in log order
        # (only records an fsync covers get here: see the module docstring).
        self._backlog: list[_IndexWork] = []
        self._backlog_records = 0
        self._backlog_since = 0.0
        self._index_now = False
        self._closed = False
        self._stopping = False
        self._fatal: BaseException | None = None
        # The leaders' transaction memory (see the module docstring).
        self._open: set[int] = set()
        self._done: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self._done_floor = 0
        # Records written by the leaders / reflected in the index, counted since open.
        self._seq = 0
        self._indexed_seq = 0
        self._head: tuple[int, int] | None = None
        try:
            self._recover()
        except BaseException:
            self.vlog.close()
            self.index.close()
            raise
        self._safe_ts = self.sorter.safe_ts
        self._max_commit_ts = self.sorter.max_commit_ts
        self._committer = threading.Thread(target=self._commit_loop, name="pump-committer", daemon=True)
        self._indexer = threading.Thread(target=self._index_loop, name="pump-indexer", daemon=True)
        self._committer.start()
        self._indexer.start()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        for start_ts, ptr, floor in self.index.pending_floors():
            self.sorter.prewrite(start_ts, ptr, recovered=True, floor=floor)
        segments = self.vlog.segments()
        head = self.index.head() or (segments[0] if segments else 1, 0)
        replayed = 0
        wb = self.index.db.write_batch()
        for ptr, payload in self.vlog.scan(*head):
            binlog = binlog_pb2.Binlog.FromString(payload)
            self._apply(wb, binlog.tp, binlog.start_ts, binlog.commit_ts, ptr, replay=True, binlog=binlog)
            replayed += 1
        self._put_meta(wb)
        wb.write()
        self._open = set(self.sorter.pending.starts())
        # Every finished transaction is in the index now; nothing above the
        # newest start_ts it holds has finished.
        for key in self.index.db.iterator(prefix=ix.P_TXN, reverse=True, include_value=False):
            self._done_floor = ix.U64.unpack_from(key, 1)[0]
            break
        if replayed:
            log.info("recovered %d value-log records past the index head", replayed)
        log.info(
            "storage open: %d pending txns, safe ts %d, max commit ts %d, gc ts %d",
            len(self._open), self.sorter.safe_ts, self.sorter.max_commit_ts, self.gc_ts,
        )

    # ------------------------------------------------------------------ state
    @property
    def safe_ts(self) -> int:
        """The safe ts of what the index holds (see ``pump.sorter``)."""
        return self._safe_ts

    @property
    def max_commit_ts(self) -> int:
        return self._max_commit_ts

    @property
    def pending_count(self) -> int:
        """Transactions whose prewrite is stored (its fsync may be under way) and whose outcome is not."""
        return len(self._open)

    def is_pending(self, start_ts: int) -> bool:
        return start_ts in self._open

    def pending_older_than(self, age_s: float, batch: int = RESOLVE_BATCH) -> Iterator[list[tuple[int, bytes]]]:
        """(start_ts, prewrite_key) of transactions pending longer than ``age_s``, in
        start_ts order, in lists of at most ``batch``.

        Read from the index's ``W`` keys (which carry the writer's id), not from the
        prewrites: a pending part of a snapshot may be megabytes, and the resolver
        asks every few seconds. Only a prewrite indexed by an older version (no key
        beside its ``W`` entry) is read to learn its writer."""
        # ``pending_count`` counts a prewrite once it is durable; the sorter
        # learns of it when the indexer thread has caught up (50 ms at most).
        # Wait for that so both views agree on what is pending.
        self.wait_indexed(timeout=5.0)
        now = time.monotonic()
        after = 0
        while True:
            rows = self.index.pending_keys(after, batch)
            if not rows:
                return
            after = rows[-1][0]
            with self._state_lock:
                arrived = [self.sorter.pending.arrived(ts) for ts, _ptr, _key in rows]
            old = [(ts, key or binlog_pb2.Binlog.FromString(self.vlog.read(ptr)).prewrite_key)
                   for (ts, ptr, key), at in zip(rows, arrived, strict=True) if at is not None and now - at >= age_s]
            if old:
                yield old
            if len(rows) < batch:
                return

    def storage_bytes(self) -> int:
        idx = sum(f.stat().st_size for f in (self.dir / "index").iterdir() if f.is_file())
        return self.vlog.size_bytes() + idx

    def disk_free_bytes(self) -> int:
        return shutil.disk_usage(self.dir).free

    def wait_safe(self, ts: int, timeout: float) -> bool:
        """Block until safe_ts >= ts or the timeout passes."""
        if self._safe_ts < ts:
            self._request_index()
        with self._state_lock:
            return self._state_lock.wait_for(lambda: self._safe_ts >= ts or self._closed, timeout) and (
                self._safe_ts >= ts
            )

    def wait_indexed(self, timeout: float | None = None) -> bool:
        """Block until every record written so far is in the index and the sorter."""
        target = self._seq
        self._request_index()
        with self._state_lock:
            return self._state_lock.wait_for(
                lambda: self._indexed_seq >= target or self._fatal is not None or self._closed, timeout
            ) and self._indexed_seq >= target

    # ------------------------------------------------------------------ writes
    def _check_open(self) -> None:
        if self._fatal is not None:
            raise errors.Unavailable(f"pump storage stopped after a fatal error: {self._fatal}")
        if self._closed:
            raise errors.Unavailable("pump storage is closed")

    def submit_cb(self, entries: list[Entry], callback: Callback, *, may_lead: bool = True) -> None:
        """Store binlogs in the next group commit; ``callback`` runs once they are
        durable (one result per entry: None = stored, or the error that refused
        it), or with the fatal error that stopped writes. It runs on the thread
        that appended the group (this one, when no append was running: it leads,
        and returns after the acknowledgement, or the leader at work) or on the
        thread whose fsync covered it. It must be quick and must not block (hand
        the result to its owner).

        ``may_lead=False``: this thread must not be kept in the commit (a write
        stream whose client has another batch on the wire: its reading thread
        should go on reading while this one is fsynced); the committer thread
        commits it, and the next batch read meanwhile joins the following group."""
        req = _Request(entries, callback)
        with self._lead_cv:
            self._check_open()
            self._pending.append(req)
            if self._leading:
                return  # the leader at work commits it in its next group
            self._leading = True
            if not may_lead:
                self._handed = True
                self._commit_cv.notify()
                return
        self._lead()

    def submit(self, entries: list[Entry]) -> concurrent.futures.Future[Results]:
        """As ``submit_cb``, with a future for the results."""
        future: concurrent.futures.Future[Results] = concurrent.futures.Future()

        def done(results: Results | None, exc: BaseException | None) -> None:
            if results is not None:
                future.set_result(results)
            else:
                future.set_exception(exc or errors.Unavailable("pump storage write failed"))

        self.submit_cb(entries, done)
        return future

    def write(self, entries: list[Entry], timeout: float | None = None) -> Results:
        """Store binlogs and wait until they are durable and indexed."""
        future: concurrent.futures.Future[Results] = concurrent.futures.Future()
        req_seq = [0]

        def done(results: Results | None, exc: BaseException | None) -> None:
            if results is not None:
                req_seq[0] = self._seq  # the leader's, right after this group
                future.set_result(results)
            else:
                future.set_exception(exc or errors.Unavailable("pump storage write failed"))

        deadline = None if timeout is None else time.monotonic() + timeout
        self.submit_cb(entries, done)
        results = future.result(timeout)
        self._request_index()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        with self._state_lock:
            if not self._state_lock.wait_for(
                lambda: self._indexed_seq >= req_seq[0] or self._fatal is not None or self._closed, remaining
            ):
                raise errors.DeadlineExceeded(f"pump index did not catch up within {timeout}s")
            if self._indexed_seq < req_seq[0]:
                raise errors.Unavailable(f"pump storage stopped before indexing the write: {self._fatal}")
        return results

    def _take_group(self) -> list[_Request]:
        """Pending requests up to ``max_group_bytes`` (at least one); under _lead_cv."""
        pending = self._pending
        group = [pending.popleft()]
        size = group[0].nbytes
        while pending and size < self.max_group_bytes:
            req = pending.popleft()
            group.append(req)
            size += req.nbytes
        return group

    def _lead(self) -> None:
        """Append pending groups as the leader (``_leading`` is set for this thread),
        give the leadership up, then acknowledge and fsync.

        One group at a time: a caller's thread appends the one with its own
        request, the committer thread the next pending one; if more is
        pending then, the leadership passes to the committer thread (again, when
        it is the committer: it takes it back at once), so no group's
        acknowledgement waits for later groups' appends. The fsync comes after
        the leadership is given up (``_sync_to``), so the next group is appended,
        and a group of commits acknowledged, while it runs."""
        now: list[tuple[list[_Request], list[Results]]] = []
        sync_to: int | None = None  # the seq an fsync must cover before this returns
        appended = False
        failed: list[_Request] = []
        while True:
            with self._lead_cv:
                if self._fatal is not None:
                    failed = list(self._pending)
                    self._pending.clear()
                    self._leading = False
                    self._lead_cv.notify_all()
                    self._commit_cv.notify()
                    break
                if not self._pending or appended:
                    if self._pending:
                        self._handed = True  # the leadership passes to the committer thread
                        self._commit_cv.notify()
                    else:
                        self._leading = False
                        self._lead_cv.notify_all()  # close() may wait for this
                        if self._unsynced and self._committer_idle:
                            self._commit_cv.notify()  # its timer for them starts now
                    break
                group = self._take_group()
            appended = True
            try:
                wait, due, seq, results = self._append_group(group)
            except BaseException as exc:
                self._stop_writes("pump storage write", exc)
                err = errors.Unavailable(f"pump storage write failed: {exc}")
                for r in group:
                    self._fail(r, err)
                continue
            if wait:
                sync_to = seq
            else:
                now.append((group, results))
                if due:
                    sync_to = seq
        for group, results in now:
            self._acknowledge(group, results)
        if now and self._unsynced:
            # Tests only: a power loss now takes the acknowledged, unsynced commits
            # (no fsync may begin while the failpoint stalls for the acknowledgements
            # to reach the writers).
            failpoint.hit(FAILPOINT_POWER_LOSS, first=self._freeze_syncs, before=self.vlog.drop_unsynced)
        if sync_to is not None:
            self._sync_to(sync_to)
        if failed:
            err = errors.Unavailable(f"pump storage write failed: {self._fatal}")
            for r in failed:
                self._fail(r, err)

    def _commit_loop(self) -> None:
        """The committer thread: leads whenever a caller's thread hands it the
        leadership, and fsyncs acknowledged commits no fsync has covered within
        ``COMMIT_SYNC_DELAY_S`` (at once when a reader waits for them or the
        storage closes)."""
        while True:
            with self._lead_cv:
                while True:
                    if self._handed:
                        self._handed = False
                        lead = True
                        break
                    now = time.monotonic()
                    due = self._unsynced_since + COMMIT_SYNC_DELAY_S
                    # Unsynced records no fsync begun covers yet.
                    to_sync = (self._sync_begun < self._seq and bool(self._unsynced) and self._fatal is None
                               and not self._syncs_frozen)
                    if to_sync and (self._stopping or self._sync_now or now >= due):
                        lead = False
                        break
                    if self._stopping and not to_sync:
                        return
                    if not to_sync and now - self._last_append < COMMITTER_IDLE_S:
                        # Writes are coming: look again in a while rather than be woken
                        # by every group of commits (a thread wake-up per transaction).
                        self._commit_cv.wait(COMMIT_SYNC_DELAY_S)
                    elif not to_sync:
                        self._committer_idle = True
                        self._commit_cv.wait()
                        self._committer_idle = False
                    else:
                        self._commit_cv.wait(max(due - now, 0.0))
                target = self._seq
            if lead:
                self._lead()
            else:
                self._sync_to(target)

    def _stop_writes(self, what: str, exc: BaseException) -> None:
        """A write, fsync or index batch failed: the storage takes no more writes
        (``_fatal``, seen by every later submission) and readers waiting on the
        state are woken to see it."""
        log.critical("%s failed; refusing further writes: %s", what, exc, exc_info=True)
        with self._lead_cv:
            self._fatal = exc
        with self._state_lock:
            self._state_lock.notify_all()

    @staticmethod
    def _fail(req: _Request, exc: BaseException) -> None:
        try:
            req.callback(None, exc)
        except Exception:
            log.exception("pump storage: a write callback failed")

    @staticmethod
    def _acknowledge(group: list[_Request], results: list[Results]) -> None:
        for req, res in zip(group, results, strict=True):
            try:
                req.callback(res, None)
            except Exception:  # a caller's bug must not stop the Pump's writes
                log.exception("pump storage: a write callback failed")

    def _append_group(self, group: list[_Request]) -> tuple[bool, bool, int, list[Results]]:
        """Validate and append one group (the leader only; no fsync here). Returns
        (its acknowledgement waits for an fsync, an fsync is due for earlier
        commits, the group's last seq, one result list per request)."""
        # 1. Validate in arrival order against the memory of transaction states
        #    plus this group's own effects. The durability invariant (module
        #    docstring): a group holding a prewrite (stored or refused: a refused
        #    duplicate's original may not be durable yet) waits for an fsync, and
        #    so does one whose outcome was checked against a prewrite no fsync
        #    covers yet; commits and rollbacks alone are acknowledged at once.
        overlay: dict[int, tuple[int, int]] = {}
        accepted: list[Entry] = []
        results: list[Results] = []
        wait = self.sync_commits
        unsynced_pre = self._unsynced_pre
        validate = self._validate
        nbytes = 0
        for req in group:
            res: Results = []
            for entry in req.entries:
                err = validate(entry, overlay)
                res.append(err)
                if entry.tp == PREWRITE or entry.start_ts in unsynced_pre:
                    wait = True
                if err is None:
                    accepted.append(entry)
                    nbytes += len(entry.payload)
            results.append(res)
        # 2. Append; then the outcome is final: remember it (the next leader
        #    validates against it while this group's fsync may still run).
        pointers: list[Pointer] = []
        if accepted:
            pointers = self.vlog.append([e.payload for e in accepted])
            head = self.vlog.head
        # The seq of the group's last record: only this leader moves _seq, so it is
        # read here, outside the lock, and stored under it below.
        seq = self._seq + len(accepted)
        open_, done = self._open, self._done
        for start, (kind, value) in overlay.items():
            if kind == _P:
                open_.add(start)
            else:
                open_.discard(start)
                done[start] = (value, seq)
                done.move_to_end(start)
        if len(done) > DONE_MEMORY:
            self._forget_done()
        stats = self.stats
        stats.binlogs += len(accepted)
        stats.bytes += nbytes
        stats.groups += 1
        # 3. Hand the records to the fsync stage (seq counts only appended records,
        #    so an fsync begun after this covers them).
        due = False
        with self._lead_cv:
            if accepted:
                self._seq = seq
                self._last_append = time.monotonic()
                if not self._unsynced:
                    self._unsynced_since = self._last_append
                self._unsynced.append(_IndexWork(accepted, pointers, seq, head))
                for e in accepted:
                    if e.tp == PREWRITE:
                        unsynced_pre[e.start_ts] = seq
            for req in group:
                req.seq = seq
            if wait:
                self._awaiting.append((seq, group, results))
            elif self._unsynced and (
                    self._sync_now or time.monotonic() - self._unsynced_since >= COMMIT_SYNC_DELAY_S):
                due = True
        return wait, due, seq, results

    def _sync_to(self, target: int) -> None:
        """Make every record up to seq ``target`` durable and acknowledge the groups
        that waited for it. Runs with no leadership: appends go on meanwhile.

        An fsync begun after ``target`` was appended covers it, so if one is
        running this returns at once (its thread acknowledges); else this thread
        begins one, at once, even while another runs for earlier records. Every
        fsync covers everything appended before it began (``_seq`` read then: only
        records whose bytes were written count). The records it covers go to the
        indexer and their groups are acknowledged only after it returned; the
        index gets them in log order (queued under ``_lead_cv`` as a prefix of
        ``_unsynced``). This enforces the module docstring's invariants."""
        ready: list[tuple[int, list[_Request], list[Results]]] = []
        with self._lead_cv:
            if self._fatal is not None:
                failed, self._awaiting = list(self._awaiting), collections.deque()
            else:
                failed = []
                while self._awaiting and self._awaiting[0][0] <= self._synced_seq:
                    ready.append(self._awaiting.popleft())
                begin = self._sync_begun < target and not self._syncs_frozen
                if begin:
                    snap = self._seq
                    head = self._unsynced[-1].head if self._unsynced else None
                    self._sync_begun = snap
                    self._syncs_running += 1
                    self._sync_now = False
        if failed:
            self._fail_groups(failed)
            return
        for _seq, group, results in ready:
            self._acknowledge(group, results)
        if not begin:
            return
        try:
            n = self.vlog.sync_appended()
        except BaseException as exc:
            with self._lead_cv:
                self._syncs_running -= 1
                self._lead_cv.notify_all()
            self._stop_writes("pump storage fsync", exc)
            with self._lead_cv:
                failed, self._awaiting = list(self._awaiting), collections.deque()
            self._fail_groups(failed)
            return
        ready = []
        with self._lead_cv:
            self._syncs_running -= 1
            self.stats.fsyncs += n
            if snap > self._synced_seq:
                self._synced_seq = snap
                if head is not None:
                    self.vlog.mark_synced(head)
            durable: list[_IndexWork] = []
            unsynced = self._unsynced
            unsynced_pre = self._unsynced_pre
            while unsynced and unsynced[0].seq <= self._synced_seq:
                work = unsynced.pop(0)
                durable.append(work)
                for e in work.entries:
                    if e.tp == PREWRITE and unsynced_pre.get(e.start_ts) == work.seq:
                        del unsynced_pre[e.start_ts]
            while self._awaiting and self._awaiting[0][0] <= self._synced_seq:
                ready.append(self._awaiting.popleft())
            if durable:
                self._queue_for_index(durable)
            self._lead_cv.notify_all()  # close() waits for running fsyncs
        for _seq, group, results in ready:
            self._acknowledge(group, results)

    def _freeze_syncs(self) -> None:
        with self._lead_cv:
            self._syncs_frozen = True

    def _fail_groups(self, groups: list[tuple[int, list[_Request], list[Results]]]) -> None:
        err = errors.Unavailable(f"pump storage write failed: {self._fatal}")
        for _seq, group, _results in groups:
            for r in group:
                self._fail(r, err)

    def _queue_for_index(self, durable: list[_IndexWork]) -> None:
        """Hand records an fsync covers to the indexer (in log order; the leader only)."""
        with self._index_cv:
            if not self._backlog:
                self._backlog_since = time.monotonic()
                self._index_cv.notify()  # the indexer's timer starts now
            self._backlog += durable
            self._backlog_records += sum([len(w.entries) for w in durable])
            if self._backlog_records >= INDEX_BATCH_RECORDS or self._index_now:
                self._index_now = True
                self._index_cv.notify()

    def _forget_done(self) -> None:
        # Drop the oldest outcomes once the index holds them; raise the floor
        # so a later binlog for such a start_ts is checked against the index.
        done = self._done
        while len(done) > DONE_MEMORY:
            start, (_value, seq) = next(iter(done.items()))
            if seq > self._indexed_seq:
                return
            done.popitem(last=False)
            if start > self._done_floor:
                self._done_floor = start

    def _state(self, start: int, overlay: dict[int, tuple[int, int]]) -> tuple[int, int] | None:
        """(kind, value) of start_ts: (_P, _PENDING), (_C, commit_ts), (_R, _ROLLED_BACK), or None."""
        state = overlay.get(start)
        if state is not None:
            return state
        if start in self._open:
            return (_P, _PENDING)
        done = self._done.get(start)
        if done is not None:
            return (_R, _ROLLED_BACK) if done[0] == _ROLLED_BACK else (_C, done[0])
        if start <= self._done_floor:
            raw = self.index.db.get(ix.txn_key(start))
            if raw is not None:
                outcome, commit_ts, _ = ix.decode_txn(raw)
                return (_C, commit_ts) if outcome == "C" else (_R, _ROLLED_BACK)
        return None

    def _validate(self, entry: Entry, overlay: dict[int, tuple[int, int]]) -> errors.BinlakeError | None:
        start = entry.start_ts
        tp = entry.tp
        if tp == COMMIT and start == entry.commit_ts and entry.internal:
            return None  # fake binlog
        state = self._state(start, overlay)
        if tp == PREWRITE:
            if state is not None:
                return errors.AlreadyExists(f"prewrite for start_ts {start} is already stored on this pump")
            overlay[start] = (_P, _PENDING)
            return None
        if tp == COMMIT:
            if state is None:
                return errors.FailedPrecondition(
                    f"commit for start_ts {start} has no prewrite on this pump; "
                    "a commit must go to the pump that took the prewrite"
                )
            if state[0] == _C:
                if state[1] == entry.commit_ts:
                    return errors.AlreadyExists(
                        f"commit for start_ts {start} is already stored with commit_ts {entry.commit_ts}"
                    )
                return errors.FailedPrecondition(
                    f"duplicate commit for start_ts {start}: already committed with commit_ts {state[1]}, "
                    f"this one says {entry.commit_ts}"
                )
            if state[0] == _R:
                return errors.FailedPrecondition(f"commit for start_ts {start}, which was rolled back")
            overlay[start] = (_C, entry.commit_ts)
            return None
        # ROLLBACK
        if state is None:
            return errors.FailedPrecondition(f"rollback for start_ts {start} has no prewrite on this pump")
        if state[0] == _R:
            return errors.AlreadyExists(f"rollback for start_ts {start} is already stored")
        if state[0] == _C:
            return errors.FailedPrecondition(
                f"rollback for start_ts {start}, which already committed with commit_ts {state[1]}"
            )
        overlay[start] = (_R, _ROLLED_BACK)
        return None

    # ------------------------------------------------------------------ indexing
    def _request_index(self) -> None:
        """Have the indexer index its backlog now (a reader or ``write`` waits for it).

        Set even when the backlog is empty: the records a waiter wants may be
        acknowledged and not yet in the backlog (the leader queues them for the
        index after the callbacks); the indexer takes them as soon as they are."""
        with self._index_cv:
            if not self._index_now:
                self._index_now = True
                self._index_cv.notify()
        # Acknowledged commits wait for an fsync before they can be indexed: now.
        with self._lead_cv:
            if not self._sync_now and (self._unsynced or self._leading):
                self._sync_now = True
                self._commit_cv.notify()

    def _index_loop(self) -> None:
        """The indexer thread: index the backlog when it is old or large enough,
        when asked to, and once more when the storage closes."""
        while True:
            with self._index_cv:
                while True:
                    if self._backlog and (
                        self._index_now or self._stopping
                        or time.monotonic() - self._backlog_since >= INDEX_MAX_LAG_S
                    ):
                        break
                    if self._stopping:
                        return
                    timeout = (
                        None if not self._backlog
                        else self._backlog_since + INDEX_MAX_LAG_S - time.monotonic()
                    )
                    self._index_cv.wait(timeout)
                batch, self._backlog, self._backlog_records = self._backlog, [], 0
                self._index_now = False
            try:
                self._index_batch(batch)
            except BaseException as exc:
                self._stop_writes("pump index write", exc)
                return

    def _index_batch(self, batch: list[_IndexWork]) -> None:
        # Transactions whose prewrite and outcome are both in this batch: their W key
        # would be put and deleted in the same atomic write, so neither is written
        # (most transactions finish within one INDEX_MAX_LAG_S; this halves their
        # index writes and the tombstones LevelDB compacts later).
        prewrites: set[int] = set()
        outcomes: set[int] = set()
        for work in batch:
            for entry in work.entries:
                if entry.tp == PREWRITE:
                    prewrites.add(entry.start_ts)
                elif entry.start_ts != entry.commit_ts:  # a fake binlog (start == commit) is no outcome
                    outcomes.add(entry.start_ts)
        paired = prewrites & outcomes
        wb = self.index.db.write_batch()
        apply = self._apply
        with self._state_lock:
            n = 0
            for work in batch:
                for entry, ptr in zip(work.entries, work.pointers, strict=True):
                    apply(wb, entry.tp, entry.start_ts, entry.commit_ts, ptr, paired=entry.start_ts in paired,
                          binlog=entry.binlog)
                    n += 1
                    if n % INDEX_YIELD_EVERY == 0:
                        # Let the committing and answering threads have the GIL: a batch
                        # of thousands of records would otherwise hold it for milliseconds.
                        time.sleep(0)
            self._head = batch[-1].head
            self._put_meta(wb)
            failpoint.hit(FAILPOINT_BEFORE_INDEX)
            wb.write()
            # Published only now: a reader that sees the new safe ts finds every
            # commit below it in the index.
            self._indexed_seq = batch[-1].seq
            self._safe_ts = self.sorter.safe_ts
            self._max_commit_ts = self.sorter.max_commit_ts
            self.stats.index_batches += 1
            self._state_lock.notify_all()

    def _apply(self, wb: plyvel.WriteBatch, tp: int, start: int, commit_ts: int, ptr: Pointer, *,
               replay: bool = False, paired: bool = False, binlog: binlog_pb2.Binlog | None = None) -> None:
        """Index one durable record (``binlog``: its message) and update the sorter.
        ``paired``: the transaction's prewrite and outcome are in the same index batch (no W key)."""
        if tp == PREWRITE:
            if replay and (start in self.sorter.pending or self.index.db.get(ix.txn_key(start))):
                return
            floor = self.sorter.prewrite(start, ptr)
            if not paired:
                wb.put(ix.wait_key(start), ix.wait_value(ptr, floor, binlog.prewrite_key if binlog else b""))
        elif tp == COMMIT and start == commit_ts:
            self.sorter.fake(commit_ts)
        elif tp == COMMIT or tp == ROLLBACK:
            prewrite = self.sorter.pending.location(start)
            if prewrite is None:
                if not replay:
                    raise AssertionError(f"validated outcome for start_ts {start} without a pending prewrite")
                return
            if not paired:
                wb.delete(ix.wait_key(start))
            if tp == COMMIT:
                wb.put(ix.txn_key(start), ix.encode_committed(commit_ts, prewrite))
                if commit_ts >= self.gc_ts:
                    wb.put(ix.commit_key(commit_ts, start), prewrite.pack())
                self.sorter.commit(start, commit_ts)
            else:
                wb.put(ix.txn_key(start), ix.encode_rolled_back(prewrite))
                wb.put(ix.rollback_key(start), b"")
                self.sorter.rollback(start)
        if replay:
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
        for item in self.serve_window(start_ts, end_ts, max_txns=max_txns, max_bytes=max_bytes, parts=False):
            assert isinstance(item, list)
            yield item

    def serve_window(
        self, start_ts: int, end_ts: int, *, max_txns: int = 256, max_bytes: int = 4 << 20,
        parts: bool = True, keys_only: bool = False,
    ) -> Iterator[list[binlog_pb2.Binlog] | Part]:
        """``read_window``, bounded by ``max_bytes`` whatever the transactions' sizes.

        ``parts``: a transaction larger than ``max_bytes`` comes as ``Part``s of at
        most ``max_bytes`` of its stored prewrite, read from the value log one part
        at a time (its checksum is verified before the last part is yielded, so a
        reader that completes it has checked bytes). ``keys_only``: commit binlogs
        with start_ts and commit_ts alone (no value-log read at all)."""
        with self._gate:
            if start_ts < self.gc_ts:
                raise errors.OutOfRange(
                    f"window start {start_ts} is below this pump's GC ts {self.gc_ts}"
                )
            batch: list[binlog_pb2.Binlog] = []
            size = 0
            for commit_ts, start, ptr in self.index.commits(start_ts, end_ts):
                if keys_only:
                    batch.append(binlog_pb2.Binlog(tp=COMMIT, start_ts=start, commit_ts=commit_ts))
                    if len(batch) >= max_txns:
                        yield batch
                        batch = []
                    continue
                if parts and ptr.length > max_bytes:
                    if batch:
                        yield batch
                        batch, size = [], 0
                    offset = 0
                    for data in self.vlog.read_slices(ptr, max_bytes):
                        yield Part(start, commit_ts, data, offset, ptr.length)
                        offset += len(data)
                    continue
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
        to the safe ts, and never moves backwards.

        Bounded whatever it removes: the new GC ts is written (and enforced for
        reads) first, then the index keys below it are deleted in batches of
        ``GC_BATCH_KEYS``, and the oldest live segment is a running minimum over
        the index. Invariant: no window at or above the stored GC ts ever misses a
        transaction, and none below it is served; so a crash between batches
        leaves only unreachable leftovers, which the next round deletes (each
        round deletes below the stored GC ts, whether or not it moves)."""
        target = min(gc_ts, self.safe_ts)
        moved = target > self.gc_ts
        if moved:
            with self._state_lock:
                # Alone, before any delete: LevelDB's log keeps writes in order, so no
                # crash can keep a delete and lose the GC ts that covers it.
                self.index.db.put(ix.META_GC, ix.U64.pack(target))
                self.gc_ts = target
        removed_txns = self._delete_below(self.gc_ts)
        if not moved and not removed_txns:
            return {"gc_ts": self.gc_ts, "txns": 0, "segments": 0}
        removed_segments: list[int] = []
        live = self._oldest_live_segment()
        if self._gate.exclusive(timeout=30.0):
            removed_segments = self.vlog.remove_below(live)
        log.info("gc to ts %d: %d txns, %d segments removed", self.gc_ts, removed_txns, len(removed_segments))
        return {"gc_ts": self.gc_ts, "txns": removed_txns, "segments": len(removed_segments)}

    def _delete_below(self, gc_ts: int) -> int:
        """Delete the C/R keys below ``gc_ts`` and their T keys, ``GC_BATCH_KEYS`` at a
        time (failpoint ``pump-gc-after-batch`` after each batch); return how many."""
        removed = 0
        db = self.index.db
        for prefix, id_at in ((ix.P_COMMIT, 9), (ix.P_ROLLBACK, 1)):
            start, stop = prefix, prefix + ix.U64.pack(gc_ts)
            while True:
                with db.iterator(start=start, stop=stop, include_value=False) as it:
                    keys = list(itertools.islice(it, GC_BATCH_KEYS))
                if not keys:
                    break
                wb = db.write_batch()
                for key in keys:
                    wb.delete(key)
                    wb.delete(ix.P_TXN + key[id_at:id_at + 8])
                wb.write()
                removed += len(keys)
                failpoint.hit(FAILPOINT_GC_AFTER_BATCH)
                if len(keys) < GC_BATCH_KEYS:
                    break
                # Past the last deleted key: a scan from the prefix would walk the tombstones again.
                start = keys[-1] + b"\x00"
        return removed

    def _oldest_live_segment(self) -> int:
        """The oldest segment anything live points into (pending prewrites, committed
        transactions at or above the GC ts) or the replay head: a running minimum."""
        live = self.vlog.head[0]
        head = self.index.head()
        if head:
            live = min(live, head[0])
        unpack = ix.POINTER.unpack_from
        for prefix in (ix.P_WAIT, ix.P_COMMIT):
            with self.index.db.iterator(prefix=prefix, include_key=False) as it:
                for value in it:
                    segment = unpack(value)[0]
                    if segment < live:
                        live = segment
        return live

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Finish the writes under way and their indexing, then close the files."""
        with self._lead_cv:
            if self._closed:
                return
            self._closed = True  # no new submission from here on
            # A leader at work appends (or hands on) what is pending before it stops
            # leading; fsyncs under way finish (the committer's last one covers the rest).
            self._lead_cv.wait_for(lambda: not self._leading and not self._syncs_running, timeout=30)
            self._stopping = True
            self._lead_cv.notify_all()
            self._commit_cv.notify()
        self._committer.join(timeout=30)
        with self._index_cv:
            self._stopping = True
            self._index_cv.notify_all()
        self._indexer.join(timeout=30)
        with self._state_lock:
            self._state_lock.notify_all()
        self.vlog.close()
        self.index.close()
