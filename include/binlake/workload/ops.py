"""The operations a workload transaction is made of, and the values they write.

Each operation (``Insert``, ``Update``, ``Transfer``, ``DDL`` ...) is a frozen
record that the planner builds and the runner applies inside one TxnWriter
transaction; every one is valid in any execution order (it re-reads the rows it
changes and does nothing when they are gone). ``LogicalTxn`` groups them into
one transaction of a plan. The value generators draw every column value from
the planner's ``random.Random``, so a plan stays a pure function of its seed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import string
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any, Protocol

from binlake import errors
from binlake.sql.schema import ColumnDef

PROFILES = ("oltp", "bank", "ddl", "mixed")
BANK_TABLE = "accounts"
BANK_INITIAL_BALANCE = Decimal("1000.00")
WIDE_BYTES = 64 * 1024
# Rows per statement of a generated (bulk) insert: bounds the size of one
# executemany and of the read-back that follows it.
_CHUNK = 1000
_LOAD_ROWS_PER_TXN = 500
_BASE_TIME = dt.datetime(2020, 1, 1)
# Letters, digits and a few multi-byte characters: strings must survive every
# dialect (no NUL: PostgreSQL text cannot hold it).
_ALPHABET = string.ascii_letters + string.digits + " -_.,é漢字ß€🙂"


# ---------------------------------------------------------------- value generation
def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(_ALPHABET, k=n))


def _value(rng: random.Random, col: ColumnDef, null_rate: float = 0.15) -> Any:
    """A random value for ``col``'s current type (all decisions from ``rng``)."""
    if col.nullable and rng.random() < null_rate:
        return None
    t = col.type
    if t == "int":
        return rng.randint(-1_000_000, 1_000_000_000)
    if t == "uint":
        return rng.randint(0, (1 << 64) - 1)
    if t == "bool":
        return rng.random() < 0.5
    if t == "float":
        return round(rng.uniform(-1e6, 1e6), 6)
    if t == "decimal":
        precision, scale = col.precision or 10, col.scale or 0
        # At most `precision` digits in all, so the value always fits the column.
        return Decimal(rng.randrange(10 ** min(precision, 15))).scaleb(-scale)
    if t == "string":
        if col.length:
            return _text(rng, rng.randint(max(1, col.length // 2), col.length))
        return _text(rng, rng.randint(0, 60))
    if t == "bytes":
        return rng.randbytes(rng.randint(0, min(col.length or 48, 48)))
    if t == "date":
        return _BASE_TIME.date() + dt.timedelta(days=rng.randrange(20_000))
    if t == "datetime":
        return _BASE_TIME + dt.timedelta(seconds=rng.randrange(400_000_000), microseconds=rng.randrange(1_000_000))
    if t == "time":
        return dt.time(rng.randrange(24), rng.randrange(60), rng.randrange(60), rng.randrange(1_000_000))
    if t == "json":
        return {
            "n": rng.randint(-1000, 1000),
            "s": _text(rng, rng.randint(0, 12)),
            "ok": rng.random() < 0.5,
            "tags": [_text(rng, 3) for _ in range(rng.randint(0, 3))],
            "nested": {"x": rng.randint(0, 9), "y": None},
        }
    raise errors.InvalidArgument(f"workload cannot generate values of type {t}")


def _wide_value(rng: random.Random, col: ColumnDef, size: int) -> Any:
    if col.type == "bytes":
        return rng.randbytes(size)
    return _text(rng, size)


# ---------------------------------------------------------------- operations
@dataclasses.dataclass
class _Counts:
    inserts: int = 0
    updates: int = 0
    deletes: int = 0


class _Txn(Protocol):  # the part of binlake.writer.txn_writer.Txn the operations use
    writer: Any

    def insert_many(self, table: str, rows: Sequence[dict[str, Any]]) -> None: ...
    def update(self, table: str, key: dict[str, Any], values: dict[str, Any]) -> int: ...
    def update_where(self, table: str, where: Any, values: dict[str, Any]) -> int: ...
    def delete(self, table: str, key: dict[str, Any]) -> int: ...
    def delete_where(self, table: str, where: Any) -> int: ...
    def get(self, table: str, key: dict[str, Any]) -> dict[str, Any] | None: ...


@dataclasses.dataclass(frozen=True)
class Insert:
    """Insert rows with fresh primary keys."""

    table: str
    rows: tuple[dict[str, Any], ...]

    def columns(self) -> tuple[str, ...]:
        return tuple(sorted({c for r in self.rows for c in r}))

    def apply(self, txn: _Txn, n: _Counts) -> None:
        txn.insert_many(self.table, [dict(r) for r in self.rows])
        n.inserts += len(self.rows)


@dataclasses.dataclass(frozen=True)
class Generate:
    """Insert ``count`` rows with ids ``first_id..`` whose values are drawn at run
    time from ``seed``: bulk loads, large and wide rows stay small in the plan
    and still a pure function of it."""

    table: str
    first_id: int
    count: int
    seed: int
    cols: tuple[ColumnDef, ...]
    unique: str | None = None
    wide: tuple[str, ...] = ()
    wide_bytes: int = 0

    def columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cols)

    def rows(self) -> Iterator[dict[str, Any]]:
        rng = random.Random(self.seed)
        for i in range(self.count):
            key = self.first_id + i
            row: dict[str, Any] = {}
            for c in self.cols:
                if c.name == "id":
                    row["id"] = key
                elif c.name == self.unique:
                    # Derived from the id, which is never handed out twice.
                    row[c.name] = None if rng.random() < 0.1 else f"gen-{key}"
                elif c.name in self.wide:
                    row[c.name] = _wide_value(rng, c, self.wide_bytes)
                else:
                    row[c.name] = _value(rng, c)
            yield row

    def apply(self, txn: _Txn, n: _Counts) -> None:
        chunk: list[dict[str, Any]] = []
        for row in self.rows():
            chunk.append(row)
            if len(chunk) >= _CHUNK:
                txn.insert_many(self.table, chunk)
                chunk = []
        if chunk:
            txn.insert_many(self.table, chunk)
        n.inserts += self.count


@dataclasses.dataclass(frozen=True)
class Update:
    """Point update by primary key (a no-op if the row is gone)."""

    table: str
    key: int
    values: dict[str, Any]

    def columns(self) -> tuple[str, ...]:
        return ("id", *sorted(self.values))

    def apply(self, txn: _Txn, n: _Counts) -> None:
        n.updates += txn.update(self.table, {"id": self.key}, dict(self.values))


@dataclasses.dataclass(frozen=True)
class WideUpdate:
    """Set the wide columns of one row to ~64 KiB values drawn at run time from ``seed``."""

    table: str
    key: int
    seed: int
    cols: tuple[ColumnDef, ...]
    size: int

    def columns(self) -> tuple[str, ...]:
        return ("id", *(c.name for c in self.cols))

    def apply(self, txn: _Txn, n: _Counts) -> None:
        rng = random.Random(self.seed)
        values = {c.name: _wide_value(rng, c, self.size) for c in self.cols}
        n.updates += txn.update(self.table, {"id": self.key}, values)


@dataclasses.dataclass(frozen=True)
class UpdateRange:
    """Range update: every row with ``lo <= id <= hi`` gets ``values``."""

    table: str
    lo: int
    hi: int
    values: dict[str, Any]

    def columns(self) -> tuple[str, ...]:
        return ("id", *sorted(self.values))

    def apply(self, txn: _Txn, n: _Counts) -> None:
        lo, hi = self.lo, self.hi
        n.updates += txn.update_where(self.table, lambda t: t.c.id.between(lo, hi), dict(self.values))


@dataclasses.dataclass(frozen=True)
class Delete:
    table: str
    key: int

    def columns(self) -> tuple[str, ...]:
        return ("id",)

    def apply(self, txn: _Txn, n: _Counts) -> None:
        n.deletes += txn.delete(self.table, {"id": self.key})


@dataclasses.dataclass(frozen=True)
class DeleteRange:
    table: str
    lo: int
    hi: int

    def columns(self) -> tuple[str, ...]:
        return ("id",)

    def apply(self, txn: _Txn, n: _Counts) -> None:
        lo, hi = self.lo, self.hi
        n.deletes += txn.delete_where(self.table, lambda t: t.c.id.between(lo, hi))


@dataclasses.dataclass(frozen=True)
class ChangeKey:
    """Primary-key change: the row ``key`` moves to the never-used ``new_key``."""

    table: str
    key: int
    new_key: int

    def columns(self) -> tuple[str, ...]:
        return ("id",)

    def apply(self, txn: _Txn, n: _Counts) -> None:
        n.updates += txn.update(self.table, {"id": self.key}, {"id": self.new_key})


@dataclasses.dataclass(frozen=True)
class SwapUnique:
    """Swap two rows' values of a unique column inside one transaction:
    a := NULL, b := a's old value, a := b's old value (each step keeps the key unique)."""

    table: str
    a: int
    b: int
    column: str

    def columns(self) -> tuple[str, ...]:
        return ("id", self.column)

    def apply(self, txn: _Txn, n: _Counts) -> None:
        ra = txn.get(self.table, {"id": self.a})
        rb = txn.get(self.table, {"id": self.b})
        if ra is None or rb is None:
            return
        col = self.column
        txn.update(self.table, {"id": self.a}, {col: None})
        txn.update(self.table, {"id": self.b}, {col: ra[col]})
        txn.update(self.table, {"id": self.a}, {col: rb[col]})
        n.updates += 3


@dataclasses.dataclass(frozen=True)
class Reinsert:
    """Delete a row and insert the same primary key (and unique value) with new
    values, in one transaction."""

    table: str
    key: int
    values: dict[str, Any]
    unique: str | None

    def columns(self) -> tuple[str, ...]:
        return ("id", *sorted(self.values), *((self.unique,) if self.unique else ()))

    def apply(self, txn: _Txn, n: _Counts) -> None:
        old = txn.get(self.table, {"id": self.key})
        if old is None:
            return
        n.deletes += txn.delete(self.table, {"id": self.key})
        row = {"id": self.key, **self.values}
        if self.unique is not None:
            row[self.unique] = old[self.unique]
        txn.insert_many(self.table, [row])
        n.inserts += 1


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Money moves between accounts: each leg ``(src, dst, amount)`` moves up to
    ``amount`` (never below zero), in order. The sum of balances is the same
    before and after."""

    table: str
    legs: tuple[tuple[int, int, Decimal], ...]

    def columns(self) -> tuple[str, ...]:
        return ("id", "balance")

    def apply(self, txn: _Txn, n: _Counts) -> None:
        keys = sorted({k for src, dst, _ in self.legs for k in (src, dst)})
        rows = {k: txn.get(self.table, {"id": k}) for k in keys}
        if any(r is None for r in rows.values()):
            return
        balance = {k: Decimal(r["balance"]) for k, r in rows.items() if r is not None}
        delta = dict.fromkeys(keys, Decimal(0))
        for src, dst, amount in self.legs:
            moved = min(amount, balance[src])
            if moved <= 0:
                continue
            balance[src] -= moved
            balance[dst] += moved
            delta[src] -= moved
            delta[dst] += moved
        # One update per account, in key order: concurrent transfers lock rows in
        # the same order and cannot deadlock each other.
        changed = [k for k in keys if delta[k] != 0]
        if txn.writer.dialect == "sqlite":
            # SQLite transactions run one at a time (TxnWriter serialises them),
            # so the balances just read are current; its arithmetic on decimals
            # stored as text would go through floats, so compute here.
            for k in changed:
                n.updates += txn.update(self.table, {"id": k}, {"balance": balance[k]})
        else:
            # Elsewhere another transaction may have changed a balance since the
            # read: let the database add under its row lock (exact NUMERIC).
            t = txn.writer.sa_table(self.table)
            for k in changed:
                n.updates += txn.update_where(self.table, lambda tb, k=k: tb.c.id == k,
                                              {"balance": t.c.balance + delta[k]})


@dataclasses.dataclass(frozen=True)
class DDL:
    """One schema change, as a TxnWriter DDL method call: ``create_table`` takes
    (columns, primary key, unique keys); the others take ``table`` and ``args``."""

    action: str
    table: str
    args: tuple[Any, ...] = ()

    def apply_ddl(self, writer: Any) -> None:
        if self.action == "create_table":
            cols, pk, uniques = self.args
            writer.create_table(self.table, list(cols), list(pk), {k: list(v) for k, v in uniques})
        else:
            getattr(writer, self.action)(self.table, *self.args)


Op = (Insert | Generate | Update | WideUpdate | UpdateRange | Delete | DeleteRange | ChangeKey | SwapUnique
      | Reinsert | Transfer | DDL)


@dataclasses.dataclass(frozen=True)
class LogicalTxn:
    """One transaction of the plan: a DDL alone, or DML operations run together."""

    seq: int
    label: str
    ops: tuple[Op, ...]

    @property
    def is_ddl(self) -> bool:
        return any(isinstance(op, DDL) for op in self.ops)
