"""The DAGs' S3 settings: the ``binlake_lake_s3`` aws Connection, and several ingest
runs at once on an S3 lake (their writes take turns through the lake's writer lease)."""

from __future__ import annotations

import pytest
from binlake_airflow import config

from binlake import errors


def test_an_aws_connection_gives_the_aws_variables() -> None:
    got = config.s3_from_connection("AK", "SK", {"endpoint_url": "http://s3:8333", "region_name": "eu-west-1"})
    assert got == {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_ENDPOINT_URL": "http://s3:8333",
                   "AWS_REGION": "eu-west-1"}
    assert config.s3_from_connection(None, None, {}) == {}  # the SDK's own chain (IAM role)
    with pytest.raises(errors.ConfigError, match="no password"):
        config.s3_from_connection("AK", "", {})
    with pytest.raises(errors.ConfigError, match="not an http"):
        config.s3_from_connection("AK", "SK", {"endpoint_url": "s3:8333"})


def test_an_s3_lake_allows_several_ingest_runs_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Their writes take turns through the lake's writer lease (tests/dags/test_s3_lake.py).
    monkeypatch.delenv(config.MAX_ACTIVE_RUNS_ENV, raising=False)
    monkeypatch.delenv("BINLAKE_SPARK_REMOTE", raising=False)
    monkeypatch.setenv("BINLAKE_LAKE_DIR", "s3://lake/x")
    assert config.ingest_max_active_runs() == config.DEFAULT_MAX_ACTIVE_RUNS
