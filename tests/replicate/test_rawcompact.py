"""The apply's fast compaction (``rawcompact``: from image JSON, typing only the
final images) against the reference (``compactor.compact`` over fully decoded
changes): equal change for change on random change sequences, with key changes,
deletes then re-inserts, composite keys, routed shards (extract column) and
keyless tables. Plus the parallel mode's buckets of conflict groups."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from binlake.lake.decoding import decode
from binlake.lake.decoding.image import value_json
from binlake.proto import binlog_pb2
from binlake.replicate import checkpoint, compactor, parallel, rawcompact
from binlake.replicate.causality import TableKeys, group
from binlake.replicate.compactor import Change
from binlake.sql import schema as sc

COLUMNS = [sc.ColumnDef("id", "int", False), sc.ColumnDef("g", "string", False, length=8),
           sc.ColumnDef("v", "string"), sc.ColumnDef("d", "decimal", precision=10, scale=2),
           sc.ColumnDef("t", "datetime"), sc.ColumnDef("b", "bytes"), sc.ColumnDef("u", "uint"),
           sc.ColumnDef("f", "float")]


def table(key: list[str]) -> binlog_pb2.TableInfo:
    return sc.new_table(7, "app", "t", COLUMNS, key, None, 1)


def image(info: binlog_pb2.TableInfo, row: dict[str, Any] | None) -> str | None:
    if row is None:
        return None
    types = {c.name: c.type for c in info.columns}
    return "{" + ",".join(f"{json.dumps(n)}:{value_json(row[n], types[n]) if row[n] is not None else 'null'}"
                          for n in sorted(row)) + "}"


values = st.fixed_dictionaries({
    "v": st.one_of(st.none(), st.text(max_size=3)),
    "d": st.one_of(st.none(), st.decimals(min_value=-999, max_value=999, places=2, allow_nan=False)),
    "t": st.one_of(st.none(), st.datetimes(min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2030, 1, 1))),
    "b": st.one_of(st.none(), st.binary(max_size=3)),
    "u": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "f": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
})
# Steps over a key space of 4 ids x 2 groups, so keys repeat, move and come back.
steps = st.lists(st.tuples(st.sampled_from(["insert", "update", "delete"]), st.integers(0, 3), st.sampled_from("xy"),
                           st.booleans(), values), max_size=40)


def play(raw_steps: list[tuple[str, int, str, bool, dict[str, Any]]]
         ) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """A consistent change sequence (an upstream's log) from random steps."""
    live: dict[tuple[int, str], dict[str, Any]] = {}
    out: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    for op, i, g, move, vals in raw_steps:
        k = (i, g)
        if op == "insert" and k not in live:
            row = {"id": i, "g": g, **vals}
            live[k] = row
            out.append(("insert", None, row))
        elif live:
            old_k = k if k in live else sorted(live)[i % len(live)]
            before = live.pop(old_k)
            if op == "delete":
                out.append(("delete", before, None))
                continue
            new_id = next((j for j in range(old_k[0] + 1, old_k[0] + 9) if (j % 8, old_k[1]) not in live), None)
            after = dict(before, **vals)
            if move and new_id is not None:  # a key change
                after["id"] = new_id % 8
            live[(after["id"], after["g"])] = after
            out.append(("update", before, after))
    return out


def reference(info: binlog_pb2.TableInfo, seq: list[tuple[str, Any, Any]], key: list[str] | None,
              extract: tuple[str, str] | None = None) -> list[Change]:
    changes = []
    for n, (op, before, after) in enumerate(seq):
        b = decode.image_values(image(info, before), info)
        a = decode.image_values(image(info, after), info)
        if extract:
            for img in (b, a):
                if img is not None:
                    img[extract[0]] = extract[1]
        changes.append(Change("t", op, b, a, 100 + n // 3, n % 3))
    return compactor.compact(changes, key)


def raw(info: binlog_pb2.TableInfo, seq: list[tuple[str, Any, Any]], key: list[str],
        extract: tuple[str, str] | None = None) -> list[rawcompact.RawChange]:
    dec = rawcompact.ImageDecoder(info, key, extract)
    return [(op, image(info, b), image(info, a), 100 + n // 3, n % 3, dec) for n, (op, b, a) in enumerate(seq)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_fast_compaction_equals_the_reference(raw_steps: list[Any]) -> None:
    seq = play(raw_steps)
    for key in (["id", "g"], ["id"]):  # one key per row, and one that two rows may share
        info = table(key)
        assert rawcompact.compact("t", raw(info, seq, key), True) == reference(info, seq, key)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_keyless_tables_keep_every_change_in_commit_order(raw_steps: list[Any]) -> None:
    seq = play(raw_steps)
    info = table(["id", "g"])
    assert rawcompact.compact("t", raw(info, seq, []), False) == reference(info, seq, None)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_routed_shard_keys_include_the_extract_column(raw_steps: list[Any]) -> None:
    seq = play(raw_steps)
    info = table(["id", "g"])
    key = ["id", "g", "src"]
    extract = ("src", "orders_01")
    assert rawcompact.compact("t", raw(info, seq, key, extract), True) == reference(info, seq, key, extract)


def test_the_rules_on_typed_keys() -> None:
    info = table(["id", "g"])
    r1 = {"id": 1, "g": "x", "v": "a", "d": decimal.Decimal("1.50"), "t": None, "b": b"\x00", "u": 2**63,
          "f": 0.1}
    r2 = dict(r1, v="b")
    r3 = dict(r1, id=2)
    seq = [("insert", None, r1), ("update", r1, r2), ("update", r2, r3), ("delete", r3, None), ("insert", None, r1)]
    out = rawcompact.compact("t", raw(info, seq, ["id", "g"]), True)
    # id 1: inserted, updated, moved away and back: one insert of the last image; id 2: nothing
    assert [(c.op, c.after) for c in out] == [("insert", r1)]
    assert out == reference(info, seq, ["id", "g"])


def test_bad_images_are_refused_with_the_table_named() -> None:
    dec = rawcompact.ImageDecoder(table(["id"]), ["id"])
    with pytest.raises(ValueError, match="column\\(s\\) zz that app.t does not"):
        dec.parse('{"id":1,"zz":2}')
    with pytest.raises(ValueError, match="not image JSON"):
        dec.parse("{")
    with pytest.raises(ValueError, match="key column"):
        rawcompact.ImageDecoder(table(["id"]), ["nope"])


def test_buckets_keep_groups_whole_and_reruns_deal_the_same_way() -> None:
    keys = {"t": TableKeys(("id",))}
    changes = [Change("t", "insert", None, {"id": i % 7}) for i in range(20)]
    groups = group(changes, keys)
    assert len(groups) == 7
    first = dict(parallel.buckets(groups, 3, set()))
    assert len(first) == 3 and sorted(c for part in first.values() for c in map(id, part)) == sorted(map(id, changes))
    for part in first.values():  # a group is never split, and keeps its order
        for g in groups:
            inside = [c for c in part if c in g]
            assert inside in ([], g)
    # a rerun with another parallel_tasks, after bucket 1 of 3 went in: the same buckets
    again = dict(parallel.buckets(groups, 5, {checkpoint.bucket_id(1, 3)}))
    assert again == first
