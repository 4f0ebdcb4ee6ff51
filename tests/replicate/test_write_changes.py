"""Writing one batch of changes to a real target (no lake, no Spark): compaction,
deletes before inserts (a unique-key swap inside a batch), normal mode's check
of the target, safe mode's convergence, and keyless tables in commit order."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from dbfixtures import TARGETS, mariadb_server, new_target_url, postgres_server  # noqa: F401

from binlake.proto import binlog_pb2
from binlake.replicate import parallel, table_write
from binlake.replicate.compactor import Change
from binlake.sql import schema as sc
from binlake.sql import targets
from binlake.sql.targets.postgresql import array_literal as pg_array_literal
from binlake.sql.url import open_target


def info() -> binlog_pb2.TableInfo:
    return sc.new_table(5, "app", "t", [sc.ColumnDef("id", "int", False), sc.ColumnDef("u", "int"),
                                       sc.ColumnDef("v", "string")], ["id"], {"uk_u": ["u"]}, 1)


def r(i: int, u: Any, v: str = "x") -> dict[str, Any]:
    return {"id": i, "u": u, "v": v}


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Any:
    t = open_target(new_target_url(request.param, request, tmp_path, "w"))
    t.create_table(info())
    yield t
    t.close()


def rows(t: targets.Target) -> list[tuple[Any, ...]]:
    with t.engine.connect() as conn:
        return sorted(tuple(x) for x in conn.exec_driver_sql("SELECT id, u, v FROM t"))


def write(t: targets.Target, changes: list[Change], safe: bool = False) -> int:
    with t.engine.connect() as conn:
        conn.begin()
        n = table_write.write_changes(t, conn, info(), changes, safe)
        conn.commit()
    return n


def test_unique_key_swap_and_delete_then_reuse(target: targets.Target) -> None:
    write(target, [Change("t", "insert", None, r(1, 1)), Change("t", "insert", None, r(2, 2))])
    # swap u between rows 1 and 2 through a temporary value, all in one batch
    write(target, [Change("t", "update", r(1, 1), r(1, 9)), Change("t", "update", r(2, 2), r(2, 1)),
                   Change("t", "update", r(1, 9), r(1, 2))])
    assert rows(target) == [(1, 2, "x"), (2, 1, "x")]
    # the case: delete (2, u=1) then give u=1 to row 1
    write(target, [Change("t", "delete", r(2, 1), None), Change("t", "update", r(1, 2), r(1, 1, "y"))])
    assert rows(target) == [(1, 1, "y")]


def test_normal_mode_refuses_a_target_changed_by_hand(target: targets.Target) -> None:
    write(target, [Change("t", "insert", None, r(1, 1)), Change("t", "insert", None, r(2, 2))])
    with target.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM t WHERE id = 2")
    with pytest.raises(table_write.Mismatch) as info_:
        write(target, [Change("t", "insert", None, r(3, 3)), Change("t", "update", r(2, 2), r(2, 5))])
    err = table_write.diagnose(target, info_.value, "window [1, 2)")
    assert "target table t: the row with key id=2 that window [1, 2) updates or deletes is not in the target" \
        in str(err)
    assert rows(target) == [(1, 1, "x")]  # rolled back: 3 not inserted
    with pytest.raises(table_write.Mismatch) as info_:
        write(target, [Change("t", "insert", None, r(1, 7))])
    assert "the row with key id=1 that w inserts is already in the target" in str(
        table_write.diagnose(target, info_.value, "w"))


def test_safe_mode_converges_from_any_partial_state(target: targets.Target) -> None:
    batch = [Change("t", "insert", None, r(1, 1)), Change("t", "insert", None, r(2, 2)),
             Change("t", "update", r(1, 1), r(1, 3, "z")), Change("t", "delete", r(2, 2), None),
             Change("t", "insert", None, r(4, 2))]
    write(target, batch[:2])  # part of the batch is already in
    write(target, batch, safe=True)
    assert rows(target) == [(1, 3, "z"), (4, 2, "x")]
    write(target, batch, safe=True)  # and again: unchanged
    assert rows(target) == [(1, 3, "z"), (4, 2, "x")]


def test_keyless_table_keeps_commit_order(tmp_path: pathlib.Path) -> None:
    t = open_target(f"sqlite:///{tmp_path / 'k.db'}")
    nk = binlog_pb2.TableInfo(table_id=9, db="app", name="nk")
    nk.columns.add(id=1, name="a", type=binlog_pb2.INT, nullable=True, sql_type="int")
    nk.columns.add(id=2, name="b", type=binlog_pb2.STRING, nullable=True, sql_type="string")
    with t.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE nk (a BIGINT, b TEXT)")
        table_write.write_changes(t, conn, nk, [
            Change("nk", "insert", None, {"a": 1, "b": "x"}), Change("nk", "insert", None, {"a": 1, "b": "x"}),
            Change("nk", "update", {"a": 1, "b": "x"}, {"a": 2, "b": None}),
            Change("nk", "delete", {"a": 2, "b": None}, None), Change("nk", "insert", None, {"a": 3, "b": None})],
            False)
    with t.engine.connect() as conn:
        assert sorted(conn.exec_driver_sql("SELECT a, b FROM nk").all()) == [(1, "x"), (3, None)]
    t.close()


def test_apply_groups_one_transaction_per_task_and_skips_groups_already_in(tmp_path: pathlib.Path) -> None:
    from binlake.replicate import checkpoint

    url = f"sqlite:///{tmp_path / 'g.db'}"
    t = open_target(url)
    t.create_table(info())
    checkpoint.ensure(t.engine)
    infos = {"t": info()}
    groups = [(0, [Change("t", "insert", None, r(1, 1)), Change("t", "update", r(1, 1), r(1, 5))]),
              (1, [Change("t", "insert", None, r(2, 2))])]
    assert list(parallel.apply_groups(url, "task", infos, 10, 0, 10, False, groups[:1])) == [(1, 1, "")]  # compacted to one insert
    assert rows(t) == [(1, 5, "x")]
    # a rerun of the whole batch applies only group 1
    assert list(parallel.apply_groups(url, "task", infos, 10, 0, 10, False, groups)) == [(1, 1, "")]
    assert rows(t) == [(1, 5, "x"), (2, 2, "x")]
    with t.engine.connect() as conn:
        assert checkpoint.done_groups(conn, "task", 10) == {0, 1}
    # a group whose row is missing: nothing of the task's groups is written, the message names the key
    bad = [(2, [Change("t", "insert", None, r(3, 3))]),
           (3, [Change("t", "delete", r(9, 9), None)])]
    ((n_groups, n_rows, message),) = list(parallel.apply_groups(url, "task", infos, 10, 0, 10, False, bad))
    assert (n_groups, n_rows) == (0, 0) and "target table t: the row with key id=9" in message
    assert rows(t) == [(1, 5, "x"), (2, 2, "x")]
    t.close()


@pytest.mark.parametrize("kind", ["postgresql", "sqlite", "duckdb"])
def test_delete_keys_of_any_text_and_integers(kind: str, request: pytest.FixtureRequest,
                                              tmp_path: pathlib.Path) -> None:
    """The deletes' one array (PostgreSQL sends it as a text literal it builds): keys
    with the literal's own syntax in them (quotes, backslashes, commas, braces,
    spaces, NULL as text, an empty string) delete exactly those rows; so do integer
    keys at both ends of the range."""
    url = new_target_url(kind, request, tmp_path, "k")
    keys = ['a"b', "back\\slash", "c,d", "{e}", " sp ", "NULL", "", "ü€😀", "plain", '\\"', "x\ty"]
    by_text = sc.new_table(6, "app", "s", [sc.ColumnDef("k", "string", False, length=40), sc.ColumnDef("n", "int")],
                           ["k"], None, 1)
    by_int = sc.new_table(7, "app", "i", [sc.ColumnDef("k", "int", False)], ["k"], None, 1)
    ints = [-(2**63), -1, 0, 1, 2**63 - 1]
    t = open_target(url)
    try:
        t.create_table(by_text)
        t.create_table(by_int)
        t.bulk_load(by_text, [{"k": k, "n": i} for i, k in enumerate(keys)])
        t.bulk_load(by_int, [{"k": k} for k in ints])
        gone = keys[::2]
        with t.engine.connect() as conn:
            conn.begin()
            assert t.delete_keys(conn, by_text, [(k,) for k in gone]) == len(gone)
            assert t.delete_keys(conn, by_int, [(ints[0],), (ints[2],), (ints[4],)]) == 3
            conn.commit()
        with t.engine.connect() as conn:
            left = sorted(r[0] for r in conn.exec_driver_sql("SELECT k FROM s"))
            left_ints = sorted(r[0] for r in conn.exec_driver_sql("SELECT k FROM i"))
        assert left == sorted(keys[1::2])
        assert left_ints == [ints[1], ints[3]]
    finally:
        t.close()
    assert pg_array_literal([1, 2]) == "{1,2}"
    assert pg_array_literal(['a"b', "c\\"]) == '{"a\\"b","c\\\\"}'
    assert pg_array_literal([1, "a"]) is None
