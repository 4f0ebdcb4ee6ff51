"""Targets and diff against real databases: SQLite, PostgreSQL, MariaDB and DuckDB.

Rows of every column type loaded through ``Target.bulk_load`` read back equal
to a SQLite source holding the same rows (``diff`` OK, and the checksums'
checksums agree); a row changed, deleted or added by hand in the target is
reported by key, and the ``--fix-sql`` statements make the target equal again.
"""

from __future__ import annotations

import datetime as dt
import decimal
import pathlib
from typing import Any

import pytest
import sqlalchemy as sa
from dbfixtures import TARGETS, kept_and_lost, mariadb_server, new_target_url, postgres_server  # noqa: F401

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.sql import checksum, diff
from binlake.sql import schema as sc
from binlake.sql import url as sql_url
from binlake.sql.url import open_target

COLS = [
    sc.ColumnDef("id", "int", False), sc.ColumnDef("code", "string", True, length=32),
    sc.ColumnDef("u", "uint"), sc.ColumnDef("flag", "bool"), sc.ColumnDef("f", "float"),
    sc.ColumnDef("amount", "decimal", precision=12, scale=2), sc.ColumnDef("note", "string"),
    sc.ColumnDef("blob", "bytes"), sc.ColumnDef("day", "date"), sc.ColumnDef("at", "datetime"),
    sc.ColumnDef("tod", "time"), sc.ColumnDef("doc", "json"),
]


def table_info(name: str = "items") -> binlog_pb2.TableInfo:
    return sc.new_table(101, "app", name, COLS, ["id"], {"uk_code": ["code"]}, 1)


def rows(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append({
            "id": i, "code": f"c{i:05d}" if i % 7 else None, "u": 2**64 - 1 - i, "flag": i % 2 == 0,
            "f": i / 3, "amount": decimal.Decimal(f"{i}.50"), "note": "héllo 'q' \\ x" if i % 5 else None,
            "blob": bytes([i % 256, 0, 255]), "day": dt.date(2026, 1, 1) + dt.timedelta(days=i),
            "at": dt.datetime(2026, 11, 21, 8, 0, 0, i), "tod": dt.time(8, 0, i % 60, 1),
            "doc": {"a": [i, None], "s": "x"} if i % 3 else None,
        })
    return out


@pytest.fixture(params=TARGETS)
def target_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    return new_target_url(request.param, request, tmp_path)


def test_bulk_load_then_diff_ok_and_fix(target_url: str, tmp_path: pathlib.Path) -> None:
    source_url = f"sqlite:///{tmp_path / 'source.db'}"
    data = rows(250)
    with open_target(source_url) as src:
        src.create_table(table_info())
        assert src.bulk_load(table_info(), data) == 250
    with open_target(target_url) as tgt:
        tgt.create_table(table_info())
        with pytest.raises(errors.FailedPrecondition, match="already has a table items"):
            tgt.create_table(table_info())
        tgt.create_table(table_info(), if_exists="skip")
        assert tgt.bulk_load(table_info(), data) == 250
    report = diff.diff_databases(source_url, target_url, chunk_size=40)
    assert report.ok, report.summary()
    assert [(t.name, t.status, t.source_rows, t.target_rows) for t in report.tables] == [("items", "OK", 250, 250)]
    assert report.tables[0].chunks == 7
    assert checksum.checksum(source_url) == checksum.checksum(target_url)

    # Change the target by hand: one row altered, one deleted, one added.
    engine = sa.create_engine(sql_url.normalize_url(target_url))
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE items SET note = 'changed' WHERE id = 17")
        conn.exec_driver_sql("DELETE FROM items WHERE id = 120")
        conn.exec_driver_sql("INSERT INTO items (id, flag) VALUES (9999, " +
                             ("TRUE" if engine.dialect.name == "postgresql" else "1") + ")")
    engine.dispose()
    fix = tmp_path / "fix.sql"
    report = diff.diff_databases(source_url, target_url, chunk_size=40, fix_sql=str(fix))
    assert not report.ok
    t = report.tables[0]
    assert t.status == "DIFF"
    assert t.differing == [{"id": "17"}]
    assert t.only_in_source == [{"id": "120"}]
    assert t.only_in_target == [{"id": "9999"}]
    assert "missing   id=120" in report.summary()
    assert checksum.checksum(source_url) != checksum.checksum(target_url)

    engine = sa.create_engine(sql_url.normalize_url(target_url))
    with engine.begin() as conn:
        for stmt in fix.read_text().splitlines():
            if stmt and not stmt.startswith("--"):
                conn.exec_driver_sql(stmt.replace("%", "%%") if engine.dialect.name not in ("sqlite", "duckdb") else stmt)
    engine.dispose()
    assert diff.diff_databases(source_url, target_url, chunk_size=40).ok
    assert checksum.checksum(source_url) == checksum.checksum(target_url)


def test_diff_missing_table_and_bad_input(tmp_path: pathlib.Path) -> None:
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    with open_target(a) as src:
        src.create_table(table_info())
        src.bulk_load(table_info(), rows(5))
    open_target(b).close()
    report = diff.diff_databases(a, b)
    assert [(t.name, t.status, t.source_rows) for t in report.tables] == [("items", "MISSING", 5)]
    assert not report.ok
    with pytest.raises(errors.InvalidArgument, match="no table.*nope"):
        diff.diff_databases(a, b, tables=["nope"])
    with pytest.raises(errors.InvalidArgument, match="chunk size"):
        diff.diff_databases(a, b, chunk_size=0)


def test_diff_keeps_diff_keys_keys_by_default(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The keys a report keeps: ``[memory] diff_keys`` unless ``keep_keys``/``--keep-keys``
    says otherwise (the counts stay exact); a negative count is one clear line."""
    from binlake import cli

    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    with open_target(a) as src:
        src.create_table(table_info())
        src.bulk_load(table_info(), rows(20))
    with open_target(b) as tgt:
        tgt.create_table(table_info())
    monkeypatch.setenv("BINLAKE_MEMORY_DIFF_KEYS", "3")
    (t,) = diff.diff_databases(a, b).tables
    assert (t.missing_count, t.only_in_source) == (20, [{"id": "0"}, {"id": "1"}, {"id": "10"}])
    assert len(diff.diff_databases(a, b, keep_keys=7).tables[0].only_in_source) == 7
    assert cli.main(["diff", a, b]) == 1
    out = capsys.readouterr().out
    assert out.count("missing   id=") == 3 and "... 17 more missing" in out
    assert cli.main(["diff", a, b, "--keep-keys", "0"]) == 1
    out = capsys.readouterr().out
    assert "missing   id=" not in out and "(20 missing in target" in out and "... 20 more missing" in out
    assert cli.main(["diff", a, b, "--keep-keys", "-1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "binlake diff: error: --keep-keys must be a number of keys (0 or more), got -1")
    with pytest.raises(errors.InvalidArgument, match="keep_keys must be a count"):
        diff.diff_databases(a, b, keep_keys=-1)
    monkeypatch.setenv("BINLAKE_MEMORY_DIFF_KEYS", "-1")
    assert cli.main(["diff", a, b]) == 2
    assert "diff_keys" in capsys.readouterr().err


def test_open_target_validates() -> None:
    with pytest.raises(errors.InvalidArgument, match="unsupported database 'oracle'"):
        open_target("oracle://u:p@h/db")
    with pytest.raises(errors.InvalidArgument, match="not a database URL"):
        open_target("not a url")
    assert sql_url.normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert sql_url.normalize_url("mysql://u@h/db").drivername == "mysql+pymysql"
    assert sql_url.normalize_url("mariadb+pymysql://u@h/db").drivername == "mysql+pymysql"
    assert sql_url.normalize_url("duckdb:///a/b.duckdb").drivername == "duckdb"
    for memory in ("duckdb://", "duckdb:///:memory:", "sqlite://"):
        with pytest.raises(errors.InvalidArgument, match="needs a file path"):
            open_target(memory)
    with pytest.raises(errors.Unavailable, match=r"cannot reach target postgresql\+psycopg://u:\*\*\*@127.0.0.1:1/db"):
        open_target("postgresql://u:secret@127.0.0.1:1/db")


def test_cli_diff_and_apply_exit_codes(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    from binlake import cli

    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    for url, n in ((a, 5), (b, 4)):
        with open_target(url) as t:
            t.create_table(table_info())
            t.bulk_load(table_info(), rows(n))
    assert cli.main(["diff", a, b, "--chunk-size", "2"]) == 1
    out = capsys.readouterr().out
    assert "items" in out and "DIFF" in out and "missing   id=4" in out
    assert cli.main(["diff", a, a]) == 0
    assert "all OK" in capsys.readouterr().out
    assert cli.main(["diff", a, "oracle://x/y"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unsupported database 'oracle'" in err[0]
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "r"\nlake = "l"\ntarget = "sqlite:///x.db"\nmode = "consistent"\ncolour = 1\n')
    assert cli.main(["apply", "--task", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"binlake apply: error: task file {bad}: colour: unknown key "
                   "(config/task.sample.toml lists every key)"]


def test_diff_against_an_empty_target_streams_its_fix_sql(tmp_path: pathlib.Path) -> None:
    """A table the target holds empty and one it lacks: the report counts every key and
    lists only the first ones, the fix SQL (every row's INSERT) goes to its file as it
    is found, and this process's memory stays far below the rows' size; applied, the
    fix makes the target equal."""
    import tracemalloc

    n = 25_000
    source_url, target_url = f"sqlite:///{tmp_path / 'big.db'}", f"sqlite:///{tmp_path / 'empty.db'}"
    kept_and_lost(source_url, target_url, n, 40, 201)
    fix = tmp_path / "fix.sql"
    tracemalloc.start()
    try:
        report = diff.diff_databases(source_url, target_url, chunk_size=500, fix_sql=str(fix), keep_keys=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    by_name = {t.name: t for t in report.tables}
    assert (by_name["kept"].status, by_name["kept"].missing_count, by_name["kept"].source_rows) == ("DIFF", n, n)
    assert by_name["kept"].only_in_source == [{"id": "0"}, {"id": "1"}, {"id": "10"}]
    assert (by_name["lost"].status, by_name["lost"].source_rows) == ("MISSING", n)
    assert f"{n - 3} more missing" in report.summary()  # the 3 kept are listed
    assert report.fix_statements == 2 * n + 1  # the CREATE TABLE of "lost", every row's INSERT
    size = fix.stat().st_size
    assert size > 2 * n * 60
    # The rows and their statements are on disk; memory held a chunk and the first keys.
    assert peak < size / 3, (peak, size)
    import sqlite3

    with sqlite3.connect(tmp_path / "empty.db") as db:
        db.executescript("BEGIN;\n" + fix.read_text() + "COMMIT;\n")  # as `sqlite3 empty.db < fix.sql` would
    assert diff.diff_databases(source_url, target_url).ok



def test_sqlite_inserts_in_batches_of_batch_rows(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's insert_rows and insert_arrow write ``[memory] batch_rows`` rows at a time in
    the caller's one transaction: a row is read from the caller's iterator only once the
    batches before it are inserted (the rows' parameters are never all in memory), and
    the result is the same rows."""
    import pyarrow as pa

    monkeypatch.setenv("BINLAKE_MEMORY_BATCH_ROWS", "100")
    info = sc.new_table(301, "app", "narrow", [sc.ColumnDef("id", "int", False), sc.ColumnDef("note", "string")],
                        ["id"], None, 1)
    url = f"sqlite:///{tmp_path / 't.db'}"
    n = 1_050
    with open_target(url) as t:
        t.create_table(info)
        with t.engine.connect() as conn:
            conn.begin()
            seen: list[int] = []

            def lazy_rows() -> Any:
                for i in range(n):
                    # Inserted so far, in this transaction: every full batch before row i.
                    seen.append(conn.exec_driver_sql("SELECT count(*) FROM narrow").scalar_one())
                    yield {"id": i, "note": f"n{i}"}

            assert t.insert_rows(conn, info, lazy_rows()) == n
            assert seen[99] == 0 and seen[100] == 100 and seen[1_049] == 1_000
            arrow = pa.table({"id": list(range(n, 2 * n)), "note": [None] * n})
            assert t.insert_arrow(conn, info, arrow) == n
            conn.rollback()
            assert conn.exec_driver_sql("SELECT count(*) FROM narrow").scalar_one() == 0  # one transaction
            conn.rollback()
            conn.begin()
            t.insert_rows(conn, info, lazy_rows())
            t.insert_arrow(conn, info, arrow)
            conn.commit()
    with sa.create_engine(url).connect() as c:
        got = c.exec_driver_sql("SELECT count(*), count(note), sum(id) FROM narrow").one()
    assert tuple(got) == (2 * n, n, sum(range(2 * n)))
