"""The DAGs' S3 settings: the ``binlake_lake_s3`` aws Connection, and several ingest
runs at once on an S3 lake (their writes take turns through the lake's writer lease)."""

from __future__ import annotations

import pytest
from binlake_airflow import config

from binlake import errors


def test_an_aws_connection_gives_the_s3_settings() -> None:
    got = config.s3_from_connection("AK", "SK", {"endpoint_url": "http://s3:8333", "region_name": "eu-west-1"})
    assert got == {"access_key_id": "AK", "secret_access_key": "SK", "endpoint_url": "http://s3:8333",
                   "region": "eu-west-1"}
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


def test_the_connection_of_an_s3_lake_comes_first_and_stays_out_of_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An s3:// lake in a task: the binlake_lake_s3 Connection is a settings source of
    [lake.s3] above AWS_* and BINLAKE_LAKE_S3_*, for every reader of the settings in the
    task process; nothing is written into the process's environment."""
    import json
    import os

    from binlake import config as settings
    from binlake.lake import s3settings

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("BINLAKE_LAKE_S3_REGION", "eu-west-3")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_BINLAKE_LAKE_S3", json.dumps(
        {"conn_type": "aws", "login": "conn-key", "password": "conn-secret",
         "extra": {"endpoint_url": "http://s3:8333"}}))
    monkeypatch.setenv("BINLAKE_LAKE_DIR", "s3://lake/x")
    try:
        assert s3settings.s3_settings().access_key_id == "env-key"  # not yet: no task asked for the lake
        assert config.lake_dir() == "s3://lake/x"
        s = s3settings.s3_settings()
        assert (s.access_key_id, s.secret_access_key, s.endpoint_url, s.region) == (
            "conn-key", "conn-secret", "http://s3:8333", "eu-west-3")
        assert os.environ["AWS_ACCESS_KEY_ID"] == "env-key" and "AWS_ENDPOINT_URL" not in os.environ
        # A child process (a Spark server) gets what is in force here.
        assert s3settings.aws_env()["AWS_ACCESS_KEY_ID"] == "conn-key"
        monkeypatch.setenv("AIRFLOW_CONN_BINLAKE_LAKE_S3", json.dumps({"conn_type": "aws", "login": "k"}))
        with pytest.raises(errors.ConfigError, match="no password"):
            s3settings.s3_settings()
    finally:
        settings.reset()
