"""Table checksums (binlake.sql.checksum): equal rows give equal checksums whatever the insertion
order; any changed value changes it; values are compared by meaning (1.5 ==
1.50), and NULL is never confused with a string."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from binlake import cli, errors
from binlake.sql import checksum
from binlake.sql import dialect as dl
from binlake.sql import schema as sc

ROWS = [
    {"id": i, "name": f"row {i} é", "price": Decimal(i) / 4, "blob": bytes([i, 0, 255]),
     "at": dt.datetime(2024, 1, 2, 3, 4, 5, i), "doc": {"b": [1, i], "a": None}, "flag": i % 2 == 0,
     "ratio": i / 3, "note": None if i % 3 == 0 else "NULL" if i % 3 == 1 else f"n{i}"}
    for i in range(1, 41)
]


def _db(path: pathlib.Path, rows: list[dict[str, Any]], extra_internal: bool = False) -> str:
    url = f"sqlite:///{path}"
    engine = sa.create_engine(url)
    md = sa.MetaData()
    t = sa.Table("items", md, sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.String(40)),
                 sa.Column("price", sa.Numeric(10, 2)), sa.Column("blob", sa.LargeBinary),
                 sa.Column("at", sa.DateTime), sa.Column("doc", sa.JSON), sa.Column("flag", sa.Boolean),
                 sa.Column("ratio", sa.Float), sa.Column("note", sa.Text))
    other = sa.Table("empty", md, sa.Column("id", sa.Integer, primary_key=True))
    if extra_internal:
        sa.Table("_binlake_meta", md, sa.Column("k", sa.String(10), primary_key=True))
    md.create_all(engine)
    with engine.begin() as conn:
        if rows:
            conn.execute(t.insert(), rows)
        assert other is not None
        if extra_internal:
            conn.execute(sa.text("INSERT INTO _binlake_meta VALUES ('writer')"))
    engine.dispose()
    return url


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")
def test_same_rows_in_any_order_same_checksum(tmp_path: pathlib.Path) -> None:
    a = _db(tmp_path / "a.db", ROWS)
    b = _db(tmp_path / "b.db", list(reversed(ROWS[20:])) + ROWS[:20], extra_internal=True)
    sa_, sb = checksum.checksum(a), checksum.checksum(b)
    assert sa_ == sb  # binlake's own tables are skipped
    assert sa_["items"][0] == 40
    assert sa_["empty"] == (0, "0" * 32)
    assert "_binlake_meta" in checksum.checksum(b, include_internal=True)
    assert checksum.checksum(a, ["items"]) == {"items": sa_["items"]}
    with pytest.raises(errors.NotFound, match="nope"):
        checksum.checksum(a, ["nope"])


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")
@pytest.mark.parametrize("column, value", [
    ("name", "row 7 e"), ("price", Decimal("1.76")), ("blob", b"\x07\x00\xfe"), ("doc", {"a": None, "b": [1, 8]}),
    ("at", dt.datetime(2024, 1, 2, 3, 4, 5, 8)), ("flag", True), ("ratio", 7 / 3 + 1e-9), ("note", None),
])
def test_one_changed_value_changes_the_checksum(tmp_path: pathlib.Path, column: str, value: Any) -> None:
    changed = [dict(r) for r in ROWS]
    changed[6][column] = value
    a = checksum.checksum(_db(tmp_path / "a.db", ROWS), ["items"])
    b = checksum.checksum(_db(tmp_path / "b.db", changed), ["items"])
    assert a["items"][0] == b["items"][0]
    assert a["items"][1] != b["items"][1]


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")
def test_missing_row_changes_the_checksum(tmp_path: pathlib.Path) -> None:
    a = checksum.checksum(_db(tmp_path / "a.db", ROWS), ["items"])
    b = checksum.checksum(_db(tmp_path / "b.db", ROWS[1:]), ["items"])
    assert a["items"] != b["items"]


def test_canonical_values() -> None:
    assert checksum.canonical(Decimal("1.50")) == checksum.canonical(Decimal("1.5")) == "1.5"
    assert checksum.canonical(Decimal("0.00")) == checksum.canonical(Decimal("-0")) == "0"
    assert checksum.canonical(Decimal("1E+2")) == checksum.canonical(Decimal("100.000")) == "100"
    assert checksum.canonical(True) == checksum.canonical(1) == "1"
    assert checksum.canonical(b"\x00\xff") == "00ff"
    assert checksum.canonical(dt.datetime(2024, 1, 1)) == "2024-01-01T00:00:00.000000"
    assert checksum.canonical(dt.timedelta(hours=1, microseconds=5)) == checksum.canonical(dt.time(1, 0, 0, 5))
    assert checksum.canonical({"b": 1, "a": [True]}) == '{"a":[true],"b":1}'
    assert checksum.canonical("x", json_column=True) == '"x"'
    assert checksum.canonical(None) is None
    assert checksum.row_hash({"v": Decimal("1.5")}) == checksum.row_hash({"v": Decimal("1.50")})


def test_null_is_not_the_string_null() -> None:
    hashes = {checksum.row_hash({"a": v}) for v in (None, "NULL", "", "\x00")}
    assert len(hashes) == 4
    # Values are framed: moving text between columns changes the row.
    assert checksum.row_hash({"a": "xy", "b": ""}) != checksum.row_hash({"a": "x", "b": "y"})


def _binlake_table(path: pathlib.Path, prices: list[str]) -> tuple[str, dict[str, Any]]:
    """A table as TxnWriter makes it on SQLite: decimals stored as text."""
    info = sc.new_table(100, "main", "money", [sc.ColumnDef("id", "int", False),
                                               sc.ColumnDef("amount", "decimal", True, 20, 2)], ["id"], None, 1)
    url = f"sqlite:///{path}"
    engine = sa.create_engine(url)
    t = dl.sa_table(info, "sqlite")
    t.metadata.create_all(engine)
    with engine.begin() as conn:
        # Raw text, as another writer (or a hand-made restore) may have stored it.
        for i, p in enumerate(prices):
            conn.execute(sa.text("INSERT INTO money (id, amount) VALUES (:i, :p)"), {"i": i, "p": p})
    engine.dispose()
    return url, {"money": info}


def test_binlake_types_make_text_decimals_compare_by_value(tmp_path: pathlib.Path) -> None:
    a, schema = _binlake_table(tmp_path / "a.db", ["1.50", "2", "0.00"])
    b, _ = _binlake_table(tmp_path / "b.db", ["1.5", "2.00", "0"])
    # Reflected, the column is TEXT: the strings differ.
    assert checksum.checksum(a) != checksum.checksum(b)
    # Typed by binlake's definition, they are the same decimals.
    assert checksum.checksum(a, schema=schema) == checksum.checksum(b, schema=schema)
    assert checksum.checksum(a, schema=schema)["money"][0] == 3


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")
def test_ctl_checksum_cli(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _db(tmp_path / "a.db", ROWS)
    assert cli.main(["ctl", "checksum", url, "--tables", "items,empty", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"table": "empty", "rows": 0, "checksum": "0" * 32},
                     {"table": "items", "rows": 40, "checksum": checksum.checksum(url)["items"][1]}]
    assert cli.main(["ctl", "checksum", url]) == 0
    out = capsys.readouterr().out
    assert "items" in out and "40" in out
    assert cli.main(["ctl", "checksum", url, "--tables", "missing"]) == 2
    assert "missing" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")
def test_portable_checksum_sums_the_portable_row_hashes(tmp_path: pathlib.Path) -> None:
    # A whole table's portable checksum takes shortcuts for common kinds: it must sum the
    # very hashes portable_rows gives (the row texts a Spark frame renders too).
    url = _db(tmp_path / "a.db", ROWS)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        total = xor = rows = 0
        for _key, h in checksum.portable_rows(conn, "items", None, ()):
            rows, total, xor = rows + 1, (total + h) % (1 << 64), xor ^ h
    engine.dispose()
    assert checksum.checksum(url, ["items"], portable=True)["items"] == (40, f"{total:016x}{xor:016x}")
    assert checksum.checksum(url, ["items"], portable=True) != checksum.checksum(
        _db(tmp_path / "b.db", ROWS[:-1] + [{**ROWS[-1], "name": "other"}]), ["items"], portable=True)
