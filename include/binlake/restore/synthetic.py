"""A synthetic lake: one sysbench-like table and its history, written straight with Spark.

For the restore benchmark and the DAG tests, which measure or exercise what
happens *after* the ingest: ``build_lake`` writes ``changes``, ``ddl_history``
and ``windows`` in exactly the lake's format (canonical image JSON, one
transaction per change) without Pumps or an upstream database. ``rows``
inserts come first (keys 1..rows), then ``changes - rows`` updates of
pseudo-random keys (each changes ``k``, ``c`` and ``balance``); commit_ts
values are ``t0 + 4 * n``, and the ledger holds ``windows`` contiguous windows
ending just after the last change.
"""

from __future__ import annotations

from typing import Any

WINDOWS = 5


def _table_info() -> Any:
    from binlake.sql import schema
    from binlake.sql.schema import ColumnDef

    cols = [ColumnDef("id", "int", False), ColumnDef("k", "int", False), ColumnDef("c", "string", True, length=120),
            ColumnDef("balance", "decimal", True, precision=20, scale=2)]
    info = schema.new_table(1001, "main", "bench", cols, ["id"], None, 1)
    return info


def build_lake(spark: Any, lake: str, rows: int, changes: int, t0: int, windows: int = WINDOWS) -> int:
    """Write the synthetic lake; returns the last commit_ts."""
    import datetime as dt

    from pyspark.sql import functions as F

    from binlake.lake import decode
    from binlake.lake.ingest import CHANGES, DDL_HISTORY, WINDOWS_DDL, table_path

    info = _table_info()
    ddl = {"commit_ts": t0 - 2, "start_ts": t0 - 3, "schema_version": info.schema_version, "db": info.db,
           "tbl": info.name, "table_id": info.table_id, "previous_table_id": 0, "dropped": False,
           "query": "CREATE TABLE bench (...)", "table_info": info.SerializeToString(),
           "table_json": decode.table_json(info)}
    spark.createDataFrame([tuple(ddl[n] for n, _ in decode.DDL_COLUMNS)], decode.DDL_HISTORY_DDL) \
        .write.format("delta").mode("overwrite").save(table_path(lake, DDL_HISTORY))
    n = F.col("id")  # change number 0..changes-1
    # Inserts for 0..rows-1 (key = n + 1); updates pick a pseudo-random key.
    key = F.when(n < rows, n + 1).otherwise(F.pmod(F.xxhash64(n), F.lit(rows)) + 1)
    version = F.when(n < rows, F.lit(0)).otherwise(n)

    def image(v: Any) -> Any:
        # Canonical image JSON: names sorted, decimal as a string with its scale.
        bal = F.format_number((F.pmod(F.xxhash64(key, v), F.lit(10_000_000)) / 100).cast("decimal(20,2)"), 2)
        return F.concat(F.lit('{"balance":"'), F.regexp_replace(bal, ",", ""), F.lit('","c":"'),
                        F.lpad(F.conv(F.abs(F.xxhash64(v, key)).cast("string"), 10, 36), 60, "x"),
                        F.lit('","id":'), key.cast("string"), F.lit(',"k":'), F.pmod(v * 7, 1000).cast("string"),
                        F.lit("}"))

    prev = F.when(n < rows, F.lit(None)).otherwise(image(F.lit(-1)))
    commit = F.lit(t0) + n * 4
    df = (spark.range(changes, numPartitions=max(2, changes // 500_000))
          .select(commit.alias("commit_ts"), (commit - 1).alias("start_ts"), F.lit(0).alias("seq"),
                  F.to_date(F.timestamp_millis(F.shiftright(commit, 18))).alias("commit_date"),
                  F.lit("main").alias("db"), F.lit("bench").alias("tbl"), F.lit(info.table_id).cast("long").alias(
                      "table_id"),
                  F.when(n < rows, "insert").otherwise("update").alias("op"),
                  F.concat(F.lit('{"id":'), key.cast("string"), F.lit("}")).alias("keys"),
                  prev.alias("before"), image(version).alias("after"),
                  F.lit(info.schema_version).cast("long").alias("schema_version"), F.lit("bench").alias("pump")))
    df.write.format("delta").mode("overwrite").partitionBy("commit_date").save(table_path(lake, CHANGES))
    last = t0 + (changes - 1) * 4
    end = last + 1
    first = t0 - 3  # the first window holds the CREATE TABLE too
    bounds = [first + (end - first) * i // windows for i in range(windows + 1)]
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    ledger: list[tuple[Any, ...]] = [(a, b, ["bench"], {"bench": 0}, {}, 0, 0, 0, "done", now) for a, b in zip(bounds, bounds[1:],
                                                                                        strict=False)]
    spark.createDataFrame(ledger, WINDOWS_DDL).write.format("delta").mode("overwrite").save(
        table_path(lake, "windows"))
    return last
