"""Table-level restore into a live database: ``binlake restore --tables ... --rename
OLD=NEW`` and ``--into-schema S`` on SQLite, PostgreSQL and MariaDB.

The lake is synthetic (``restore.synthetic``: three tables, every change one
transaction). Each target first gets the "live" tables (as an apply would hold
them, then written to, plus a table made by hand), and the table restored under a
new name must equal the plain restore of the original at the same T (value by
value), while every other table of the target keeps its checksum and its
recorded definition. The commands run in-process
(``binlake.cli.main``), so a refusal is seen as the user sees it: exit 2 and one
line on stderr, and the target's checksums unchanged.
"""

from __future__ import annotations

import dataclasses
import pathlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from dbfixtures import mariadb_server, postgres_server  # noqa: F401
from pyspark.sql import SparkSession

from binlake import cli
from binlake.proto import binlog_pb2
from binlake.restore import restore, synthetic
from binlake.sql import checksum, targets
from binlake.sql.url import open_target

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROWS, CHANGES, TABLES = 60, 240, 3
T0 = 1_800_000_000_000 << 18
EARLY = T0 + 4 * 90 + 2  # after the inserts and some updates: the table differs from its live state
OLD, NEW = "main.bench_0002", "bench_0002_at_early"


@dataclasses.dataclass(frozen=True)
class Lake:
    path: str
    last: int
    ref: list[tuple[Any, ...]]  # main.bench_0002's rows restored at EARLY (plain, SQLite)
    info: binlog_pb2.TableInfo  # main.bench_0002's definition
    early: str  # URL of every table restored at EARLY (plain, SQLite): the live tables' start


def _rows(url: str, info: binlog_pb2.TableInfo, name: str) -> list[tuple[Any, ...]]:
    """Every row of table ``name`` (of definition ``info``), typed as binlake created it, by key."""
    with open_target(url) as target:
        renamed = binlog_pb2.TableInfo()
        renamed.CopyFrom(info)
        renamed.name = name
        table = type(target).sa_table(renamed)
        with target.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.select(table).order_by(table.c.id))]


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Lake:
    root = tmp_path_factory.mktemp("rename")
    path = str(root / "lake")
    last = synthetic.build_lake(spark, path, ROWS, CHANGES, T0, windows=2, tables=TABLES)
    early = f"sqlite:///{root / 'early.db'}"
    restore.run(spark, path, EARLY, target=early)
    with open_target(early) as target:
        info = target.recorded_schema()["bench_0002"]
    ref = _rows(early, info, info.name)
    assert len(ref) == ROWS // TABLES
    return Lake(path, last, ref, info, early)


def _user_tables(url: str) -> dict[str, tuple[int, str]]:
    return checksum.checksum(url)


def _recorded(url: str) -> dict[str, tuple[int, bytes]]:
    with open_target(url) as target:
        return {n: (i.table_id, i.SerializeToString()) for n, i in target.recorded_schema().items()}


def binlake(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    """``binlake ARGV`` in this process: its exit status and its stderr lines."""
    capsys.readouterr()
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's refusals
        code = int(exc.code or 0)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


@pytest.fixture
def restore_cmd(lake: Lake, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, list[str]]]:
    def run(target: str, *extra: str, ts: int = EARLY) -> tuple[int, list[str]]:
        return binlake(capsys, "restore", "--lake", lake.path, "--ts", str(ts), "--master", "local[2]",
                       "--json", "--target", target, *extra)

    return run


def _live(lake: Lake, url: str) -> None:
    """The live tables, as an apply keeps them: the three tables' rows at EARLY in tables
    created with binlake's definitions (recorded in ``_binlake_schema``, claimed by no
    restore), then live writes on two of them, and a table made by hand."""
    with open_target(lake.early) as source, open_target(url) as target:
        for info in source.recorded_schema().values():
            target.create_table(info)
            with source.engine.connect() as conn:
                target.bulk_load(info, [dict(r._mapping) for r in conn.execute(sa.select(source.table(info)))])
    with open_target(url) as target, target.engine.begin() as conn:
        q = target.engine.dialect.identifier_preparer.quote
        conn.exec_driver_sql(f"UPDATE {q('bench_0001')} SET {q('k')} = {q('k')} + 1 WHERE {q('id')} <= 5")
        conn.exec_driver_sql(f"DELETE FROM {q('bench_0002')} WHERE {q('id')} = 3")
        conn.exec_driver_sql(f"CREATE TABLE {q('notes')} ({q('id')} INTEGER PRIMARY KEY, {q('body')} VARCHAR(20))")
        conn.exec_driver_sql(f"INSERT INTO {q('notes')} VALUES (1, 'kept')")


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def live(request: pytest.FixtureRequest, lake: Lake, tmp_path: pathlib.Path) -> tuple[str, str]:
    name = f"live_{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'live.db'}"
    else:
        server = request.getfixturevalue("postgres_server" if request.param == "postgresql" else "mariadb_server")
        url = server.create_database(name)
    _live(lake, url)
    return request.param, url


def test_tables_restored_under_new_names_beside_the_live_ones(
        lake: Lake, live: tuple[str, str], restore_cmd: Callable[..., tuple[int, list[str]]]) -> None:
    kind, live_url = live
    before, recorded = _user_tables(live_url), _recorded(live_url)
    two = ["--tables", f"{OLD},main.bench_0003", "--rename", f"{OLD}=main.{NEW}", "--rename", "bench_0003=b3_early"]
    if kind == "sqlite":
        # A restore that dies after its first table (SQLite loads one at a time). Run again
        # as another run, it is refused, naming the run that made the table; under that
        # run's id it replaces what it made and finishes, without --replace.
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("BINLAKE_FAILPOINT", "restore-after-table:raise:1")
            code, err = restore_cmd(live_url, *two, "--run-id", "fix-0903")
        assert code != 0 and len(set(_user_tables(live_url)) - set(before)) == 1, err
        code, err = restore_cmd(live_url, *two)
        assert code == 2 and len(err) == 1 and "run it again with --run-id fix-0903" in err[0], err
        two += ["--run-id", "fix-0903"]
    code, err = restore_cmd(live_url, *two)
    assert code == 0, err
    after = _user_tables(live_url)
    assert set(after) == {*before, NEW, "b3_early"}
    assert {n: after[n] for n in before} == before  # nothing else touched
    assert _rows(live_url, lake.info, NEW) == lake.ref
    # The live tables' recorded definitions are left as they were (the copies have ids of their own).
    now = _recorded(live_url)
    assert {n: now[n] for n in recorded} == recorded and now[NEW][0] < 0
    # Onto a live table: refused, one line, nothing written.
    code, err = restore_cmd(live_url, "--tables", OLD, "--rename", f"{OLD}=bench_0001")
    assert code == 2 and len(err) == 1 and "bench_0001" in err[0] and "--replace" in err[0], err
    assert _user_tables(live_url) == after
    if kind != "sqlite":
        return  # --replace below is the same code on every database (and costs a restore)
    # Onto the live table refused above, with --replace: it is overwritten, and only it.
    code, err = restore_cmd(live_url, "--tables", OLD, "--rename", f"{OLD}=bench_0001", "--replace")
    assert code == 0, err
    assert _rows(live_url, lake.info, "bench_0001") == lake.ref
    final = _user_tables(live_url)
    assert final["bench_0001"] != before["bench_0001"]
    assert {n: final[n] for n in before if n != "bench_0001"} == {n: v for n, v in before.items() if n != "bench_0001"}


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_into_schema_puts_the_tables_in_a_new_schema(
        request: pytest.FixtureRequest, lake: Lake, kind: str,
        restore_cmd: Callable[..., tuple[int, list[str]]]) -> None:
    server = request.getfixturevalue("postgres_server" if kind == "postgresql" else "mariadb_server")
    url = server.create_database(f"live_{uuid.uuid4().hex[:10]}")
    _live(lake, url)
    before = _user_tables(url)
    schema = f"restored_{uuid.uuid4().hex[:8]}"
    # A rename naming another schema than --into-schema's: refused before anything.
    code, err = restore_cmd(url, "--tables", f"{OLD},main.bench_0003", "--into-schema", schema,
                            "--rename", f"{OLD}=elsewhere.x")
    assert code == 2 and len(err) == 1 and "conflicts with --into-schema" in err[0], err
    with open_target(url) as target:
        assert not target.has_namespace(schema)
    code, err = restore_cmd(url, "--tables", f"{OLD},main.bench_0003", "--into-schema", schema,
                            "--rename", f"{OLD}={schema}.{NEW}")
    assert code == 0, err
    assert _user_tables(url) == before  # the target's own schema/database untouched
    with open_target(url) as target:
        assert target.has_namespace(schema)
        scoped = type(target).namespace_url(target.engine.url, schema).render_as_string(hide_password=False)
    assert set(_user_tables(scoped)) == {NEW, "bench_0003"}
    assert _rows(scoped, lake.info, NEW) == lake.ref


@pytest.fixture(scope="module")
def sqlite_live(lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One live SQLite target for every refusal: each must leave it as it was."""
    url = f"sqlite:///{tmp_path_factory.mktemp('refusals') / 'live.db'}"
    _live(lake, url)
    yield url


@pytest.mark.parametrize(("extra", "says"), [
    (["--rename", "main.nope=x"], "main.nope is not among the restored tables"),
    (["--rename", "bench_0003=x"], "bench_0003 is not among the restored tables"),  # restored: only --tables
    (["--tables", f"{OLD},main.bench_0003", "--rename", f"{OLD}=x,main.bench_0003=X"], "would both be"),
    (["--tables", f"{OLD},main.bench_0003", "--rename", f"{OLD}=bench_0003"], "would both be"),
    (["--rename", f"{OLD}=_binlake_restore_claims"], "binlake keeps for its own tables"),
    (["--rename", f"{OLD}=sqlite_x"], "SQLite keeps for itself"),
    (["--rename", f"{OLD}=other.x"], "SQLite has no schemas"),
    (["--rename", f"{OLD}=a.b.c"], "is not TABLE or DB.TABLE"),
    (["--rename", f"{OLD}"], "give OLD=NEW"),
    (["--into-schema", "s"], "SQLite has no schemas"),
    (["--rename", f"{OLD}=x", "--verify", "LIVE"], "--verify compares tables under their own names"),
])
def test_bad_names_are_one_line_and_write_nothing(
        sqlite_live: str, restore_cmd: Callable[..., tuple[int, list[str]]], extra: list[str], says: str) -> None:
    before, recorded = _user_tables(sqlite_live), _recorded(sqlite_live)
    extra = [sqlite_live if a == "LIVE" else a for a in extra]  # an existing database: nothing made in the cwd
    argv = extra if "--tables" in extra else ["--tables", OLD, *extra]
    code, err = restore_cmd(sqlite_live, *argv)
    assert code == 2 and len(err) == 1, err
    assert says in err[0]
    assert _user_tables(sqlite_live) == before and _recorded(sqlite_live) == recorded


def test_a_name_too_long_for_postgresql_is_refused(
        postgres_server: Any, restore_cmd: Callable[..., tuple[int, list[str]]]) -> None:  # noqa: F811
    url = postgres_server.create_database(f"live_{uuid.uuid4().hex[:10]}")
    code, err = restore_cmd(url, "--tables", OLD, "--rename", f"{OLD}={'x' * 64}")
    assert code == 2 and len(err) == 1 and "64 bytes long; PostgreSQL keeps 63" in err[0], err
    assert checksum.checksum(url, include_internal=True) == {}


def test_rename_without_a_destination_and_with_out(
        lake: Lake, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    from deltalake import DeltaTable

    base = ["restore", "--lake", lake.path, "--ts", str(EARLY), "--master", "local[2]", "--json", "--tables", OLD]
    code, err = binlake(capsys, *base, "--rename", f"{OLD}={NEW}")
    assert code == 2 and len(err) == 1 and "give a destination" in err[0], err
    # --out: the directory takes the new name; a name no directory can have is refused.
    out = tmp_path / "out"
    code, err = binlake(capsys, *base, "--out", str(out), "--rename", f"{OLD}=_archive.x")
    assert code == 2 and len(err) == 1 and "begins with _ or ." in err[0], err
    assert not out.exists() or not any(out.iterdir())
    code, err = binlake(capsys, *base, "--out", str(out), "--rename", f"{OLD}=archive.{NEW}")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["_binlake_restore.json", f"archive.{NEW}"]
    got = DeltaTable(str(out / f"archive.{NEW}")).to_pyarrow_table().sort_by("id")
    assert [tuple(r.values()) for r in got.to_pylist()] == lake.ref


def test_the_restore_dag_tasks_rename_into_a_live_target(
        lake: Lake, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The binlake_restore tasks' bodies in order, as a run calls them (a ``dag.test()``
    run of the same costs a minute on a loaded machine; tests/dags runs the DAG itself)."""
    import airflowkit  # noqa: F401 - Airflow's private home, set before Airflow is imported (tests/dags may not run)
    from airflow.sdk.exceptions import AirflowFailException
    from binlake_airflow import restore_tasks

    monkeypatch.setenv("BINLAKE_LAKE_DIR", lake.path)
    url = f"sqlite:///{tmp_path / 'live.db'}"
    _live(lake, url)
    before = _user_tables(url)
    conf = {"commit_ts": EARLY, "tables": OLD, "target": url}
    # Into a name of the live tables: refused before anything is rebuilt.
    with pytest.raises(AirflowFailException, match="already holds table.*bench_0001.*set replace"):
        restore_tasks.check_coverage(restore_tasks.resolve({**conf, "rename": f"{OLD}=bench_0001"}, "manual__x"))
    resolved = restore_tasks.resolve({**conf, "rename": f"{OLD}={NEW}"}, "manual__rename")
    assert restore_tasks.check_coverage(resolved)["tables"][0]["into"] == NEW
    restore_tasks.rebuild(resolved)
    loaded = restore_tasks.load(resolved)["loaded"]
    assert loaded == [{"table": OLD, "rows": len(lake.ref), "into": NEW}]
    after = _user_tables(url)
    assert {n: after[n] for n in before} == before and set(after) == {*before, NEW}
    assert _rows(url, lake.info, NEW) == lake.ref


def test_the_target_kinds_say_what_names_they_take() -> None:
    pg, my, lite = targets.PostgreSQL, targets.MySQL, targets.SQLite
    assert pg.name_problem("x" * 63) is None and "PostgreSQL keeps 63" in str(pg.name_problem("é" * 32))
    assert "pg_" in str(pg.name_problem("pg_archive", namespace=True)) and pg.name_problem("pg_t") is None
    assert "at most 64" in str(my.name_problem("x" * 65)) and "Basic Multilingual" in str(my.name_problem("a\U0001f600"))
    assert "space" in str(lite.name_problem("x ")) and "control" in str(lite.name_problem("a\tb"))
    url = sa.engine.make_url("postgresql+psycopg://u@h/db")
    assert pg.namespace_url(url, "my schema").query["options"] == '-csearch_path="my\\ schema"'
    assert my.namespace_url(sa.engine.make_url("mysql+pymysql://u@h/db?charset=utf8mb4"), "s").database == "s"
