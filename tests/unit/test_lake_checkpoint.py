"""The lake's consumer checkpoint: the end of its gap-free ledger, and its id."""

from __future__ import annotations

import pytest

from binlake.lake.pumps.checkpoint import CONSUMER_ID_ENV, consumer_id, contiguous_end


def w(start: int, end: int, status: str = "done") -> dict[str, object]:
    return {"start_ts": start, "end_ts": end, "status": status}


def test_contiguous_end_stops_at_the_first_gap() -> None:
    assert contiguous_end([]) is None
    assert contiguous_end([w(10, 20)]) == 20
    assert contiguous_end([w(20, 30), w(10, 20), w(30, 40)]) == 40
    # A gap (a window still to backfill) holds the checkpoint at the gap.
    assert contiguous_end([w(10, 20), w(30, 40)]) == 20
    # A window not done does not count.
    assert contiguous_end([w(10, 20), w(20, 30, "running"), w(30, 40)]) == 20


def test_consumer_id_names_the_lake(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv(CONSUMER_ID_ENV, raising=False)
    assert consumer_id("s3a://bucket/lake/") == "lake:s3a://bucket/lake"
    assert consumer_id("/data/lake") == "lake:/data/lake"
    assert consumer_id("/data/my lake").startswith("lake-")  # no whitespace in ids
    monkeypatch.setenv(CONSUMER_ID_ENV, "lake-eu")
    assert consumer_id("/data/lake") == "lake-eu"
