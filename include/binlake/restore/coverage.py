"""What the ``windows`` ledger lets a restore promise.

A restore to T (Reparo's stop-tso: every transaction with commit_ts <= T,
none after) needs every change with commit_ts in ``(base_ts, T]``, where the
base is a snapshot at ``base_ts`` or, without one, the lake's beginning (its
first window's start). Only windows the ledger records as ``done`` count: rows
a crashed ingest left in ``changes`` outside any ledger window are never read.

Refusals are one line naming what to do: the window to ingest, or why no base
exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from binlake import errors, tso
from binlake.lake.store.ledger import uncovered


def done_windows(windows: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    return sorted((int(w["start_ts"]), int(w["end_ts"])) for w in windows if w.get("status") == "done")


def lake_span(windows: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(first window start, newest window end) of the ledger; NotFound when empty."""
    done = done_windows(windows)
    if not done:
        raise errors.NotFound("the lake has no ingested window: ingest one first (binlake ingest ...)")
    return done[0][0], max(e for _s, e in done)


def last_restorable(windows: Sequence[Mapping[str, Any]]) -> int:
    """The newest T a restore can reach from the lake's beginning: one below the end of
    the contiguous run of windows from the first (a later gap stops it)."""
    first, end = lake_span(windows)
    gaps = uncovered([{"start_ts": s, "end_ts": e} for s, e in done_windows(windows)], first, end)
    return (gaps[0][0] if gaps else end) - 1


def check(windows: Sequence[Mapping[str, Any]], ts: int, base_ts: int | None = None) -> None:
    """Refuse T unless the ledger covers ``(base_ts, T]`` (``base_ts`` None: from the
    lake's first window start). Raises errors.FailedPrecondition / NotFound."""
    if isinstance(ts, bool) or not isinstance(ts, int) or not 0 < ts < tso.MAX_TS:
        raise errors.InvalidArgument(f"commit_ts must be a TSO (a positive integer), got {ts!r}")
    first, end = lake_span(windows)
    if ts >= end:
        raise errors.FailedPrecondition(
            f"commit_ts {ts} ({tso.iso(ts, millis=True)}) is not covered: the newest ingested window ends at {end} ({tso.iso(end, millis=True)}); "
            f"ingest [{end}, {ts + 1}) or later first (binlake ingest --start-ts {end} --end-ts {ts + 1})")
    lo = first if base_ts is None else base_ts + 1
    if base_ts is None and ts < first:
        raise errors.FailedPrecondition(
            f"commit_ts {ts} ({tso.iso(ts, millis=True)}) is before the oldest data the lake holds: its first window starts at "
            f"{first} ({tso.iso(first, millis=True)}) and no snapshot at or below {ts} exists")
    done = [{"start_ts": s, "end_ts": e} for s, e in done_windows(windows)]
    # Over the whole ledger, so a gap is named whole (the window to ingest), not cut at T.
    gaps = [(a, b) for a, b in uncovered(done, lo, end) if a <= ts]
    if gaps:
        a, b = gaps[0]
        raise errors.FailedPrecondition(
            f"commit_ts {ts} ({tso.iso(ts, millis=True)}) is not covered: the windows ledger has a gap [{a}, {b}) ({tso.iso(a, millis=True)} .. "
            f"{tso.iso(b, millis=True)}) between the base at {lo - 1 if base_ts is not None else first} and {ts}; ingest "
            f"[{a}, {b}) first (binlake ingest --start-ts {a} --end-ts {b})")
