"""``bench snapshot`` bookkeeping, without servers: the load's split of the rows,
what ``binlake ctl dump`` lines tell it (the snapshot at the Pumps, the follow-up,
the markers), the upstream's rate, the windows' phases and the PASS/MISS targets."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from binlake import tso
from binlake.cli import benchmarks


@pytest.fixture
def snap(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sys, "path", list(sys.path))
    return benchmarks.bench_module("snapshot")


def test_the_rows_are_split_over_the_tables_and_loaded_in_chunks(snap: Any) -> None:
    parts = snap.split_rows(10, 3)
    assert parts == [(1, 4), (5, 7), (8, 10)]
    assert sum(b - a + 1 for a, b in snap.split_rows(1_000_003, 20)) == 1_000_003
    assert list(snap.load_chunks(1, 250_000)) == [(1, 100_000), (100_001, 200_000), (200_001, 250_000)]
    assert snap.table_names(3) == ["t00", "t01", "t02"]


def _ddl(table_id: int, name: str) -> dict[str, Any]:
    return {"commit_ts": 1, "ddl_query": "CREATE TABLE", "ddl_table": {"tableId": str(table_id), "name": name}}


def _txn(ts: int, table_id: int, inserts: int = 0, updates: int = 0, deletes: int = 0) -> dict[str, Any]:
    return {"commit_ts": ts, "mutations": [{"table_id": table_id, "inserts": inserts, "updates": updates,
                                            "deletes": deletes}]}


def test_the_snapshot_has_ended_when_its_rows_and_a_follow_up_transaction_are_at_the_pumps(snap: Any) -> None:
    view = snap.PumpView(rows_wanted=30)
    for line in (_ddl(1, "t00"), _ddl(2, "t01"), _ddl(3, "wk"), _ddl(4, "w"),
                 _txn(10, 3, inserts=1000),  # wk's own rows in the snapshot: not the follow-up
                 _txn(11, 4, inserts=1, updates=1),  # the other writer's workload
                 _txn(12, 1, inserts=20)):
        view.feed(line)
    assert view.snapshot_rows == 20 and not view.snapshot_done_ts
    view.feed(_txn(13, 2, inserts=10))
    assert view.rows_done_ts == 13 and not view.snapshot_done_ts  # rows all there, no follow-up yet
    view.feed(_txn(15, 3, inserts=1, updates=1))
    assert view.snapshot_done_ts == 15
    view.feed(_txn(20, 3, deletes=1))
    assert not view.marker_ts  # one marker of two
    view.feed(_txn(18, 4, deletes=1))
    assert view.marker_ts == 20


def test_rates_and_window_phases(snap: Any) -> None:
    commits = [100.0 + i / 10 for i in range(100)]  # 10/s over [100, 110)
    assert snap.rate_between(commits, 100, 110) == pytest.approx(10)
    assert snap.rate_between(commits, 105, 120) == pytest.approx(50 / 15)
    assert snap.rate_between(commits, 5, 5) == 0.0
    w = snap.IngestWindow(tso.compose(100_000), tso.compose(110_000), 110.0, done_wall=125.0)
    assert w.freshness_s == 15.0
    assert snap.overlaps(w, 109, 200) and snap.overlaps(w, 50, 101) and not snap.overlaps(w, 110, 200)


def test_targets_pass_and_miss(snap: Any) -> None:
    stage = snap.Stage
    r = snap.DbResult("mariadb", 1000, 0, [
        stage("floor: mariadb-dump --single-transaction", 1.0, 1000),
        stage("snapshot -> 2 Pumps", 3.0, 1000, rss={"source": 100 << 20, "pump1": 600 << 20}),
    ], rate_alone=200, rate_snapshot=170, fresh_alone=10, fresh_snapshot=30, diff_ok=True)
    got = {name: ok for name, _measured, ok in snap.targets(r)}
    assert got == {"snapshot rows/s >= 0.5 x the dump's": False, "freshness during the snapshot <= 2 x after it": False,
                   "upstream txn/s during the snapshot >= 0.8 x alone": True, "peak RSS source <= 512 MiB": True,
                   "peak RSS pump1 <= 512 MiB": False, "restore at T equals the upstream (binlake diff)": True}
    assert "| snapshot -> 2 Pumps | 3.0 | 333 |" in "\n".join(snap.stage_table(r))
