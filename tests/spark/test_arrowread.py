"""The in-process reader of the lake (``binlake.lake.store.arrowread``) against Spark's
own read of the same Delta tables: the same rows for any ``commit_ts`` range
(across dates, appends and a window written again), and a clear refusal, never
a wrong answer, for a table that needs what a plain Parquet read does not do
(deletion vectors), after which the apply reads through Spark and still ends equal.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
from typing import Any

import pytest
from pyspark.sql import SparkSession

from binlake import tso
from binlake.lake import ingest
from binlake.lake.decoding import decode
from binlake.lake.store import arrowread, location

pytestmark = pytest.mark.timeout(600)

COLS = ("commit_ts", "seq", "table_id", "schema_version", "op", "before", "after")
DAY0 = dt.datetime(2026, 11, 20, 23, 59, 50, tzinfo=dt.UTC)  # the changes cross midnight


def _rows(first: int, n: int, tag: str) -> list[dict[str, Any]]:
    out = []
    for i in range(first, first + n):
        ts = tso.from_datetime(DAY0 + dt.timedelta(seconds=i))
        out.append({"commit_ts": ts, "start_ts": ts - 1, "seq": i % 3, "commit_date": decode.commit_date(ts),
                    "db": "main", "tbl": "t", "table_id": 7, "op": "insert",
                    "keys": json.dumps({"id": i}), "before": None,
                    "after": json.dumps({"id": i, "v": f"{tag}{i}"}), "schema_version": 1, "pump": "p1"})
    return out


def _write(spark: SparkSession, path: str, rows: list[dict[str, Any]], mode: str) -> None:
    (spark.createDataFrame(rows, decode.CHANGES_DDL).write.format("delta").mode(mode)
     .partitionBy("commit_date").save(path))


def _spark_read(spark: SparkSession, path: str, lo: int, hi: int) -> list[tuple[Any, ...]]:
    got = spark.read.format("delta").load(path).where(f"commit_ts >= {lo} AND commit_ts < {hi}").select(*COLS)
    return sorted(tuple(r) for r in got.collect())


def _arrow_read(reader: arrowread.TableReader, lo: int, hi: int) -> list[tuple[Any, ...]]:
    table = reader.read_changes(lo, hi, COLS, decode.commit_date(lo), decode.commit_date(hi - 1))
    return sorted(zip(*(table.column(c).to_pylist() for c in COLS), strict=True))


def test_ranges_equal_sparks_read(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    path = location.table_path(str(tmp_path / "lake"), location.CHANGES)
    _write(spark, path, _rows(0, 12, "a"), "overwrite")  # 23:59:50 .. 00:00:01: two partitions
    _write(spark, path, _rows(12, 8, "a"), "append")
    reader = arrowread.TableReader(path)
    ts = [tso.from_datetime(DAY0 + dt.timedelta(seconds=i)) for i in range(21)]
    for lo, hi in [(ts[0], ts[20]), (ts[3], ts[11]), (ts[10], ts[12]), (ts[11], ts[16]), (ts[19], ts[20]),
                   (ts[20], ts[20] + 5)]:
        want = _spark_read(spark, path, lo, hi)
        assert _arrow_read(reader, lo, hi) == want, (lo, hi)
    assert len(_arrow_read(reader, ts[0], ts[20])) == 20
    # A window written again (replaceWhere, as the ingest does) after the reader was
    # made: the reader sees the new version, never the old rows beside the new ones.
    (spark.createDataFrame(_rows(5, 5, "b"), decode.CHANGES_DDL).write.format("delta").mode("overwrite")
     .option("replaceWhere", f"commit_ts >= {ts[5]} AND commit_ts < {ts[10]}").save(path))
    got = _arrow_read(reader, ts[0], ts[20])
    assert got == _spark_read(spark, path, ts[0], ts[20])
    assert [json.loads(r[6])["v"] for r in got[5:10]] == [f"b{i}" for i in range(5, 10)]
    # More commits than Delta's checkpoint interval: the log is then read from a
    # Parquet checkpoint plus the JSON commits after it.
    for i in range(20, 32):
        _write(spark, path, _rows(i, 1, "c"), "append")
    assert list(pathlib.Path(path, "_delta_log").glob("*.checkpoint.parquet"))
    end = tso.from_datetime(DAY0 + dt.timedelta(seconds=40))
    assert _arrow_read(reader, ts[0], end) == _spark_read(spark, path, ts[0], end)
    assert len(_arrow_read(reader, ts[0], end)) == 32
    assert _arrow_read(arrowread.TableReader(path), ts[15], end) == _spark_read(spark, path, ts[15], end)
    # The maintenance DAG's OPTIMIZE: small files merged into files that span many windows.
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, path).optimize().executeCompaction()
    mid = tso.from_datetime(DAY0 + dt.timedelta(seconds=25))
    assert _arrow_read(reader, ts[3], mid) == _spark_read(spark, path, ts[3], mid)
    assert len(_arrow_read(reader, ts[0], end)) == 32
    schema = reader.read_changes(ts[0], ts[1], COLS, decode.commit_date(ts[0]), decode.commit_date(ts[0])).schema
    assert schema == spark.read.format("delta").load(path).select(*COLS).limit(0).toArrow().schema


def test_bad_input_and_what_it_cannot_read(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    assert arrowread.local_path("s3a://bucket/lake/changes") is None
    assert arrowread.local_path("file:///data/lake/changes") == "/data/lake/changes"
    assert arrowread.local_path("/data/lake/changes") == "/data/lake/changes"
    # S3 tables are read here too (tests/dags/test_s3_lake.py); other schemes go to Spark.
    with pytest.raises(arrowread.NotReadable, match="neither a local directory nor on S3"):
        arrowread.TableReader("hdfs://namenode/lake/changes")
    with pytest.raises(arrowread.NotReadable, match="no Delta table"):
        arrowread.TableReader(str(tmp_path / "nothing"))
    path = str(tmp_path / "dv")
    _write(spark, path, _rows(0, 6, "a"), "overwrite")
    reader = arrowread.TableReader(path)
    lo, hi = _rows(0, 1, "a")[0]["commit_ts"], _rows(6, 1, "a")[0]["commit_ts"]
    with pytest.raises(ValueError, match="empty range"):
        reader.read_changes(hi, lo, COLS, dt.date(2026, 11, 20), dt.date(2026, 11, 21))
    with pytest.raises(TypeError, match="integers"):
        reader.read_changes("1", hi, COLS, dt.date(2026, 11, 20), dt.date(2026, 11, 21))  # type: ignore[arg-type]
    # Deletion vectors: a row deleted through a vector is still in its Parquet file.
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE seq = 1")
    with pytest.raises(arrowread.NotReadable, match="(?i)deletion"):
        reader.read_changes(lo, hi, COLS, dt.date(2026, 11, 20), dt.date(2026, 11, 21))
    assert len(_spark_read(spark, path, lo, hi)) == 4


def test_apply_reads_through_spark_when_in_process_cannot(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    """A lake whose change table has deletion vectors: the apply says so in its log,
    reads through Spark, and the target holds exactly the rows the vectors left."""
    from binlake.replicate import runner, task
    from binlake.sql import schema as sc
    from binlake.sql.url import open_target

    lake = str(tmp_path / "lake")
    info = sc.new_table(7, "main", "t", [sc.ColumnDef("id", "int", False), sc.ColumnDef("v", "string")],
                        ["id"], None, 1)
    rows = _rows(0, 12, "a")
    create_ts = rows[0]["commit_ts"] - 10
    ddl = {"commit_ts": create_ts, "start_ts": create_ts - 1, "schema_version": 1, "db": "main", "tbl": "t",
           "table_id": 7, "previous_table_id": 0, "dropped": False, "query": "CREATE TABLE t (...)",
           "table_info": info.SerializeToString(), "table_json": decode.table_json(info)}
    spark.createDataFrame([ddl], decode.DDL_HISTORY_DDL).write.format("delta").save(
        location.table_path(lake, location.DDL_HISTORY))
    path = location.table_path(lake, location.CHANGES)
    _write(spark, path, rows, "overwrite")
    end = rows[-1]["commit_ts"] + 1
    spark.createDataFrame([(create_ts - 5, end, ["p1"], {"p1": 12}, {"main.t:insert": 12}, 12, 12, 1, "done",
                            dt.datetime(2026, 11, 21, 1, 0))], ingest.WINDOWS_DDL).write.format("delta").save(
        location.table_path(lake, location.WINDOWS))
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE seq = 1")  # 4 of the 12 inserts
    url = f"sqlite:///{tmp_path / 'target.db'}"
    applier = runner.Applier(spark, task.Task(name="dv", lake=lake, target=url, mode="consistent"))
    summary = applier.run()
    assert summary.changes == 8
    assert applier.reader._readers[location.CHANGES] is None  # it fell back to Spark
    assert applier.reader._readers[location.WINDOWS] is not None  # ... for that table only
    with open_target(url) as t, t.engine.connect() as c:
        ids = sorted(r[0] for r in c.exec_driver_sql("SELECT id FROM t"))
    assert ids == [i for i in range(12) if i % 3 != 1]
