"""Restores, snapshots and history tables of a table larger than the memory they are given.

One synthetic table whose decoded rows take more than three times the Spark
driver's heap (wide rows, so the run stays quick), rebuilt by a subprocess whose
driver JVM has 512 MiB (``[memory] driver``, the smallest heap Spark runs
with) and whose other bounds are the defaults: a restore to a local ``--out``
and one to S3, into SQLite, PostgreSQL and MariaDB, a snapshot and the history
tables. Each result is compared row by row with the expected table, computed
here by plain Spark SQL over the change table (not by binlake's rebuild); the
database targets are compared with SQLite's copy by ``binlake diff``, and
SQLite's with the expected rows by a merge of both sorted streams. The
subprocess's own peak RSS must stay a fraction of the decoded size: the
restore's memory is bounded by its settings, not by the table.
"""

from __future__ import annotations

import decimal
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from dbfixtures import mariadb_server, new_target_url, postgres_server  # noqa: F401
from pyspark.sql import SparkSession

from binlake.lake.store import location
from binlake.restore import history, layout, restore, synthetic
from binlake.sql.diff import diff_databases
from binlake.testing import s3server

ROWS = 380_000
UPDATES = 40_000
WIDTH = 4_000
T0 = 400_000_000_000_000_000
HEAP_MB = 512
TABLE_ID = synthetic.FIRST_TABLE_ID

# What the subprocess runs: every rebuild of the big table, in one driver JVM of
# HEAP_MB. It prints one JSON line: its peak RSS and the JVM's heap.
JOB = textwrap.dedent("""
    import json, resource, sys
    from binlake.lake.sparkenv import session
    from binlake.restore import history, restore, snapshot
    lake, ts, mid, out, s3out, sqlite, pg, maria = sys.argv[1:9]
    spark = session.command_session()
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    say = lambda m: print(m, file=sys.stderr, flush=True)
    restore.run(spark, lake, int(ts), out=out, progress=say)
    restore.run(spark, lake, int(ts), target=sqlite, progress=say)
    snapshot.take(spark, lake, int(mid), progress=say)
    history.update(spark, lake, progress=say)
    # From the snapshot at mid plus the changes after it: the aggregating rebuild.
    restore.run(spark, lake, int(ts), target=pg, progress=say)
    restore.run(spark, lake, int(ts), target=maria, progress=say)
    if s3out != "-":
        restore.run(spark, lake, int(ts), out=s3out, progress=say)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_rss": peak, "heap": heap}))
""")


def _expected(spark: SparkSession, lake: str, ts: int) -> Any:
    """The table at ``ts``: each key's last image, typed, by plain Spark SQL."""
    from pyspark.sql import functions as F

    changes = spark.read.format("delta").load(location.table_path(lake, location.CHANGES))
    last = (changes.where(F.col("commit_ts") <= ts).groupBy("keys")
            .agg(F.max_by("after", "commit_ts").alias("after")))
    doc = F.from_json("after", "id long, k long, c string, balance string")
    return last.select(doc.alias("d")).select(
        F.col("d.id").alias("id"), F.col("d.k").alias("k"), F.col("d.c").alias("c"),
        F.col("d.balance").cast("decimal(20,2)").alias("balance"))


def _same(expected: Any, got: Any) -> None:
    """Row-by-row equality of two frames (Spark: a multiset difference both ways)."""
    cols = ["id", "k", "c", "balance"]
    typed = got.select(got["id"].cast("long").alias("id"), got["k"].cast("long").alias("k"), got["c"],
                       got["balance"].cast("decimal(20,2)").alias("balance"))
    assert typed.count() == expected.count()
    assert expected.select(*cols).exceptAll(typed.select(*cols)).count() == 0
    assert typed.select(*cols).exceptAll(expected.select(*cols)).count() == 0


def _sorted_rows(expected: Any) -> Iterator[tuple[Any, ...]]:
    for r in expected.repartitionByRange(32, "id").sortWithinPartitions("id").toLocalIterator():
        yield (int(r["id"]), int(r["k"]), r["c"], decimal.Decimal(r["balance"]))


def _database_rows(url: str) -> Iterator[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            result = conn.execution_options(stream_results=True).exec_driver_sql(
                "SELECT id, k, c, balance FROM bench ORDER BY id")
            for r in result:
                yield (int(r[0]), int(r[1]), r[2], decimal.Decimal(str(r[3])))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.LocalS3]:
    from binlake.lake.sparkenv.session import jars_dir

    if not s3server.available() or not any(jars_dir().glob("hadoop-aws-*.jar")):
        pytest.fail("no S3 server or no hadoop-aws jar: run `make setup`")
    server = s3server.LocalS3(tmp_path_factory.mktemp("s3"), buckets=("out",)).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_table_three_times_the_heap_restores_snapshots_and_historizes_equal(
        spark: SparkSession, tmp_path: pathlib.Path, request: pytest.FixtureRequest,
        s3: s3server.LocalS3) -> None:
    lake = str(tmp_path / "lake")
    last = synthetic.build_lake(spark, lake, ROWS, ROWS + UPDATES, T0, width=WIDTH)
    mid = T0 + (ROWS - 1) * 4  # the last insert: the snapshot holds every key, the updates come after
    # The rows the old one-table-at-a-time path held in the task process, as Python objects.
    sample = {"id": 1, "k": 7, "c": "x" * WIDTH, "balance": decimal.Decimal("12345.67")}
    decoded = ROWS * (sys.getsizeof(sample) + sum(sys.getsizeof(v) for v in sample.values()))
    assert decoded >= 3 * HEAP_MB * 2**20, decoded

    out = tmp_path / "out"
    sqlite = new_target_url("sqlite", request, tmp_path, "big")
    pg = new_target_url("postgresql", request, tmp_path, "big")
    maria = new_target_url("mariadb", request, tmp_path, "big")
    env = {**os.environ, **s3.env(), "BINLAKE_MEMORY_DRIVER": f"{HEAP_MB}m"}
    run = subprocess.run([sys.executable, "-c", JOB, lake, str(last), str(mid), str(out), "s3a://out/restored",
                          sqlite, pg, maria], capture_output=True, text=True, env=env, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["heap"] <= (HEAP_MB + 64) * 2**20, figures  # the setting reached the JVM
    # The Python process holds batches, not the table.
    assert figures["peak_rss"] < decoded / 3, (figures, decoded)

    expected = _expected(spark, lake, last)
    _same(expected, spark.read.format("delta").load(str(out / "main.bench")))
    _same(_expected(spark, lake, mid), spark.read.format("delta").load(layout.snapshot_table(lake, mid, TABLE_ID)))
    _same(expected, history.at(spark, lake, TABLE_ID, last))

    # SQLite against the expected rows, streamed side by side in key order.
    n = 0
    for want, got in zip(_sorted_rows(expected), _database_rows(sqlite), strict=True):
        assert want == got, (want[:2], got[:2])
        n += 1
    assert n == ROWS
    for url in (pg, maria):
        report = diff_databases(sqlite, url)
        assert report.ok, report.summary()

    for key, value in s3.env().items():
        os.environ[key] = value
    try:
        from binlake.lake.sparkenv.session import configure_spark

        configure_spark(spark)
        _same(expected, spark.read.format("delta").load("s3a://out/restored/main.bench"))
    finally:
        for key in s3.env():
            os.environ.pop(key, None)
        configure_spark(spark)
    assert (out / restore.MANIFEST).exists()  # the local out's completion marker, written last
