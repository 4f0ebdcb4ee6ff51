"""The apply's Arrow compaction (``arrowcompact``) against the reference
(``compactor.compact`` over fully decoded changes): the same final changes, in
the same order, on random change sequences (key changes, chained and swapped
keys, deletes then re-inserts, NULLs), and the typed rows it hands to COPY equal
the reference's final rows. What it cannot type is refused, never guessed."""

from __future__ import annotations

import datetime as dt
import decimal
import pathlib
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from dbfixtures import TARGETS, mariadb_server, new_target_url, postgres_server  # noqa: F401
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_rawcompact import image, play, reference, steps, table

from binlake.lake.decoding import decode
from binlake.proto import binlog_pb2
from binlake.replicate import arrowcompact, compactor, rawcompact, read, table_write
from binlake.replicate.compactor import Change
from binlake.sql import schema as sc
from binlake.sql import targets
from binlake.sql.url import open_target

# A table every column of which has a verbatim CSV form (the PostgreSQL COPY path).
FLAT = [sc.ColumnDef("id", "int", False), sc.ColumnDef("g", "string", False, length=8),
        sc.ColumnDef("v", "string"), sc.ColumnDef("d", "decimal", precision=10, scale=2),
        sc.ColumnDef("u", "uint"), sc.ColumnDef("f", "float"), sc.ColumnDef("ok", "bool")]


def flat_table(key: list[str]) -> binlog_pb2.TableInfo:
    return sc.new_table(8, "app", "t", FLAT, key, None, 1)


flat_values = st.fixed_dictionaries({
    "v": st.one_of(st.none(), st.text(max_size=3)),
    "d": st.one_of(st.none(), st.decimals(min_value=-999, max_value=999, places=2, allow_nan=False)),
    "u": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "f": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    "ok": st.one_of(st.none(), st.booleans()),
})
flat_steps = st.lists(st.tuples(st.sampled_from(["insert", "update", "delete"]), st.integers(0, 3),
                                st.sampled_from("xy"), st.booleans(), flat_values), max_size=40)


def arrow_changes(info: binlog_pb2.TableInfo, seq: list[tuple[str, Any, Any]]) -> pa.Table:
    return pa.table({"op": pa.array([op for op, _b, _a in seq], pa.string()),
                     "before": pa.array([image(info, b) for _op, b, _a in seq], pa.string()),
                     "after": pa.array([image(info, a) for _op, _b, a in seq], pa.string()),
                     "commit_ts": pa.array([100 + n // 3 for n in range(len(seq))], pa.int64()),
                     "seq": pa.array([n % 3 for n in range(len(seq))], pa.int32())})


def fast(info: binlog_pb2.TableInfo, seq: list[tuple[str, Any, Any]], key: list[str],
         extract: tuple[str, str] | None = None) -> arrowcompact.Compacted:
    return arrowcompact.compact("t", arrow_changes(info, seq), rawcompact.ImageDecoder(info, key, extract))


def k(image: dict[str, Any] | None, key: list[str]) -> tuple[Any, ...]:
    assert image is not None
    return tuple(image[c] for c in key)


def check_flat(info: binlog_pb2.TableInfo, seq: list[tuple[str, Any, Any]], key: list[str],
               extract: tuple[str, str] | None = None) -> None:
    want = reference(info, seq, key, extract)
    got = fast(info, seq, key, extract)
    assert got.changes() == want
    assert got.gone_keys() == [k(c.before, key) for c in want if c.op != "insert"]
    assert got.insert_keys() == [k(c.after, key) for c in want if c.op == "insert"]
    rows = got.rows_table()
    assert rows is not None
    names = [c.name for c in info.columns] + ([extract[0]] if extract else [])
    assert rows.column_names == names
    typed = rows.to_pylist()
    for row in typed:  # decimals travel as their exact JSON text
        if row["d"] is not None:
            row["d"] = decimal.Decimal(row["d"])
    assert typed == [c.after for c in want if c.after is not None]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_arrow_compaction_equals_the_reference(raw_steps: list[Any]) -> None:
    # bytes, datetimes: compacted as Arrow, rows typed per final change by the decoder
    seq = play(raw_steps)
    for key in (["id", "g"], ["id"]):  # one key per row, and one that two rows may share
        info = table(key)
        got = fast(info, seq, key)
        assert got.rows_table() is None
        assert got.changes() == reference(info, seq, key)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flat_steps)
def test_the_copy_rows_equal_the_reference_final_rows(raw_steps: list[Any]) -> None:
    seq = play(raw_steps)
    for key in (["id", "g"], ["id"], ["g"]):
        check_flat(flat_table(key), seq, key)


@settings(max_examples=60, deadline=None)
@given(flat_steps)
def test_routed_shard_keys_include_the_extract_column(raw_steps: list[Any]) -> None:
    seq = play(raw_steps)
    check_flat(flat_table(["id", "g"]), seq, ["id", "g", "src"], ("src", "orders_01"))


R = {"g": "x", "v": None, "d": None, "u": None, "f": None, "ok": None}


@pytest.mark.parametrize("seq, want", [
    # chained key changes in one batch: 1 -> 2 -> 3 is delete 1 + insert 3
    ([("insert", None, dict(R, id=1)), ("update", dict(R, id=1), dict(R, id=2)),
      ("update", dict(R, id=2), dict(R, id=3))], [("insert", None, 3)]),
    ([("update", dict(R, id=1), dict(R, id=2, v="a")), ("update", dict(R, id=2, v="a"), dict(R, id=3, v="b"))],
     [("delete", 1, None), ("insert", None, 3)]),
    # a swap of two existing keys through a third: both rows updated in place
    ([("update", dict(R, id=1, v="a"), dict(R, id=9, v="a")), ("update", dict(R, id=2, v="b"), dict(R, id=1, v="b")),
      ("update", dict(R, id=9, v="a"), dict(R, id=2, v="a"))], [("update", 1, 1), ("update", 2, 2)]),
    # delete then re-insert: an update; insert then delete: nothing; update then delete: the delete
    ([("delete", dict(R, id=1), None), ("insert", None, dict(R, id=1, v="n"))], [("update", 1, 1)]),
    ([("insert", None, dict(R, id=4)), ("delete", dict(R, id=4), None)], []),
    ([("update", dict(R, id=5), dict(R, id=5, v="u")), ("delete", dict(R, id=5, v="u"), None)],
     [("delete", 5, None)]),
    # NULLs in non-key columns survive as NULLs, not empty strings
    ([("insert", None, dict(R, id=6, v="")), ("update", dict(R, id=6, v=""), dict(R, id=6, v=None))],
     [("insert", None, 6)]),
])
def test_the_rules_table_driven(seq: list[tuple[str, Any, Any]], want: list[tuple[str, Any, Any]]) -> None:
    info = flat_table(["id"])
    got = fast(info, seq, ["id"])
    assert [(c.op, c.before and c.before["id"], c.after and c.after["id"]) for c in got.changes()] == want
    check_flat(info, seq, ["id"])


def test_what_arrow_cannot_type_is_refused() -> None:
    info = table(["t"])  # a datetime key: compared as datetimes by the reference, not as text
    with pytest.raises(arrowcompact.Unsupported):
        fast(info, [], ["t"])
    flat = flat_table(["id"])
    dec = rawcompact.ImageDecoder(flat, ["id"])
    for bad in ('{"id":1,"zz":2}', '{"id":"1"}', '{"id":1.5}', '{"id":1,"v":{"$base64":"AA=="}}', "{"):
        changes = pa.table({"op": ["insert"], "before": pa.array([None], pa.string()), "after": [bad],
                            "commit_ts": [1], "seq": [0]})
        with pytest.raises(pa.ArrowInvalid):
            arrowcompact.compact("t", changes, dec)
    with pytest.raises(TypeError, match="pyarrow Table"):
        arrowcompact.compact("t", [], dec)  # type: ignore[arg-type]


@pytest.mark.parametrize("block", [None, 1024])
def test_large_batches_keep_one_final_change_per_key(block: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if block is not None:  # the images parsed as hundreds of blocks, on every core, in order
        monkeypatch.setattr(arrowcompact, "_BLOCK", block)
    info = flat_table(["id"])
    seq: list[tuple[str, Any, Any]] = []
    for i in range(3000):
        seq.append(("insert", None, dict(R, id=i)))
    for i in range(0, 3000, 3):
        seq.append(("update", dict(R, id=i), dict(R, id=i, v="u")))
    for i in range(0, 3000, 5):
        seq.append(("delete", dict(R, id=i, v="u" if i % 3 == 0 else None), None))
    got = fast(info, seq, ["id"])
    assert len(got) == 3000 - 600
    assert got.changes() == compactor.compact(
        [Change("t", op, decode.image_values(image(info, b), info), decode.image_values(image(info, a), info),
                100 + n // 3, n % 3) for n, (op, b, a) in enumerate(seq)], ["id"])


# FLAT with a date and a datetime: they too go as Arrow (cast from their image text).
TEMPORAL = [*FLAT, sc.ColumnDef("day", "date"), sc.ColumnDef("at", "datetime")]


def temporal_table(key: list[str]) -> binlog_pb2.TableInfo:
    return sc.new_table(9, "app", "t", TEMPORAL, key, None, 1)


temporal_steps = st.lists(st.tuples(
    st.sampled_from(["insert", "update", "delete"]), st.integers(0, 3), st.sampled_from("xy"), st.booleans(),
    st.fixed_dictionaries({
        "v": st.one_of(st.none(), st.text(max_size=3)),
        "d": st.one_of(st.none(), st.decimals(min_value=-999, max_value=999, places=2, allow_nan=False)),
        "u": st.none(), "f": st.none(), "ok": st.none(),
        "day": st.one_of(st.none(), st.dates(min_value=dt.date(1, 1, 1), max_value=dt.date(9999, 12, 31))),
        "at": st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1, 1, 1),
                                                max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999))),
    })), max_size=40)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(temporal_steps)
def test_dates_and_datetimes_go_as_arrow_equal_to_the_reference(raw_steps: list[Any]) -> None:
    seq = play(raw_steps)
    for key in (["id", "g"], ["id"]):
        info = temporal_table(key)
        want = reference(info, seq, key)
        got = fast(info, seq, key)
        assert got.changes() == want
        rows = got.rows_table()
        assert rows is not None  # the Arrow path, not the per-row one
        assert rows.schema.field("day").type == pa.date32() and rows.schema.field("at").type == pa.timestamp("us")
        typed = rows.to_pylist()
        for row in typed:
            if row["d"] is not None:
                row["d"] = decimal.Decimal(row["d"])
        assert typed == [c.after for c in want if c.after is not None]


def test_a_datetime_text_the_strict_cast_refuses_goes_back_to_rawcompact() -> None:
    info = temporal_table(["id"])
    dec = rawcompact.ImageDecoder(info, ["id"])
    for bad in ('{"id":1,"g":"x","at":"2020-01-02T03:04:05+02:00"}', '{"id":1,"g":"x","day":"2020-1-2"}',
                '{"id":1,"g":"x","at":"2020-01-02T03:04:05.1234567"}', '{"id":1,"g":"x","day":20200102}'):
        changes = pa.table({"op": ["insert"], "before": pa.array([None], pa.string()), "after": [bad],
                            "commit_ts": [1], "seq": [0]})
        with pytest.raises(pa.ArrowInvalid):
            arrowcompact.compact("t", changes, dec)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.integers(1, 7))
def test_final_changes_decode_a_slice_at_a_time(raw_steps: list[Any], size: int) -> None:
    """What has no Arrow form (bytes here) is decoded ``size`` final changes at a time:
    the slices, in order, are exactly the final changes."""
    seq = play(raw_steps)
    info = table(["id", "g"])
    got = fast(info, seq, ["id", "g"])
    want = reference(info, seq, ["id", "g"])
    parts = list(got.iter_changes(size))
    assert all(1 <= len(p) <= size for p in parts)
    assert [c for p in parts for c in p] == want
    rows = list(got.iter_rows(size))
    assert all(1 <= len(p) <= size for p in rows)
    assert [r for p in rows for r in p] == [c.after for c in want if c.after is not None]
    for bad in (got.iter_changes(0), got.iter_rows(0)):
        with pytest.raises(ValueError, match="positive integer"):
            next(bad)


@pytest.mark.parametrize("kind", TARGETS)
def test_rows_without_an_arrow_form_stream_to_every_target(kind: str, request: pytest.FixtureRequest,
                                                           tmp_path: pathlib.Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of a table with bytes (no Arrow form) reaches each target decoded a
    slice at a time (never the whole batch as Python values at once), equal to the
    reference; a MariaDB target, which has no Arrow writer, takes compacted changes
    the same way (deletes of the keys, then the final rows)."""
    monkeypatch.setattr(arrowcompact, "DECODE_SLICE", 4)
    biggest: list[int] = []
    whole = arrowcompact.Compacted.iter_rows

    def watched(self: arrowcompact.Compacted, size: int = arrowcompact.DECODE_SLICE) -> Any:
        for part in whole(self, size):
            biggest.append(len(part))
            yield part

    monkeypatch.setattr(arrowcompact.Compacted, "iter_rows", watched)
    info = table(["id"])
    t = open_target(new_target_url(kind, request, tmp_path, "s"))
    try:
        t.create_table(info)
        base = {"g": "x", "v": "a", "d": decimal.Decimal("1.50"), "t": dt.datetime(2024, 2, 29, 1, 2, 3, 4),
                "b": b"\x00\xff", "u": 7, "f": 0.5}
        seq: list[tuple[str, Any, Any]] = [("insert", None, dict(base, id=i)) for i in range(30)]
        seq += [("update", dict(base, id=i), dict(base, id=i, v="b", b=b"z")) for i in range(0, 30, 3)]
        seq += [("delete", dict(base, id=i), None) for i in range(1, 30, 7)]
        final = fast(info, seq, ["id"])
        assert final.rows_table() is None
        with t.engine.connect() as conn:
            conn.begin()
            table_write.write_changes(t, conn, info, final, False, True)
            conn.commit()
        assert biggest and max(biggest) <= 4
        want = {c.after["id"]: c.after for c in reference(info, seq, ["id"]) if c.after is not None}
        table_ = t.sa_table(info)
        with t.engine.connect() as conn:
            have = {r.id: r for r in conn.execute(sa.select(table_))}
        assert sorted(have) == sorted(want)
        for i, row in want.items():
            assert bytes(have[i].b) == row["b"] and have[i].v == row["v"]
    finally:
        t.close()


def _rows(t: targets.Target, info: binlog_pb2.TableInfo) -> list[dict[str, Any]]:
    """The target table's rows, typed by binlake's definition (SQLite keeps decimals
    and uints as text, PostgreSQL the uint as NUMERIC(20))."""
    table = t.sa_table(info)
    with t.engine.connect() as conn:
        out = [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(table.c.id))]
    for row in out:
        row["u"] = int(row["u"]) if row["u"] is not None else None
    return out


@pytest.mark.parametrize("kind", ["postgresql", "sqlite", "duckdb"])
def test_arrow_rows_written_straight_to_the_target(kind: str, request: pytest.FixtureRequest,
                                                  tmp_path: pathlib.Path) -> None:
    """The Arrow write path end to end (PostgreSQL: COPY; SQLite: one prepared
    INSERT over the columns; DuckDB: an insert from the Arrow table): NULL and the empty string apart, CSV's special
    characters, exact decimals, the largest uint, floats and booleans; and a
    target changed by hand is refused with the table and key named."""
    info = flat_table(["id"])
    t = open_target(new_target_url(kind, request, tmp_path, "a"))
    try:
        t.create_table(info)
        texts = ["", None, 'a,"b"\nc', "\\.", "\\N", "ü€ 😀", "NULL", " "]
        seq: list[tuple[str, Any, Any]] = []
        for i, v in enumerate(texts):
            seq.append(("insert", None, {"id": i, "g": "x", "v": v, "d": decimal.Decimal("-12.50") if i % 2 else None,
                                         "u": 2**64 - 1 if i == 3 else i, "f": 0.1 * i if i % 3 else None,
                                         "ok": [True, False, None][i % 3]}))
        seq.append(("update", seq[2][2], dict(seq[2][2], v="")))
        seq.append(("delete", seq[4][2], None))

        def write(s: list[tuple[str, Any, Any]]) -> int:
            final = fast(info, s, ["id"])
            assert final.rows_table() is not None  # the Arrow path, not the per-row one
            with t.engine.connect() as conn:
                conn.begin()
                try:
                    n = table_write.write_changes(t, conn, info, final, False, True)
                except BaseException:
                    conn.rollback()
                    raise
                conn.commit()
            return n

        assert write(seq) == len(texts) - 1
        assert _rows(t, info) == [c.after for c in reference(info, seq, ["id"])]
        # a row deleted by hand that the next batch updates: nothing written, the key named
        with t.engine.begin() as conn:
            conn.exec_driver_sql('DELETE FROM "t" WHERE id = 5')
        before = _rows(t, info)
        nxt = [("insert", None, dict(seq[0][2], id=20)), ("update", seq[5][2], dict(seq[5][2], v="w"))]
        with pytest.raises(table_write.Mismatch) as bad:
            write(nxt)
        assert "target table t: the row with key id=5 that w updates or deletes is not in the target" in str(
            table_write.diagnose(t, bad.value, "w"))
        assert _rows(t, info) == before
        # a row inserted by hand that the next batch inserts: a unique violation, the key named
        with pytest.raises(table_write.Mismatch) as bad:
            write([("insert", None, dict(seq[0][2], id=1))])
        assert "the row with key id=1 that w inserts is already in the target" in str(
            table_write.diagnose(t, bad.value, "w"))
        assert _rows(t, info) == before
    finally:
        t.close()


@pytest.mark.parametrize("ts, seq, ordered", [
    ([], [], True), ([5], [0], True), ([1, 1, 2], [0, 1, 0], True), ([1, 2, 2], [5, 0, 1], True),
    ([1, 1, 2], [1, 0, 0], False), ([2, 1], [0, 1], False), ([1, 1], [0, 0], False),
])
def test_a_read_is_sorted_unless_already_in_commit_order(ts: list[int], seq: list[int], ordered: bool) -> None:
    t = pa.table({"commit_ts": pa.array(ts, pa.int64()), "seq": pa.array(seq, pa.int32())})
    assert read.in_commit_order(t) is ordered


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flat_steps, st.integers(1, 5))
def test_split_deals_every_final_change_to_one_bucket_by_key(raw_steps: list[Any], count: int) -> None:
    """Parallel mode's buckets: together they are exactly the whole (keys to delete,
    keys inserted, rows, each in order), a key is in one bucket only, and its bucket
    depends on the key and the count alone (a rerun deals it the same way)."""
    seq = play(raw_steps)
    for key in (["id"], ["id", "g"], ["g"]):
        info = flat_table(key)
        whole = fast(info, seq, key)
        parts = whole.split(count)
        assert len(parts) == count
        gone = [g for part in parts for g in part[0]]
        inserted = [i for part in parts for i in part[1]]
        assert sorted(gone, key=repr) == sorted(whole.gone_keys(), key=repr)
        assert sorted(inserted, key=repr) == sorted(whole.insert_keys(), key=repr)
        rows = whole.rows_table()
        assert rows is not None
        assert sum(p[2].num_rows for p in parts) == rows.num_rows
        owner: dict[tuple[Any, ...], int] = {}
        for i, (g, ins, part_rows) in enumerate(parts):
            for kk in [*g, *ins, *(tuple(r[c] for c in key) for r in part_rows.to_pylist())]:
                assert owner.setdefault(kk, i) == i, kk
            # each bucket keeps the whole's order
            assert g == [x for x in whole.gone_keys() if x in set(g)]
        again = fast(info, list(reversed(seq)), key) if seq else whole
        for kk, i in owner.items():
            hit = [j for j, part in enumerate(again.split(count)) if kk in part[0] or kk in part[1]]
            assert hit in ([], [i])
