"""The lake's staging directory: where it is, what counts as a leftover, what the sweep removes."""

from __future__ import annotations

import os
import pathlib
import time

import pytest

from binlake.lake.store import staging


def test_only_a_local_lake_stages(tmp_path: pathlib.Path) -> None:
    assert staging.staging_dir(str(tmp_path)) == str(tmp_path / staging.STAGING_DIR)
    assert staging.staging_dir(f"file:{tmp_path}") == str(tmp_path / staging.STAGING_DIR)
    assert staging.staging_dir("s3://bucket/lake") is None
    assert staging.left_over("s3://bucket/lake") == []
    with pytest.raises(ValueError, match="lake must be"):
        staging.staging_dir(" ")


def test_leftovers_and_the_sweep(tmp_path: pathlib.Path) -> None:
    lake = str(tmp_path)
    assert staging.left_over(lake) == []  # no directory yet
    where = tmp_path / staging.STAGING_DIR
    where.mkdir()
    old, new = where / "changes-1-2--a.parquet", where / "changes-2-3--b.parquet"
    for f in (old, new):
        f.write_bytes(b"x")
    hour_ago = time.time() - staging.STALE_S - 5
    os.utime(old, (hour_ago, hour_ago))
    assert staging.left_over(lake) == [str(old), str(new)]
    # Only files older than STALE_S go: a younger one may still be read by its write.
    assert staging.sweep(str(where)) == [old.name]
    assert staging.left_over(lake) == [str(new)]
    staging.remove([str(new), str(new)])  # a file removed meanwhile is no error
    assert staging.left_over(lake) == []
