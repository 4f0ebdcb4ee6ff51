"""Parallel mode's Arrow buckets (a table whose only unique key is its primary
key: its final changes dealt into buckets by key, one worker thread and one
checkpoint row per bucket) into PostgreSQL and SQLite: the target ends equal to
the changes' final rows; workers failing after their buckets committed, then a
rerun, apply every bucket exactly once; the same windows again change
nothing. Also the consistent mode over the same lake, read in process.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import random
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from dbfixtures import new_target_url, postgres_server  # noqa: F401
from pyspark.sql import SparkSession

from binlake import failpoint, tso
from binlake.lake import ingest
from binlake.lake.decoding import decode
from binlake.lake.store import location
from binlake.replicate import checkpoint, parallel, runner, table_write, task
from binlake.sql import schema as sc
from binlake.sql import targets
from binlake.sql.url import open_target

pytestmark = pytest.mark.timeout(900)

TXN = 5
WINDOWS = 3


def _image(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """3,000 row changes (inserts, updates, deletes, over keys that come and go)
    of one table ``kv`` (id primary key, v, n) in three windows, as the ingest
    writes them (one Delta commit per window), and the final rows."""
    rng = random.Random(11)
    live: dict[int, dict[str, Any]] = {}
    changes: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    for i in range(3000):
        r = rng.random()
        if r < 0.6 or len(live) < 20:
            row = {"id": i, "v": rng.choice(["", "a,b", 'q"uote', "x" * rng.randrange(40), None]), "n": i % 97}
            live[i] = row
            changes.append(("insert", None, row))
        else:
            key = rng.choice(list(live))
            if r < 0.85:
                after = dict(live[key], v=f"u{i}", n=None if i % 5 == 0 else i)
                changes.append(("update", live[key], after))
                live[key] = after
            else:
                changes.append(("delete", live.pop(key), None))
    path = str(tmp_path_factory.mktemp("lake"))
    info = sc.new_table(21, "main", "kv", [sc.ColumnDef("id", "int", False), sc.ColumnDef("v", "string"),
                                           sc.ColumnDef("n", "int")], ["id"], None, 1)
    base = tso.from_datetime(dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC))
    step = 1 << 18
    ddl = {"commit_ts": base + 1, "start_ts": base, "schema_version": 1, "db": "main", "tbl": "kv", "table_id": 21,
           "previous_table_id": 0, "dropped": False, "query": "CREATE TABLE kv (...)",
           "table_info": info.SerializeToString(), "table_json": decode.table_json(info)}
    spark.createDataFrame([ddl], decode.DDL_HISTORY_DDL).write.format("delta").save(
        location.table_path(path, location.DDL_HISTORY))
    rows = []
    for i, (op, before, after) in enumerate(changes):
        ts = base + 1 + step * (1 + i // TXN)
        key = after if after is not None else before
        assert key is not None
        rows.append({"commit_ts": ts, "start_ts": ts - 1, "seq": i % TXN, "commit_date": decode.commit_date(ts),
                     "db": "main", "tbl": "kv", "table_id": 21, "op": op, "keys": _image({"id": key["id"]}),
                     "before": _image(before) if before else None, "after": _image(after) if after else None,
                     "schema_version": 1, "pump": "p1"})
    end = rows[-1]["commit_ts"] + 1
    cuts = [base] + [base + (end - base) * (j + 1) // WINDOWS for j in range(WINDOWS)]
    ledger = []
    for n, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        part = [r for r in rows if a <= r["commit_ts"] < b]
        spark.createDataFrame(part, decode.CHANGES_DDL).write.format("delta").mode(
            "overwrite" if n == 0 else "append").partitionBy("commit_date").save(
            location.table_path(path, location.CHANGES))
        ledger.append((a, b, ["p1"], {"p1": len(part)}, {"main.kv:x": len(part)}, len(part) // TXN, len(part),
                       1 if n == 0 else 0, "done", dt.datetime(2026, 11, 20, 9, 0)))
    spark.createDataFrame(ledger, ingest.WINDOWS_DDL).write.format("delta").save(
        location.table_path(path, location.WINDOWS))
    return {"path": path, "final": sorted((r["id"], r["v"], r["n"]) for r in live.values()),
            "end": cuts[-1], "changes": len(changes)}


def _rows(url: str) -> list[tuple[Any, ...]]:
    with open_target(url) as t, t.engine.connect() as c:
        return sorted(tuple(r) for r in c.exec_driver_sql("SELECT id, v, n FROM kv"))


def _checkpoint_ts(url: str, name: str) -> int:
    with open_target(url) as t, t.engine.connect() as c:
        cp = checkpoint.read(c, name)
    return cp.ts if cp else 0


@pytest.mark.slow  # workers failed, then two reruns
@pytest.mark.parametrize("kind", ["postgresql", "sqlite", "duckdb"])
def test_workers_failed_after_their_buckets_then_rerun(kind: str, spark: SparkSession, lake: dict[str, Any],
                                             request: pytest.FixtureRequest, tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url = new_target_url(kind, request, tmp_path, "kv")
    t = task.Task(name=f"p{uuid.uuid4().hex[:6]}", lake=lake["path"], target=url, mode="parallel", parallel_tasks=3)
    taken: list[bool] = []
    real = parallel.arrow_parallel

    def spy(target: targets.Target, batch: Any, safe: bool) -> bool:
        verdict = real(target, batch, safe)
        if batch.tables:  # (the batch before the CREATE TABLE has nothing to write)
            taken.append(verdict)
        return verdict

    monkeypatch.setattr(parallel, "arrow_parallel", spy)
    monkeypatch.setenv(failpoint.ENV, "apply-after-group:raise")
    with pytest.raises(failpoint.FailpointError):
        runner.Applier(spark, t).run()
    monkeypatch.delenv(failpoint.ENV)
    assert taken and all(taken)  # every batch went to the tasks as Arrow buckets
    with open_target(url) as tgt, tgt.engine.connect() as conn:
        buckets = conn.execute(sa.select(sa.func.count()).select_from(checkpoint.table)
                               .where(checkpoint.table.c.grp >= 0)).scalar_one()
    assert buckets >= 1  # a bucket committed before its task was killed
    assert _checkpoint_ts(url, t.name) < lake["end"]
    summary = runner.Applier(spark, t).run()
    assert _rows(url) == lake["final"]
    assert _checkpoint_ts(url, t.name) == lake["end"]
    assert summary.windows >= 1
    # Every window again, from no checkpoint: the target refuses (its rows are
    # there), and nothing changes.
    with open_target(url) as tgt, tgt.engine.begin() as conn:
        conn.execute(checkpoint.table.delete().where(checkpoint.table.c.task == t.name))
    with pytest.raises(table_write.TargetDiverged, match="target table kv.*those other workers committed stay"):
        runner.Applier(spark, t).run()
    assert _rows(url) == lake["final"]


@pytest.mark.parametrize("kind", ["postgresql", "sqlite", "duckdb"])
def test_consistent_over_the_same_lake(kind: str, spark: SparkSession, lake: dict[str, Any],
                                       request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> None:
    url = new_target_url(kind, request, tmp_path, "kv")
    t = task.Task(name="c1", lake=lake["path"], target=url, mode="consistent")
    applier = runner.Applier(spark, t)
    summary = applier.run()
    assert summary.windows == WINDOWS and summary.changes == lake["changes"]
    assert applier.reader._readers[location.CHANGES] is not None  # read in process, not through Spark
    assert _rows(url) == lake["final"]
    assert runner.Applier(spark, t).run().windows == 0  # nothing after the checkpoint
    assert _rows(url) == lake["final"]
