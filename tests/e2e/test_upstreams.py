"""TxnWriter against real upstreams: SQLite, PostgreSQL and MariaDB.

Each test runs an in-process registry and one in-process Pump, writes through
a TxnWriter into a fresh upstream database, reads the window back from the
Pump and checks the binlog against what the upstream database holds:

- every row image (before and after) equals the upstream rows, value for
  value, for every column type and its edges;
- mutations come in execution order, commit_ts equals ``_binlake_txn_status``;
- DDL binlogs carry the table definition that decodes every later row, with
  one schema version per DDL;
- a writer killed right after (or right before) the database commit is
  resolved by the Pump through the restarted writer's status service;
- bad input is refused with binlake's errors, and leaves no binlog behind.

PostgreSQL and MariaDB cases skip when the server binaries are missing
(see ``dbfixtures``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

# Imported fixtures are registered for this module (see dbfixtures); a test taking
# one as a parameter "redefines" the name for pyflakes, hence the F811 markers below.
from dbfixtures import mariadb_server, postgres_server, upstream_url  # noqa: F401
from pumpkit import wait_until

from binlake import codec, config, errors
from binlake.client.reader import pull_window
from binlake.proto import binlog_pb2
from binlake.pump.node import PumpNode
from binlake.registry.server import RegistryServer
from binlake.sql import schema as sc
from binlake.sql.schema import ColumnDef as C
from binlake.writer.txn_writer import STATUS_TABLE, CommitInfo, Txn, TxnWriter

D = decimal.Decimal
OPS = {binlog_pb2.INSERT: "insert", binlog_pb2.UPDATE: "update", binlog_pb2.DELETE_ROW: "delete"}

# ---------------------------------------------------------------------------- the cluster


@dataclasses.dataclass
class Cluster:
    registry: RegistryServer
    pump: PumpNode

    def window(self, writer: TxnWriter, start_ts: int = 0) -> list[binlog_pb2.Binlog]:
        """Every complete transaction the Pump serves from ``start_ts`` up to now."""
        end_ts = writer.registry.get_ts()
        return list(pull_window({"p1": self.pump.addr}, start_ts, end_ts, wait=True, wait_timeout_s=30))


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[Cluster]:
    reg = RegistryServer(
        config.load(config.RegistrySettings, data_dir=tmp_path / "registry", addr="127.0.0.1:0")
    ).start()
    pump = PumpNode(config.load(
        config.PumpSettings, registry=reg.addr, data_dir=tmp_path / "p1", addr="127.0.0.1:0", node_id="p1",
        stop_write_at_free_bytes=0, fake_binlog_interval_s=0.2,
        # Resolve a missing commit after one second, so the crash tests are quick.
        txn_timeout_s=1,
    )).start()
    try:
        yield Cluster(reg, pump)
    finally:
        pump.stop(grace=0.5)
        reg.stop(grace=0.5)


@pytest.fixture
def writer(upstream_url: str, cluster: Cluster) -> Iterator[TxnWriter]:  # noqa: F811
    w = TxnWriter(upstream_url, registry=cluster.registry.addr).start()
    try:
        yield w
    finally:
        w.close()


# ---------------------------------------------------------------------------- reading back


def normalise(info: binlog_pb2.TableInfo, row: dict[str, Any]) -> dict[str, Any]:
    """An upstream row as the codec's Python values, normalising only what the
    codec defines: TIME may come as a timedelta (MySQL), JSON as text."""
    out: dict[str, Any] = {}
    for col in info.columns:
        v = row[col.name]
        if v is not None:
            if col.type == binlog_pb2.TIME and isinstance(v, dt.timedelta):
                v = (dt.datetime.min + v).time()
            elif col.type == binlog_pb2.JSON and isinstance(v, (str, bytes)):
                v = json.loads(v)
            elif col.type == binlog_pb2.BYTES and isinstance(v, memoryview):
                v = bytes(v)
        out[col.name] = v
    return out


def upstream_rows(w: TxnWriter, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The upstream table's rows by primary key, read through the writer's engine."""
    info = w.table(table)
    keys = sc.key_columns(info)
    with w.engine.connect() as conn:
        rows = [normalise(info, dict(r._mapping)) for r in conn.execute(sa.select(w.sa_table(table)))]
    return {tuple(r[k] for k in keys): r for r in rows}


def status_rows(w: TxnWriter) -> dict[int, int]:
    with w.engine.connect() as conn:
        return dict(conn.execute(sa.text(f"SELECT start_ts, commit_ts FROM {STATUS_TABLE}")).all())


@dataclasses.dataclass
class Event:
    table_id: int
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


def _check_ids(raw: bytes | binlog_pb2.Row, info: binlog_pb2.TableInfo) -> None:
    # A row carries exactly the columns of the definition in force when it was written.
    row = binlog_pb2.Row.FromString(raw) if isinstance(raw, bytes) else raw
    assert sorted(c.id for c in row.columns) == sorted(c.id for c in info.columns), (
        f"row columns {[c.id for c in row.columns]} vs table {info.name} v{info.schema_version} "
        f"columns {[c.id for c in info.columns]}"
    )


def events(b: binlog_pb2.Binlog, infos: dict[int, binlog_pb2.TableInfo]) -> list[Event]:
    """The row changes of a served transaction, per table in execution order."""
    value = binlog_pb2.PrewriteValue.FromString(b.prewrite_value)
    out: list[Event] = []
    for m in value.mutations:
        info = infos[m.table_id]
        ins, upd, dels = iter(m.inserted_rows), iter(m.updated_rows), iter(m.deleted_rows)
        for op in m.sequence:
            if op == binlog_pb2.INSERT:
                raw = next(ins)
                _check_ids(raw, info)
                out.append(Event(m.table_id, "insert", None, codec.decode_row(raw, info)))
            elif op == binlog_pb2.UPDATE:
                raw = next(upd)
                upd_row = binlog_pb2.UpdatedRow.FromString(raw)
                _check_ids(upd_row.old, info)
                _check_ids(upd_row.new, info)
                old, new = codec.decode_update(raw, info)
                out.append(Event(m.table_id, "update", old, new))
            else:
                assert op == binlog_pb2.DELETE_ROW, op
                raw = next(dels)
                _check_ids(raw, info)
                out.append(Event(m.table_id, "delete", codec.decode_row(raw, info), None))
        assert next(ins, None) is None and next(upd, None) is None and next(dels, None) is None, (
            "the sequence does not cover every row of the mutation"
        )
    return out


def apply(state: dict[int, dict[tuple[Any, ...], dict[str, Any]]], evs: list[Event],
          infos: dict[int, binlog_pb2.TableInfo]) -> None:
    """Replay ``evs`` onto ``state``; every before image must equal the row it replaces."""
    for ev in evs:
        keys = sc.key_columns(infos[ev.table_id])
        rows = state.setdefault(ev.table_id, {})
        if ev.before is not None:
            key = tuple(ev.before[k] for k in keys)
            assert rows.get(key) == ev.before, f"before image of {ev.op} {key}: {ev.before} != stored {rows.get(key)}"
            del rows[key]
        if ev.after is not None:
            key = tuple(ev.after[k] for k in keys)
            assert key not in rows, f"{ev.op} of {key} onto an existing row"
            rows[key] = ev.after


def grouped(ops: list[tuple[str, str]], ids: dict[str, int]) -> list[tuple[int, str]]:
    """Expected (table_id, op) list: tables in first-touch order, each in execution order."""
    order: list[str] = []
    by: dict[str, list[str]] = {}
    for table, op in ops:
        if table not in by:
            order.append(table)
            by[table] = []
        by[table].append(op)
    return [(ids[t], op) for t in order for op in by[t]]


def backend(w: TxnWriter) -> str:
    return w.engine.dialect.name


# ---------------------------------------------------------------------------- a. DML, every type

EVERY_TYPE = [
    C("id", "int"),
    C("code", "string", length=32),
    C("i", "int"),
    C("u", "uint"),
    C("b", "bool"),
    C("f", "float"),
    C("d", "decimal", precision=38, scale=10),
    C("s", "string"),
    C("bin", "bytes"),
    C("day", "date"),
    C("ts", "datetime"),
    C("tod", "time"),
    C("doc", "json"),
]
NULLABLE = [c.name for c in EVERY_TYPE if c.name != "id"]

ROW_MAX = {
    "id": 2**63 - 1, "code": "max", "i": 2**63 - 1, "u": 2**64 - 1, "b": True, "f": 1.7976931348623157e308,
    "d": D("9999999999999999999999999999.9999999999"), "s": "unicode ☃ é 中文 😀 𝄞 \u200b",
    "bin": b"\x00\x01\x00\xff\x00", "day": dt.date(9999, 12, 31), "ts": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    "tod": dt.time(23, 59, 59, 999999), "doc": {"k": [1, "two", {"three": 3.5, "n": None}], "ü": True, "big": 2**62},
}
ROW_MIN = {
    "id": -(2**63), "code": "min", "i": -(2**63), "u": 0, "b": False, "f": -2.2250738585072014e-308,
    "d": D("-1234567890123456789012345678.0123456789"), "s": "", "bin": b"", "day": dt.date(1000, 1, 1),
    "ts": dt.datetime(1000, 1, 1, 0, 0, 0, 1), "tod": dt.time(0, 0, 0), "doc": [],
}
ROW_BIG = {
    "id": 1, "code": "big", "i": 0, "u": 1, "b": True, "f": 1 / 3, "d": D("0.0000000001"),
    "s": "é" + "x" * 100_000 + "😀", "bin": bytes(range(256)) * 400, "day": dt.date(1969, 12, 31),
    "ts": dt.datetime(1969, 12, 31, 23, 59, 59, 123456), "tod": dt.time(12, 34, 56, 1), "doc": {"nested": {"a": [None]}},
}
ROW_NULLS = {"id": 0}


def test_dml_images_match_upstream(writer: TxnWriter, cluster: Cluster) -> None:
    w = writer
    every = w.create_table("every_type", EVERY_TYPE, ["id"], unique_keys={"uk_every_code": ["code"]})
    other = w.create_table("other", [C("id", "int"), C("v", "string", length=32)], ["id"])
    ids = {"every_type": every.table_id, "other": other.table_id}
    infos = {every.table_id: every, other.table_id: other}
    sat = w.sa_table("every_type")
    steps: list[tuple[CommitInfo, list[tuple[int, str]], dict[int, dict[tuple[Any, ...], dict[str, Any]]]]] = []

    def run(fn: Callable[[Txn], None], ops: list[tuple[str, str]]) -> None:
        with w.transaction() as tx:
            fn(tx)
        assert tx.info is not None
        snap = {ids[t]: upstream_rows(w, t) for t in ids}
        steps.append((tx.info, grouped(ops, ids), snap))

    # 1: every type at its edges, a long row, a row of NULLs.
    run(lambda tx: tx.insert_many("every_type", [ROW_MAX, ROW_MIN, ROW_BIG, ROW_NULLS]),
        [("every_type", "insert")] * 4)

    # 2: update, primary-key change (of the all-NULL row), delete, insert + update of one row.
    def t2(tx: Txn) -> None:
        assert tx.update("every_type", {"id": 1}, {"s": "short", "bin": b"\x00", "doc": {"a": 1}, "f": 0.1}) == 1
        assert tx.update("every_type", {"id": 0}, {"id": 5, "code": "was-null"}) == 1
        assert tx.delete("every_type", {"id": -(2**63)}) == 1
        tx.insert("every_type", {"id": 7, "code": "seven", "i": 7, "s": "x"})
        assert tx.update("every_type", {"id": 7}, {"i": 8, "s": None}) == 1
        assert tx.update("every_type", {"id": 12345}, {"i": 1}) == 0  # no such row: no change, no event

    run(t2, [("every_type", op) for op in ("update", "update", "delete", "insert", "update")])

    # 3: a batch of rows, then a range update (SQL expression) and a range delete.
    run(lambda tx: tx.insert_many("every_type", [{"id": n, "i": n, "s": f"r{n}"} for n in range(10, 20)]),
        [("every_type", "insert")] * 10)

    def t4(tx: Txn) -> None:
        n = tx.update_where("every_type", lambda t: t.c.id.between(12, 16),
                            {"i": sat.c.i + 100, "ts": dt.datetime(2024, 2, 29, 12, 0, 0, 500)})
        assert n == 5
        assert tx.delete_where("every_type", lambda t: t.c.id > 17) == 3  # 18, 19 and 2^63-1

    run(t4, [("every_type", "update")] * 5 + [("every_type", "delete")] * 3)

    # 5: several tables in one transaction, interleaved.
    def t5(tx: Txn) -> None:
        tx.insert("other", {"id": 1, "v": "a"})
        tx.update("every_type", {"id": 10}, {"s": "multi"})
        tx.insert("other", {"id": 2, "v": "b"})
        tx.delete("other", {"id": 1})
        tx.delete("every_type", {"id": 11})

    run(t5, [("other", "insert"), ("every_type", "update"), ("other", "insert"), ("other", "delete"),
             ("every_type", "delete")])

    # 6: read-only: no binlog at all.
    with w.transaction() as tx:
        assert tx.get("every_type", {"id": 5}) is not None
        assert len(tx.select("every_type", lambda t: t.c.id >= 10)) == 7
    assert tx.info is None

    served = cluster.window(w)
    ddl = [b for b in served if b.ddl_query]
    dml = [b for b in served if not b.ddl_query]
    assert [b.ddl_table.name for b in ddl] == ["every_type", "other"]
    assert len(dml) == len(steps), "one binlog per writing transaction, none for the read-only one"
    # The window holds exactly the committed transactions, with the committed ts.
    assert {b.start_ts: b.commit_ts for b in served} == status_rows(w)

    state: dict[int, dict[tuple[Any, ...], dict[str, Any]]] = {}
    for b, (info, ops, snap) in zip(dml, steps, strict=True):
        assert (b.start_ts, b.commit_ts) == (info.start_ts, info.commit_ts)
        evs = events(b, infos)
        assert [(e.table_id, e.op) for e in evs] == ops, "sequence must follow execution order"
        assert binlog_pb2.PrewriteValue.FromString(b.prewrite_value).schema_version == every.schema_version + 1
        apply(state, evs, infos)
        assert {t: state.get(t, {}) for t in snap} == snap, f"binlog of txn {b.start_ts} differs from the upstream"
        assert info.row_changes == len(evs)

    # The edges survive exactly (Decimal equality is exact; floats compare bit for bit).
    first = events(dml[0], infos)
    for expected, ev in zip((ROW_MAX, ROW_MIN, ROW_BIG), first, strict=False):
        assert ev.after is not None
        for k, v in expected.items():
            assert ev.after[k] == v and type(ev.after[k]) is type(v), (k, ev.after[k], v)
    assert all(v is None for k, v in first[3].after.items() if k != "id")  # type: ignore[union-attr]

    # NULL is SQL NULL in the upstream (not, say, a JSON 'null' document).
    with w.engine.connect() as conn:
        nulls = conn.execute(sa.select(sa.func.count()).select_from(sat).where(
            sat.c.id == 5, *[sat.c[c].is_(None) for c in NULLABLE if c != "code"])).scalar_one()
    assert nulls == 1


# ---------------------------------------------------------------------------- b. DDL


def test_ddl_binlogs_decode_every_later_row(writer: TxnWriter, cluster: Cluster) -> None:
    w = writer
    v0 = w.schema_version
    steps: list[tuple[str, Any]] = []  # ("ddl", TableInfo) or ("dml", (CommitInfo, table, snapshot))

    def ddl(info: binlog_pb2.TableInfo) -> binlog_pb2.TableInfo:
        steps.append(("ddl", (info, {} if info.dropped else upstream_rows(w, info.name))))
        return info

    def dml(table: str, fn: Callable[[Txn], None]) -> None:
        with w.transaction() as tx:
            fn(tx)
        steps.append(("dml", (tx.info, w.table(table).table_id, upstream_rows(w, table))))

    t = ddl(w.create_table("t1", [C("id", "int"), C("a", "int"), C("b", "string", length=32), C("c", "int")], ["id"]))
    dml("t1", lambda tx: tx.insert_many("t1", [{"id": 1, "a": 10, "b": "one", "c": 100},
                                               {"id": 2, "a": 20, "b": "two", "c": 200}]))
    added = ddl(w.add_column("t1", C("extra", "string")))
    dml("t1", lambda tx: (tx.insert("t1", {"id": 3, "a": 30, "b": "three", "extra": "e3"}),
                          tx.update("t1", {"id": 1}, {"extra": "e1"})))
    ddl(w.change_column_type("t1", C("a", "decimal", precision=20, scale=4)))
    dml("t1", lambda tx: (tx.insert("t1", {"id": 4, "a": D("1.2345"), "b": "four"}),
                          tx.update("t1", {"id": 2}, {"a": D("20.5")})))
    ddl(w.change_column_type("t1", C("c", "string")))
    dml("t1", lambda tx: (tx.update("t1", {"id": 2}, {"c": "two hundred"}), tx.update("t1", {"id": 1}, {"b": "uno"})))
    # Old and new values survive the type changes exactly, as the new type.
    rows = upstream_rows(w, "t1")
    assert [(type(rows[(k,)]["a"]), rows[(k,)]["a"]) for k in (1, 4)] == [(D, D(10)), (D, D("1.2345"))]
    assert [rows[(k,)]["c"] for k in (1, 2, 3)] == ["100", "two hundred", None]
    ddl(w.add_unique_key("t1", "uk_t1_b", ["b"]))
    with pytest.raises(errors.FailedPrecondition, match="upstream refused the change"):
        w.run(lambda tx: tx.insert("t1", {"id": 9, "b": "two"}))  # the unique key is in force
    ddl(w.rename_column("t1", "b", "bee"))
    dml("t1", lambda tx: tx.insert("t1", {"id": 5, "bee": "five"}))
    ddl(w.drop_unique_key("t1", "uk_t1_b"))
    dml("t1", lambda tx: tx.insert("t1", {"id": 6, "bee": "five"}))  # a duplicate is fine now
    ddl(w.drop_column("t1", "extra"))
    dml("t1", lambda tx: (tx.update("t1", {"id": 3}, {"a": D("3")}), tx.delete("t1", {"id": 4})))
    ddl(w.rename_table("t1", "t2"))
    dml("t2", lambda tx: tx.update("t2", {"id": 5}, {"id": 50}))
    truncated = ddl(w.truncate_table("t2"))
    assert truncated.table_id != t.table_id and truncated.previous_table_id == t.table_id
    dml("t2", lambda tx: tx.insert("t2", {"id": 1, "a": D("-1.5"), "bee": "after truncate", "c": "c"}))
    dropped = ddl(w.drop_table("t2"))
    assert dropped.dropped and w.tables() == []
    n_ddl = sum(1 for kind, _ in steps if kind == "ddl")
    assert w.schema_version == v0 + n_ddl

    served = cluster.window(w)
    assert len(served) == len(steps)
    assert {b.start_ts: b.commit_ts for b in served} == status_rows(w)
    infos: dict[int, binlog_pb2.TableInfo] = {}
    state: dict[int, dict[tuple[Any, ...], dict[str, Any]]] = {}
    version = v0
    for b, (kind, payload) in zip(served, steps, strict=True):
        value = binlog_pb2.PrewriteValue.FromString(b.prewrite_value)
        if kind == "ddl":
            info, snap = payload
            version += 1
            assert b.ddl_query and b.ddl_table == info
            assert b.ddl_table.schema_version == b.ddl_job_id == value.schema_version == version
            assert not value.mutations
            if info.previous_table_id:
                infos.pop(info.previous_table_id, None)
                state.pop(info.previous_table_id, None)
            if info.dropped:
                infos.pop(info.table_id, None)
                state.pop(info.table_id, None)
            else:
                infos[info.table_id] = b.ddl_table
                state[info.table_id] = dict(snap)
        else:
            info, table_id, snap = payload
            assert (b.start_ts, b.commit_ts) == (info.start_ts, info.commit_ts)
            assert value.schema_version == version, "DML carries the schema version in force"
            # Decode with the definitions read from earlier DDL binlogs only.
            evs = events(b, infos)
            apply(state, evs, infos)
            assert state[table_id] == snap

    # Rows before ADD COLUMN carry no value for it; the row written after it does.
    extra_id = next(c.id for c in added.columns if c.name == "extra")
    first_dml = [b for b in served if not b.ddl_query]
    rows0 = binlog_pb2.PrewriteValue.FromString(first_dml[0].prewrite_value).mutations[0].inserted_rows
    assert all(extra_id not in {c.id for c in binlog_pb2.Row.FromString(r).columns} for r in rows0)
    after_add = events(first_dml[1], {added.table_id: added})
    assert after_add[0].after is not None and after_add[0].after["extra"] == "e3"
    assert after_add[1].before is not None and after_add[1].before["extra"] is None


# ---------------------------------------------------------------------------- c. crash points

CRASH_WRITER = textwrap.dedent("""
    import sys
    from binlake.writer.txn_writer import TxnWriter

    url, registry, writer_id = sys.argv[1:4]
    w = TxnWriter(url, registry=registry, writer_id=writer_id).start()
    with w.transaction() as tx:
        tx.insert("crash", {"id": 1, "v": "written by the dying writer"})
    print("the failpoint did not fire", flush=True)
""")


@pytest.mark.parametrize("failpoint", ["after-db-commit", "before-db-commit"])
def test_writer_crash_resolved_from_status_table(
    upstream_url: str, cluster: Cluster, tmp_path: pathlib.Path, failpoint: str  # noqa: F811
) -> None:
    writer_id = "crash-writer"
    with TxnWriter(upstream_url, registry=cluster.registry.addr, writer_id=writer_id) as first:
        first.create_table("crash", [C("id", "int"), C("v", "string")], ["id"])
    storage = cluster.pump.storage
    assert storage.pending_count == 0

    script = tmp_path / "crash_writer.py"
    script.write_text(CRASH_WRITER)
    env = {**os.environ, "BINLAKE_FAILPOINT": f"{failpoint}:exit"}
    res = subprocess.run([sys.executable, str(script), upstream_url, cluster.registry.addr, writer_id],
                         env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 137, f"writer exited with {res.returncode}:\n{res.stdout}\n{res.stderr}"
    # The prewrite was acknowledged before the process died; its commit never came.
    assert storage.pending_count == 1
    [[(start_ts, prewrite_key)]] = list(storage.pending_older_than(0))
    assert prewrite_key == writer_id.encode()

    # The restarted writer (same id, same database) serves the status service.
    with TxnWriter(upstream_url, registry=cluster.registry.addr, writer_id=writer_id) as second:
        wait_until(lambda: not storage.is_pending(start_ts), timeout=30, what=f"pump to resolve {start_ts}")
        committed = status_rows(second)
        rows = upstream_rows(second, "crash")
        served = {b.start_ts: b for b in cluster.window(second)}
        info = second.table("crash")

    if failpoint == "after-db-commit":
        # The database committed: the Pump serves it at exactly the stored commit_ts.
        assert start_ts in committed
        assert rows == {(1,): {"id": 1, "v": "written by the dying writer"}}
        b = served[start_ts]
        assert b.commit_ts == committed[start_ts]
        [ev] = events(b, {info.table_id: info})
        assert (ev.op, ev.after) == ("insert", rows[(1,)])
    else:
        # Never committed: rolled back in the database, never served.
        assert start_ts not in committed
        assert rows == {}
        assert start_ts not in served
    assert set(served) == set(committed)


# ---------------------------------------------------------------------------- d. bad input


def test_bad_input_refused_without_binlog(writer: TxnWriter, cluster: Cluster) -> None:
    w = writer
    w.create_table("t", [C("id", "int"), C("k", "string", length=16), C("f", "float"), C("n", "int"),
                         C("u", "uint"), C("s", "string")], ["id"], unique_keys={"uk_t_k": ["k"]})
    good = w.run(lambda tx: tx.insert("t", {"id": 1, "k": "one", "f": 1.0}))
    assert good is not None
    version = w.schema_version

    def refused(exc_type: type[Exception], match: str, fn: Callable[[Txn], None]) -> None:
        # Each attempt does a good change first: the whole transaction must roll back.
        def body(tx: Txn) -> None:
            tx.insert("t", {"id": 100, "k": "must-vanish"})
            fn(tx)

        with pytest.raises(exc_type, match=match):
            w.run(body)

    refused(errors.InvalidArgument, r"unknown table 'nope'", lambda tx: tx.insert("nope", {"id": 2}))
    refused(errors.InvalidArgument, r"table t has no column\(s\) zz", lambda tx: tx.insert("t", {"id": 2, "zz": 1}))
    refused(errors.InvalidArgument, r"table t has no column\(s\) zz",
            lambda tx: tx.update("t", {"id": 1}, {"zz": 1}))
    refused(errors.InvalidArgument, r"t\.f \(float\).*NaN", lambda tx: tx.insert("t", {"id": 2, "f": float("nan")}))
    refused(errors.InvalidArgument, r"t\.f \(float\).*NaN", lambda tx: tx.update("t", {"id": 1}, {"f": float("inf")}))
    refused(errors.InvalidArgument, r"t\.n \(int\).*outside the signed 64-bit range",
            lambda tx: tx.insert("t", {"id": 2, "n": 2**63}))
    refused(errors.InvalidArgument, r"t\.f \(float\).*NaN", lambda tx: tx.update("t", {"id": 1}, {"f": float("nan")}))
    refused(errors.InvalidArgument, r"t\.n \(int\).*outside the signed 64-bit range",
            lambda tx: tx.update("t", {"id": 1}, {"n": -(2**63) - 1}))
    refused(errors.InvalidArgument, r"t\.u \(uint\).*outside the unsigned 64-bit range",
            lambda tx: tx.insert("t", {"id": 2, "u": -1}))
    refused(errors.InvalidArgument, r"t\.n \(int\): expected int, got str",
            lambda tx: tx.insert("t", {"id": 2, "n": "12"}))
    refused(errors.InvalidArgument, r"primary key columns \['id'\]", lambda tx: tx.delete("t", {"k": "one"}))
    refused(errors.FailedPrecondition, r"upstream refused the change", lambda tx: tx.insert("t", {"id": 1}))
    refused(errors.FailedPrecondition, r"upstream refused the change",
            lambda tx: tx.insert("t", {"id": 3, "k": "one"}))  # unique key

    # The upstream rolled every one of them back and is still usable.
    assert sorted(upstream_rows(w, "t")) == [(1,)]

    with pytest.raises(errors.InvalidArgument, match=r"s2\.name: a string column in a primary key needs a length"):
        w.create_table("s2", [C("name", "string")], ["name"])
    with pytest.raises(errors.InvalidArgument, match=r"t\.s: a string column in a unique key needs a length"):
        w.add_unique_key("t", "uk_t_s", ["s"])
    with pytest.raises(errors.InvalidArgument, match=r"t\.k: changing string\(16\) to int may not keep every value"):
        w.change_column_type("t", C("k", "int"))
    with pytest.raises(errors.InvalidArgument, match=r"t\.f: changing float to decimal\(10,2\) may not keep"):
        w.change_column_type("t", C("f", "decimal", precision=10, scale=2))
    with pytest.raises(errors.InvalidArgument, match="already has a column"):
        w.add_column("t", C("K", "int"))
    with pytest.raises(errors.InvalidArgument, match="unknown table 'nope'"):
        w.drop_table("nope")
    assert w.schema_version == version, "a refused DDL changes no schema version"

    last = w.run(lambda tx: tx.update("t", {"id": 1}, {"s": "still works"}))
    assert last is not None
    served = cluster.window(w)
    assert {b.start_ts: b.commit_ts for b in served} == status_rows(w)
    assert [b.start_ts for b in served if not b.ddl_query] == [good.start_ts, last.start_ts]
    assert cluster.pump.storage.pending_count == 0
