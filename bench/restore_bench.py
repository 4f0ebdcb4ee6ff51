"""Restore benchmark: one table of ROWS rows with a history of CHANGES row changes,
restored at a late commit_ts three ways, against replaying the same changes row
by row into SQLite (the naive way, as Reparo applies binlogs) in the same run.

Setup (not timed): a lake written directly with Spark (no Pumps: the upstream
and the ingest are not what is measured) holding, for a sysbench-like table
``bench(id bigint pk, k bigint, c varchar, balance decimal(20,2))``, ROWS inserts
then CHANGES - ROWS updates of random rows (each changes ``k``, ``c`` and
``balance``), one transaction per change, in the lake's own format (canonical
image JSON, ``ddl_history``, a ``windows`` ledger of five windows). Then a
snapshot at 90 % of the history and the history tables.

Cases, each restoring every row at T = the last commit_ts into a fresh Delta
directory (``restore.write_out``) and counting it:

(a) from the whole history: all CHANGES row changes reduced per key;
(b) from the snapshot at 90 % plus the last 10 % of the changes;
(c) from the history tables (the versions valid at T);
naive: the same changes, in commit order, each one's image JSON parsed and
  applied with one INSERT or UPDATE statement into SQLite (a commit every
  1,000 statements, which is kinder to it than one per transaction).

Reported: seconds, rows/s (restored rows per second; for naive, changes
applied per second), the ratio to naive, and peak RSS (driver Python and the
process tree with the JVM). Run: ``binlake bench restore [--rows N --changes M]``.

``--lake s3://BUCKET/PREFIX`` puts the lake on S3 (endpoint and keys from AWS_* /
[lake.s3]; ``--seaweedfs`` starts a throwaway SeaweedFS for it) and reports the
three cases only (the naive replay is the same with either lake).

Many tables (``binlake bench restore --tables 10,1000 [--rows N --changes M]``):
the same ROWS rows and CHANGES changes spread over each count of tables
(``synthetic.build_lake(tables=...)``), each lake restored at its last commit_ts
from the lake's start into SQLite, into PostgreSQL (a throwaway local server)
and as Delta tables (``--out``). Per restore: seconds, Spark jobs run (the
status tracker's job ids) and the bytes Spark read from local files (Hadoop's
file-system statistics, the JVM's own counter: the lake's Parquet files and
Delta logs; Hadoop's local file system counts no read operations, so bytes
stand for reads). Then the extra cost per table (the difference between the largest
and smallest count of tables, divided by the tables added) next to its floor,
measured in the same run: creating the same number of tables, each with its
rows already decoded, in one transaction (a database), or writing each as a
Delta table with delta-rs (``--out``) - what any restore must pay per table.
Then a snapshot of every table at the same ts (``snapshot``: written and proven), and
the same snapshot with every table's proof summed in Spark (``snapshot, proofs in
Spark``: what a snapshot cost before small tables were summed in the task process),
both against the Delta floor.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import shutil
import sqlite3
import sys
import tempfile
import time
from decimal import Decimal
from typing import Any

SNAPSHOT_AT = 0.9
BATCH = 1000


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def naive_replay(spark: Any, lake: str, db_path: str) -> tuple[float, int]:
    """Changes in commit order, one statement each, into SQLite. Returns (seconds, changes)."""
    # Reading the changes out is not timed: only the apply, as Reparo's would be.
    from binlake.lake.store.location import CHANGES, table_path
    src = pathlib.Path(db_path).with_suffix(".changes")
    spark.read.format("delta").load(table_path(lake, CHANGES)).select("commit_ts", "op", "after") \
        .orderBy("commit_ts").coalesce(1).write.mode("overwrite").json(str(src))
    files = sorted(src.glob("part-*.json"))
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE bench (id INTEGER PRIMARY KEY, k INTEGER NOT NULL, c TEXT, balance TEXT)")
    conn.commit()
    done = 0
    started = time.perf_counter()
    for f in files:
        with open(f) as fh:
            for line in fh:
                change = json.loads(line)
                row = json.loads(change["after"])
                bal = str(Decimal(row["balance"]))
                if change["op"] == "insert":
                    conn.execute("INSERT INTO bench (id, k, c, balance) VALUES (?, ?, ?, ?)",
                                 (row["id"], row["k"], row["c"], bal))
                else:
                    conn.execute("UPDATE bench SET k = ?, c = ?, balance = ? WHERE id = ?",
                                 (row["k"], row["c"], bal, row["id"]))
                done += 1
                if done % BATCH == 0:
                    conn.commit()
    conn.commit()
    elapsed = time.perf_counter() - started
    conn.close()
    shutil.rmtree(src, ignore_errors=True)
    return elapsed, done


class Counters:
    """Spark jobs run and bytes Spark read from local files (the lake), read before and
    after a restore."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def read(self) -> tuple[int, int]:
        jobs = self.spark.sparkContext.statusTracker().getJobIdsForGroup(None)
        jvm: Any = self.spark.sparkContext._jvm
        read = sum(int(st.getBytesRead()) for st in jvm.org.apache.hadoop.fs.FileSystem.getAllStatistics()
                   if st.getScheme() == "file")
        return (max(jobs) + 1 if jobs else 0), read


def _floor(kind: str, url_or_dir: str, tables: int, rows: list[dict[str, Any]]) -> float:
    """Seconds to create ``tables`` tables holding ``rows`` between them (already
    decoded): one transaction per table (a database) or one delta-rs write each."""
    from binlake.restore import direct, restore, synthetic

    per = max(1, len(rows) // tables)
    started = time.perf_counter()
    if kind == "delta":
        for i in range(tables):
            info = synthetic._table_info(i, tables)
            direct.write_delta(f"{url_or_dir}/floor_{i}", direct.arrow_table(info, rows[i * per:(i + 1) * per]))
        return time.perf_counter() - started
    target = restore.open_target(url_or_dir)
    try:
        started = time.perf_counter()
        for i in range(tables):
            info = synthetic._table_info(i, tables)
            restore.load_table(target, info, rows[i * per:(i + 1) * per])
        return time.perf_counter() - started
    finally:
        target.close()


def many_tables(args: argparse.Namespace) -> int:
    """``--tables A,B,...``: the same rows over each count of tables (see the module doc)."""
    import uuid

    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark
    from binlake.restore import restore, synthetic
    from binlake.stack.localdb import LocalPostgres

    counts = sorted({int(t) for t in str(args.tables).split(",") if t.strip()})
    rows = args.rows if args.rows != DEFAULT_ROWS else 20_000
    changes = args.changes if args.changes != DEFAULT_CHANGES else 2 * rows
    if not counts or counts[0] < 1 or counts[-1] > rows or changes < rows:
        from binlake import errors

        raise errors.InvalidArgument("--tables needs counts from 1 to --rows, comma-separated (e.g. 10,1000)")
    root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="restore-bench-", dir=pathlib.Path(__file__).parent))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    spark = build_spark("binlake-bench-restore", args.master, extra_conf=LAKE_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    counters = Counters(spark)
    pg = LocalPostgres(root / "pg").start()
    t0 = (1_800_000_000_000 << 18)
    results: dict[tuple[int, str], tuple[float, int, int, int]] = {}
    try:
        for i, n in enumerate([counts[0], *counts]):  # the first run warms the JVM, not recorded
            lake = str(root / f"lake-{n}")
            if not pathlib.Path(lake).exists():
                synthetic.build_lake(spark, lake, rows, changes, t0, tables=n)
            last = t0 + (changes - 1) * 4
            for kind in ("sqlite", "postgresql", "delta", "snapshot", "snapshot, proofs in Spark"):
                if kind.startswith("snapshot"):
                    jobs0, opens0 = counters.read()
                    took, n_rows = _snapshot(spark, lake, last, kind != "snapshot")
                    jobs1, opens1 = counters.read()
                    assert n_rows == rows, n_rows
                    if i > 0:
                        results[(n, kind)] = (took, jobs1 - jobs0, opens1 - opens0, n_rows)
                        print(f"{n:>6} tables  {kind:<10} {took:7.1f}s  {jobs1 - jobs0:>4} Spark jobs", flush=True)
                    continue
                if kind == "sqlite":
                    dest = {"target": f"sqlite:///{root / f'{uuid.uuid4().hex[:8]}.db'}"}
                elif kind == "postgresql":
                    dest = {"target": str(pg.create_database(f"r_{uuid.uuid4().hex[:10]}"))}
                else:
                    dest = {"out": str(root / f"out-{uuid.uuid4().hex[:8]}")}
                jobs0, opens0 = counters.read()
                s = time.perf_counter()
                # From the lake's start, whatever snapshot an earlier run took at the same ts.
                r = restore.run(spark, lake, last, parallelism=args.parallel, source="changes", **dest)
                took = time.perf_counter() - s
                jobs1, opens1 = counters.read()
                assert r.rows == rows and len(r.tables) == n, (r.rows, len(r.tables))
                if i > 0:
                    results[(n, kind)] = (took, jobs1 - jobs0, opens1 - opens0, r.rows)
                    print(f"{n:>6} tables  {kind:<10} {took:7.1f}s  {jobs1 - jobs0:>4} Spark jobs  "
                          f"{(opens1 - opens0) / 2**20:>7.2f} MiB read from the lake", flush=True)
        big, small = counts[-1], counts[0]
        sample = [{"id": k + 1, "k": k % 1000, "c": "x" * 60, "balance": Decimal("12.34")} for k in range(rows)]
        floors = {"sqlite": _floor("sqlite", f"sqlite:///{root / 'floor.db'}", big - small, sample),
                  "postgresql": _floor("postgresql", str(pg.create_database("floor")), big - small, sample),
                  "delta": _floor("delta", str(root / "floor-out"), big - small, sample)}
        print()
        print(f"`binlake bench restore --tables {args.tables} --rows {rows} --changes {changes}` "
              f"(parallelism {args.parallel})")
        print()
        print("| tables | into | seconds | Spark jobs | MiB read from the lake |")
        print("|---:|---|---:|---:|---:|")
        for (n, kind), (took, jobs, read, _r) in sorted(results.items()):
            print(f"| {n:,} | {kind} | {took:.1f} | {jobs} | {read / 2**20:.2f} |")
        print()
        print(f"| into | extra ms per table ({small:,} -> {big:,} tables) | floor ms per table | vs floor |")
        print("|---|---:|---:|---:|")
        for kind in ("sqlite", "postgresql", "delta", "snapshot", "snapshot, proofs in Spark"):
            extra = (results[(big, kind)][0] - results[(small, kind)][0]) / (big - small) * 1000
            floor = floors["delta" if kind.startswith("snapshot") else kind] / (big - small) * 1000
            print(f"| {kind} | {extra:.1f} | {floor:.1f} | {extra / floor:.1f}x |")
    finally:
        pg.stop()
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def _snapshot(spark: Any, lake: str, ts: int, in_spark: bool) -> tuple[float, int]:
    """Seconds and rows of a snapshot of every table at ``ts`` (it replaces one taken there
    before); ``in_spark``: every table's proof summed in Spark (none in this process)."""
    from binlake.restore import proven, snapshot

    kept = proven.driver_rows
    if in_spark:
        proven.driver_rows = lambda: -1  # type: ignore[assignment]  # no table is small enough
    try:
        s = time.perf_counter()
        r = snapshot.take(spark, lake, ts)
        return time.perf_counter() - s, r.rows
    finally:
        proven.driver_rows = kept  # type: ignore[assignment]


DEFAULT_ROWS = 1_000_000
DEFAULT_CHANGES = 5_000_000


def main(args: argparse.Namespace) -> int:
    from binlake import errors

    if getattr(args, "tables", None):
        return many_tables(args)
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark
    from binlake.restore import history, restore, snapshot, synthetic

    if args.rows < 1 or args.changes < args.rows:
        raise errors.InvalidArgument("--rows must be >= 1 and --changes >= --rows")
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from ingest_bench import PeakRSS

    root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="restore-bench-", dir=pathlib.Path(__file__).parent))
    root.mkdir(parents=True, exist_ok=True)
    s3_lake = getattr(args, "lake", None)
    store = None
    if s3_lake is not None:
        # The lake on S3 (restored tables still go to local --out directories).
        import os

        from binlake.lake.store import location
        from binlake.lake.store import s3 as lake_s3

        where = location.parse(s3_lake, "--lake")
        if getattr(args, "seaweedfs", False):
            from binlake.testing.s3server import LocalS3

            store = LocalS3(root / "seaweedfs", buckets=(str(where.bucket),)).start()
            os.environ.update(store.env())
        lake_s3.probe(s3_lake)
    spark = build_spark("binlake-bench-restore", args.master, extra_conf=LAKE_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        lake = f"{s3_lake.rstrip('/')}/restore-bench-{int(time.time())}" if s3_lake else str(root / "lake")
        t0 = (1_800_000_000_000 << 18)
        print(f"setup: {args.rows:,} rows, {args.changes:,} changes ...", flush=True)
        s = time.perf_counter()
        last = synthetic.build_lake(spark, lake, args.rows, args.changes, t0)
        snap_ts = t0 + int((args.changes - 1) * SNAPSHOT_AT) * 4
        snapshot.take(spark, lake, snap_ts)
        history.update(spark, lake)
        print(f"setup done in {time.perf_counter() - s:.0f}s (lake, snapshot at 90 %, history tables)", flush=True)
        results: list[tuple[str, float, int, Any]] = []
        for label, source in (("(a) whole history", "changes"), ("(b) snapshot + changes", "auto"),
                              ("(c) history tables", "history")):
            out = str(root / f"out-{source}")
            with PeakRSS() as peak:
                s = time.perf_counter()
                p = restore.plan(spark, lake, last, None, source)
                r = restore.write_out(spark, p, out, replace=True)
                took = time.perf_counter() - s
            print(f"{label:<24} {took:7.1f}s  {r.rows:,} rows  bases {[t.base.kind for t in p.tables]}", flush=True)
            assert r.rows == args.rows, (label, r.rows)
            results.append((label, took, r.rows, peak))
        if s3_lake:
            print()
            print(f"| case ({args.rows:,} rows, {args.changes:,} changes, lake {lake}) | seconds | rows/s | "
                  "peak RSS driver | peak RSS tree |")
            print("|---|---:|---:|---:|---:|")
            for label, took, rows, peak in results:
                print(f"| {label} | {took:.1f} | {rows / took:,.0f} | {_mib(peak.driver)} | {_mib(peak.tree)} |")
            return 0
        naive_s, naive_n = naive_replay(spark, lake, str(root / "naive.db"))
        print(f"{'naive SQLite replay':<24} {naive_s:7.1f}s  {naive_n:,} changes", flush=True)
        conn = sqlite3.connect(root / "naive.db")
        assert conn.execute("SELECT count(*) FROM bench").fetchone()[0] == args.rows
        conn.close()
        print()
        print(f"| case ({args.rows:,} rows, {args.changes:,} changes) | seconds | rows/s | vs naive | "
              "peak RSS driver | peak RSS tree |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, took, rows, peak in results:
            print(f"| {label} | {took:.1f} | {rows / took:,.0f} | {naive_s / took:.1f}x | {_mib(peak.driver)} | "
                  f"{_mib(peak.tree)} |")
        print(f"| naive row-by-row SQLite replay | {naive_s:.1f} | {naive_n / naive_s:,.0f} changes/s | 1.0x | "
              f"{_mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)} | - |")
    finally:
        if store is not None:
            store.stop()
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0
