"""A synthetic lake: sysbench-like tables and their history, written straight with Spark.

For the restore benchmark and the DAG tests, which measure or exercise what
happens *after* the ingest: ``build_lake`` writes ``changes``, ``ddl_history``
and ``windows`` in exactly the lake's format (canonical image JSON, one
transaction per change) without Pumps or an upstream database. ``rows``
inserts come first (keys 1..rows), then ``changes - rows`` updates of
pseudo-random keys (each changes ``k``, ``c`` and ``balance``); commit_ts
values are ``t0 + 4 * n``, and the ledger holds ``windows`` contiguous windows
ending just after the last change. With ``tables`` > 1 the same rows are spread
over that many tables of the same shape (``bench_0001`` ...; row r of the lake is
key ``r // tables + 1`` of table ``r % tables``), for benchmarks of many tables.
"""

from __future__ import annotations

from typing import Any

WINDOWS = 5


FIRST_TABLE_ID = 1001


def table_name(index: int, tables: int) -> str:
    """The name of table ``index`` (0-based) of a lake of ``tables`` tables."""
    return "bench" if tables == 1 else f"bench_{index + 1:04d}"


def _table_info(index: int = 0, tables: int = 1, width: int = 60) -> Any:
    from binlake.sql import schema
    from binlake.sql.schema import ColumnDef

    cols = [ColumnDef("id", "int", False), ColumnDef("k", "int", False), ColumnDef("c", "string", True, length=max(120, width)),
            ColumnDef("balance", "decimal", True, precision=20, scale=2)]
    info = schema.new_table(FIRST_TABLE_ID + index, "main", table_name(index, tables), cols, ["id"], None, 1)
    return info


def build_lake(spark: Any, lake: str, rows: int, changes: int, t0: int, windows: int = WINDOWS,
               tables: int = 1, width: int = 60) -> int:
    """Write the synthetic lake (one turn at the lake's writes); returns the last commit_ts.
    ``width``: the characters of column ``c`` (wide rows with few of them: a lot of
    bytes quickly, for the memory tests)."""
    if not isinstance(tables, int) or not 1 <= tables <= rows:
        raise ValueError(f"tables must be an integer from 1 to rows ({rows}), got {tables!r}")
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= 65_000:
        raise ValueError(f"width must be an integer from 1 to 65000, got {width!r}")
    from binlake.lake.store import writelock

    with writelock.lake_writes(lake, what="synthetic lake", spark=spark):
        return _build_lake(spark, lake, rows, changes, t0, windows, tables, width)


def _build_lake(spark: Any, lake: str, rows: int, changes: int, t0: int, windows: int, tables: int,
                width: int) -> int:
    import datetime as dt

    from pyspark.sql import functions as F

    from binlake.lake.decoding import decode
    from binlake.lake.decoding.rows import WINDOWS_DDL
    from binlake.lake.store.location import CHANGES, DDL_HISTORY, table_path

    info = _table_info(0, tables, width)
    ddls = []
    for i in range(tables):
        t = _table_info(i, tables, width)
        ddl = {"commit_ts": t0 - 2, "start_ts": t0 - 3, "schema_version": t.schema_version, "db": t.db,
               "tbl": t.name, "table_id": t.table_id, "previous_table_id": 0, "dropped": False,
               "query": f"CREATE TABLE {t.name} (...)", "table_info": t.SerializeToString(),
               "table_json": decode.table_json(t)}
        ddls.append(tuple(ddl[n] for n, _ in decode.DDL_COLUMNS))
    spark.createDataFrame(ddls, decode.DDL_HISTORY_DDL) \
        .write.format("delta").mode("overwrite").save(table_path(lake, DDL_HISTORY))
    n = F.col("id")  # change number 0..changes-1
    # Inserts for rows 0..rows-1; updates pick a pseudo-random row. Row r is key
    # r // tables + 1 of table r % tables.
    row = F.when(n < rows, n).otherwise(F.pmod(F.xxhash64(n), F.lit(rows)))
    key = F.floor(row / tables).cast("long") + 1
    tbl = F.pmod(row, F.lit(tables))
    name = (F.lit("bench") if tables == 1
            else F.concat(F.lit("bench_"), F.lpad((tbl + 1).cast("string"), 4, "0")))
    version = F.when(n < rows, F.lit(0)).otherwise(n)

    def image(v: Any) -> Any:
        # Canonical image JSON: names sorted, decimal as a string with its scale.
        bal = F.format_number((F.pmod(F.xxhash64(key, v), F.lit(10_000_000)) / 100).cast("decimal(20,2)"), 2)
        return F.concat(F.lit('{"balance":"'), F.regexp_replace(bal, ",", ""), F.lit('","c":"'),
                        F.lpad(F.conv(F.abs(F.xxhash64(v, key)).cast("string"), 10, 36), width, "x"),
                        F.lit('","id":'), key.cast("string"), F.lit(',"k":'), F.pmod(v * 7, 1000).cast("string"),
                        F.lit("}"))

    prev = F.when(n < rows, F.lit(None)).otherwise(image(F.lit(-1)))
    commit = F.lit(t0) + n * 4
    df = (spark.range(changes, numPartitions=max(2, changes // 500_000))
          .select(commit.alias("commit_ts"), (commit - 1).alias("start_ts"), F.lit(0).alias("seq"),
                  F.to_date(F.timestamp_millis(F.shiftright(commit, 18))).alias("commit_date"),
                  F.lit("main").alias("db"), name.alias("tbl"),
                  (F.lit(FIRST_TABLE_ID) + tbl).cast("long").alias("table_id"),
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
    ledger: list[tuple[Any, ...]] = [(a, b, ["bench"], {"bench": 0}, {}, 0, 0, 0, "done", now)
                                     for a, b in zip(bounds, bounds[1:], strict=False)]
    spark.createDataFrame(ledger, WINDOWS_DDL).write.format("delta").mode("overwrite").save(
        table_path(lake, "windows"))
    return last
