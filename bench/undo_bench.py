"""``binlake bench undo``: row changes/s of ``binlake undo`` into PostgreSQL and MariaDB.

``bench apply``'s sysbench-like table (``apply_bench.generate``: 70 % inserts,
20 % updates, 10 % deletes, transactions of 10, real before images) receives
2N row changes, written into a lake as ten windows. Then, in one run, per
target (PostgreSQL, MariaDB), each into an empty database:

* ``binlake apply`` (consistent mode) of all 2N changes: the apply's rate;
* ``binlake undo`` of the last N (the range from the (N+1)th change's
  commit_ts to the lake's end): the target must then hold exactly the table
  after the first N changes (count and column sums checked).

The peer: the same 2N changes run as SQL on a MariaDB server with a row binlog
(binlog rotated after the first N), then ``mariadb-binlog --flashback`` of the
second binlog file piped into ``mariadb``, timed, and checked the same way.
Rates are row changes undone (or applied) per second.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from binlake.cli.benchmarks import bench_module


def _sql_value(v: Any) -> str:
    return str(v) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'"


def run_upstream(conn: Any, table: str, changes: list[Any], txn: int) -> None:
    """The changes as SQL statements, ``txn`` to a transaction (the peer's binlog)."""
    cur = conn.cursor()
    for i in range(0, len(changes), txn):
        for op, before, after in changes[i:i + txn]:
            if op == "insert":
                cols = ", ".join(after)
                cur.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join(_sql_value(v) for v in after.values())})")
            elif op == "update":
                cur.execute(f"UPDATE {table} SET k = {after['k']}, c = '{after['c']}' WHERE id = {after['id']}")
            else:
                cur.execute(f"DELETE FROM {table} WHERE id = {before['id']}")
        conn.commit()


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--changes", type=int, default=1_000_000)
        parser.add_argument("--master", default="local[2]")
        parser.add_argument("--dir", default=None)
        parser.add_argument("--keep", action="store_true")
        args = parser.parse_args()
    n = int(args.changes)
    apply_bench = bench_module("apply")
    txn = apply_bench.TXN
    if n < 1000 or n % txn:
        print(f"bench undo: --changes must be at least 1000 and a multiple of {txn}", file=sys.stderr)
        return 2
    import pymysql

    from binlake import tso
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark
    from binlake.replicate import runner, task
    from binlake.stack.localdb import LocalMariaDB, LocalPostgres
    from binlake.undo import revert, steps
    from binlake.undo.selection import Selection

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="undo-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # the PostgreSQL server runs as its own user and must enter it
    servers: list[Any] = []
    try:
        print(f"generating {2 * n:,} row changes ...", flush=True)
        changes, _final = apply_bench.generate(2 * n)
        _first, then = apply_bench.generate(n)
        spark = build_spark("binlake-bench-undo", args.master or "local[2]", shuffle_partitions=4,
                            extra_conf=LAKE_CONF)
        spark.sparkContext.setLogLevel("ERROR")
        lake = str(root / "lake")
        bounds, info, _counts = apply_bench.write_lake(spark, lake, changes, 10)
        # write_lake's clock: the table is created at base + 1, transaction j commits at
        # create + (1 + j) ms (in TSO units); the undo starts at the (N+1)th change's.
        create = tso.from_datetime(dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)) + 1
        start, end = create + (1 << 18) * (1 + n // txn), bounds[-1][1]
        pg = LocalPostgres(root / "pg")
        pg.start()
        servers.append(pg)
        maria = LocalMariaDB(root / "mariadb", binlog=True)
        maria.start()
        servers.append(maria)
        results: list[tuple[str, str, int, float]] = []
        for kind, server in (("postgresql", pg), ("mariadb", maria)):
            url = str(server.create_database(f"undo_{kind}"))
            began = time.perf_counter()
            summary = runner.Applier(spark, task.Task(name="bench", lake=lake, target=url, mode="consistent")).run()
            took = time.perf_counter() - began
            assert summary.changes == 2 * n, (summary.changes, 2 * n)
            results.append((kind, "binlake apply (consistent) of all the changes", 2 * n, took))
            print(f"  {kind:<10} apply {2 * n:,} changes {took:8.1f}s", flush=True)
            if not results[:-1]:
                # Warm the JVM for the undo's own jobs (a dry run writes nothing), as the apply's are.
                steps.run(spark, lake, Selection(start, end), url, revert.Options(dry_run=True))
            began = time.perf_counter()
            _p, result = steps.run(spark, lake, Selection(start, end), url, revert.Options())
            took = time.perf_counter() - began
            assert result.mode == "undone", result.summary()
            apply_bench._check_final(url, kind, then)
            results.append((kind, "binlake undo of the last half", n, took))
            print(f"  {kind:<10} undo  {n:,} changes {took:8.1f}s ({result.reverted:,} keys reverted)", flush=True)
        # The peer: the same changes through MariaDB's own row binlog, flashed back.
        conn = pymysql.connect(host="127.0.0.1", port=maria.port, user="root", password="", autocommit=False)
        cur = conn.cursor()
        cur.execute("CREATE DATABASE peer")
        cur.execute("USE peer")
        cur.execute(f"CREATE TABLE {apply_bench.TABLE} (id BIGINT PRIMARY KEY, k BIGINT, c VARCHAR(120), "
                    "pad VARCHAR(60)) ENGINE=InnoDB")
        print("running the changes on the MariaDB peer ...", flush=True)
        run_upstream(conn, apply_bench.TABLE, changes[:n], txn)
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW MASTER STATUS")
        second = str(cur.fetchone()[0])
        run_upstream(conn, apply_bench.TABLE, changes[n:], txn)
        cur.execute("FLUSH BINARY LOGS")
        conn.close()
        binlog = maria.data_dir / second
        began = time.perf_counter()
        dump = subprocess.Popen(["mariadb-binlog", "--flashback", "--database=peer", str(binlog)],
                                stdout=subprocess.PIPE)
        load = subprocess.run(["mariadb", "-h", "127.0.0.1", "-P", str(maria.port), "-u", "root", "peer"],
                              stdin=dump.stdout, capture_output=True, check=False)
        dump.wait()
        took = time.perf_counter() - began
        assert dump.returncode == 0 and load.returncode == 0, load.stderr.decode()[-2000:]
        apply_bench._check_final(maria.url_for("peer"), "mariadb", then)
        results.append(("mariadb", "mariadb-binlog --flashback \\| mariadb (peer)", n, took))
        print()
        print(f"binlake bench undo --changes {n}  ({2 * n:,} changes in the lake, the last {n:,} undone; "
              f"load average {os.getloadavg()[0]:.1f})")
        print()
        print("| target | case | row changes | seconds | row changes/s | undo's rate / this |")
        print("|---|---|---:|---:|---:|---:|")
        undo_rate = {k: c / t for k, case, c, t in results if case.startswith("binlake undo")}
        for kind, case, count, secs in results:
            rate = count / secs
            print(f"| {kind} | {case} | {count:,} | {secs:.1f} | {rate:,.0f} | {undo_rate[kind] / rate:.2f} |")
        return 0
    finally:
        for s in servers:
            s.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
