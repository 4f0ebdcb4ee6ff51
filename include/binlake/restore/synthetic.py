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

``shape="wide"`` gives one table of a realistic width instead (``WIDE_COLUMNS``:
fourteen columns of ints, decimals, a double, datetimes, a date, varchars and a
nullable text, about 300 bytes a typed row); an update then changes its mutable
columns (``qty``, ``status``, ``amount``, ``score``, ``updated_at``, ``note``).
``wide_final_rows`` gives the same table's typed rows after the last change, the
rows any restore at the last commit_ts must produce (the benchmarks' floors and
checks use it).
"""

from __future__ import annotations

from typing import Any

WINDOWS = 5
SHAPES = ("narrow", "wide")


FIRST_TABLE_ID = 1001


def table_name(index: int, tables: int) -> str:
    """The name of table ``index`` (0-based) of a lake of ``tables`` tables."""
    return "bench" if tables == 1 else f"bench_{index + 1:04d}"


def _table_info(index: int = 0, tables: int = 1, shape: str = "narrow") -> Any:
    from binlake.sql import schema
    from binlake.sql.schema import ColumnDef

    if shape == "wide":
        return schema.new_table(FIRST_TABLE_ID + index, "main", table_name(index, tables),
                                [ColumnDef(n, t, nullable, precision=e.get("precision"), scale=e.get("scale"),
                                           length=e.get("length")) for n, t, nullable, e in WIDE_COLUMNS],
                                ["id"], None, 1)
    cols = [ColumnDef("id", "int", False), ColumnDef("k", "int", False), ColumnDef("c", "string", True, length=120),
            ColumnDef("balance", "decimal", True, precision=20, scale=2)]
    info = schema.new_table(FIRST_TABLE_ID + index, "main", table_name(index, tables), cols, ["id"], None, 1)
    return info


# The wide shape: (name, type, nullable, ColumnDef extras), in table order.
WIDE_COLUMNS: tuple[tuple[str, str, bool, dict[str, int]], ...] = (
    ("id", "int", False, {}),
    ("account_id", "int", False, {}),  # an int-sized value
    ("ref_no", "int", False, {}),  # a bigint-sized value
    ("qty", "int", False, {}),
    ("status", "int", False, {}),
    ("name", "string", False, {"length": 64}),
    ("email", "string", False, {"length": 120}),
    ("city", "string", True, {"length": 40}),
    ("amount", "decimal", False, {"precision": 18, "scale": 4}),
    ("price", "decimal", True, {"precision": 12, "scale": 2}),
    ("score", "float", True, {}),
    ("created_at", "datetime", False, {}),
    ("updated_at", "datetime", False, {}),
    ("birth_date", "date", True, {}),
    ("note", "string", True, {}),  # a text column, null in one row of five
)
# Bytes a typed value of each fixed-width type takes (strings: their UTF-8 length).
TYPED_WIDTH = {"int": 8, "float": 8, "decimal": 16, "datetime": 8, "date": 4}


def build_lake(spark: Any, lake: str, rows: int, changes: int, t0: int, windows: int = WINDOWS,
               tables: int = 1, shape: str = "narrow") -> int:
    """Write the synthetic lake (one turn at the lake's writes); returns the last commit_ts."""
    if not isinstance(tables, int) or not 1 <= tables <= rows:
        raise ValueError(f"tables must be an integer from 1 to rows ({rows}), got {tables!r}")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    if shape == "wide" and tables != 1:
        raise ValueError("the wide shape is one table: tables must be 1")
    from binlake.lake.store import writelock

    with writelock.lake_writes(lake, what="synthetic lake", spark=spark):
        return _build_lake(spark, lake, rows, changes, t0, windows, tables, shape)


def _update_row(n: Any, rows: int) -> Any:
    """The row (0-based) that change number ``n`` >= ``rows`` updates."""
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(n), F.lit(rows))


def _wide_values(key: Any, v: Any) -> list[tuple[str, Any]]:
    """The wide table's typed columns of row ``key`` at version ``v`` (0: as inserted;
    the mutable columns follow ``v``), in ``WIDE_COLUMNS`` order."""
    from pyspark.sql import functions as F

    def h(*salt: Any) -> Any:
        return F.abs(F.xxhash64(key, *salt, F.lit(len(salt))))

    def text(seed: Any, width: int, pad: str) -> Any:
        return F.lpad(F.conv(seed.cast("string"), 10, 36), width, pad)

    created = F.lit(1_700_000_000_000_000) + key * 1_000_003
    note = F.concat(text(h(v, F.lit(8)), 13, "a"), F.lit(" "), text(h(v, F.lit(9)), 13, "b"), F.lit(" "),
                    F.repeat(text(h(v, F.lit(10)), 12, "c"), 8))
    return [
        ("id", key),
        ("account_id", F.pmod(h(F.lit(1)), F.lit(2_000_000_000))),
        ("ref_no", F.shiftright(h(F.lit(2)), 1)),
        ("qty", F.pmod(h(v, F.lit(3)), F.lit(1000))),
        ("status", F.pmod(v, F.lit(5)).cast("long")),
        ("name", text(h(F.lit(4)), 40, "n")),
        ("email", F.concat(text(h(F.lit(5)), 24, "e"), F.lit("@example.com"))),
        ("city", F.when(F.pmod(key, F.lit(50)) == 0, F.lit(None)).otherwise(text(h(F.lit(6)), 20, "c"))),
        ("amount", (F.pmod(h(v, F.lit(7)), F.lit(10**12)) / 10_000).cast("decimal(18,4)")),
        ("price", (F.pmod(h(F.lit(11)), F.lit(10**8)) / 100).cast("decimal(12,2)")),
        ("score", (F.pmod(h(v, F.lit(12)), F.lit(10**7)) / 1000).cast("double")),
        ("created_at", F.timestamp_micros(created).cast("timestamp_ntz")),
        ("updated_at", F.timestamp_micros(created + v * 1_000_000 + 7).cast("timestamp_ntz")),
        ("birth_date", F.date_add(F.lit("1950-01-01").cast("date"), F.pmod(h(F.lit(13)), F.lit(20_000)).cast("int"))),
        ("note", F.when(F.pmod(h(v, F.lit(14)), F.lit(5)) == 0, F.lit(None)).otherwise(note)),
    ]


def _wide_image(key: Any, v: Any) -> Any:
    """Canonical image JSON of the wide row ``key`` at version ``v``: names sorted,
    decimals as strings with their scale, datetimes ISO with microseconds."""
    from pyspark.sql import functions as F

    types = {n: t for n, t, _n, _e in WIDE_COLUMNS}
    fields = []
    for name, col in sorted(_wide_values(key, v), key=lambda nc: nc[0]):
        if types[name] == "decimal":
            col = col.cast("string")
        elif types[name] == "datetime":
            col = F.date_format(col, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS")
        elif types[name] == "date":
            col = F.date_format(col, "yyyy-MM-dd")
        fields.append(col.alias(name))
    return F.to_json(F.struct(*fields), {"ignoreNullFields": "false"})


def wide_final_rows(spark: Any, rows: int, changes: int) -> Any:
    """The wide lake's typed rows after its last change (what a restore at its last
    commit_ts gives), as a DataFrame of ``WIDE_COLUMNS``."""
    from pyspark.sql import functions as F

    keys = spark.range(rows).select((F.col("id") + 1).alias("key"))
    last = (spark.range(rows, changes).select((_update_row(F.col("id"), rows) + 1).alias("key"), F.col("id").alias("v"))
            .groupBy("key").agg(F.max("v").alias("v")))
    both = keys.join(last, "key", "left").select("key", F.coalesce("v", F.lit(0)).alias("v"))
    return both.select(*[col.alias(name) for name, col in _wide_values(F.col("key"), F.col("v"))])


def _build_lake(spark: Any, lake: str, rows: int, changes: int, t0: int, windows: int, tables: int,
                shape: str = "narrow") -> int:
    import datetime as dt

    from pyspark.sql import functions as F

    from binlake.lake.decoding import decode
    from binlake.lake.decoding.rows import WINDOWS_DDL
    from binlake.lake.store.location import CHANGES, DDL_HISTORY, table_path

    info = _table_info(0, tables, shape)
    ddls = []
    for i in range(tables):
        t = _table_info(i, tables, shape)
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
    row = F.when(n < rows, n).otherwise(_update_row(n, rows))
    key = F.floor(row / tables).cast("long") + 1
    tbl = F.pmod(row, F.lit(tables))
    name = (F.lit("bench") if tables == 1
            else F.concat(F.lit("bench_"), F.lpad((tbl + 1).cast("string"), 4, "0")))
    version = F.when(n < rows, F.lit(0)).otherwise(n)

    def image(v: Any) -> Any:
        if shape == "wide":
            return _wide_image(key, v)
        # Canonical image JSON: names sorted, decimal as a string with its scale.
        bal = F.format_number((F.pmod(F.xxhash64(key, v), F.lit(10_000_000)) / 100).cast("decimal(20,2)"), 2)
        return F.concat(F.lit('{"balance":"'), F.regexp_replace(bal, ",", ""), F.lit('","c":"'),
                        F.lpad(F.conv(F.abs(F.xxhash64(v, key)).cast("string"), 10, 36), 60, "x"),
                        F.lit('","id":'), key.cast("string"), F.lit(',"k":'), F.pmod(v * 7, 1000).cast("string"),
                        F.lit("}"))

    commit = F.lit(t0) + n * 4
    df = (spark.range(changes, numPartitions=max(2, changes // 500_000))
          .select(commit.alias("commit_ts"), (commit - 1).alias("start_ts"), F.lit(0).alias("seq"),
                  F.to_date(F.timestamp_millis(F.shiftright(commit, 18))).alias("commit_date"),
                  F.lit("main").alias("db"), name.alias("tbl"),
                  (F.lit(FIRST_TABLE_ID) + tbl).cast("long").alias("table_id"),
                  F.when(n < rows, "insert").otherwise("update").alias("op"),
                  F.concat(F.lit('{"id":'), key.cast("string"), F.lit("}")).alias("keys"),
                  image(version).alias("after"),
                  F.lit(info.schema_version).cast("long").alias("schema_version"), F.lit("bench").alias("pump")))
    # An update's before image is what its row held: the after image of the row's previous
    # change (the lake's images are whole rows; the proofs of snapshots sum on it).
    from pyspark.sql.window import Window

    df = df.withColumn("before", F.lag("after").over(Window.partitionBy("table_id", "keys").orderBy("commit_ts")))
    df = df.select(*[c for c, _t in decode.CHANGE_COLUMNS])
    df.write.format("delta").mode("overwrite").partitionBy("commit_date").save(table_path(lake, CHANGES))
    last = t0 + (changes - 1) * 4
    end = last + 1
    first = t0 - 3  # the first window holds the CREATE TABLE too
    bounds = [first + (end - first) * i // windows for i in range(windows + 1)]
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    if shape == "wide":
        # What each window holds, as the ingest counts it (the apply reads windows by their rows).
        def held(a: int, b: int) -> int:
            return max(0, min(changes, -(-(b - t0) // 4)) - max(0, -(-(a - t0) // 4)))

        ledger: list[tuple[Any, ...]] = [
            (a, b, ["bench"], {"bench": held(a, b)}, {f"main.{info.name}:x": held(a, b)}, held(a, b), held(a, b),
             1 if a <= t0 - 2 < b else 0, "done", now) for a, b in zip(bounds, bounds[1:], strict=False)]
    else:
        ledger = [(a, b, ["bench"], {"bench": 0}, {}, 0, 0, 0, "done", now)
                  for a, b in zip(bounds, bounds[1:], strict=False)]
    spark.createDataFrame(ledger, WINDOWS_DDL).write.format("delta").mode("overwrite").save(
        table_path(lake, "windows"))
    return last
