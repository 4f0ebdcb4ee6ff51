"""Concurrent Delta writers are recognised by Delta's typed conflict exceptions
(not by words in a message) and the ingest's idempotent writes are retried."""

from __future__ import annotations

import concurrent.futures
import pathlib

import pytest
from pyspark.sql import SparkSession

from binlake.lake import ingest


@pytest.mark.slow
def test_concurrent_first_writes_conflict_typed_and_are_retried(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "t")

    def write(i: int) -> None:
        df = spark.createDataFrame([(i, j) for j in range(20)], "k long, v long")
        df.write.format("delta").mode("overwrite").option("replaceWhere", f"k = {i}").save(path)

    # Two writers creating one table at once: Delta lets one win and the other
    # fail with a typed conflict (ProtocolChangedException), which the retry absorbs.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = [pool.submit(ingest._retry_concurrent, "t", lambda i=i: write(i), lambda: None) for i in range(2)]
        for f in done:
            f.result()
    rows = spark.read.format("delta").load(path).groupBy("k").count().orderBy("k").collect()
    assert [(r["k"], r["count"]) for r in rows] == [(0, 20), (1, 20)]

    # Anything else is no conflict: raised at once, not retried.
    calls = []

    def bad() -> None:
        calls.append(1)
        spark.sql("SELECT * FROM no_such_table_anywhere").collect()

    try:
        ingest._retry_concurrent("t", bad, lambda: None)
    except Exception as exc:
        assert not isinstance(exc, ingest.delta_conflicts())
    assert calls == [1]
