"""``binlake bench apply``: row changes/s from the lake into PostgreSQL and SQLite.

A sysbench-like table (``sbtest1``: id, k, c char(120), pad char(60)) receives
N row changes, 70 % inserts, 20 % updates (k and c), 10 % deletes, in
transactions of 10, written straight into a lake (``changes``, ``ddl_history``,
``windows``: the format the ingest writes) as W windows. Then, in one run:

* ``binlake apply`` (the real runner: Spark reads each window, compaction,
  batched statements, checkpoint) into PostgreSQL and SQLite, consistent and
  parallel mode, each into an empty database;
* the naive replayer: one statement per row change in commit order, one
  transaction per window (the baseline the apply must beat by 10x);
* PostgreSQL COPY of the same final rows into an empty table (the limit);
* the writes alone: per window, the deletes and the final rows that any
  exactly-once apply of that window must write (worked out by the benchmark,
  untimed), written with binlake's own statements in one transaction per
  window: the target's own share of an apply, with nothing read or compacted.

``--sqlite-changes N`` runs SQLite's cases (its row-by-row replay is the slowest
case by far) on the first N of the same changes, in a lake of their own; the
table gives each row's size, and each ratio compares cases of the same size.
Every apply case checks the target's final rows (count and column sums).

Prints seconds, row changes/s, the ratios, and per apply case the peak
resident memory of this process and of the Spark JVM while the case ran
(sampled from /proc), beside what they held before it: the apply holds two
reads of the lake at a time (the one being written, the next being compacted),
so its memory is bounded by the largest reads, not the run.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import resource
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

TABLE = "sbtest1"
TXN = 10


def _image(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def generate(n: int, seed: int = 7) -> tuple[list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]],
                                              dict[int, dict[str, Any]]]:
    """The row changes (op, before, after) and the final rows."""
    rng = random.Random(seed)
    live: dict[int, dict[str, Any]] = {}
    ids: list[int] = []
    out: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    next_id = 1
    for _ in range(n):
        r = rng.random()
        if r < 0.7 or len(ids) < 100:
            row = {"id": next_id, "k": rng.randrange(1_000_000), "c": f"{rng.getrandbits(240):060x}" * 2,
                   "pad": f"{rng.getrandbits(128):032x}" + "-" * 28}
            live[next_id] = row
            ids.append(next_id)
            next_id += 1
            out.append(("insert", None, row))
        else:
            i = rng.randrange(len(ids))
            key = ids[i]
            before = live[key]
            if r < 0.9:
                after = dict(before, k=rng.randrange(1_000_000), c=f"{rng.getrandbits(240):060x}" * 2)
                live[key] = after
                out.append(("update", before, after))
            else:
                ids[i] = ids[-1]
                ids.pop()
                del live[key]
                out.append(("delete", before, None))
    return out, live


def write_lake(spark: Any, lake: str, changes: list[Any], windows: int
               ) -> tuple[list[tuple[int, int]], Any, list[int]]:
    """The lake of ``changes``: windows, the table definition, row changes per window."""
    import datetime as dt

    import pyarrow as pa

    from binlake import tso
    from binlake.lake import ingest
    from binlake.lake.decoding import decode
    from binlake.lake.store import location
    from binlake.sql import schema as sc

    info = sc.new_table(100, "main", TABLE, [sc.ColumnDef("id", "int", False), sc.ColumnDef("k", "int"),
                                             sc.ColumnDef("c", "string", length=120),
                                             sc.ColumnDef("pad", "string", length=60)], ["id"], None, 1)
    base = tso.from_datetime(dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC))
    create_ts = base + 1
    ddl = {"commit_ts": create_ts, "start_ts": base, "schema_version": 1, "db": "main", "tbl": TABLE,
           "table_id": 100, "previous_table_id": 0, "dropped": False, "query": f"CREATE TABLE {TABLE} (...)",
           "table_info": info.SerializeToString(), "table_json": decode.table_json(info)}
    spark.createDataFrame([ddl], decode.DDL_HISTORY_DDL).write.format("delta").mode("overwrite").save(
        location.table_path(lake, location.DDL_HISTORY))
    cols: dict[str, list[Any]] = {name: [] for name, _ in decode.CHANGE_COLUMNS}
    step = 1 << 18  # one transaction per millisecond
    for i, (op, before, after) in enumerate(changes):
        ts = create_ts + step * (1 + i // TXN)
        key = after if after is not None else before
        assert key is not None
        for name, value in (("commit_ts", ts), ("start_ts", ts - 1), ("seq", i % TXN),
                            ("commit_date", decode.commit_date(ts)), ("db", "main"), ("tbl", TABLE),
                            ("table_id", 100), ("op", op), ("keys", _image({"id": key["id"]})),
                            ("before", _image(before) if before else None), ("after", _image(after) if after else None),
                            ("schema_version", 1), ("pump", "pump1")):
            cols[name].append(value)
    end = create_ts + step * (2 + len(changes) // TXN)
    table = pa.table(cols)
    cuts = [base] + [base + (end - base) * (j + 1) // windows for j in range(windows)]
    bounds = list(zip(cuts, cuts[1:], strict=False))
    ts_list = cols["commit_ts"]
    # One Delta commit of its own files per window, as the ingest writes them.
    rows = []
    counts = []
    at = 0
    for a, b in bounds:
        upto = bisect.bisect_left(ts_list, b, lo=at)
        df = spark.createDataFrame(table.slice(at, upto - at), decode.CHANGES_DDL)
        df.write.format("delta").mode("overwrite" if a == base else "append").partitionBy("commit_date").save(
            location.table_path(lake, location.CHANGES))
        count = upto - at
        at = upto
        counts.append(count)
        rows.append((a, b, ["pump1"], {"pump1": count}, {f"main.{TABLE}:x": count}, count // TXN, count,
                     1 if a <= create_ts < b else 0, "done", dt.datetime(2026, 11, 20, 9, 0)))
    spark.createDataFrame(rows, ingest.WINDOWS_DDL).write.format("delta").mode("overwrite").save(
        location.table_path(lake, location.WINDOWS))
    return bounds, info, counts


def naive_replay(url: str, info: Any, changes: list[Any], per_window: list[int]) -> float:
    """One statement per row change, commit order, one transaction per window."""
    from binlake.sql.url import open_target

    with open_target(url) as t:
        t.create_table(info)
        raw: Any = t.engine.raw_connection()
        try:
            cur = raw.cursor()
            mark = "%s" if t.dialect != "sqlite" else "?"
            ins = f"INSERT INTO {TABLE} (id, k, c, pad) VALUES ({mark}, {mark}, {mark}, {mark})"
            upd = f"UPDATE {TABLE} SET k = {mark}, c = {mark}, pad = {mark} WHERE id = {mark}"
            dele = f"DELETE FROM {TABLE} WHERE id = {mark}"
            started = time.perf_counter()
            i = 0
            for n in per_window:
                for op, before, after in changes[i:i + n]:
                    if op == "insert":
                        cur.execute(ins, (after["id"], after["k"], after["c"], after["pad"]))
                    elif op == "update":
                        cur.execute(upd, (after["k"], after["c"], after["pad"], after["id"]))
                    else:
                        cur.execute(dele, (before["id"],))
                raw.commit()
                i += n
            return time.perf_counter() - started
        finally:
            raw.close()


def copy_final(url: str, info: Any, final: dict[int, dict[str, Any]]) -> float:
    from binlake.sql.url import open_target

    with open_target(url) as t:
        t.create_table(info)
        started = time.perf_counter()
        t.bulk_load(info, final.values())
        return time.perf_counter() - started


def window_writes(changes: list[Any], per_window: list[int]
                  ) -> list[tuple[list[tuple[int]], list[dict[str, Any]]]]:
    """Per window, the writes any exactly-once apply of it must make: the keys
    whose row goes away or changes (they existed before the window), then the
    window's final rows of the keys inserted or updated in it."""
    out = []
    i = 0
    for n in per_window:
        existed: dict[int, bool] = {}  # key -> it had a row before the window
        last: dict[int, dict[str, Any] | None] = {}  # key -> its row at the window's end
        for op, before, after in changes[i:i + n]:
            key = (after or before)["id"]
            existed.setdefault(key, op != "insert")
            last[key] = after
        gone = [(k,) for k, had in existed.items() if had]
        rows = [r for r in last.values() if r is not None]
        out.append((gone, rows))
        i += n
    return out


def writes_floor(url: str, info: Any, writes: list[tuple[list[tuple[int]], list[dict[str, Any]]]]) -> float:
    """The target's own time for those writes, window by window, each in one
    transaction, with binlake's own statements (deletes of an array of keys, COPY):
    what no apply of the same windows into this target can go below."""
    import pyarrow as pa

    from binlake.sql.url import open_target

    with open_target(url) as t:
        t.create_table(info)
        tables = [(gone, pa.Table.from_pylist(rows)) for gone, rows in writes]
        started = time.perf_counter()
        for gone, rows in tables:
            with t.engine.connect() as conn:
                conn.begin()
                t.delete_keys(conn, info, gone)
                t.insert_arrow(conn, info, rows)
                conn.commit()
        return time.perf_counter() - started


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss(pid: int | str = "self") -> int:
    """Resident bytes of process ``pid`` now (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class RssPeak:
    """Peak resident memory of this process and of another (the Spark JVM) while the
    ``with`` block runs, sampled every 20 ms, and what each held at its start."""

    def __init__(self, other_pid: int | None) -> None:
        self.other = other_pid
        self.start = self.peak = self.start_other = self.peak_other = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss())
            if self.other:
                self.peak_other = max(self.peak_other, _rss(self.other))

    def __enter__(self) -> RssPeak:
        self.start = self.peak = _rss()
        if self.other:
            self.start_other = self.peak_other = _rss(self.other)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _jvm_pid(spark: Any) -> int | None:
    """The Spark driver JVM's process id, when this process launched it."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    return getattr(proc, "pid", None)


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--changes", type=int, default=1_000_000)
        parser.add_argument("--sqlite-changes", type=int, default=None)
        parser.add_argument("--windows", type=int, default=10)
        parser.add_argument("--targets", default="postgresql,sqlite")
        parser.add_argument("--modes", default="consistent,parallel")
        parser.add_argument("--master", default="local[2]")
        args = parser.parse_args()
    sqlite_n = getattr(args, "sqlite_changes", None) or args.changes
    if args.changes < 1000 or args.windows < 1 or not 1000 <= sqlite_n <= args.changes:
        print("bench apply: --changes must be at least 1000, --windows positive, and --sqlite-changes between "
              "1000 and --changes", file=sys.stderr)
        return 2
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(targets) <= {"postgresql", "sqlite"} or not set(modes) <= {"consistent", "parallel"}:
        print("bench apply: --targets from postgresql,sqlite; --modes from consistent,parallel", file=sys.stderr)
        return 2
    from binlake.lake.decoding import decode
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark
    from binlake.replicate import runner, task
    from binlake.stack.localdb import LocalPostgres

    root = Path(tempfile.mkdtemp(prefix="apply-bench-"))
    pg = None
    try:
        print(f"generating {args.changes:,} row changes (70% insert, 20% update, 10% delete) ...", flush=True)
        changes, final = generate(args.changes)
        spark = build_spark("binlake-bench-apply", args.master, shuffle_partitions=4, extra_conf=LAKE_CONF)
        spark.sparkContext.setLogLevel("ERROR")
        lake = str(root / "lake")
        bounds, info, counts = write_lake(spark, lake, changes, args.windows)
        print(f"lake written: {len(bounds)} windows, {len(final):,} final rows", flush=True)
        # SQLite's cases may run on a prefix of the same changes (its row-by-row replay is
        # the slowest case by far): ``generate`` gives the same first changes at any size.
        runs: dict[str, tuple[str, list[Any], dict[int, dict[str, Any]], list[int]]] = {
            kind: (lake, changes, final, counts) for kind in targets}
        if "sqlite" in targets and sqlite_n < args.changes:
            small, small_final = generate(sqlite_n)
            small_lake = str(root / "lake-sqlite")
            _b, _i, small_counts = write_lake(spark, small_lake, small, args.windows)
            runs["sqlite"] = (small_lake, small, small_final, small_counts)
            print(f"sqlite lake written: {sqlite_n:,} row changes, {len(small_final):,} final rows", flush=True)
        # Warm the JVM (classes, Delta's log reader) so the first measured case is not charged for it.
        from binlake.lake.store import ledger, location

        ledger.read_windows(spark, lake)
        spark.read.format("delta").load(location.table_path(lake, location.CHANGES)).count()
        # ... and the apply's own read path (ddl_history, a window handed over as Arrow): the
        # first window into a scratch SQLite database, then the first read's worth of windows
        # handed over twice more (the JIT compiles the Parquet and Arrow paths), not measured.
        warm = runner.Applier(spark, task.Task(name="warmup", lake=lake, target=f"sqlite:///{root / 'warmup.db'}",
                                               mode="consistent"))
        warm.run(until_ts=bounds[0][1])
        span = 0
        rows = 0
        while span < len(counts) and rows + counts[span] <= warm.reader.budget:
            rows += counts[span]
            span += 1
        for _ in range(2):
            warm.reader.read_changes(bounds[0][0], bounds[max(0, span - 1)][1],
                                     decode.SchemaHistory.from_rows(warm.reader.ddl_rows()))
        if "postgresql" in targets:
            root.chmod(0o755)
            pg = LocalPostgres(root / "pg").start()

        def new_url(kind: str) -> str:
            if kind == "sqlite":
                return f"sqlite:///{root / f'{uuid.uuid4().hex[:8]}.db'}"
            assert pg is not None
            url = str(pg.create_database(f"b_{uuid.uuid4().hex[:10]}"))
            # Every case starts with no dirty pages of the cases before it to flush: a
            # checkpoint the row-by-row replay's WAL triggers would otherwise land on
            # (and slow the commits of) whichever case runs next.
            from binlake.sql.url import open_target

            with open_target(url) as t, t.engine.connect() as c:
                c.exec_driver_sql("CHECKPOINT")
            return url

        results: list[tuple[str, str, float, RssPeak]] = []
        jvm = _jvm_pid(spark)
        baseline: dict[str, float] = {}
        for kind in targets:
            _lake, kchanges, _final, kcounts = runs[kind]
            baseline[kind] = naive_replay(new_url(kind), info, kchanges, kcounts)
            print(f"  {kind:<10} row-by-row      {baseline[kind]:8.1f}s", flush=True)
        copy_s = copy_final(new_url("postgresql"), info, final) if "postgresql" in targets else 0.0
        if copy_s:
            print(f"  postgresql COPY final rows {copy_s:8.1f}s", flush=True)
        floor: dict[str, float] = {}
        for kind in targets:
            _lake, kchanges, _final, kcounts = runs[kind]
            floor[kind] = writes_floor(new_url(kind), info, window_writes(kchanges, kcounts))
            print(f"  {kind:<10} the writes alone {floor[kind]:8.1f}s", flush=True)
        for kind in targets:
            klake, kchanges, kfinal, _counts = runs[kind]
            for mode in modes:
                url = new_url(kind)
                t = task.Task(name="bench", lake=klake, target=url, mode=mode)  # type: ignore[arg-type]
                with RssPeak(jvm) as mem:
                    started = time.perf_counter()
                    summary = runner.Applier(spark, t).run()
                    took = time.perf_counter() - started
                assert summary.changes == len(kchanges), (summary.changes, len(kchanges))
                _check_final(url, kind, kfinal)
                results.append((kind, mode, took, mem))
                print(f"  {kind:<10} apply {mode:<10} {took:8.1f}s", flush=True)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        mib = 1 << 20
        print()
        sq = f" --sqlite-changes {sqlite_n}" if sqlite_n < args.changes else ""
        print(f"binlake bench apply --changes {args.changes}{sq} --windows {args.windows}  "
              f"({len(final):,} final rows; load average {os.getloadavg()[0]:.1f}; peak RSS of this process "
              f"{rss:.0f} MiB, most of it the generated changes the baselines replay)")
        print()
        print("| target | mode | row changes | seconds | row changes/s | x row-by-row | / COPY | / writes alone |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for kind in targets:
            b = baseline[kind]
            n = len(runs[kind][1])
            print(f"| {kind} | row-by-row (naive) | {n:,} | {b:.1f} | {n / b:,.0f} | 1.0 | "
                  f"{f'{copy_s / b:.2f}' if kind == 'postgresql' and copy_s else '-'} | {floor[kind] / b:.2f} |")
        if copy_s:
            print(f"| postgresql | COPY of the final rows | {len(changes):,} | {copy_s:.1f} | "
                  f"{len(changes) / copy_s:,.0f} | {baseline['postgresql'] / copy_s:.1f} | 1.00 | - |")
        for kind in targets:
            f = floor[kind]
            n = len(runs[kind][1])
            print(f"| {kind} | the writes alone (per window: deletes, then COPY/INSERT; nothing read or compacted) | "
                  f"{n:,} | {f:.1f} | {n / f:,.0f} | {baseline[kind] / f:.1f} | "
                  f"{f'{copy_s / f:.2f}' if kind == 'postgresql' and copy_s else '-'} | 1.00 |")
        for kind, mode, took, _mem in results:
            n = len(runs[kind][1])
            ratio_copy = f"{copy_s / took:.2f}" if kind == "postgresql" and copy_s else "-"
            print(f"| {kind} | binlake apply {mode} | {n:,} | {took:.1f} | {n / took:,.0f} | "
                  f"{baseline[kind] / took:.1f} | {ratio_copy} | {floor[kind] / took:.2f} |")
        print()
        print("Memory while each apply ran (MiB): peak resident, and the rise over the start of the case.")
        print()
        print("| target | mode | bench process peak | rise | Spark JVM peak | rise |")
        print("|---|---|---:|---:|---:|---:|")
        for kind, mode, _took, mem in results:
            jvm_cols = (f"{mem.peak_other / mib:.0f} | {(mem.peak_other - mem.start_other) / mib:+.0f}"
                        if mem.other else "- | -")
            print(f"| {kind} | {mode} | {mem.peak / mib:.0f} | {(mem.peak - mem.start) / mib:+.0f} | {jvm_cols} |")
        return 0
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def _check_final(url: str, kind: str, final: dict[int, dict[str, Any]]) -> None:
    """The target holds exactly the final rows (count and a checksum of the keys and values)."""
    if kind == "sqlite":
        conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            got = conn.execute(f"SELECT count(*), sum(id), sum(k), sum(length(c)) FROM {TABLE}").fetchone()
        finally:
            conn.close()
    else:
        from binlake.sql.url import open_target

        with open_target(url) as t, t.engine.connect() as c:
            got = c.exec_driver_sql(f"SELECT count(*), sum(id), sum(k), sum(length(c)) FROM {TABLE}").fetchone()
    want = (len(final), sum(r["id"] for r in final.values()), sum(r["k"] for r in final.values()),
            sum(len(r["c"]) for r in final.values()))
    assert tuple(int(v or 0) for v in got) == want, (kind, tuple(got), want)
