"""The pace of a source's initial snapshot: at most ``--snapshot-max-rows-per-s``
rows a second, on average since the snapshot began.

Why a DBA sets it: a snapshot read as fast as the upstream serves it (a) takes
the primary's disk and CPU from its clients, and (b) puts its rows into the
lake's windows faster than an ingest takes them in: a window then holds
hundreds of thousands of snapshot rows, and every other writer's changes in it
wait for that ingest too. Paced below the ingest's own rows/s
(``docs/operations/sizing.md``), each window holds a bounded share of the
snapshot and the freshness of everything else stays near normal. The price: a
longer snapshot, so a longer-open read view on the upstream (MVCC history kept
for it) and a later marker.

The pace is kept after each row part (``Attempt.send_rows``): the part is sent
at once, then the sender waits until the rows sent so far are due. The reader
runs at most one batch ahead (``source.readahead``), so the upstream is read at
the same pace. A stop ends the wait at once.
"""

from __future__ import annotations

import math
import threading
import time

from binlake import errors


def check_rate(rate: float) -> float:
    """``rate`` as the pace in rows/s (0: no pace), or InvalidArgument saying why not."""
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate < 0:
        raise errors.InvalidArgument(
            f"--snapshot-max-rows-per-s must be 0 (no limit) or a positive number of rows/s, got {rate!r}")
    return float(rate)


class RowPace:
    """``after(rows)`` once a part of ``rows`` rows is sent: waits (on ``stop``) until
    the rows sent since the first part are due at ``rate`` rows/s. ``rate`` 0: never waits."""

    def __init__(self, rate: float, stop: threading.Event | None = None) -> None:
        self.rate = check_rate(rate)
        self._stop = stop if stop is not None else threading.Event()
        self._began: float | None = None
        self.rows = 0
        self.waited_s = 0.0

    def after(self, rows: int) -> None:
        if not self.rate:
            return
        now = time.monotonic()
        if self._began is None:
            # From the end of the first part's send: every part, the first included, waits
            # until its rows are due, so the whole snapshot averages at most ``rate``.
            self._began = now
        self.rows += rows
        delay = self._began + self.rows / self.rate - now
        if delay > 0:
            self.waited_s += delay
            self._stop.wait(delay)
