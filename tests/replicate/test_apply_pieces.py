"""A window larger than the apply's read budget is read and applied in pieces:
the target ends equal to the changes' final rows in both modes, into SQLite and
PostgreSQL, and no read holds more than the budget (or the one transaction larger
than it, read alone); the pieces are cut the same whether the commit_ts counts
come from this process or from Spark; a kill -9 between pieces (consistent mode:
the window's one transaction is lost whole) and workers failing inside a piece
(parallel mode: the checkpoint is at a piece's end) end, after a rerun, equal
with the checkpoint at the last window's end and nothing applied twice.

The lake: one table ``kv`` created in the first window; the second window holds
about 4.7 times the budget of row changes (transactions spread over minutes, a
burst of transactions within one millisecond, one transaction larger than the
budget, a CREATE TABLE ``kw`` and changes of both tables after it), updating and
deleting keys across its pieces; a small third window follows.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import random
import re
import subprocess
import sys
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
from binlake.replicate import checkpoint, rules, runner, task
from binlake.replicate.read import LakeReader
from binlake.sql import schema as sc
from binlake.sql.url import open_target

pytestmark = pytest.mark.timeout(600)

BUDGET = 1000
BIG_TXN = 1200  # row changes of the one transaction larger than the budget
MS = 1 << 18  # one millisecond of TSO
COLS = {"kv": ["id", "v", "n"], "kw": ["id", "s"]}


def _image(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


class _Workload:
    """Random inserts, updates and deletes over the keys of two tables, as
    transactions at given commit_ts; ``live`` is each table's final rows."""

    def __init__(self) -> None:
        self.rng = random.Random(5)
        self.live: dict[str, dict[int, dict[str, Any]]] = {"kv": {}, "kw": {}}
        self.next_id = 1
        self.rows: list[dict[str, Any]] = []

    def change(self, table: str, i: int) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
        live = self.live[table]
        r = self.rng.random()
        if r < 0.5 or len(live) < 30:
            key, self.next_id = self.next_id, self.next_id + 1
            row: dict[str, Any] = ({"id": key, "v": self.rng.choice(["", "a,b", None, "x" * 7]), "n": i % 89}
                                   if table == "kv" else {"id": key, "s": f"s{i}"})
            live[key] = row
            return "insert", None, row
        key = self.rng.choice(list(live))
        if r < 0.8:
            after = dict(live[key], v=f"u{i}", n=i) if table == "kv" else dict(live[key], s=f"t{i}")
            before, live[key] = live[key], after
            return "update", before, after
        return "delete", live.pop(key), None

    def txn(self, ts: int, size: int, tables: tuple[str, ...] = ("kv",)) -> None:
        for seq in range(size):
            table = tables[seq % len(tables)]
            op, before, after = self.change(table, len(self.rows))
            key = after if after is not None else before
            assert key is not None
            self.rows.append({"commit_ts": ts, "start_ts": ts - 1, "seq": seq, "commit_date": decode.commit_date(ts),
                              "db": "main", "tbl": table, "table_id": 21 if table == "kv" else 22, "op": op,
                              "keys": _image({"id": key["id"]}), "before": _image(before) if before else None,
                              "after": _image(after) if after else None,
                              "schema_version": 1 if table == "kv" else 2, "pump": "p1"})


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three windows as the ingest writes them (the big one in the middle), the
    windows' bounds, the final rows and the big transaction's commit_ts."""
    base = tso.from_datetime(dt.datetime(2026, 11, 21, 8, 0, tzinfo=dt.UTC))
    w1, w2, w3 = base + 1000 * MS, base + 601_000 * MS, base + 602_000 * MS
    work = _Workload()
    for i in range(40):  # window 1: 200 changes after CREATE TABLE kv
        work.txn(base + MS * (2 + i), 5)
    for i in range(200):  # window 2: transactions a second apart ...
        work.txn(w1 + MS * 1000 * (1 + i), 5)
    burst = w1 + MS * 250_000
    for i in range(300):  # ... 300 within one millisecond (one commit_ts bucket until refined) ...
        work.txn(burst + 1 + i, 5)
    big_ts = w1 + MS * 260_000
    work.txn(big_ts, BIG_TXN)  # ... one transaction larger than the budget ...
    kw_ts = w1 + MS * 270_000  # ... CREATE TABLE kw, then changes of both tables
    for i in range(200):
        work.txn(kw_ts + MS * 1000 * (1 + i), 5, ("kv", "kw"))
    for i in range(20):  # window 3
        work.txn(w2 + MS * (1 + i), 5)
    path = str(tmp_path_factory.mktemp("lake"))
    ddls = []
    for table_id, name, cols, ts, version in (
            (21, "kv", [sc.ColumnDef("id", "int", False), sc.ColumnDef("v", "string"), sc.ColumnDef("n", "int")],
             base + 1, 1),
            (22, "kw", [sc.ColumnDef("id", "int", False), sc.ColumnDef("s", "string")], kw_ts, 2)):
        info = sc.new_table(table_id, "main", name, cols, ["id"], None, version)
        ddls.append({"commit_ts": ts, "start_ts": ts - 1, "schema_version": version, "db": "main", "tbl": name,
                     "table_id": table_id, "previous_table_id": 0, "dropped": False,
                     "query": f"CREATE TABLE {name} (...)", "table_info": info.SerializeToString(),
                     "table_json": decode.table_json(info)})
    spark.createDataFrame(ddls, decode.DDL_HISTORY_DDL).write.format("delta").save(
        location.table_path(path, location.DDL_HISTORY))
    bounds = [(base, w1), (w1, w2), (w2, w3)]
    ledger = []
    for n, (a, b) in enumerate(bounds):
        part = [r for r in work.rows if a <= r["commit_ts"] < b]
        spark.createDataFrame(part, decode.CHANGES_DDL).write.format("delta").mode(
            "overwrite" if n == 0 else "append").partitionBy("commit_date").save(
            location.table_path(path, location.CHANGES))
        txns = len({r["commit_ts"] for r in part})
        ledger.append((a, b, ["p1"], {"p1": len(part)}, {"main.kv:x": len(part)}, txns, len(part),
                       sum(1 for d in ddls if a <= d["commit_ts"] < b), "done", dt.datetime(2026, 11, 21, 9, 0)))
    spark.createDataFrame(ledger, ingest.WINDOWS_DDL).write.format("delta").save(
        location.table_path(path, location.WINDOWS))
    big = sum(1 for r in work.rows if w1 <= r["commit_ts"] < w2)
    assert big >= 3 * BUDGET
    return {"path": path, "windows": bounds, "big_ts": big_ts, "big": big, "rows": work.rows,
            "final": {t: sorted(tuple(r[c] for c in COLS[t]) for r in work.live[t].values()) for t in COLS}}


@pytest.fixture(autouse=True)
def _budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_MEMORY_READ_BUDGET", str(BUDGET))
    monkeypatch.setattr(failpoint, "_hits", {})  # every test counts its own failpoint hits


def _tables(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with open_target(url) as t, t.engine.connect() as c:
        have = set(sa.inspect(c).get_table_names())
        return {name: sorted(tuple(r) for r in c.exec_driver_sql(f"SELECT {', '.join(cols)} FROM {name}"))
                if name in have else [] for name, cols in COLS.items()}


def _checkpoint(url: str, name: str) -> checkpoint.Checkpoint | None:
    with open_target(url) as t, t.engine.connect() as c:
        return checkpoint.read(c, name)


def _bucket_rows(url: str, name: str) -> int:
    with open_target(url) as t, t.engine.connect() as c:
        return int(c.execute(sa.select(sa.func.count()).select_from(checkpoint.table)
                             .where(checkpoint.table.c.task == name, checkpoint.table.c.grp >= 0)).scalar_one())


def _final_of(rows: list[dict[str, Any]], until: int) -> dict[str, list[tuple[Any, ...]]]:
    """Each table's rows after the changes before ``until``."""
    state: dict[str, dict[int, tuple[Any, ...]]] = {t: {} for t in COLS}
    for r in rows:
        if r["commit_ts"] >= until:
            continue
        if r["before"]:
            state[r["tbl"]].pop(json.loads(r["before"])["id"])
        if r["after"]:
            after = json.loads(r["after"])
            state[r["tbl"]][after["id"]] = tuple(after[c] for c in COLS[r["tbl"]])
    return {t: sorted(v.values()) for t, v in state.items()}


@pytest.mark.parametrize("kind, mode", [(k, m) for k in ("sqlite", "postgresql") for m in ("consistent", "parallel")])
def test_big_window_is_applied_in_pieces(kind: str, mode: str, spark: SparkSession, lake: dict[str, Any],
                                         request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> None:
    url = new_target_url(kind, request, tmp_path, "pc")
    t = task.Task(name="pieces", lake=lake["path"], target=url, mode=mode, parallel_tasks=3)
    lines: list[str] = []
    applier = runner.Applier(spark, t, progress=lines.append)
    summary = applier.run()
    assert _tables(url) == lake["final"]
    assert _checkpoint(url, t.name) == checkpoint.Checkpoint(lake["windows"][-1][1], *lake["windows"][-1])
    assert summary.windows == 3 and summary.changes == len(lake["rows"])
    # The big window took several pieces; every read held at most the budget, but
    # the one transaction larger than it, which was read alone.
    held = [int(m.group(2).replace(",", "")) for m in
            (re.search(r"piece (\d+/\d+) \(([\d,]+) changes\)", line) for line in lines) if m]
    assert summary.split_windows == 1 and summary.pieces == len(held) >= lake["big"] // BUDGET
    assert sum(held) == lake["big"]
    assert all(n <= BUDGET or n == BIG_TXN for n in held) and BIG_TXN in held
    assert applier.reader.peak_rows == summary.largest_read == BIG_TXN
    assert f"window(s) read in {summary.pieces} pieces" in summary.summary()
    assert runner.Applier(spark, t).run().windows == 0  # nothing after the checkpoint
    assert _tables(url) == lake["final"]


def test_pieces_cut_between_transactions_the_same_through_spark(spark: SparkSession, lake: dict[str, Any],
                                                                tmp_path: pathlib.Path) -> None:
    t = task.Task(name="cuts", lake=lake["path"], target=f"sqlite:///{tmp_path / 'x.db'}", mode="consistent")
    here = LakeReader(spark, t, lake["path"], rules.Rules(t))
    window = next(w for w in here.windows() if int(w["rows"]) == lake["big"])
    a, b = lake["windows"][1]
    pieces = here.pieces(window, a)
    assert pieces[0][0] == a and pieces[-1][1] == b
    assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:], strict=False))
    stamps = [r["commit_ts"] for r in lake["rows"]]
    for lo, hi in pieces:
        inside = [ts for ts in stamps if lo <= ts < hi]
        assert len(inside) <= BUDGET or set(inside) == {lake["big_ts"]}
    # Through Spark (an aggregate per commit_ts bucket) the cuts are the same.
    spark_reader = LakeReader(spark, t, lake["path"], rules.Rules(t))
    spark_reader._readers[location.CHANGES] = None
    assert spark_reader.pieces(window, a) == pieces
    # From a checkpoint inside the window: the same cuts, the first piece clipped.
    assert here.pieces(window, pieces[2][0]) == pieces[2:]
    assert here.pieces(window, pieces[2][0] + 1) == [(pieces[2][0] + 1, pieces[2][1]), *pieces[3:]]
    assert here.peak_rows == 0  # counting read no changes


def _cli_apply(task_file: pathlib.Path, fail: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["BINLAKE_SPARK_MASTER"] = "local[1]"
    env[failpoint.ENV] = fail
    return subprocess.run([sys.executable, "-m", "binlake.cli", "apply", "--task", str(task_file)],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_kill_between_pieces_then_rerun(kind: str, spark: SparkSession, lake: dict[str, Any],
                                        request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> None:
    url = new_target_url(kind, request, tmp_path, "pk")
    task_file = tmp_path / "task.toml"
    task_file.write_text(f'name = "kill"\nlake = "{lake["path"]}"\ntarget = "{url}"\nmode = "consistent"\n')
    t = task.load(task_file)
    first = lake["windows"][0]
    runner.Applier(spark, t).run(until_ts=first[1])
    proc = _cli_apply(task_file, "apply-after-piece:exit:3")  # killed after the big window's third piece
    assert proc.returncode == 137, proc.stderr[-2000:]
    assert "piece 3/" in proc.stderr
    # Three pieces were written in the window's transaction: nothing of them shows.
    assert _checkpoint(url, t.name) == checkpoint.Checkpoint(first[1], *first)
    assert _tables(url) == _final_of(lake["rows"], first[1])
    summary = runner.Applier(spark, t).run()
    assert summary.windows == 2 and summary.split_windows == 1
    assert _tables(url) == lake["final"]
    assert _checkpoint(url, t.name) == checkpoint.Checkpoint(lake["windows"][-1][1], *lake["windows"][-1])


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_parallel_workers_failed_inside_a_piece_then_rerun(kind: str, spark: SparkSession, lake: dict[str, Any],
                                                           request: pytest.FixtureRequest, tmp_path: pathlib.Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    url = new_target_url(kind, request, tmp_path, "pp")
    t = task.Task(name=f"pp{uuid.uuid4().hex[:6]}", lake=lake["path"], target=url, mode="parallel",
                  parallel_tasks=3)
    a = lake["windows"][1][0]
    # The first window's batch is three buckets (hits 1-3), then each piece's: the
    # 8th hit is a worker of the big window's second piece, after its bucket committed.
    monkeypatch.setenv(failpoint.ENV, "apply-after-group:raise:8")
    with pytest.raises(failpoint.FailpointError):
        runner.Applier(spark, t).run()
    monkeypatch.delenv(failpoint.ENV)
    cp = _checkpoint(url, t.name)
    reader = LakeReader(spark, t, lake["path"], rules.Rules(t))
    pieces = reader.pieces(next(w for w in reader.windows() if int(w["start_ts"]) == a), a)
    assert cp is not None and cp.ts == pieces[0][1] < lake["big_ts"]  # the first piece's end, inside the window
    assert _bucket_rows(url, t.name) >= 1  # buckets of the second piece are in
    assert _tables(url) != _final_of(lake["rows"], cp.ts)  # ... beyond the checkpoint
    # The rerun cuts the same pieces: it finds those buckets and applies the rest once.
    summary = runner.Applier(spark, t).run()
    assert summary.windows == 2
    assert _tables(url) == lake["final"]
    assert _checkpoint(url, t.name) == checkpoint.Checkpoint(lake["windows"][-1][1], *lake["windows"][-1])
    assert _bucket_rows(url, t.name) == 0
