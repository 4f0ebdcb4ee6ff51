"""The apply: every ingested window after the target's checkpoint, in commit_ts
order, filtered, routed, compacted and written to the target, exactly once.

``Applier`` coordinates one run; each phase lives in a module of its own:

1. plan: the windows after the checkpoint, from the lake's ``windows`` ledger;
   a gap stops the apply naming the missing window (``Applier.plan``);
2. read (``read``): the window's ``changes`` and the DDL history as Arrow, in
   this process or through Spark (which also evaluates expression filters);
   a window over the read budget is read in pieces of at most the budget (cut
   between transactions), so the memory held does not grow with the window;
   the next window (or piece) is read and cut in a second thread while one is
   written: two reads are held at most;
3. batch (``batch``): the window cut at its DDLs into batches, filtered, routed
   and compacted to one final change per key (safe mode: decoded instead);
4. write, in the task's mode: ``consistent`` (the window, all its pieces, in one
   target transaction) or ``parallel`` (each batch's conflict groups by worker
   threads; a piece ends a batch);
   both write a table's changes with ``table_write``, which also checks the target
   against the log in normal mode (``TargetDiverged``); the checkpoint moves in
   the same target transaction as the data;
5. report (``report``): what the run did (``ApplySummary``).

Safe mode (DM's, for the windows after a restored snapshot) does not check the
target, and converges.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from binlake import errors, failpoint, tso
from binlake.lake.decoding import decode
from binlake.lake.store import s3
from binlake.replicate import checkpoint, consistent, parallel, rules, target_ddl
from binlake.replicate.batch import Batch, Batcher
from binlake.replicate.read import LakeReader
from binlake.replicate.report import ApplySummary, progress_bar
from binlake.replicate.task import Task
from binlake.sql import targets
from binlake.sql.url import open_target

Progress = Callable[[str], None]


@dataclasses.dataclass
class _Piece:
    """A piece of a window (the whole window unless it is read in pieces), read
    and cut into batches, ready to write."""

    index: int  # 0-based, among the window's pieces
    count: int  # the window's pieces (from the checkpoint on)
    batches: list[Batch]
    safe: bool
    counted: ApplySummary  # what the piece holds and filters out
    rows: int  # row changes read for it


class Applier:
    """Applies a task's windows; one per run (``run``)."""

    def __init__(self, spark: Any, task: Task, *, lake: str | None = None, target_url: str | None = None,
                 progress: Progress | None = None) -> None:
        if not isinstance(task, Task):
            raise TypeError(f"task must be a replicate.task.Task, got {type(task).__name__}")
        self.spark = spark
        self.task = task
        # An S3 lake is checked (bucket, keys, endpoint) before the target is touched.
        self.lake = lake or task.lake
        s3.prepare(spark, self.lake)
        url = target_url or task.target
        if "://" not in url:
            raise errors.InvalidArgument(
                f"task {task.name}: target {url!r} is an Airflow Connection id; only the binlake_apply DAG "
                "resolves those: give a database URL (sqlite:///PATH, postgresql://..., mysql://...)")
        self.target_url = url
        self.rules = rules.Rules(task)
        self.progress = progress or (lambda _msg: None)
        self.reader = LakeReader(spark, task, self.lake, self.rules)
        # The pieces of the window being read (``_prepare``, in the prefetch thread).
        self._plan: list[tuple[int, int]] = []

    def plan(self, start: int, until_ts: int | None) -> tuple[list[dict[str, Any]], int]:
        """The windows to apply from checkpoint ts ``start`` (0: from the first), and
        how many later ones ``until_ts`` leaves out. Refuses gaps."""
        windows = self.reader.windows()
        todo = [w for w in windows if int(w["end_ts"]) > start]
        if start > 0 and todo and int(todo[0]["start_ts"]) > start:
            a, b = start, int(todo[0]["start_ts"])
            raise errors.FailedPrecondition(
                f"window [{a}, {b}) ({tso.iso(a)} .. {tso.iso(b)}) is missing from the lake's windows ledger: ingest it "
                "(or backfill the ingest DAG) and apply again")
        for prev, nxt in zip(todo, todo[1:], strict=False):
            if int(prev["end_ts"]) != int(nxt["start_ts"]):
                a, b = int(prev["end_ts"]), int(nxt["start_ts"])
                if until_ts is not None and a >= until_ts:
                    break
                raise errors.FailedPrecondition(
                    f"window [{a}, {b}) ({tso.iso(a)} .. {tso.iso(b)}) is missing from the lake's windows ledger: ingest "
                    "it (or backfill the ingest DAG) and apply again")
        if until_ts is not None:
            kept = [w for w in todo if int(w["end_ts"]) <= until_ts]
            return kept, len(todo) - len(kept)
        return todo, 0

    def status(self) -> dict[str, Any]:
        """The task's checkpoint against the lake: windows behind, lag."""
        target = open_target(self.target_url)
        try:
            with target.engine.connect() as conn:
                cp = checkpoint.read(conn, self.task.name)
        finally:
            target.close()
        windows = self.reader.windows()
        ts = cp.ts if cp else 0
        behind = [w for w in windows if int(w["end_ts"]) > ts]
        latest = max((int(w["end_ts"]) for w in windows), default=0)
        return {"task": self.task.name, "target": str(target), "checkpoint_ts": ts,
                "checkpoint_time": tso.iso(ts) if cp else "-", "windows_behind": len(behind),
                "lake_end_ts": latest,
                "lag_s": round(max(0.0, (tso.to_datetime(latest) - tso.to_datetime(ts)).total_seconds()), 3)
                if cp and latest else None}

    # -- running
    def run(self, until_ts: int | None = None) -> ApplySummary:
        """Apply every window after the checkpoint (up to ``until_ts``)."""
        began = time.monotonic()
        target = open_target(self.target_url)
        summary = ApplySummary(self.task.name, str(target))
        try:
            checkpoint.ensure(target.engine)
            with target.engine.connect() as conn:
                cp = checkpoint.read(conn, self.task.name)
            start = cp.ts if cp else (self.task.start_after_ts + 1 if self.task.start_after_ts else 0)
            windows, summary.behind = self.plan(start, until_ts)
            ddl_rows = self.reader.ddl_rows()
            history = decode.SchemaHistory.from_rows(ddl_rows)
            batcher = Batcher(self.rules, history, ddl_rows)
            self.reader.forget()
            if cp is None and start == 0 and windows:
                self._bootstrap(target, batcher, int(windows[0]["start_ts"]), summary)
            summary.checkpoint_ts = start
            fresh = cp is None
            # The next piece (the next window's first, after a window's last) is read
            # and compacted in a second thread while one is written: the target works
            # on the write while this process compacts. Only reads happen ahead (the
            # lake, the DDL history), one piece at a time: two pieces are held at
            # most. What commits, and the checkpoint, stay strictly in commit order.
            with ThreadPoolExecutor(1, thread_name_prefix="apply-prefetch") as pool:
                ahead = pool.submit(self._prepare, batcher, windows, 0, 0, start, fresh)
                for n, w in enumerate(windows, start=1):
                    a, b = int(w["start_ts"]), int(w["end_ts"])
                    with self._window(target, a, b, summary, batcher) as write:
                        while True:
                            piece = ahead.result()
                            last = piece.index + 1 == piece.count
                            if not last:
                                ahead = pool.submit(self._prepare, batcher, windows, n - 1, piece.index + 1, start,
                                                    fresh)
                            elif n < len(windows):
                                ahead = pool.submit(self._prepare, batcher, windows, n, 0, b, fresh)
                            write(piece.batches, piece.safe)
                            summary.changes_by_op.update(piece.counted.changes_by_op)
                            summary.filtered += piece.counted.filtered
                            if piece.count > 1:
                                summary.pieces += 1
                                self.progress(f"window [{a}, {b}): piece {piece.index + 1}/{piece.count} "
                                              f"({piece.rows:,} changes)")
                            if last:
                                break
                            failpoint.hit("apply-after-piece")
                    summary.split_windows += piece.count > 1
                    summary.windows += 1
                    summary.first_window = summary.first_window or (a, b)
                    summary.last_window = (a, b)
                    summary.checkpoint_ts = start = b
                    self.progress(f"[{progress_bar(n, len(windows))}] {n}/{len(windows)} window [{a}, {b}) {tso.iso(b)}  "
                                  f"{summary.changes:,} row changes, {summary.ddls} DDL")
                    failpoint.hit("apply-after-window")
        finally:
            summary.largest_read = self.reader.peak_rows
            self.reader.forget()
            target.close()
        summary.elapsed_s = time.monotonic() - began
        return summary

    @contextlib.contextmanager
    def _window(self, target: targets.Target, a: int, b: int, summary: ApplySummary, batcher: Batcher
                ) -> Iterator[consistent.PieceWriter]:
        """The writer of window ``[a, b)``'s pieces in the task's mode: consistent
        mode's one transaction, committed with the checkpoint at ``b`` when the
        block ends; parallel mode's batches, each with its checkpoint."""
        if self.task.mode == "parallel":
            def write(batches: list[Batch], safe: bool) -> None:
                parallel.apply_window(self.spark, target, self.target_url, self.task, batches, a, b, safe, summary,
                                      batcher.ddl_change)

            yield write
        else:
            with consistent.window(target, self.task.name, a, b, summary, batcher.ddl_change) as in_transaction:
                yield in_transaction

    def _prepare(self, batcher: Batcher, windows: list[dict[str, Any]], n: int, k: int, start: int, fresh: bool
                 ) -> _Piece:
        """Piece ``k`` of window ``n`` (both 0-based; the window's changes from
        ``start``, the checkpoint) read and cut into batches. ``fresh``: the target
        had no checkpoint when the run began. Piece 0 plans the window's pieces."""
        a = int(windows[n]["start_ts"])
        # Safe mode for the configured windows, and for the first one after a restored
        # snapshot: the snapshot may already hold part of that window.
        safe = a < self.task.safe_mode_until_ts or (fresh and self.task.start_after_ts > 0 and n == 0)
        if k == 0:
            # Only this thread plans and reads: the plan waits here for the window's next pieces.
            self._plan = self.reader.pieces(windows[n], max(a, start))
        lo, hi = self._plan[k]
        counted = ApplySummary(self.task.name, "")
        rows = self.reader.window_rows(windows, n, lo, hi, batcher.history)
        return _Piece(k, len(self._plan), batcher.batches(rows, lo, hi, counted, safe), safe, counted,
                      rows[4] - rows[3])

    def _bootstrap(self, target: targets.Target, batcher: Batcher, first_start: int, summary: ApplySummary) -> None:
        """A target with no checkpoint, applied from the lake's first window: create
        the tables whose DDLs precede it (the lake holds them in ddl_history)."""
        with target.engine.connect() as conn:
            conn.begin()
            for ddl in batcher.ddl_rows:
                if int(ddl["commit_ts"]) >= first_start:
                    break
                change = batcher.ddl_change(ddl)
                if change is not None:
                    target_ddl.apply_ddl(target, conn, change[0], change[2], change[1])
                    summary.ddls += 1
            conn.commit()
