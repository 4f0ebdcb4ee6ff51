"""Tables too big for the task process are loaded into a target from the executors'
Arrow batches, dates and datetimes included: each target kind ends with exactly the
table's typed rows.

``[memory] direct_rows`` 0 makes every table count as too big to decode in this
process, so a few hundred rows take the path a table of millions takes: rebuilt by
Spark, streamed as Arrow IPC messages, loaded by the target's ``insert_arrow``
(PostgreSQL: ``COPY`` of Arrow's CSV; DuckDB: the arrays; SQLite and the others: the
values as ``binlake.codec`` decodes them)."""

from __future__ import annotations

import pathlib
import shutil
import uuid
from typing import Any

import pytest
from dbfixtures import postgres_server  # noqa: F401
from pyspark.sql import SparkSession

from binlake.proto import binlog_pb2
from binlake.restore import checks, onepass, patch, restore, snapshot, stream, synthetic
from binlake.sql import checksum

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

T0 = 1_800_000_000_000 << 18
ROWS = 400


@pytest.fixture(scope="module")
def wide(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, str, tuple[int, str]]:
    """A lake of the wide synthetic table (dates, datetimes, decimals, a double, text,
    nulls; two changes a row), its last ts, the table's name and its expected checksum."""
    lake = str(tmp_path_factory.mktemp("typed-load") / "lake")
    last = synthetic.build_lake(spark, lake, ROWS, 2 * ROWS, T0, windows=1, shape="wide")
    info = restore.plan(spark, lake, last).tables[0].info
    assert {binlog_pb2.DATE, binlog_pb2.DATETIME} <= {c.type for c in info.columns}
    want = checks.frame_checksum(synthetic.wide_final_rows(spark, ROWS, 2 * ROWS), info)
    assert want[0] == ROWS
    return lake, last, info.name, want


@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "postgresql"])
def test_a_table_rebuilt_by_the_executors_loads_as_arrow_into_each_target_kind(
        kind: str, spark: SparkSession, wide: tuple[str, int, str, tuple[int, str]], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    lake, last, name, want = wide
    if kind == "postgresql":
        target = request.getfixturevalue("postgres_server").create_database(f"typed_{uuid.uuid4().hex[:10]}")
    else:
        target = f"{kind}:///{tmp_path / ('restored.' + kind)}"
    monkeypatch.setenv("BINLAKE_MEMORY_DIRECT_ROWS", "0")
    calls: list[str] = []
    arrow_tables, python_rows = stream.arrow_tables, stream.python_rows

    def spy_arrow(df: Any, info: binlog_pb2.TableInfo) -> Any:
        calls.append("arrow")
        return arrow_tables(df, info)

    def spy_rows(df: Any, info: binlog_pb2.TableInfo) -> Any:
        calls.append("rows")
        return python_rows(df, info)

    widest: list[tuple[int, int]] = []
    widest_partition = onepass.widest_partition

    def spy_widest(shared: Any) -> tuple[int, int]:
        widest.append(widest_partition(shared))
        return widest[-1]

    monkeypatch.setattr(stream, "arrow_tables", spy_arrow)
    monkeypatch.setattr(stream, "python_rows", spy_rows)
    monkeypatch.setattr(onepass, "widest_partition", spy_widest)
    result = restore.run(spark, lake, last, target=target, source="changes")
    assert result.rows == ROWS
    assert calls == ["arrow"]
    # No table streams through this process and the one pass's partitions were within
    # the bounds: its first checkpoint was read as it was (no second shuffle).
    assert len(widest) == 1 and onepass.within_bounds(widest[0]) and widest[0][0] > 0
    assert checksum.checksum(target, [name]) == {name: want}


@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "postgresql"])
def test_a_restore_from_a_snapshot_of_an_unchanged_table_reads_its_files_in_batches(
        kind: str, spark: SparkSession, wide: tuple[str, int, str, tuple[int, str]], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """At the snapshot's ts, and at a later ts with no change of the table in between,
    the target gets the snapshot's rows read from its Parquet files in this process,
    in batches of ``[memory] batch_rows`` rows (several here), with no Spark rebuild
    of the table; the rows are the table's at that ts (as the replay of every change
    gives it), value by value."""
    lake, last, name, at_last = wide
    lake = str(shutil.copytree(lake, tmp_path / "lake"))
    # Changes commit every 4 ts: (last - 3, last - 1] holds none, the last one is at last.
    snap, later = last - 3, last - 1
    expected = {}
    for ts in (snap, later):
        ref = f"sqlite:///{tmp_path / f'replayed-{ts}.db'}"
        restore.run(spark, lake, ts, target=ref, source="changes")
        expected[ts] = checksum.checksum(ref, [name])
    assert expected[snap] == expected[later] != {name: at_last}  # the last change is not in them
    snapshot.take(spark, lake, snap)
    monkeypatch.setenv("BINLAKE_MEMORY_BATCH_ROWS", "100")
    monkeypatch.setenv("BINLAKE_MEMORY_DIRECT_ROWS", "0")
    spark_paths: list[str] = []
    batches: list[int] = []
    arrow_tables, python_rows, base_tables = stream.arrow_tables, stream.python_rows, stream.base_tables
    monkeypatch.setattr(stream, "arrow_tables", lambda *a: spark_paths.append("arrow") or arrow_tables(*a))
    monkeypatch.setattr(stream, "python_rows", lambda *a: spark_paths.append("rows") or python_rows(*a))

    def spy_base(*args: Any) -> Any:
        got = base_tables(*args)
        assert got is not None, "the snapshot's files were not read directly"
        return (batches.append(t.num_rows) or t for t in got)

    monkeypatch.setattr(stream, "base_tables", spy_base)
    for ts in (snap, later):
        if kind == "postgresql":
            target = request.getfixturevalue("postgres_server").create_database(f"snap_{uuid.uuid4().hex[:10]}")
        else:
            target = f"{kind}:///{tmp_path / f'restored-{ts}.{kind}'}"
        batches.clear()
        result = restore.run(spark, lake, ts, target=target)
        assert [(n, rows, base) for n, rows, base in result.tables] == [(f"main.{name}", ROWS, "snapshot")]
        assert spark_paths == []
        assert len(batches) >= ROWS // 100 and max(batches) <= 100 and sum(batches) == ROWS
        assert checksum.checksum(target, [name]) == expected[ts]


@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "postgresql"])
def test_a_restore_from_a_snapshot_and_later_changes_copies_the_snapshot_then_patches_the_changed_keys(
        kind: str, spark: SparkSession, wide: tuple[str, int, str, tuple[int, str]], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """A restore to a ts after a snapshot, with changes of the table in between: the
    snapshot's files are copied into the target as they are, then each key changed
    since is deleted and its row at T inserted (``patch``), with no Spark rebuild of
    the table; the result equals the replay of every change, value by value."""
    lake, last, name, at_last = wide
    lake = str(shutil.copytree(lake, tmp_path / "lake"))
    # Change n commits at T0 + 4n: the snapshot holds the inserts and the first 200
    # updates; the last 200 updates (of random rows, some twice) come after it.
    snap = T0 + 4 * (ROWS + 200 - 1)
    snapshot.take(spark, lake, snap)
    monkeypatch.setenv("BINLAKE_MEMORY_BATCH_ROWS", "100")
    monkeypatch.setenv("BINLAKE_MEMORY_DIRECT_ROWS", "0")
    copied: list[int] = []
    deleted: list[int] = []
    base_tables = stream.base_tables

    def spy_base(*args: Any) -> Any:
        got = base_tables(*args)
        assert got is not None, "the snapshot's files were not read directly"
        return (copied.append(t.num_rows) or t for t in got)

    monkeypatch.setattr(stream, "base_tables", spy_base)
    apply = patch.Changed.apply

    def spy_apply(self: patch.Changed, target: Any, conn: Any) -> int:
        keys = [len(batch) for batch in self.keys()]
        assert keys and max(keys) <= 100  # in batches of [memory] batch_rows
        deleted.append(sum(keys))
        return apply(self, target, conn)

    monkeypatch.setattr(patch.Changed, "apply", spy_apply)
    if kind == "postgresql":
        target = request.getfixturevalue("postgres_server").create_database(f"patch_{uuid.uuid4().hex[:10]}")
    else:
        target = f"{kind}:///{tmp_path / f'patched.{kind}'}"
    result = restore.run(spark, lake, last, target=target)
    assert [(n, rows, base) for n, rows, base in result.tables] == [(f"main.{name}", ROWS, "snapshot + changes")]
    assert sum(copied) == ROWS
    assert len(deleted) == 1 and 0 < deleted[0] <= 200
    assert checksum.checksum(target, [name]) == {name: at_last}
