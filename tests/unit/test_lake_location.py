"""binlake.lake.store.location: the lake URI, table locations, and the S3 settings handed
to Spark (s3a) and delta-rs, from AWS_* / BINLAKE_LAKE_S3_* / [lake.s3]."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

from binlake import config, errors
from binlake.lake import s3settings
from binlake.lake.store import location


@pytest.fixture(autouse=True)
def _no_aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith(("AWS_", "BINLAKE_LAKE_S3_")):
            monkeypatch.delenv(key)
    config.reset()
    yield
    config.reset()  # the file a test chose is not the next one's


def test_parse_paths_and_s3_uris(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert location.parse("data/lake").base == str(tmp_path / "data" / "lake")
    assert location.parse(f"file://{tmp_path}/x/").base == f"{tmp_path}/x"
    lake = location.parse("s3://my-bucket/a//b/")
    assert (lake.is_s3, lake.bucket, lake.prefix, lake.base) == (True, "my-bucket", "a/b", "s3a://my-bucket/a/b")
    assert location.parse("s3a://my-bucket").base == "s3a://my-bucket"
    assert location.table_path("s3://my-bucket/p", "changes") == "s3a://my-bucket/p/changes"
    assert location.parse("hdfs://nn/lake").base == "hdfs://nn/lake"  # passed on to Spark as is


@pytest.mark.parametrize(("bad", "message"), [
    ("s3://", "names no bucket"), ("s3:///prefix", "names no bucket"), ("s3://Bad_Bucket/x", "not a valid bucket"),
    ("s3://bkt/a/../b", "'..'"), ("", "must be a directory"), ("  ", "must be a directory"),
])
def test_bad_lakes_are_one_clear_line(bad: str, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message) as exc:
        location.parse(bad)
    assert "\n" not in str(exc.value)


def test_catalog_paths_are_relative_and_resolve_under_the_current_lake() -> None:
    path = location.join("s3://bkt/old", "history", "t42")
    stored = location.relative("s3://bkt/old", path)
    assert stored == "history/t42"
    assert location.resolve("s3://bkt/new/place", stored) == "s3a://bkt/new/place/history/t42"
    assert location.resolve("/lake", "/elsewhere/history/t1") == "/elsewhere/history/t1"  # an older, absolute row
    with pytest.raises(ValueError, match="relative names"):
        location.join("/lake", "../x")


def test_settings_env_beats_config_file_and_reach_both_engines(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "binlake.toml"
    cfg.write_text('[lake.s3]\nendpoint_url = "http://10.0.0.5:8333"\nregion = "eu-west-3"\n'
                   'access_key_id = "from-file"\nsecret_access_key = "file-secret"\n')
    config.use_file(cfg)
    s = s3settings.s3_settings()
    assert (s.endpoint_url, s.region, s.access_key_id, s.allow_http) == (
        "http://10.0.0.5:8333", "eu-west-3", "from-file", True)
    assert "file-secret" not in repr(s)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    hadoop = s3settings.hadoop_conf()
    assert hadoop["fs.s3a.access.key"] == "from-env" and hadoop["fs.s3a.secret.key"] == "env-secret"
    assert hadoop["fs.s3a.endpoint"] == "http://10.0.0.5:8333" and hadoop["fs.s3a.path.style.access"] == "true"
    assert hadoop["fs.s3a.connection.ssl.enabled"] == "false"
    opts = s3settings.storage_options()
    assert opts["AWS_ENDPOINT_URL"] == "http://10.0.0.5:8333" and opts["AWS_ALLOW_HTTP"] == "true"
    assert opts["AWS_ACCESS_KEY_ID"] == "from-env" and opts["AWS_REGION"] == "eu-west-3"
    start = s3settings.spark_conf()
    assert start["spark.hadoop.fs.s3a.endpoint"] == "http://10.0.0.5:8333"
    # Start confs land on the JVM's command line: the keys go through its environment instead.
    assert not any("env-secret" in v or "from-env" in v for v in start.values())
    assert s3settings.aws_env()["AWS_SECRET_ACCESS_KEY"] == "env-secret"


def test_bad_s3_settings_name_the_key(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "binlake.toml"
    cfg.write_text('[lake.s3]\nendpoint_url = "10.0.0.5:8333"\n')
    config.use_file(cfg)
    with pytest.raises(errors.InvalidArgument, match=r"\[lake.s3\] endpoint_url.*not an http"):
        s3settings.s3_settings()
    cfg.write_text('[lake.s3]\nbucket = "x"\n')
    with pytest.raises(errors.InvalidArgument, match="unknown key"):
        s3settings.s3_settings()


def test_without_s3_settings_spark_uses_the_sdk_chain() -> None:
    conf = s3settings.hadoop_conf()
    assert "fs.s3a.access.key" not in conf and "fs.s3a.endpoint" not in conf
    assert "AWS_ACCESS_KEY_ID" not in s3settings.storage_options()
