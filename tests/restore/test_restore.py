"""Restore to a commit_ts against the truth: the upstream's own state captured at known ts.

One SQLite upstream runs the ``mixed`` workload (bank transfers, OLTP with key
changes, and DDL: add/drop/rename/retype column, rename/truncate/create/drop
table) in four slices through TxnWriter and two Pump processes; after each
slice the upstream's checksums are taken at a fresh TSO. The binlogs are
ingested in three windows whose bounds fall between the captures. Restoring to
each captured ts must give exactly the captured checksums, whichever base the
restore starts from (the whole history, a snapshot, the history tables).
"""

from __future__ import annotations

import decimal
import json
import os
import pathlib
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import PUMP_ARGS, Upstream, ingest_all, run_captured
from dbfixtures import mariadb_server, postgres_server  # noqa: F401
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from binlake import cli, errors, failpoint, tso
from binlake.lake.store.ledger import read_windows
from binlake.restore import checks, history, layout, restore, snapshot
from binlake.restore import tables as restore_tables
from binlake.sql import checksum
from binlake.testing.devcluster import DevCluster
from binlake.workload import ops as wops
from binlake.workload import plan as wplan

ACCOUNTS = 20
# One workload, four captures, three ingests, then many Spark restores: minutes on two cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def captured(cluster: DevCluster, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Upstream, str, list[int]]]:
    root = tmp_path_factory.mktemp("restore")
    plan = wplan.plan("mixed", 2, 180, 5, large_txn_rows=150, large_txn_every=60, ddl_every=8, table_rows=60,
                      accounts=ACCOUNTS)
    up = run_captured(f"sqlite:///{root / 'up.db'}", cluster.registry_addr, plan, 4, root)
    a, b = up.start_ts, up.end_ts
    bounds = [a + (b - a) * i // 3 for i in range(4)]
    lake = str(root / "lake")
    ingest_all(spark, lake, cluster.registry_addr, bounds)
    yield up, lake, bounds


def checksums_at(spark: SparkSession, lake: str, ts: int, source: str = "changes",
                 tables: list[str] | None = None) -> tuple[dict[str, tuple[int, str]], list[str]]:
    p = restore.plan(spark, lake, ts, tables, source)
    frames = restore_tables.frames(spark, p)
    got = {t.info.name: checks.frame_checksum(frames[t.table_id], t.info) for t in p.tables}
    return got, [t.base.kind for t in p.tables]


def test_restore_from_the_whole_history_equals_the_upstream_at_every_capture(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]]) -> None:
    up, lake, _bounds = captured
    # The workload's DDL changed the set of tables between captures (renames, truncates).
    assert len({frozenset(c.checksums) for c in up.captures}) > 1
    for cap in up.captures:
        got, bases = checksums_at(spark, lake, cap.ts)
        assert got == cap.checksums, f"at {cap.ts}"
        assert set(bases) == {"lake start"}


def test_restore_out_writes_typed_delta_tables_and_a_manifest(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]], tmp_path: pathlib.Path) -> None:
    up, lake, _ = captured
    cap = up.captures[1]
    out = tmp_path / "out"
    result = restore.run(spark, lake, cap.ts, out=str(out))
    manifest = json.loads((out / restore.MANIFEST).read_text())
    assert manifest["ts"] == cap.ts and manifest["rows"] == sum(n for n, _ in cap.checksums.values())
    assert {t.split(".")[1] for t, _, _ in result.tables} == set(cap.checksums)
    schema = restore.plan(spark, lake, cap.ts).tables
    for t in schema:
        df = spark.read.format("delta").load(restore.out_path(str(out), t.info))
        assert checks.frame_checksum(df, t.info) == cap.checksums[t.info.name]
    accounts = spark.read.format("delta").load(str(out / f"main.{wops.BANK_TABLE}"))
    types = dict(accounts.dtypes)
    assert types["id"] == "bigint" and types["balance"] == "decimal(20,2)" and types["owner"] == "string"
    # Restoring into the same --out again is refused unless --replace.
    with pytest.raises(errors.AlreadyExists, match="--replace"):
        restore.run(spark, lake, cap.ts, out=str(out))


def test_restore_into_a_target_database_verified_by_diff(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]], tmp_path: pathlib.Path) -> None:
    up, lake, _ = captured
    cap = up.captures[2]
    assert cap.copy is not None
    source = f"sqlite:///{cap.copy}"
    target = f"sqlite:///{tmp_path / 'restored.db'}"
    result = restore.run(spark, lake, cap.ts, target=target, verify_url=source)
    assert result.verified is not None and result.verified.startswith("clean"), result.verified
    assert result.rows == sum(n for n, _ in cap.checksums.values())
    assert checksum.checksum(target, list(cap.checksums), schema=checksum.load_schema(source)) == cap.checksums
    # An unreachable target is refused before anything is rebuilt; an existing table is not overwritten.
    with pytest.raises(errors.Unavailable, match="cannot reach target"):
        restore.run(spark, lake, cap.ts, target="postgresql+psycopg://nobody@127.0.0.1:1/none")
    with pytest.raises(errors.BinlakeError):
        restore.run(spark, lake, cap.ts, target=target)
    assert checksum.checksum(target, list(cap.checksums), schema=checksum.load_schema(source)) == cap.checksums


def test_restore_into_duckdb_through_the_cli_then_diff(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]], tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An analyst's restore: every table at a ts into a DuckDB file, verified, as the CLI runs it."""
    up, lake, _ = captured
    cap = up.captures[1]
    assert cap.copy is not None
    source = f"sqlite:///{cap.copy}"
    target = f"duckdb:///{tmp_path / 'laptop' / 'restored.duckdb'}"
    assert cli.main(["restore", "--lake", lake, "--ts", str(cap.ts), "--target", target, "--verify", source]) == 0
    assert "clean" in capsys.readouterr().out
    assert cli.main(["diff", source, target]) == 0
    assert "all OK" in capsys.readouterr().out
    assert checksum.checksum(target, list(cap.checksums), schema=checksum.load_schema(source)) == cap.checksums
    # Its tables are plain DuckDB tables: the bank's total is one query away.
    import duckdb

    with duckdb.connect(str(tmp_path / "laptop" / "restored.duckdb"), read_only=True) as db:
        total, n = db.execute(f"SELECT sum(balance), count(*) FROM {wops.BANK_TABLE}").fetchone() or (None, 0)
    assert (total, n) == (cap.bank_total, cap.accounts)
    # A second restore into the same file refuses the tables it holds, and changes nothing.
    assert cli.main(["restore", "--lake", lake, "--ts", str(cap.ts), "--target", target]) != 0
    assert checksum.checksum(target, list(cap.checksums), schema=checksum.load_schema(source)) == cap.checksums


def test_bank_total_and_accounts_hold_at_many_ts(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]]) -> None:
    up, lake, bounds = captured
    # Window edges +-1, inside windows, and the captures.
    points = sorted({bounds[1] - 1, bounds[1], bounds[2] + 1, (bounds[2] + bounds[3]) // 2 + 12345})
    expected = decimal.Decimal(ACCOUNTS * 1000)
    for ts in points:
        if ts < up.captures[0].ts // 2:
            continue
        p = restore.plan(spark, lake, ts, [wops.BANK_TABLE])
        df = restore_tables.frames(spark, p)[p.tables[0].table_id]
        row = df.agg(F.sum("balance").alias("total"), F.count("*").alias("n")).collect()[0]
        if row["n"] == 0:  # before the accounts were loaded
            continue
        assert (row["total"], row["n"]) == (expected, ACCOUNTS), f"at {ts}"
    for cap in up.captures:
        assert (cap.bank_total, cap.accounts) == (expected, ACCOUNTS)


def test_snapshot_plus_changes_equals_whole_history_equals_history_tables(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]]) -> None:
    up, lake, _ = captured
    first = snapshot.take(spark, lake, up.captures[1].ts)
    assert first.rows == sum(n for n, _ in up.captures[1].checksums.values())
    # A second snapshot starts from the first one.
    second = snapshot.take(spark, lake, up.captures[2].ts)
    assert {base for _t, _n, base in second.tables} <= {"snapshot", "snapshot (table created later)", "lake start"}
    assert "snapshot" in {base for _t, _n, base in second.tables}
    made = history.update(spark, lake)
    assert made.applied_end_ts == read_windows(spark, lake)[-1]["end_ts"]
    for cap in up.captures[2:]:
        from_snapshot, bases = checksums_at(spark, lake, cap.ts, "auto")
        assert "snapshot" in bases
        from_history, hbases = checksums_at(spark, lake, cap.ts, "history")
        assert set(hbases) == {"history"}
        whole, _ = checksums_at(spark, lake, cap.ts, "changes")
        assert from_snapshot == whole == from_history == cap.checksums, f"at {cap.ts}"
    # The snapshot's own tables equal the upstream at its ts.
    for e in snapshot.catalog(spark, lake):
        if e.snapshot_ts == up.captures[1].ts and e.info is not None:
            df = spark.read.format("delta").load(e.path)
            assert checks.frame_checksum(df, e.info) == up.captures[1].checksums[e.tbl]


def test_a_restore_into_a_database_copies_a_snapshot_then_patches_the_tables_whose_definition_held(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore two captures after a snapshot, through transfers and DDL: the tables
    whose definition held since the snapshot are its rows copied then patched with the
    keys changed since (``patch``), the others rebuilt by Spark; either way every table
    equals the upstream's at the ts, value by value."""
    kind = "duckdb"
    up, lake, _ = captured
    lake = str(shutil.copytree(lake, tmp_path / "lake"))
    snapshot.take(spark, lake, up.captures[1].ts)
    monkeypatch.setenv("BINLAKE_MEMORY_DIRECT_ROWS", "0")
    kinds: set[str] = set()
    for i, cap in enumerate(up.captures[3:]):
        assert cap.copy is not None
        target = f"{kind}:///{tmp_path / f'restored-{i}.{kind}'}"
        result = restore.run(spark, lake, cap.ts, target=target)
        kinds |= {base for _t, _n, base in result.tables}
        schema = checksum.load_schema(f"sqlite:///{cap.copy}")
        assert checksum.checksum(target, list(cap.checksums), schema=schema) == cap.checksums, f"at {cap.ts}"
    assert "snapshot + changes" in kinds


@pytest.fixture(scope="module")
def oltp_captured(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Upstream, str]]:
    """The ``oltp`` workload (deletes, range deletes, primary-key changes, unique-value
    swaps, delete and re-insert; no DDL) captured three times, ingested in two windows,
    through a cluster of its own (the ``mixed`` workload's tables have the same ids)."""
    root = tmp_path_factory.mktemp("restore-oltp")
    plan = wplan.plan("oltp", 2, 150, 7, large_txn_rows=60, large_txn_every=50, table_rows=80)
    with DevCluster(root / "cluster", pumps=2, pump_args=PUMP_ARGS) as cluster:
        up = run_captured(f"sqlite:///{root / 'up.db'}", cluster.registry_addr, plan, 3, root)
        lake = str(root / "lake")
        # From ts 1: the plan's setup (its CREATE TABLEs) comes before start_ts.
        ingest_all(spark, lake, cluster.registry_addr, [1, (up.start_ts + up.end_ts) // 2, up.end_ts])
    yield up, lake


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mariadb"])
def test_a_snapshot_patched_with_deletes_key_changes_and_unique_swaps_equals_the_upstream(
        kind: str, spark: SparkSession, oltp_captured: tuple[Upstream, str], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Every table's snapshot copied then patched (``patch``: every key changed since
    deleted, then the keys' rows at T inserted) equals the upstream at each later
    capture, through deletes, key changes and swaps of unique values between rows."""
    up, lake = oltp_captured
    lake = str(shutil.copytree(lake, tmp_path / "lake"))
    snapshot.take(spark, lake, up.captures[0].ts)
    monkeypatch.setenv("BINLAKE_MEMORY_DIRECT_ROWS", "0")
    # SQLite at both later captures; the servers at the last one (the longest patch).
    for i, cap in enumerate(up.captures[1:] if kind == "sqlite" else up.captures[2:]):
        assert cap.copy is not None
        if kind == "sqlite":
            target = f"sqlite:///{tmp_path / f'restored-{i}.db'}"
        else:
            server = request.getfixturevalue({"postgresql": "postgres_server", "mariadb": "mariadb_server"}[kind])
            target = str(server.create_database(f"patched_{uuid.uuid4().hex[:10]}"))
        result = restore.run(spark, lake, cap.ts, target=target)
        assert {base for _t, _n, base in result.tables} == {"snapshot + changes"}
        schema = checksum.load_schema(f"sqlite:///{cap.copy}")
        assert checksum.checksum(target, list(cap.checksums), schema=schema) == cap.checksums, f"at {cap.ts}"


def test_history_tables_are_plain_sql_at_any_ts_and_idempotent(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]]) -> None:
    up, lake, _ = captured
    history.update(spark, lake)
    cat = history.catalog(spark, lake)
    before = {tid: sorted(map(tuple, spark.read.format("delta").load(row["path"]).collect()), key=repr)
              for tid, row in cat.items()}
    again = history.update(spark, lake)
    assert {what for _n, what in again.tables} == {"up to date"}
    after = {tid: sorted(map(tuple, spark.read.format("delta").load(row["path"]).collect()), key=repr)
             for tid, row in history.catalog(spark, lake).items()}
    assert after == before
    # The documented query, in plain Spark SQL, on the bank table.
    bank = next(row for row in cat.values() if row["tbl"] == wops.BANK_TABLE)
    for cap in up.captures:
        total, n = spark.sql(
            f"SELECT sum(balance), count(*) FROM delta.`{bank['path']}` "
            f"WHERE _valid_from_ts <= {cap.ts} AND (_valid_to_ts IS NULL OR _valid_to_ts > {cap.ts})").collect()[0]
        assert (total, n) == (cap.bank_total, cap.accounts)
    hist = spark.read.format("delta").load(bank["path"])
    assert {r["_op"] for r in hist.select("_op").distinct().collect()} == {"insert", "update"}
    # A version never ends before it begins; at most one open version per key.
    assert hist.where("_valid_to_ts <= _valid_from_ts").count() == 0
    assert hist.where("_valid_to_ts IS NULL").groupBy("id").count().where("count > 1").count() == 0


def test_refusals_name_the_fix_and_write_nothing(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]], tmp_path: pathlib.Path) -> None:
    up, lake, bounds = captured
    out = tmp_path / "never"
    cases: list[tuple[Any, type[Exception], str]] = [
        (bounds[3], errors.FailedPrecondition, f"ingest \\[{bounds[3]}, {bounds[3] + 1}\\)"),  # above the lake
        (bounds[0] - 1, errors.FailedPrecondition, "before the oldest data the lake holds"),
    ]
    for ts, exc, message in cases:
        with pytest.raises(exc, match=message):
            restore.run(spark, lake, ts, out=str(out))
    with pytest.raises(errors.InvalidArgument, match="no table 'nope' exists at commit_ts"):
        restore.run(spark, lake, up.captures[0].ts, tables=["nope"], out=str(out))
    with pytest.raises(errors.InvalidArgument, match="exactly one destination"):
        restore.run(spark, lake, up.captures[0].ts)
    assert not out.exists()
    # The same through the CLI: one line, exit status 2.
    code = cli.main(["restore", "--lake", lake, "--ts", str(bounds[3] + 10), "--out", str(out), "--json"])
    assert code == 2 and not out.exists()
    assert cli.main(["restore", "--lake", lake, "--datetime", "yesterday", "--out", str(out)]) == 2


def test_a_snapshot_killed_half_way_is_never_used(
        spark: SparkSession, captured: tuple[Upstream, str, list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    up, lake, _ = captured
    ts = up.captures[3].ts
    monkeypatch.setenv(failpoint.ENV, "snapshot-after-table:raise")
    with pytest.raises(failpoint.FailpointError):
        snapshot.take(spark, lake, ts)
    monkeypatch.delenv(failpoint.ENV)
    assert os.path.isdir(layout.snapshot_table(lake, ts, min(restore.plan(spark, lake, ts).tables,
                                                             key=lambda t: t.table_id).table_id))
    assert ts not in {e.snapshot_ts for e in snapshot.catalog(spark, lake)}
    got, bases = checksums_at(spark, lake, ts, "auto")
    assert got == up.captures[3].checksums and ts not in {0}
    # Taken again, it completes and is used.
    snapshot.take(spark, lake, ts)
    got, bases = checksums_at(spark, lake, ts, "auto")
    assert got == up.captures[3].checksums


def test_datetime_converts_as_reparo_does() -> None:
    ts = restore.resolve_ts(datetime="2026-11-21T08:00:00", tz="Europe/Paris")
    assert ts == tso.compose(int(tso.to_datetime(ts).timestamp() * 1000), 0)
    assert tso.to_datetime(ts).hour == 7  # 08:00 in Paris is 07:00 UTC in November
    assert restore.resolve_ts(datetime="2026-11-21T08:00:00+00:00") == restore.resolve_ts(
        datetime="2026-11-21T08:00:00", tz="UTC")
    for kwargs, message in (({}, "exactly one"), ({"commit_ts": 5, "datetime": "2026-01-01"}, "exactly one"),
                            ({"datetime": "2026-11-21", "tz": "Mars/Base"}, "unknown time zone"),
                            ({"commit_ts": -3}, "positive integer"), ({"datetime": "noon"}, "cannot read")):
        with pytest.raises(errors.InvalidArgument, match=message):
            restore.resolve_ts(**kwargs)
