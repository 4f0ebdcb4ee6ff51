"""Compaction (every DM rule, table-driven) and causality (the conflict cases)."""

from __future__ import annotations

from typing import Any

import pytest

from binlake.replicate.causality import TableKeys, group
from binlake.replicate.compactor import Change, compact


def ins(a: Any, b: Any = None) -> Change:
    return Change("t", "insert", None, {"a": a, "b": b})


def upd(a0: Any, b0: Any, a1: Any, b1: Any) -> Change:
    return Change("t", "update", {"a": a0, "b": b0}, {"a": a1, "b": b1})


def dele(a: Any, b: Any = None) -> Change:
    return Change("t", "delete", {"a": a, "b": b}, None)


def shape(changes: list[Change]) -> list[tuple[str, Any, Any]]:
    return [(c.op, c.before and (c.before["a"], c.before["b"]), c.after and (c.after["a"], c.after["b"]))
            for c in changes]


CASES = [
    ("insert+update -> insert of the final image", [ins(1, 1), upd(1, 1, 1, 2)], [("insert", None, (1, 2))]),
    ("update+update -> update first before, last after", [upd(1, 1, 1, 2), upd(1, 2, 1, 3)],
     [("update", (1, 1), (1, 3))]),
    ("insert+delete -> nothing", [ins(1, 1), dele(1, 1)], []),
    ("update+delete -> delete with the original before", [upd(1, 1, 1, 2), dele(1, 2)], [("delete", (1, 1), None)]),
    ("delete+insert -> the new row", [dele(1, 1), ins(1, 5)], [("update", (1, 1), (1, 5))]),
    ("key change -> delete(old) + insert(new)", [upd(1, 1, 2, 1)], [("delete", (1, 1), None), ("insert", None, (2, 1))]),
    ("key chain 1->2->3", [upd(1, 1, 2, 1), upd(2, 1, 3, 1)], [("delete", (1, 1), None), ("insert", None, (3, 1))]),
    ("insert, delete, insert -> insert", [ins(1, 1), dele(1, 1), ins(1, 2)], [("insert", None, (1, 2))]),
    ("update, delete, insert -> update", [upd(1, 1, 1, 2), dele(1, 2), ins(1, 3)], [("update", (1, 1), (1, 3))]),
    ("delete then re-insert then update", [dele(1, 1), ins(1, 1), upd(1, 1, 1, 9)], [("update", (1, 1), (1, 9))]),
    ("separate keys stay separate", [ins(1), ins(2), dele(3)],
     [("insert", None, (1, None)), ("insert", None, (2, None)), ("delete", (3, None), None)]),
    ("swap keys 1<->2 through 3", [upd(1, "x", 3, "x"), upd(2, "y", 1, "y"), upd(3, "x", 2, "x")],
     [("update", (1, "x"), (1, "y")), ("update", (2, "y"), (2, "x"))]),
]


@pytest.mark.parametrize("name, changes, expected", CASES, ids=[c[0] for c in CASES])
def test_compaction_rules(name: str, changes: list[Change], expected: list[tuple[str, Any, Any]]) -> None:
    assert shape(compact(changes, ["a"])) == expected


def test_no_key_keeps_every_change_in_commit_order() -> None:
    changes = [ins(1, 1), upd(1, 1, 1, 2), dele(1, 2), ins(1, 1)]
    assert compact(changes, None) == changes
    assert compact(changes, []) == changes


def test_change_validates_images() -> None:
    with pytest.raises(ValueError, match="insert has no before image"):
        Change("t", "insert", {"a": 1}, {"a": 1})
    with pytest.raises(ValueError, match="op must be"):
        Change("t", "upsert", None, {"a": 1})


UNIQUE_AB = {"t": TableKeys(("id",), (("ua", ("a",)), ("ub", ("b",))))}


def row(i: int, a: Any, b: Any) -> dict[str, Any]:
    return {"id": i, "a": a, "b": b}


def test_unique_key_case_update_follows_delete() -> None:
    # t(a UNIQUE, b UNIQUE): insert (1,1), insert (2,2), delete (2,2), update t set b=2 where a=1
    c1 = Change("t", "insert", None, row(1, 1, 1))
    c2 = Change("t", "insert", None, row(2, 2, 2))
    c3 = Change("t", "delete", row(2, 2, 2), None)
    c4 = Change("t", "update", row(1, 1, 1), row(1, 1, 2))
    groups = group([c1, c2, c3, c4], UNIQUE_AB)
    assert len(groups) == 1
    only = groups[0]
    assert only == [c1, c2, c3, c4]
    assert only.index(c3) < only.index(c4)  # the update must follow the delete


def test_independent_rows_are_separate_groups_and_deterministic() -> None:
    cs = [Change("t", "insert", None, row(i, i, i)) for i in range(5)]
    groups = group(cs, UNIQUE_AB)
    assert groups == [[c] for c in cs]
    assert group(list(cs), UNIQUE_AB) == groups


def test_unique_swap_between_two_rows_is_one_group() -> None:
    # row 1 takes b=2 from row 2 and row 2 takes b=1, through a temporary value
    cs = [Change("t", "update", row(1, 1, 1), row(1, 1, 9)), Change("t", "update", row(2, 2, 2), row(2, 2, 1)),
          Change("t", "update", row(1, 1, 9), row(1, 1, 2)), Change("t", "insert", None, row(3, 3, 3))]
    groups = group(cs, UNIQUE_AB)
    assert groups == [cs[:3], [cs[3]]]


def test_primary_key_chain_is_one_group() -> None:
    cs = [Change("t", "update", row(1, 10, 10), row(2, 10, 10)), Change("t", "update", row(2, 10, 10), row(3, 10, 10)),
          Change("t", "insert", None, row(7, 7, 7))]
    assert group(cs, UNIQUE_AB) == [cs[:2], [cs[2]]]


def test_delete_and_reinsert_of_a_key_is_one_group() -> None:
    cs = [Change("t", "delete", row(1, 1, 1), None), Change("t", "insert", None, row(5, 6, 6)),
          Change("t", "insert", None, row(1, 4, 4))]
    assert group(cs, UNIQUE_AB) == [[cs[0], cs[2]], [cs[1]]]


def test_nulls_and_different_unique_keys_never_conflict() -> None:
    cs = [Change("t", "insert", None, row(1, None, None)), Change("t", "insert", None, row(2, None, None)),
          Change("t", "insert", None, row(3, 5, 6)), Change("t", "insert", None, row(4, 6, 5))]
    # NULLs in ua/ub: no conflict; a=5 on ua and b=5 on ub are different keys: no conflict
    assert group(cs, UNIQUE_AB) == [[c] for c in cs]


def test_tables_are_separate_and_keyless_tables_are_one_group() -> None:
    keys = {"t": TableKeys(("id",)), "u": TableKeys(("id",))}
    a = Change("t", "insert", None, {"id": 1})
    b = Change("u", "insert", None, {"id": 1})
    n1 = Change("nokey", "insert", None, {"x": 1})
    n2 = Change("nokey", "insert", None, {"x": 2})
    assert group([a, n1, b, n2], keys) == [[a], [n1, n2], [b]]
