"""Smoke test: build_spark gives a session that reads and writes Delta from local jars."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from binlake.lake.sparkenv import session as lake_spark

ROWS = [(1, "a", 10), (2, "b", 10), (3, "c", 20)]
COLUMNS = ["id", "name", "part"]


def test_delta_roundtrip_and_replace_where(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "smoke")
    spark.createDataFrame(ROWS, COLUMNS).write.format("delta").partitionBy("part").save(path)

    back = spark.read.format("delta").load(path)
    assert sorted(tuple(r) for r in back.select(*COLUMNS).collect()) == sorted(ROWS)

    # Re-writing one partition's range is how an ingest window is made idempotent.
    replacement = spark.createDataFrame([(4, "d", 20)], COLUMNS)
    replacement.write.format("delta").mode("overwrite").option("replaceWhere", "part = 20").save(path)

    after = spark.read.format("delta").load(path)
    assert sorted(tuple(r) for r in after.select(*COLUMNS).collect()) == [
        (1, "a", 10),
        (2, "b", 10),
        (4, "d", 20),
    ]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version").collect()
    assert sorted(r.version for r in history) == [0, 1]


def test_session_uses_local_jars_only(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    jars = conf.get("spark.jars", "") or ""
    assert any(Path(j).name.startswith("delta-spark_") for j in jars.split(",")), jars
    assert not conf.contains("spark.jars.packages")
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_missing_jars_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lake_spark.JARS_DIR_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match="make setup"):
        lake_spark.build_spark(master="local[1]")


def test_downloading_confs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"spark\.jars\.packages"):
        lake_spark.build_spark(extra_conf={"spark.jars.packages": "io.delta:delta-spark_2.13:4.0.1"})
