"""A restore on a Spark standalone cluster that loses a worker (kill -9 of the worker and
its executor) while it loads a PostgreSQL target.

The promise: the restore either ends equal to the lake, or fails with one line (no
traceback) naming the run to finish, and leaves only whole tables, each claimed by its
run; the same command with ``--run-id`` then finishes it and the target equals the lake.
The tables take the executors' path (``[memory] direct_rows`` set low) in several bounded
partitions, and the worker is killed once the restore reads the lake with an executor on
each worker, so the kill lands while the executors hold the data.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa
from dbfixtures import new_target_url, postgres_server  # noqa: F401
from pyspark.sql import SparkSession
from test_any_size import _ROW_SQL

from binlake.restore import synthetic
from binlake.restore.claims import CLAIMS_TABLE

ROWS = 30_000
TABLES = 3
T0 = 410_000_000_000_000_000


def _fingerprints_spark(spark: SparkSession, lake: str, ts: int) -> dict[str, tuple[int, int]]:
    """table -> (rows, sum of the first 32 bits of each row text's MD5), by plain Spark SQL."""
    from pyspark.sql import functions as F

    from binlake.lake.store import location

    changes = spark.read.format("delta").load(location.table_path(lake, location.CHANGES))
    last = (changes.where(F.col("commit_ts") <= ts).groupBy("tbl", "keys")
            .agg(F.max_by("after", "commit_ts").alias("after")))
    doc = F.from_json("after", "id long, k long, c string, balance string")
    typed = last.select("tbl", doc.alias("d")).selectExpr(
        "tbl", "d.id", "d.k", "d.c", "cast(d.balance as decimal(20,2)) balance")
    rows = typed.selectExpr("tbl", f"conv(substr(md5({_ROW_SQL['spark']}), 1, 8), 16, 10) h").groupBy("tbl").agg(
        F.count("*").alias("n"), F.sum(F.col("h").cast("bigint")).alias("s")).collect()
    return {r["tbl"]: (int(r["n"]), int(r["s"] or 0)) for r in rows}


def _fingerprints_pg(url: str) -> dict[str, tuple[int, int]]:
    """The same per table in the target, for every restored table it holds."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            names = [n for n in sa.inspect(conn).get_table_names() if n.startswith("bench")]
            out = {}
            for name in names:
                n, s = conn.exec_driver_sql(
                    f"SELECT count(*), sum(('x' || substr(md5({_ROW_SQL['postgresql']}), 1, 8))::bit(32)::bigint) "
                    f"FROM {name}").one()
                out[name] = (int(n), int(s or 0))
            return out
    finally:
        engine.dispose()


def _claimed(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if CLAIMS_TABLE not in sa.inspect(conn).get_table_names():
                return set()
            return {str(r[0]) for r in conn.exec_driver_sql(f"SELECT name FROM {CLAIMS_TABLE}")}
    finally:
        engine.dispose()


@pytest.mark.big  # a standalone cluster and a restore on it: `make test-big`, beside the other 36 proofs
@pytest.mark.timeout(900)
def test_a_worker_killed_mid_restore_leaves_whole_tables_and_the_rerun_equals_the_lake(
        spark: SparkSession, tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> None:
    from binlake.stack.sparkcluster import SparkCluster

    lake = str(tmp_path / "lake")
    last = synthetic.build_lake(spark, lake, ROWS, ROWS + ROWS // 2, T0, tables=TABLES)
    expected = _fingerprints_spark(spark, lake, last)
    assert len(expected) == TABLES
    pg = new_target_url("postgresql", request, tmp_path, "lost")
    env = {**os.environ, "BINLAKE_MEMORY_DIRECT_ROWS": "1000", "BINLAKE_MEMORY_PARTITION_ROWS": "4000",
           "BINLAKE_MEMORY_BATCH_ROWS": "1000", "BINLAKE_MEMORY_EXECUTOR": "768m"}
    cmd = [sys.executable, "-m", "binlake.cli", "restore", "--lake", lake, "--ts", str(last), "--target", pg]
    with SparkCluster(tmp_path / "spark", workers=2, cores=1, memory="1g") as sc:
        proc = subprocess.Popen([*cmd, "--master", sc.master_url], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        out: list[str] = []
        killed = threading.Event()

        def kill_when_loading() -> None:
            # Once the restore reads the lake, with an executor on each worker, lose
            # one worker and its executor (a moment later: its tasks have started).
            while not killed.is_set() and proc.poll() is None:
                status = sc._status() or {}
                busy = [w for w in status.get("workers", []) if w.get("coresused")]
                if len(busy) == 2 and any("reading the lake once" in line for line in out):
                    time.sleep(2.0)
                    sc.kill_worker(1)
                    killed.set()
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=kill_when_loading, daemon=True)
        watcher.start()
        for line in proc.stdout:
            out.append(line)
        proc.wait(timeout=600)
        watcher.join(timeout=5)
        text = "".join(out)
        if os.environ.get("BINLAKE_TEST_KEEP_LOG"):
            pathlib.Path(os.environ["BINLAKE_TEST_KEEP_LOG"]).write_text(text)
        assert killed.is_set(), f"the restore ended before a worker could be killed:\n{text[-3000:]}"
        assert "Traceback" not in text, text[-4000:]
        have = _fingerprints_pg(pg)
        # Whatever the outcome, every table in the target is whole and claimed by the run.
        for name, figures in have.items():
            assert figures == expected[name], (name, figures, expected[name])
        assert set(have) <= _claimed(pg)
        if proc.returncode != 0:
            assert proc.returncode in (1, 2), text[-3000:]
            last_line = [ln for ln in text.splitlines() if ln.strip()][-1]
            assert last_line.startswith(("binlake restore:", "error:", "binlake:")), text[-3000:]
            run_id = re.search(r"--run-id (\S+)", text)
            assert run_id, text[-3000:]
            rerun = subprocess.run([*cmd, "--master", sc.master_url, "--run-id", run_id.group(1)],
                                   capture_output=True, text=True, env=env, timeout=600)
            assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert _fingerprints_pg(pg) == expected
