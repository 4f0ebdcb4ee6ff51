"""One writer at a time per lake on a host: the ingest's Delta commits in turn.

Windows are independent, but Delta sees two of them as a conflict: the
``changes`` table is partitioned by ``commit_date``, a window's
``replaceWhere`` reads the whole date partition as far as Delta's conflict
check is concerned (it checks partition values, not the ``commit_ts`` range),
so any window of the same day committing meanwhile fails it with
``ConcurrentAppendException``; the unpartitioned ``windows`` ledger conflicts
the same way on every commit. A backfill running N windows at once used to
lose those races again and again (8 jittered attempts were not always enough
for 4 writers).

So the ingests of one lake take turns for their writes: an exclusive
``flock`` on a lock file held from a window's first Delta write to its ledger
row. Everything else (the task start, planning, the ledger and DDL reads, the
Pumps' scan) still runs at once, and the Spark server, which would share its
cores between concurrent jobs anyway, runs the writes back to back. The lock
file is ``_binlake_writes.lock`` inside a local lake (Spark and delta-rs skip
``_`` names; every process that mounts the lake shares it), and one per lake
URI in the temp directory for a lake in an object store (the writers of one
host; writers on other hosts still meet Delta's conflicts and the ingest's
retries). The kernel drops the lock with its process, so a killed ingest never
leaves it held.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator

LOCK_NAME = "_binlake_writes.lock"


def lock_path(lake: str) -> str:
    """The lock file of ``lake`` (a local directory or a URI)."""
    if not isinstance(lake, str) or not lake.strip():
        raise ValueError(f"lake must be a path or URI, got {lake!r}")
    from binlake.lake.arrowread import local_path

    local = local_path(lake)
    if local is not None:
        return os.path.join(os.path.abspath(local), LOCK_NAME)
    digest = hashlib.sha256(lake.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"binlake-lake-{digest}.lock")


@contextlib.contextmanager
def lake_writes(lake: str) -> Iterator[float]:
    """Hold the lake's write lock inside; yields the seconds spent waiting for it."""
    path = lock_path(lake)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    began = time.monotonic()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - began
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
