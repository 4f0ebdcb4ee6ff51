"""Spark fixtures: one local Delta-enabled session shared by the whole test session.

Starting a JVM costs seconds, so every Spark test reuses the same session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from binlake.lake.spark import build_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Two cores and two shuffle partitions keep small test jobs fast while
    # still exercising more than one task per stage.
    session = build_spark(
        "binlake-tests",
        "local[2]",
        ui=False,
        shuffle_partitions=2,
        # Delta rebuilds a table's snapshot with 50 tasks by default, which
        # dominates the run time of tiny test tables (about 9 s vs 1.5 s a read).
        extra_conf={"spark.databricks.delta.snapshotPartitions": "2"},
    )
    yield session
    session.stop()
