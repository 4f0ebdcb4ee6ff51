"""Pulling one Pump's window, resumed after transient failures."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from binlake import errors
from binlake.proto import binlog_pb2

log = logging.getLogger(__name__)

# Failures worth a retry (the Pump may be back); refusals (safe ts, GC ts) are not.
_TRANSIENT = (errors.Unavailable, errors.DeadlineExceeded)
# Tries per pull, the first included; the waits between them double from 0.5 s.
PULL_ATTEMPTS = 4


def pull_resumable(pump: str, addr: str, start_ts: int, end_ts: int,
                   attempts: int = PULL_ATTEMPTS) -> Iterator[binlog_pb2.Binlog]:
    """``reader.pull_pump``, resumed after a transient failure (a Pump restarting, a
    connection timing out on a loaded host): a window is served in (commit_ts,
    start_ts) order, so the retry starts at the last transaction handed out and
    skips what was already given. Refusals (safe ts, GC ts) are not retried."""
    from binlake.client.reader import pull_pump

    last: tuple[int, int] | None = None
    for attempt in range(1, attempts + 1):
        try:
            for txn in pull_pump(addr, start_ts if last is None else last[0], end_ts, node_id=pump):
                key = (txn.commit_ts, txn.start_ts)
                if last is not None and key <= last:
                    continue
                yield txn
                last = key
            return
        except _TRANSIENT as exc:
            if attempt == attempts:
                raise
            log.warning("pump %s: %s; retrying (%d/%d)", pump, exc, attempt, attempts - 1)
            time.sleep(0.5 * 2 ** (attempt - 1))
