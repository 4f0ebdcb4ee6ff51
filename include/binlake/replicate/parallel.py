"""``parallel`` mode: each batch's conflict groups applied concurrently by worker threads.

Each (compacted) batch is split into conflict groups (``causality``: changes
sharing a primary or unique key value, so one key's changes stay in one group,
in commit order), dealt into at most ``parallel_tasks`` buckets, and the
buckets are applied concurrently, one worker thread and one target connection
each: a worker writes its bucket in one transaction, with one checkpoint row
for the bucket; once every bucket of a batch is in, the task's checkpoint
moves to the batch's end (and the batch's DDL runs). A rerun skips the buckets
already in (a bucket is in or not, never half). When every table of a batch has
no unique key but its primary key (PostgreSQL, SQLite), its final changes are
on distinct keys and cannot conflict: they are dealt into buckets by key as
Arrow (``arrow_buckets``), not as Python changes.

A window read in pieces (``read.LakeReader.pieces``) is written piece after
piece, in commit order: a piece's last batch ends at the piece's end (a
commit_ts boundary, never inside a transaction), where the checkpoint moves,
which keeps its promise (every change before it is in, none after). A rerun
from inside the window cuts the same pieces (the cuts are the whole window's,
whatever the checkpoint), so its batches end where the crashed run's did and
their bucket rows are found.

Why threads in the apply's own process, not Spark tasks (as this mode first
used, through an RDD, which a Spark Connect session does not have): the batch
is already in this process (read from the lake), and this process writes the
target anyway (each batch's DDL and checkpoint), so the target is reachable
from here, whereas Spark tasks needed it reachable from every executor (or a
Connect server's Python workers) and shipped every bucket there and back. The
work of a bucket is the target's (statements, index updates, the commit), and
a worker waiting on its connection lets the others run: this is how TiDB DM's
syncer and TiDB Binlog's Drainer apply, N workers with their own connections,
changes dealt by key hash so that one key's changes keep their order. The same
code then runs on every kind of session: Spark Connect, spark-submit, ``local[*]``.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from sqlalchemy.engine import Connection

from binlake import errors, failpoint
from binlake.proto import binlog_pb2
from binlake.replicate import arrowcompact, causality, checkpoint, target_ddl
from binlake.replicate.batch import Batch, DDLChange
from binlake.replicate.compactor import Change
from binlake.replicate.report import ApplySummary
from binlake.replicate.table_write import (
    Mismatch,
    TargetDiverged,
    diagnose,
    table_keys,
    write_changes,
    write_final,
)
from binlake.replicate.task import Task
from binlake.sql import targets
from binlake.sql.url import open_target


def apply_window(spark: Any, target: targets.Target, target_url: str, task: Task, batches: list[Batch], a: int,
                 b: int, safe: bool, summary: ApplySummary,
                 ddl_change: Callable[[dict[str, Any]], DDLChange | None]) -> None:
    """Window ``[a, b)``: each batch's buckets by the worker threads, then its DDL and
    the checkpoint at its end. ``spark`` is not used (the batches are read already);
    kept so that both modes take the same arguments."""
    for batch in batches:
        if arrow_parallel(target, batch, safe):
            with target.engine.connect() as conn:
                done = checkpoint.done_groups(conn, task.name, batch.end)
            items = arrow_buckets(batch, task.parallel_tasks, done)
            if items:
                summary.rows_written += run_groups(task.parallel_tasks, items, functools.partial(
                    apply_arrow_buckets, target_url, task.name, batch.infos, batch.end, a, b))
            changes: list[Change] = []
        else:
            changes = batch.changes()
        if changes:
            # Compacted first (one change per key), then grouped: the groups are
            # then as small as they can be and still never share a key value.
            keys = {name: table_keys(info) for name, info in batch.infos.items()}
            groups = causality.group(changes, keys)
            with target.engine.connect() as conn:
                done = checkpoint.done_groups(conn, task.name, batch.end)
            work = [(g, part) for g, part in buckets(groups, task.parallel_tasks, done) if g not in done]
            if work:
                summary.rows_written += run_groups(task.parallel_tasks, work, functools.partial(
                    apply_groups, target_url, task.name, batch.infos, batch.end, a, b, safe,
                    compacted=batch.compacted))
        with target.engine.connect() as conn:
            conn.begin()
            if batch.ddl is not None:
                ddl_ts = int(batch.ddl["commit_ts"])
                checkpoint.write(conn, task.name, ddl_ts, a, b)
                conn.commit()
                conn.begin()
                change = ddl_change(batch.ddl)
                if change is not None:
                    target_ddl.apply_ddl(target, conn, change[0], change[2], change[1])
                    summary.ddls += 1
                checkpoint.write(conn, task.name, ddl_ts + 1, a, b)
            else:
                checkpoint.write(conn, task.name, batch.end, a, b)
            conn.commit()

def run_groups(tasks: int, work: list[Any],
               apply: Callable[[Iterable[Any]], Iterator[tuple[int, int, str]]]) -> int:
    """``apply`` over ``work`` (one item per bucket) in at most ``tasks`` worker
    threads, each given a contiguous slice of the buckets (written in one target
    transaction); rows written. ``apply`` yields (buckets applied, rows written,
    error message or ""). A worker that raises fails the batch once every worker
    has returned: what the others committed stays, with its checkpoint rows, and
    the rerun skips it (the batch's own checkpoint does not move)."""
    if not work:
        return 0
    slices = max(1, min(tasks, len(work)))
    # Contiguous slices of nearly equal size (as Spark's parallelize cut them).
    bounds = [len(work) * i // slices for i in range(slices + 1)]
    parts = [work[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo]
    with concurrent.futures.ThreadPoolExecutor(len(parts), thread_name_prefix="binlake-apply") as pool:
        futures = [pool.submit(lambda part: list(apply(part)), part) for part in parts]
        concurrent.futures.wait(futures)
    results = [r for f in futures for r in f.result()]  # re-raises a worker's exception
    failures = [msg for _groups, _n, msg in results if msg]
    if failures:
        raise TargetDiverged(failures[0]) if failures[0].startswith("target table") else \
            errors.FailedPrecondition(failures[0])
    return sum(n for _g, n, _m in results)


def buckets(groups: list[list[Change]], tasks: int, done: set[int]) -> Iterator[tuple[int, list[Change]]]:
    """The conflict groups dealt round-robin into at most ``tasks`` buckets, each
    as (checkpoint id, its changes): one worker and one checkpoint row per
    bucket, not per group. Buckets of disjoint groups are disjoint too. A rerun
    deals the same groups into as many buckets as the run whose bucket rows it
    finds (``done``), so an id means the same changes even if ``tasks`` changed."""
    count = min(tasks, len(groups))
    if done:
        count = checkpoint.bucket_count(next(iter(done)))
    parts: list[list[Change]] = [[] for _ in range(count)]
    for g, changes in enumerate(groups):
        parts[g % count].extend(changes)
    for i, part in enumerate(parts):
        if part:
            yield checkpoint.bucket_id(i, count), part


def arrow_parallel(target: targets.Target, batch: Batch, safe: bool) -> bool:
    """Whether a batch goes to the workers as Arrow: a target that writes Arrow
    natively (SQLite's and DuckDB's workers take its one write lock in turn), normal mode, every table
    compacted as Arrow with a CSV form, and no unique key but the primary key.
    Two final changes of a batch are then on different keys and can never
    conflict: any split of the keys is a split into conflict groups."""
    if not target.native_arrow or safe or not batch.tables:
        return False
    for name, final in batch.tables.items():
        if not isinstance(final, arrowcompact.Compacted) or not final.copyable:
            return False
        info = batch.infos[name]
        pk = sorted(info.primary_key)
        if not pk or any(sorted(uk.column_ids) != pk for uk in info.unique_keys):
            return False
    return True


def arrow_buckets(batch: Batch, tasks: int, done: set[int]) -> list[tuple[int, list[tuple[Any, ...]]]]:
    """The batch's final changes dealt into at most ``tasks`` buckets by key, each as
    (checkpoint id, [(table, keys to delete, keys inserted, rows as an Arrow table)]),
    leaving out the buckets in ``done``. The bucket of a key depends on the key and
    the bucket count only, and a rerun takes the count from the buckets it finds
    (``done``): an id means the same changes in every run."""
    total = sum(len(final) for final in batch.tables.values())
    count = checkpoint.bucket_count(next(iter(done))) if done else max(1, min(tasks, total))
    parts: list[list[tuple[Any, ...]]] = [[] for _ in range(count)]
    for name, final in batch.tables.items():
        assert isinstance(final, arrowcompact.Compacted)
        for i, (gone, inserted, rows) in enumerate(final.split(count)):
            if checkpoint.bucket_id(i, count) in done or (not gone and rows.num_rows == 0):
                continue
            # The workers are threads of this process: the table goes to them as it is.
            parts[i].append((name, gone, inserted, rows))
    return [(checkpoint.bucket_id(i, count), part) for i, part in enumerate(parts) if part]


def apply_arrow_buckets(url: str, task_name: str, infos: Mapping[str, binlog_pb2.TableInfo], seg_end: int, a: int,
                        b: int,
                        items: Iterable[tuple[int, list[tuple[Any, ...]]]]) -> Iterator[tuple[int, int, str]]:
    """Run by a worker: the Arrow buckets it was given (``arrow_buckets``: per
    table the keys to delete, then the rows to insert) that are not in yet."""

    def write(target: targets.Target, conn: Connection, todo: list[tuple[int, Any]]) -> int:
        n = 0
        for _g, parts in todo:
            for name, gone, inserted, rows in parts:
                n += write_final(target, conn, infos[name], gone, functools.partial(list, inserted),
                                  functools.partial(target.insert_arrow, conn, infos[name], rows))
        return n

    return _apply_buckets(url, task_name, seg_end, a, b, items, write)


def apply_groups(url: str, task_name: str, infos: Mapping[str, binlog_pb2.TableInfo], seg_end: int, a: int, b: int,
                 safe: bool, items: Iterable[tuple[int, list[Change]]],
                 compacted: bool = False) -> Iterator[tuple[int, int, str]]:
    """Run by a worker: the buckets of conflict groups it was given that are not
    in yet. The groups of a batch never touch the same key, so one worker writes all
    of its groups as one set of batched statements (each group's changes keep their
    order); concurrency is between the workers."""

    def write(target: targets.Target, conn: Connection, todo: list[tuple[int, Any]]) -> int:
        by_table: dict[str, list[Change]] = {}
        for _g, changes in todo:
            for c in changes:
                by_table.setdefault(c.table, []).append(c)
        return sum(write_changes(target, conn, infos[name], cs, safe, compacted) for name, cs in by_table.items())

    return _apply_buckets(url, task_name, seg_end, a, b, items, write)


def _apply_buckets(url: str, task_name: str, seg_end: int, a: int, b: int, items: Iterable[tuple[int, Any]],
                   write: Callable[[targets.Target, Connection, list[tuple[int, Any]]], int]
                   ) -> Iterator[tuple[int, int, str]]:
    """The buckets of ``items`` (checkpoint id, its changes) not in yet, written by
    ``write`` in one target transaction with one checkpoint row per bucket; yields
    (buckets applied, rows written, error message or "")."""
    target = open_target(url)
    try:
        with target.engine.connect() as conn:
            conn.begin()
            done = checkpoint.done_groups(conn, task_name, seg_end)
            todo = [(g, part) for g, part in items if g not in done]
            try:
                n = write(target, conn, todo)
            except Mismatch as m:
                conn.rollback()
                yield 0, 0, str(diagnose(target, m, f"window [{a}, {b})",
                                         "this worker's buckets were rolled back; those other workers "
                                         "committed stay and the rerun skips them"))
                return
            checkpoint.mark_groups(conn, task_name, seg_end, [g for g, _part in todo], a, b)
            conn.commit()
        failpoint.hit("apply-after-group")
        yield len(todo), n, ""
    finally:
        target.close()
