"""One writer at a time per lake: every Spark writer of the lake takes its turn here.

Windows are independent, but Delta sees two of them as a conflict: the
``changes`` table is partitioned by ``commit_date``, a window's
``replaceWhere`` reads the whole date partition as far as Delta's conflict
check is concerned (it checks partition values, not the ``commit_ts`` range),
so any window of the same day committing meanwhile fails it with
``ConcurrentAppendException``; the unpartitioned ``windows`` ledger conflicts
the same way on every commit. A backfill running N windows at once used to
lose those races again and again (8 jittered attempts were not always enough
for 4 writers). On S3 it is worse: delta-spark's default LogStore excludes
writers within one JVM only, so two drivers could each overwrite the other's
commit.

So every writer of a lake (the ingest in every mode, the snapshots, the history
tables, OPTIMIZE/VACUUM, the synthetic lakes of the benchmarks) runs its Delta
writes inside ``lake_writes``:

* a local lake: an exclusive ``flock`` on ``_binlake_writes.lock`` inside it
  (Spark and delta-rs skip ``_`` names; every process that mounts the lake
  shares it). The kernel drops the lock with its process, so a killed writer
  never leaves it held.
* an S3 lake: first a ``flock`` on a lock file per lake URI in the temp directory
  (the writers of this host queue there, so only one of them polls S3), then
  the lake's writer lease (``lake.lease``), which excludes writers on every host;
  a holder killed with -9 frees it after its TTL (``[lake.s3] writer_lease_ttl_s``).

The turn is reentrant within a thread (a snapshot job that also writes a catalog
takes it once), and other threads of the process wait for it as other processes
do. Writers call ``Turn.check()`` right before each Delta commit they start: on
S3 it refuses to commit once the lease is lost (see ``lake.lease`` for the
invariant); on a local lake it never fails (the kernel's lock cannot be lost).
Everything else (planning, reads, the Pumps' scan) runs outside the turn.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

LOCK_NAME = "_binlake_writes.lock"


def lock_path(lake: str) -> str:
    """The lock file of ``lake`` (a local directory or a URI)."""
    if not isinstance(lake, str) or not lake.strip():
        raise ValueError(f"lake must be a path or URI, got {lake!r}")
    from binlake.lake.store.arrowread import local_path

    local = local_path(lake)
    if local is not None:
        return os.path.join(os.path.abspath(local), LOCK_NAME)
    digest = hashlib.sha256(lake.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"binlake-lake-{digest}.lock")


@dataclasses.dataclass
class Turn:
    """A writer's turn at the lake: how long it waited, and the commit check."""

    lake: str
    waited: float
    lease: Any = None  # lake.lease.WriterLease on S3

    def check(self) -> None:
        """Before each Delta commit: raise ``lease.LeaseLost`` if this turn is over."""
        if self.lease is not None:
            self.lease.check()


# Per lock path: the process's re-entrant lock (threads wait there), and the turn
# held by the thread inside (so a nested ``lake_writes`` of that thread reuses it).
_guard = threading.Lock()
_locks: dict[str, threading.RLock] = {}
_held: dict[str, tuple[Turn, int]] = {}


@contextlib.contextmanager
def lake_writes(lake: str, *, what: str = "", spark: Any = None,
                progress: Callable[[str], None] | None = None) -> Iterator[Turn]:
    """Hold the lake's write turn inside (see the module's docstring). ``what`` names
    the writer in the S3 lease (shown to waiters); ``spark``, when given, has its
    jobs cancelled if the lease is lost mid-write."""
    path = lock_path(lake)
    with _guard:
        mine = _locks.setdefault(path, threading.RLock())
    began = time.monotonic()
    with mine:
        if path in _held:  # this thread holds it already
            turn, depth = _held[path]
            _held[path] = (turn, depth + 1)
            try:
                yield turn
            finally:
                _held[path] = (turn, depth)
            return
        with _host_lock(path):
            lease = _take_lease(lake, what, spark, progress)
            turn = Turn(lake, time.monotonic() - began, lease)
            _held[path] = (turn, 1)
            try:
                yield turn
            except Exception:
                if lease is not None:
                    # When the lease was lost, that is what stopped the writes (its loss
                    # cancelled the Spark jobs): say so rather than "job cancelled".
                    lease.check()
                raise
            finally:
                del _held[path]
                if lease is not None:
                    lease.release()


@contextlib.contextmanager
def _host_lock(path: str) -> Iterator[None]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _take_lease(lake: str, what: str, spark: Any, progress: Callable[[str], None] | None) -> Any:
    """The lake's writer lease when it is on S3 (taken, renewing), else None."""
    from binlake.lake.store import lease as lease_mod
    from binlake.lake.store import location

    if not location.parse(lake).is_s3:
        return None
    held = lease_mod.WriterLease(lake, what=what, on_lost=(lambda why: _cancel(spark, why)) if spark is not None
                                 else None)
    held.acquire(progress)
    return held


def _cancel(spark: Any, why: str) -> None:
    """Stop the session's running jobs: a write still uploading files never commits."""
    from binlake.lake.sparkenv import connect

    log.error("cancelling the Spark jobs writing the lake: %s", why)
    if connect.is_remote(spark):
        spark.interruptAll()
    else:
        spark.sparkContext.cancelAllJobs()
