"""The three proofs of a drill, each independent of the restore it checks.

(a) ``apply_targets``: every apply target equals a restore at exactly its
    checkpoint (every change with commit_ts < checkpoint ts applied: the restore
    at checkpoint ts - 1), through the task's filter and routes (shards merged
    into one table with the extract-table column). Tables whose task ignores some
    row changes (event filters, expression filters) cannot be mirrored by a restore:
    they are named in the proof's notes, not compared.
(b) ``paths``: the scratch target (read back from the database) equals the same
    tables at the same ts by every other path the lake offers: the whole history and
    the history tables. The restore itself took the third path, the newest snapshot
    plus the changes after it (the scratch target is that path's result); the three
    agree when the scratch target equals both. The whole history is not rebuilt: its
    checksum is a sum over the change rows (``restore.proven``), from the newest
    snapshot that was proven against it when taken (its recorded sum, valid while the
    rows below it digest as recorded) or from the lake's start. Only when it differs
    is it rebuilt key by key, to name the first differing key. The sums and the
    history tables' checksums come from one Spark job.
(c) ``upstream``: a table the lake shows unchanged since the ts has the
    upstream's checksum now.

Frames are checksummed in the Spark executors (``sparksum``) and databases in
this process, in the same portable rendering (``checksum.checksum(..., portable=True)``);
only when two checksums differ is the first differing key looked for: by a
bounded anti-join in Spark between two frames, or, between a frame and a
database, by spilling both sides' (key, row hash) to a SQLite file on disk and
asking it for the smallest key on one side only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sqlite3
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.replicate import checkpoint
from binlake.replicate.rules import DML, Rules
from binlake.replicate.task import Task
from binlake.restore import columns as C
from binlake.restore import proven, restore, snapshot, sparksum
from binlake.restore import tables as restore_tables
from binlake.sql import checksum
from binlake.sql.targets.base import recorded_schema
from binlake.sql.url import reader_engine

Progress = Callable[[str], None]
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclasses.dataclass
class Proof:
    """One proof's outcome: ``verdict``; ``first``: the first difference (table, key)
    of a failed one; ``notes``: what was compared and what could not be, by name."""

    name: str
    verdict: str = SKIPPED
    first: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    compared: int = 0

    def fail(self, line: str) -> None:
        if self.first is None:
            self.first = line
        self.verdict = FAILED

    def done(self) -> Proof:
        if self.verdict != FAILED:
            self.verdict = PASSED if self.compared else SKIPPED
        return self

    def text(self) -> str:
        head = self.verdict + (f": {self.first}" if self.first else "")
        return "; ".join([head, *self.notes])

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "first": self.first, "notes": self.notes, "compared": self.compared}


def _spill_difference(db_rows: Any, frame: Any, info: binlog_pb2.TableInfo) -> tuple[str, str] | None:
    """The smallest key whose (key, row hash) is on one side only, between a database's
    ``portable_rows`` and a frame: both spilled to a SQLite file on disk, never held."""
    hashed = sparksum.hashed(frame, info).select("_hi", "_lo", *[f"`{k}`" for k in C.key_names(info)])
    keys = C.key_names(info)
    with tempfile.TemporaryDirectory(prefix="binlake-drill-") as tmp:
        db = sqlite3.connect(os.path.join(tmp, "spill.db"))
        try:
            db.execute("CREATE TABLE a (k TEXT, h INTEGER)")
            db.execute("CREATE TABLE b (k TEXT, h INTEGER)")
            batch: list[tuple[str, int]] = []
            for k, h in db_rows:
                batch.append((k, h - (1 << 64) if h >= 1 << 63 else h))
                if len(batch) >= 5000:
                    db.executemany("INSERT INTO a VALUES (?, ?)", batch)
                    batch.clear()
            db.executemany("INSERT INTO a VALUES (?, ?)", batch)
            batch.clear()
            for r in hashed.toLocalIterator(prefetchPartitions=True):
                h = (int(r["_hi"]) << 32) | int(r["_lo"])
                batch.append((sparksum.key_text([r[k] for k in keys], info), h - (1 << 64) if h >= 1 << 63 else h))
                if len(batch) >= 5000:
                    db.executemany("INSERT INTO b VALUES (?, ?)", batch)
                    batch.clear()
            db.executemany("INSERT INTO b VALUES (?, ?)", batch)
            found = db.execute(
                "SELECT k, 'only in the database' FROM (SELECT k, h FROM a EXCEPT SELECT k, h FROM b) "
                "UNION ALL SELECT k, 'only in the restore' FROM (SELECT k, h FROM b EXCEPT SELECT k, h FROM a) "
                "ORDER BY 1 LIMIT 2").fetchall()
        finally:
            db.close()
    if not found:
        return None
    if len(found) == 2 and found[0][0] == found[1][0]:
        return str(found[0][0]), "differs"
    return str(found[0][0]), str(found[0][1])


def db_difference(url: str, table: str, info: binlog_pb2.TableInfo | None, frame: Any,
                  frame_info: binlog_pb2.TableInfo) -> tuple[str, str] | None:
    """The first difference between table ``table`` of database ``url`` and ``frame``."""
    engine = reader_engine(url)
    try:
        with engine.connect() as conn:
            defs = recorded_schema(conn)
            rows = checksum.portable_rows(conn, table, defs.get(table, info), C.key_names(frame_info))
            return _spill_difference(rows, frame, frame_info)
    finally:
        engine.dispose()


def _show(found: tuple[str, str] | None) -> str:
    if found is None:
        return "rows differ (no single key found)"
    key, side = found
    return f"key {key} ({side})"


def paths(spark: Any, lake: str, ts: int, names: Sequence[str], scratch_url: str,
          say: Progress, auto: restore.Plan | None = None) -> tuple[Proof, dict[str, tuple[int, str, int]]]:
    """(b): the scratch target against every other restore path; also each table's
    (rows, checksum, bytes) at ts as the whole history sums them (for the drill's figures).
    ``auto``: the restore's own plan (made here when not given)."""
    proof = Proof("paths")
    say("proof (b): checksumming the scratch target")
    if auto is None:
        auto = restore.plan(spark, lake, ts, list(names), "auto")
    by_name = {t.info.name: t for t in auto.tables}
    # The database is read in a thread of this process while Spark's executors rebuild
    # the paths (the driver only waits on them): the two run side by side.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="drill-checksum")
    pending = pool.submit(lambda: checksum.checksum(scratch_url, sorted(by_name), portable=True))
    pool.shutdown(wait=False)
    if any(t.base.kind != "lake start" for t in auto.tables):
        # The scratch target is what the newest snapshot + changes rebuilt (the restore's
        # own plan): rebuilding it again would check the restore against itself.
        proof.notes.append("newest snapshot + changes: the restore's own path (the scratch target)")
    else:
        proof.notes.append("no snapshot at or below the ts: the restore's path is the whole history")
    history_frames: dict[str, tuple[Any, binlog_pb2.TableInfo]] = {}
    try:
        hp = restore.plan(spark, lake, ts, list(names), "history")
    except errors.BinlakeError as exc:
        proof.notes.append(f"history tables: not compared ({errors.first_line(exc)})")
    else:
        frames = restore_tables.frames(spark, hp)
        history_frames = {t.info.name: (frames[t.table_id], t.info) for t in hp.tables}
    # The whole history as a sum over its change rows (``proven``): from the newest snapshot
    # proven when it was taken, or from the lake's start; with the history tables' frames,
    # one Spark job.
    records = {(e.snapshot_ts, e.table_id): e.proof for e in snapshot.catalog(spark, lake) if e.proof is not None}
    say("proof (b): summing the whole history" + (" and checksumming the history tables path"
                                                  if history_frames else "") + " in Spark")
    wholes, sums = proven.measure(
        spark, lake, auto.schema, [(t.info.name, t.table_id, ts) for t in auto.tables], records,
        extra=[sparksum.signed_parts(f"h\0{name}", frame, info) for name, (frame, info) in history_frames.items()])
    chained = sum(1 for w in wholes.values() if w.start is not None)
    proof.notes.append(f"whole history: {len(wholes)} table(s) summed from their change rows ({chained} from a "
                       f"snapshot proven when taken, {len(wholes) - chained} from the lake's start)")
    figures = {name: w.sum for name, w in wholes.items()}
    scratch = pending.result()
    for t in auto.tables:
        name = t.info.name
        got = scratch.get(name, (0, ""))
        w = wholes[name]
        proof.compared += 1
        if not w.intact or got != w.sum[:2]:
            found = _whole_difference(spark, lake, ts, t, scratch_url, history_frames.get(name),
                                      got == sums.get(f"h\0{name}", sparksum.EMPTY)[:2])
            if not w.intact:
                assert w.start is not None and w.changes_now is not None
                proof.fail(f"table {t.name} differs between the restore and the whole history path at "
                           f"{_show(found)}: the lake's change rows at or below the snapshot at "
                           f"{w.start.snapshot_ts} changed since it was proven ({w.start.changes[0]} rows then, "
                           f"{w.changes_now[0]} now)")
            elif found is None:
                # Rebuilt key by key the history equals the restore, yet its rows do not sum to
                # it: some change's before image is not what its key held before it.
                proof.fail(f"table {t.name}: the whole history's change rows do not add up ({w.sum[0]} rows by their "
                           f"sum, {got[0]} restored, {w.how()}), though rebuilt key by key it equals the restore: "
                           "a change's before image is not what its key held (a damaged or incomplete change row)")
            else:
                proof.fail(f"table {t.name} differs between the restore and the whole history path at "
                           f"{_show(found)}: restore {got[0]} rows, whole history {w.sum[0]} rows ({w.how()})")
        if name in history_frames:
            frame, info = history_frames[name]
            rows, digest, _b = sums.get(f"h\0{name}", sparksum.EMPTY)
            proof.compared += 1
            if got != (rows, digest):
                found = db_difference(scratch_url, name, t.info, frame, info)
                proof.fail(f"table {t.name} differs between the restore and the history tables path at "
                           f"{_show(found)}: restore {got[0]} rows, history tables {rows} rows")
    return proof.done(), figures


def _whole_difference(spark: Any, lake: str, ts: int, t: restore_tables.TablePlan, scratch_url: str,
                      history: tuple[Any, binlog_pb2.TableInfo] | None,
                      history_agrees: bool) -> tuple[str, str] | None:
    """The first key at which the whole history of ``t``, rebuilt key by key (only now:
    its sum already differed), differs from the restore: by an anti-join with the history
    tables' frame when that agrees with the scratch target, else against the database."""
    p = restore.plan(spark, lake, ts, [t.name], "changes")
    whole = restore_tables.frames(spark, p)[p.tables[0].table_id]
    if history is not None and history_agrees:
        found = sparksum.first_difference(history[0], whole, t.info)
        if found is None:
            return None
        return found[0], {"only in first": "only in the restore", "only in second": "only in the whole history path"
                          }.get(found[1], found[1])
    return db_difference(scratch_url, t.info.name, t.info, whole, t.info)


def _mirror_notes(rules: Rules, info: binlog_pb2.TableInfo) -> list[str]:
    """Why ``info``'s target table cannot be mirrored by a restore (empty: it can)."""
    out = []
    ignored = rules.ignored(info.db, info.name)
    if ignored & set(DML) or ignored - set(DML):
        out.append(f"event filter ignores {', '.join(sorted(ignored))}")
    exprs = rules.expr_filters(info.db, info.name)
    if exprs:
        out.append(f"expression filter on {', '.join(e.table for e in exprs)}")
    return out


def apply_targets(spark: Any, lake: str, tasks: Sequence[tuple[Task, str]], names: Sequence[str],
                  say: Progress) -> Proof:
    """(a): each (task, target URL) against a restore at its checkpoint, table by table."""
    proof = Proof("apply")
    if not tasks:
        proof.notes.append("no apply target configured")
        return proof.done()
    wanted = {n.split(".")[-1].lower() for n in names}
    for task, url in tasks:
        if os.path.abspath(str(task.lake)) != os.path.abspath(lake) and task.lake != lake:
            proof.notes.append(f"task {task.name}: not compared (it applies the lake {task.lake})")
            continue
        engine = reader_engine(url)
        try:
            with engine.connect() as conn:
                cp = checkpoint.read(conn, task.name)
        finally:
            engine.dispose()
        if cp is None:
            proof.notes.append(f"task {task.name}: not compared (no checkpoint yet: nothing applied)")
            continue
        at = cp.ts - 1
        rules = Rules(task)
        try:
            p = restore.plan(spark, lake, at, None, "auto")
        except errors.BinlakeError as exc:
            proof.notes.append(f"task {task.name}: not compared (restore at {at}: {errors.first_line(exc)})")
            continue
        # Target table -> the upstream tables routed there (shards merge into one).
        groups: dict[str, list[restore_tables.TablePlan]] = {}
        for t in p.tables:
            if not rules.replicated(t.info.db, t.info.name):
                continue
            groups.setdefault(rules.place(t.info.db, t.info.name).table, []).append(t)
        chosen = {k: v for k, v in groups.items() if any(t.info.name.lower() in wanted for t in v)}
        if not chosen:
            proof.notes.append(f"task {task.name}: none of the drill's tables is replicated there")
            continue
        say(f"proof (a): task {task.name} at its checkpoint {cp.ts}: {len(chosen)} table(s)")
        frames = restore_tables.frames(spark, restore.Plan(p.lake, p.ts, p.schema, [t for v in chosen.values()
                                                                                    for t in v], p.source))
        mirrored: dict[str, tuple[binlog_pb2.TableInfo, Any]] = {}
        for target_table, shards in sorted(chosen.items()):
            why = [w for t in shards for w in _mirror_notes(rules, t.info)]
            if why:
                proof.notes.append(f"task {task.name}: {target_table} not mirrored ({'; '.join(why)})")
                continue
            info = rules.target_info(shards[0].info)
            mirrored[target_table] = (info, _routed(spark, rules, shards, frames, info))
        sums = sparksum.frames_checksums([(name, frame, info) for name, (info, frame) in mirrored.items()])
        for target_table, (info, frame) in mirrored.items():
            rows, digest, _b = sums[target_table]
            try:
                there = checksum.checksum(url, [target_table], portable=True)[target_table]
            except errors.NotFound:
                proof.compared += 1
                proof.fail(f"task {task.name}: table {target_table} is missing in the target ({rows} rows at "
                           f"the checkpoint)")
                continue
            proof.compared += 1
            if there != (rows, digest):
                found = db_difference(url, target_table, info, frame, info)
                proof.fail(f"task {task.name}: table {target_table} differs from the restore at its checkpoint "
                           f"{cp.ts} at {_show(found)}: target {there[0]} rows, restore {rows} rows")
    return proof.done()


def _routed(spark: Any, rules: Rules, shards: Sequence[restore_tables.TablePlan], frames: Mapping[int, Any],
            info: binlog_pb2.TableInfo) -> Any:
    """The frame the target table should hold: each shard with the target's columns (the
    extract-table column holding its upstream table's name), merged."""
    from pyspark.sql import functions as F

    out = None
    for t in shards:
        place = rules.place(t.info.db, t.info.name)
        df = frames[t.table_id]
        if place.extract_column:
            df = df.withColumn(place.extract_column, F.lit(place.extract_value))
        df = df.select(*[F.col(f"`{c.name}`") for c in C.columns_of(info)])
        out = df if out is None else out.unionByName(df)
    return out


def upstream(spark: Any, lake: str, ts: int, names: Sequence[str], scratch_url: str, upstream_url: str,
             newest_end: int, say: Progress, plan: restore.Plan | None = None) -> Proof:
    """(c): tables the lake shows unchanged after ``ts`` (up to its newest window end)
    against the upstream's checksums now. ``plan``: the restore's (made here when not given)."""
    from pyspark.sql import functions as F

    from binlake.restore import rebuild
    from binlake.sql.diff import diff_databases

    proof = Proof("upstream")
    p = plan if plan is not None else restore.plan(spark, lake, ts, list(names), "auto")
    ids = [t.table_id for t in p.tables]
    say("proof (c): each table's last change in the lake")
    last = {int(r["table_id"]): int(r["m"]) for r in rebuild.changes_frame(spark, lake)
            .filter(F.col("table_id").isin(ids)).groupBy("table_id").agg(F.max("commit_ts").alias("m")).collect()}
    quiet = [t for t in p.tables if last.get(t.table_id, 0) <= ts]
    for t in p.tables:
        if t not in quiet:
            proof.notes.append(f"{t.name}: changed after the ts (not compared)")
    if not quiet:
        return proof.done()
    up_names = checksum.checksum(upstream_url)
    for t in quiet:
        name = t.info.name
        if name not in up_names:
            proof.notes.append(f"{t.name}: not in the upstream (not compared)")
            continue
        mine = checksum.checksum(scratch_url, [name])[name]
        proof.compared += 1
        if up_names[name] != mine:
            report = diff_databases(upstream_url, scratch_url, tables=[name])
            first = "rows differ"
            for td in report.tables:
                keys = td.only_in_source or td.only_in_target or td.differing
                if keys:
                    first = f"key {keys[0]}"
                    break
            proof.fail(f"table {t.name} differs from the upstream at {first}: upstream {up_names[name][0]} rows, "
                       f"restore {mine[0]} rows (unchanged in the lake up to {newest_end}; a change upstream "
                       f"not ingested yet shows here too)")
    return proof.done()
