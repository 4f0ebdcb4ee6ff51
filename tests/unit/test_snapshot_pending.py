"""A table whose initial snapshot is still being sent (``TableInfo.snapshot_pending``):
its rows decode, yet it exists for no reader until its "complete" marker, and a
restore naming it at such a ts is refused in one line saying from when it is
restorable; an unfinished attempt's table, replaced by the retake's, never counts."""

from __future__ import annotations

import pytest

from binlake import errors
from binlake.lake.decoding.schema_history import SchemaHistory
from binlake.proto import binlog_pb2
from binlake.restore import rebuild
from binlake.restore.history import ended_ts, exists_from


def table(table_id: int, pending: bool, previous: int = 0, name: str = "acc") -> binlog_pb2.TableInfo:
    info = binlog_pb2.TableInfo(table_id=table_id, db="app", name=name, schema_version=1, next_column_id=2,
                                snapshot_pending=pending, previous_table_id=previous)
    info.columns.add(id=1, name="id", type=binlog_pb2.INT, sql_type="int")
    info.primary_key.append(1)
    return info


def history() -> SchemaHistory:
    """Attempt 1 defines id 100 at 10 (pending) and dies; attempt 2 replaces it with id 101 at
    30 (pending), its marker commits at 50; table ``other`` (id 7) is ordinary all along."""
    h = SchemaHistory()
    h.add(5, table(7, False, name="other"))
    h.add(10, table(100, True))
    h.add(30, table(101, True, previous=100))
    h.add(50, table(101, False))
    return h


def upto(h: SchemaHistory, ts: int) -> SchemaHistory:
    """The definitions of ``h`` with commit_ts <= ts: what a restore at ts loads."""
    out = SchemaHistory()
    for at, info in h.entries():
        if at <= ts:
            out.add(at, info)
    return out


def test_pending_tables_decode_but_do_not_exist() -> None:
    h = history()
    # Rows written under a pending definition decode with it.
    assert h.table(100, 20).name == "acc" and h.table(101, 40).snapshot_pending
    assert h.defined(101, 40) and h.pending(101, 40) and not h.knows(101, 40)
    assert not h.knows(100, 20) and not h.defined(100, 31), "the retake retired the unfinished attempt's id"
    assert h.knows(101, 51) and not h.pending(101, 51)
    assert rebuild.versions(h, 101)[1].name == "acc"
    assert set(rebuild.tables_at(h, 20)) == {7}
    assert set(rebuild.tables_at(h, 40)) == {7}
    assert set(rebuild.tables_at(h, 40, pending=True)) == {7, 101}
    assert set(rebuild.tables_at(h, 50)) == {7, 101}
    assert h.restorable_from("app", "acc", 20) == 50
    assert h.restorable_from("app", "acc", 50) is None
    # The unfinished id ended when the retake replaced it; the completed one lives on.
    assert ended_ts(h, 100) == 30 and ended_ts(h, 101) is None
    # History tables: built for a table from its marker on, never for the unfinished attempt's id.
    assert exists_from(h, 101) == 50 and exists_from(h, 100) is None and exists_from(h, 7) == 5


def test_restore_naming_a_pending_table_is_one_line_with_the_ts_it_is_restorable_from() -> None:
    h = history()
    # What a restore at 40 loads: the DDLs up to 40; the whole history says from when.
    schema_at_40 = upto(h, 40)
    found = rebuild.tables_at(schema_at_40, 40)
    with pytest.raises(errors.FailedPrecondition) as exc:
        rebuild.select_tables(found, ["app.acc"], 40, schema_at_40, lambda: h)
    msg = str(exc.value)
    assert "\n" not in msg and "initial snapshot" in msg and "in progress" in msg
    assert "restorable from commit_ts 50" in msg and "app.acc" in msg
    # Inside the unfinished attempt too; without the whole history, it says the end is not in the lake yet.
    with pytest.raises(errors.FailedPrecondition, match="no end of that snapshot yet"):
        rebuild.select_tables(rebuild.tables_at(h, 20), ["acc"], 20, h)
    # Any other unknown name keeps its own refusal; a table that exists is chosen.
    with pytest.raises(errors.InvalidArgument, match="no table 'nope'"):
        rebuild.select_tables(found, ["nope"], 40, h)
    assert set(rebuild.select_tables(rebuild.tables_at(h, 60), ["acc"], 60, h)) == {101}


def test_a_restore_of_every_table_names_each_pending_table_it_leaves_out() -> None:
    h = history()
    schema_at_40 = upto(h, 40)
    # Every table at 40: `other` is restored, `acc` is left out, and the plan says so and why.
    assert set(rebuild.tables_at(schema_at_40, 40)) == {7}
    (line,) = rebuild.pending_at(schema_at_40, 40, lambda: h)
    assert line.startswith("app.acc (its initial snapshot was in progress at commit_ts 40; restorable from "
                           "commit_ts 50"), line
    # Without the whole history, it says the marker is not in the lake yet; inside the
    # unfinished attempt too.
    assert rebuild.pending_at(h, 20) == [
        "app.acc (its initial snapshot was in progress at commit_ts 20; the lake holds no end of that snapshot yet)"]
    # Once the marker has committed (or before any snapshot began) nothing is left out.
    assert rebuild.pending_at(h, 50, lambda: h) == [] and rebuild.pending_at(h, 7) == []
