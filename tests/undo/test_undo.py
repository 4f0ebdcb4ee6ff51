"""``binlake undo`` against the truth: the upstream's own copies before the bad batch and now.

One SQLite upstream, written through TxnWriter and two Pump processes:
``orders`` (with a unique ``code``) and ``users`` are filled, a copy of the
upstream is taken, then the bad batch runs in three transactions (a mass
UPDATE of orders 1-20, a mass DELETE of 21-30, a key change 31 -> 131), then
later good writes (a column added to orders, other orders and users changed).
Both windows are ingested into one lake, shared by every test here; each test
restores the lake's newest state into a fresh target and undoes the batch.

The undone target must equal the pre-batch copy on the keys the batch touched
and the upstream's current state everywhere else, value by value.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from dbfixtures import mariadb_server, new_target_url, postgres_server  # noqa: F401
from pumpkit import wait_cluster_safe
from pyspark.sql import SparkSession

from binlake import cli
from binlake.lake import ingest
from binlake.registry.client import RegistryClient
from binlake.replicate import checkpoint
from binlake.restore import restore
from binlake.sql import checksum, targets
from binlake.sql import schema as sc
from binlake.sql.url import open_target, reader_engine
from binlake.testing.devcluster import DevCluster
from binlake.writer.txn_writer import TxnWriter

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

PUMP_ARGS = ["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.3"]
ORDERS = [sc.ColumnDef("id", "int", False), sc.ColumnDef("status", "string", length=16),
          sc.ColumnDef("amount", "decimal", precision=10, scale=2), sc.ColumnDef("code", "string", False, length=16)]
USERS = [sc.ColumnDef("id", "int", False), sc.ColumnDef("name", "string", length=32)]
TOUCHED = {*range(1, 32), 131}  # the bad batch's keys of orders


class Lake:
    """The shared upstream, its copy before the batch, the lake and the batch's ts."""

    def __init__(self, root: pathlib.Path, up: str, before: pathlib.Path, lake: str, t1: int, t2: int, end: int,
                 key_change_txn: int) -> None:
        self.root, self.up, self.before, self.lake = root, up, before, lake
        self.t1, self.t2, self.end, self.key_change_txn = t1, t2, end, key_change_txn
        self.pristine = root / "pristine.db"


def _backup(url: str, to: pathlib.Path) -> None:
    # SQLite's online backup, not a file copy: the upstream runs in WAL mode.
    src = sqlite3.connect(url.removeprefix("sqlite:///"))
    dst = sqlite3.connect(to)
    src.backup(dst)
    src.close()
    dst.close()


@pytest.fixture(scope="module")
def shared(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    root = tmp_path_factory.mktemp("undo")
    up = f"sqlite:///{root / 'up.db'}"
    with DevCluster(root / "cluster", pumps=2, pump_args=PUMP_ARGS) as cluster, \
            RegistryClient(cluster.registry_addr) as reg, TxnWriter(up, registry=cluster.registry_addr) as w:
        t0 = reg.get_ts()
        w.create_table("orders", ORDERS, ["id"], {"uq_code": ["code"]})
        w.create_table("users", USERS, ["id"])

        def fill(t: Any) -> None:
            for i in range(1, 41):
                t.insert("orders", {"id": i, "status": "new", "amount": f"{i}.25", "code": f"c{i}"})
            for i in range(1, 11):
                t.insert("users", {"id": i, "name": f"u{i}"})

        w.run(fill)
        before = root / "before.db"
        _backup(up, before)
        t1 = reg.get_ts()
        w.run(lambda t: t.update_where("orders", lambda o: o.c.id <= 20, {"status": "void", "amount": "0.00"}))
        w.run(lambda t: t.delete_where("orders", lambda o: (o.c.id >= 21) & (o.c.id <= 30)))
        moved = w.run(lambda t: t.update("orders", {"id": 31}, {"id": 131}))
        assert moved is not None
        t2 = reg.get_ts()
        # Later good writes: DDL, other keys of orders, the other table.
        w.add_column("orders", sc.ColumnDef("note", "string", length=32))
        w.run(lambda t: (t.update("orders", {"id": 35}, {"status": "paid", "note": "ok"}),
                         t.insert("orders", {"id": 200, "status": "new", "amount": "9.99", "code": "c200"}),
                         t.update("users", {"id": 2}, {"name": "second"}), t.insert("users", {"id": 11, "name": "u11"})))
        end = reg.get_ts()

        wait_cluster_safe(cluster.registry_addr, end, 30)
        lake = str(root / "lake")
        ingest.ingest_window(spark, lake, cluster.registry_addr, t0, end)
    shared = Lake(root, up, before, lake, t1, t2, end, moved.start_ts)
    restore.run(spark, lake, end - 1, target=f"sqlite:///{shared.pristine}")
    yield shared


def rows(url: str, name: str) -> dict[tuple[str | None, ...], dict[str, str | None]]:
    """Table ``name`` of ``url`` as canonical text, typed by its recorded definition."""
    info = checksum.load_schema(url)[name]
    engine = reader_engine(url)
    try:
        table = targets.kind(engine.dialect.name).sa_table(info)
        key = targets.base.key_names(info)
        with engine.connect() as conn:
            out = {}
            for r in conn.execute(sa.select(table)):
                m = dict(r._mapping)
                out[tuple(checksum.canonical(m[k]) for k in key)] = {c: checksum.canonical(v) for c, v in m.items()}
            return out
    finally:
        engine.dispose()


def expected(s: Lake, keep: set[int] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    """Orders: the pre-batch copy on the touched keys (but ``keep``), the upstream's now elsewhere."""
    now = rows(s.up, "orders")
    then = rows(f"sqlite:///{s.before}", "orders")
    touched = {(str(k),) for k in TOUCHED - keep}
    orders = {k: v for k, v in now.items() if k not in touched}
    orders.update({k: {**v, "note": None} for k, v in then.items() if k in touched})
    return {"orders": orders, "users": rows(s.up, "users")}


def state(url: str) -> dict[str, Any]:
    return {"orders": rows(url, "orders"), "users": rows(url, "users")}


def errors_of(stderr: str) -> list[str]:
    """The command's error lines (the progress log goes to stderr too)."""
    return [x for x in stderr.splitlines() if x.startswith("binlake undo: error:")]


def fresh(s: Lake, tmp_path: pathlib.Path, name: str = "t.db") -> str:
    path = tmp_path / name
    shutil.copy(s.pristine, path)
    return f"sqlite:///{path}"


def copied(s: Lake, url: str) -> str:
    """The restored target's tables, made and loaded in ``url`` as a restore does (one Spark
    restore per module: the same definitions, recorded in ``_binlake_schema``)."""
    source = f"sqlite:///{s.pristine}"
    with open_target(url) as target:
        for info in checksum.load_schema(source).values():
            engine = reader_engine(source)
            with engine.connect() as conn:
                data = [dict(r._mapping) for r in conn.execute(sa.select(targets.kind("sqlite").sa_table(info)))]
            engine.dispose()
            restore.load_table(target, info, data)
    return url


def undo(s: Lake, target: str, *extra: str) -> int:
    return cli.main(["undo", "--lake", s.lake, "--start", str(s.t1), "--end", str(s.t2), "--target", target, *extra])


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mariadb"])
def test_the_bad_batch_is_undone_and_only_it(shared: Lake, kind: str,
                                             request: pytest.FixtureRequest, tmp_path: pathlib.Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    target = fresh(shared, tmp_path) if kind == "sqlite" else copied(shared, new_target_url(kind, request, tmp_path))
    assert state(target) == state(shared.up)  # the target holds the upstream's now, bad batch included
    capsys.readouterr()
    assert undo(shared, target) == 0
    out = capsys.readouterr().out
    assert out.startswith("undone") and "main.orders" in out, out
    assert state(target) == expected(shared)
    if kind == "sqlite":
        # A second undo of the same changes finds its record and writes nothing.
        assert undo(shared, target, "--force") == 0
        assert "already undone at" in capsys.readouterr().out
        assert state(target) == expected(shared)


def test_dry_run_prints_the_plan_and_sql_writes_the_statements_only(
        shared: Lake, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = fresh(shared, tmp_path)
    now = state(target)
    capsys.readouterr()
    assert undo(shared, target, "--dry-run") == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "main.orders" in x)
    # 20 updated rows back, 10 deleted + the key change's old key re-inserted, its new key deleted.
    assert line.split()[1:6] == ["20", "11", "1", "0", "0"], out
    assert "users" not in out
    assert state(target) == now
    sql = tmp_path / "undo.sql"
    assert undo(shared, target, "--sql", str(sql)) == 0
    assert state(target) == now and not os.path.exists(str(sql) + ".tmp")
    text = sql.read_text()
    assert text.count("DELETE FROM") >= 1 and "INSERT INTO" in text and text.rstrip().endswith("COMMIT;")
    db = sqlite3.connect(str(tmp_path / "t.db"))
    db.executescript(text)
    db.close()
    assert state(target) == expected(shared)
    assert undo(shared, target) == 0  # the file's record row makes the reviewed run count as done
    assert "already undone" in capsys.readouterr().out


def test_a_later_write_on_a_touched_key_is_a_conflict(
        shared: Lake, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = fresh(shared, tmp_path)
    engine = sa.create_engine(target)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE orders SET status = 'later' WHERE id = 5")
    engine.dispose()
    now = state(target)
    capsys.readouterr()
    assert undo(shared, target) == 2
    captured = capsys.readouterr()
    assert "first 1 of 1 conflict(s)" in captured.out and "id=5" in captured.out, captured.out
    err = errors_of(captured.err)
    assert len(err) == 1 and "nothing written" in err[0] and "--skip-conflicts" in err[0], err
    assert state(target) == now
    assert undo(shared, target, "--skip-conflicts") == 0
    want = expected(shared, keep={5})
    want["orders"][("5",)] = now["orders"][("5",)]
    assert state(target) == want
    # --force overwrites the later write too (on a copy holding the same conflict).
    forced = tmp_path / "forced.db"
    shutil.copy(tmp_path / "t.db", forced)
    engine = sa.create_engine(f"sqlite:///{forced}")
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM _binlake_undo")
    engine.dispose()
    assert undo(shared, f"sqlite:///{forced}", "--force") == 0
    assert state(f"sqlite:///{forced}") == expected(shared)


def test_a_run_killed_half_way_changes_nothing_and_a_rerun_finishes(
        shared: Lake, tmp_path: pathlib.Path) -> None:
    target = fresh(shared, tmp_path)
    now = state(target)
    env = {**os.environ, "BINLAKE_FAILPOINT": "undo-after-batch:exit:2", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, "-m", "binlake.cli", "undo", "--lake", shared.lake, "--master", "local[1]",
                           "--start", str(shared.t1), "--end", str(shared.t2), "--target", target],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 137, proc.stderr[-2000:]
    assert state(target) == now
    assert undo(shared, target) == 0
    assert state(target) == expected(shared)


def test_txn_and_where_choose_the_changes(shared: Lake, tmp_path: pathlib.Path) -> None:
    target = fresh(shared, tmp_path)
    now = state(target)
    # Only the key change: 131 goes back to 31.
    assert cli.main(["undo", "--lake", shared.lake, "--txn", str(shared.key_change_txn), "--target", target]) == 0
    want = {**now, "orders": dict(now["orders"])}
    want["orders"].pop(("131",))
    want["orders"][("31",)] = expected(shared)["orders"][("31",)]
    assert state(target) == want
    # Then only the mass delete's rows, by a predicate over the change rows and their images.
    assert undo(shared, target, "--where", "op = 'delete' AND before.amount >= 21 AND table = 'orders'") == 0
    for i in range(21, 31):
        want["orders"][(str(i),)] = expected(shared)["orders"][(str(i),)]
    assert state(target) == want


def test_every_bad_input_is_one_line_and_writes_nothing(
        shared: Lake, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = fresh(shared, tmp_path)
    now = checksum.checksum(target, include_internal=True)
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    sqlite3.connect(tmp_path / "empty.db").close()
    applied = fresh(shared, tmp_path, "applied.db")
    engine = sa.create_engine(applied)
    checkpoint.ensure(engine)
    with engine.begin() as conn:
        checkpoint.write(conn, "t1", shared.t2 - 5, shared.t1, shared.t2)
    engine.dispose()
    lake, t1, t2 = shared.lake, str(shared.t1), str(shared.t2)
    cases = {
        "--end": ["--start", t2, "--end", t1, "--target", target],
        "say which changes": ["--target", target],
        "not covered": ["--start", str(shared.end + 10), "--end", str(shared.end + 10_000_000), "--target", target],
        "no table 'nosuch'": ["--start", t1, "--end", t2, "--tables", "nosuch", "--target", target],
        "--where": ["--start", t1, "--end", t2, "--where", "op = = 'x'", "--target", target],
        "has no table orders": ["--start", t1, "--end", t2, "--target", empty],
        "apply task t1": ["--start", t1, "--end", t2, "--target", applied],
        "not both": ["--start", t1, "--end", t2, "--skip-conflicts", "--force", "--target", target],
        "no transaction": ["--txn", "12345", "--target", target],
    }
    for expect, argv in cases.items():
        capsys.readouterr()
        assert cli.main(["undo", "--lake", lake, *argv]) == 2, expect
        text = capsys.readouterr().err
        err = errors_of(text)
        assert len(err) == 1 and expect in err[0] and "Traceback" not in text, (expect, err)
    assert checksum.checksum(target, include_internal=True) == now
    assert not sa.inspect(sa.create_engine(empty)).get_table_names()
