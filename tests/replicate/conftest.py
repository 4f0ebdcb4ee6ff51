"""Replicate tests share the test run's one SparkSession (tests/spark/conftest.py
builds it the same way): a session already running is reused, not stopped here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from binlake.lake.spark import build_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    session = build_spark("binlake-tests", "local[2]", ui=False, shuffle_partitions=2,
                          extra_conf={"spark.databricks.delta.snapshotPartitions": "2"})
    yield session
    session.stop()
