"""``binlake workload``: realistic, reproducible load on an upstream through TxnWriter.

A run has two halves that never mix:

* ``plan(profile, tables, txns, seed)`` is a pure function: it draws every
  logical transaction from one ``random.Random(seed)``, keeping a model of the
  schema (table and column names, types, unique keys) and of which primary keys
  exist "on paper". The same arguments always give an equal plan.
* ``run(writer, plan, clients, rate)`` executes the plan with C client threads
  that take transactions from one shared iterator, in plan order.

Clients run concurrently, so a transaction may execute before one that precedes
it in the plan. Every transaction is therefore written to be valid in *any*
order: inserts only use primary keys never handed out before (one counter per
table), unique values are fresh or swapped, and operations on existing rows
re-read them inside the transaction (``txn.get``) and do nothing when the row
is gone. A DDL is a barrier: it starts only after every earlier transaction
finished, and nothing after it starts before it is done, so DML always sees the
schema the planner assumed. With one client the whole run, and so the final
data, is a pure function of the plan.

Profiles: ``oltp`` (sysbench-like tables ``sbtest{i}``), ``bank`` (transfers
between accounts; the sum of balances never changes), ``ddl`` (oltp with
schema changes every ~50 transactions) and ``mixed`` (all of them).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import random
import string
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any, Protocol

import sqlalchemy as sa

from binlake import errors
from binlake.source.schema import ColumnDef
from binlake.source.txn_writer import TxnWriter

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


class _Txn(Protocol):  # the part of binlake.source.txn_writer.Txn the operations use
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


# ---------------------------------------------------------------- the planner
class _Ids:
    """The primary keys that exist on paper: O(1) add, remove and random choice."""

    def __init__(self) -> None:
        self._list: list[int] = []
        self._pos: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._list)

    def __contains__(self, key: int) -> bool:
        return key in self._pos

    def add(self, key: int) -> None:
        if key not in self._pos:
            self._pos[key] = len(self._list)
            self._list.append(key)

    def remove(self, key: int) -> None:
        pos = self._pos.pop(key, None)
        if pos is None:
            return
        last = self._list.pop()
        if last != key:
            self._list[pos] = last
            self._pos[last] = pos

    def choice(self, rng: random.Random) -> int:
        return self._list[rng.randrange(len(self._list))]

    def clear(self) -> None:
        self._list.clear()
        self._pos.clear()


@dataclasses.dataclass
class _Table:
    """The planner's model of one oltp table."""

    uid: int
    name: str
    cols: list[ColumnDef]
    # role -> current column name ("c", "note", "data", "pad", "x3", ...); the
    # roles never change, the names do (RENAME COLUMN).
    roles: dict[str, str]
    extras: list[str]  # roles of columns added by DDL, in order of addition
    unique_key: str | None  # the unique key on the pad column, if there is one now
    ids: _Ids = dataclasses.field(default_factory=_Ids)
    next_id: int = 1
    bulk: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # large-insert id ranges
    created_by_ddl: bool = False

    def col(self, role: str) -> ColumnDef:
        name = self.roles[role]
        return next(c for c in self.cols if c.name == name)

    def fresh_id(self) -> int:
        key = self.next_id
        self.next_id += 1
        return key


def _oltp_columns() -> list[ColumnDef]:
    return [
        ColumnDef("id", "int", False),
        ColumnDef("k", "int", False),
        ColumnDef("c", "string", False, length=120),
        ColumnDef("pad", "string", True, length=60),
        ColumnDef("note", "string", True),
        ColumnDef("data", "bytes", True),
        ColumnDef("price", "decimal", False, precision=12, scale=2),
        ColumnDef("ts", "datetime", False),
        ColumnDef("doc", "json", True),
    ]


_OLTP_KINDS = ("point_update", "insert", "delete", "range_update", "range_delete", "pk_change", "unique_swap",
               "reinsert", "unique_null", "wide", "sysbench")
_OLTP_WEIGHTS = (22, 14, 7, 8, 3, 6, 6, 6, 6, 4, 18)
# The DDL events cycle through these so that even a short run sees each kind.
_DDL_CYCLE = ("add_column", "rename_column", "change_column_type", "toggle_unique", "rename_table",
              "add_column", "truncate_table", "create_or_drop", "drop_column", "toggle_unique",
              "create_or_drop")


class _Planner:
    def __init__(self, profile: str, tables: int, seed: int, *, large_txn_rows: int, large_txn_every: int,
                 ddl_every: int, table_rows: int, accounts: int) -> None:
        self.rng = random.Random(seed)
        self.profile = profile
        self.n_tables = tables
        self.large_txn_rows = large_txn_rows
        self.large_txn_every = large_txn_every
        self.ddl_every = ddl_every
        self.table_rows = table_rows
        self.accounts = accounts
        self.oltp = profile in ("oltp", "ddl", "mixed")
        self.bank = profile in ("bank", "mixed")
        self.with_ddl = profile in ("ddl", "mixed")
        self.tables: list[_Table] = []
        self.out: list[LogicalTxn] = []
        self.serial = 0  # fresh unique values and names
        self.uid = 0
        self.ddl_count = 0
        self.large_count = 0

    # -- helpers
    def _emit(self, label: str, *ops: Op) -> None:
        self.out.append(LogicalTxn(len(self.out), label, tuple(ops)))

    def _next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def _seed(self) -> int:
        return self.rng.getrandbits(63)

    def _fresh_pad(self) -> str:
        return f"pad-{self._next_serial()}"

    def _new_table(self, name: str, created_by_ddl: bool) -> _Table:
        self.uid += 1
        cols = _oltp_columns()
        return _Table(self.uid, name, cols, {c.name: c.name for c in cols}, [], f"uk_{name}_pad",
                      created_by_ddl=created_by_ddl)

    def _create_ddl(self, t: _Table) -> DDL:
        uniques = ((t.unique_key, (t.roles["pad"],)),) if t.unique_key else ()
        return DDL("create_table", t.name, (tuple(t.cols), ("id",), uniques))

    def _row(self, t: _Table, key: int) -> dict[str, Any]:
        row: dict[str, Any] = {"id": key}
        for c in t.cols:
            if c.name == "id":
                continue
            if c.name == t.roles["pad"]:
                row[c.name] = None if self.rng.random() < 0.2 else self._fresh_pad()
            else:
                row[c.name] = _value(self.rng, c)
        return row

    def _updatable(self, t: _Table) -> list[ColumnDef]:
        skip = {"id", t.roles["pad"]}
        return [c for c in t.cols if c.name not in skip]

    def _some_values(self, t: _Table, lo: int, hi: int) -> dict[str, Any]:
        cols = self._updatable(t)
        picked = self.rng.sample(cols, min(len(cols), self.rng.randint(lo, hi)))
        # Keep the plan's order of columns stable (sample order is already from rng).
        return {c.name: _value(self.rng, c) for c in picked}

    def _load(self, t: _Table, rows: int) -> None:
        first = t.next_id
        for start in range(first, first + rows, _LOAD_ROWS_PER_TXN):
            count = min(_LOAD_ROWS_PER_TXN, first + rows - start)
            self._emit(f"load {t.name}", Generate(t.name, start, count, self._seed(), tuple(t.cols), t.roles["pad"]))
            for key in range(start, start + count):
                t.ids.add(key)
        t.next_id = first + rows

    # -- setup
    def setup(self) -> None:
        if self.bank:
            cols = (ColumnDef("id", "int", False), ColumnDef("owner", "string", False, length=64),
                    ColumnDef("balance", "decimal", False, precision=20, scale=2))
            self._emit(f"create {BANK_TABLE}",
                       DDL("create_table", BANK_TABLE, (cols, ("id",), (("uk_accounts_owner", ("owner",)),))))
            rows = [{"id": i, "owner": f"owner-{i:06d}", "balance": BANK_INITIAL_BALANCE}
                    for i in range(1, self.accounts + 1)]
            for start in range(0, len(rows), _LOAD_ROWS_PER_TXN):
                self._emit(f"load {BANK_TABLE}", Insert(BANK_TABLE, tuple(rows[start:start + _LOAD_ROWS_PER_TXN])))
        if self.oltp:
            for i in range(1, self.n_tables + 1):
                t = self._new_table(f"sbtest{i}", False)
                self.tables.append(t)
                self._emit(f"create {t.name}", self._create_ddl(t))
                self._load(t, self.table_rows)

    # -- the workload
    def workload(self, txns: int) -> None:
        next_ddl = self.ddl_every
        for i in range(1, txns + 1):
            if self.with_ddl and i >= next_ddl:
                self._ddl()
                next_ddl = i + self.rng.randint(max(1, self.ddl_every * 4 // 5), max(1, self.ddl_every * 6 // 5))
            elif self.oltp and self.large_txn_every and i % self.large_txn_every == 0:
                self._large()
            elif self.bank and (not self.oltp or self.rng.random() < 0.35):
                self._transfer()
            else:
                self._oltp_txn()

    def _transfer(self) -> None:
        legs = []
        for _ in range(1 if self.rng.random() < 0.85 else self.rng.randint(2, 3)):
            src = self.rng.randint(1, self.accounts)
            dst = self.rng.randint(1, self.accounts - 1)
            dst += dst >= src  # any account but src
            legs.append((src, dst, Decimal(self.rng.randint(1, 20_000)).scaleb(-2)))
        self._emit("transfer", Transfer(BANK_TABLE, tuple(legs)))

    def _large(self) -> None:
        self.large_count += 1
        t = self.rng.choice(self.tables)
        if self.large_count % 2 == 0:
            # Delete a range an earlier large insert made (one big delete).
            for owner in self.tables:
                if owner.bulk:
                    lo, hi = owner.bulk.pop(0)
                    for key in range(lo, hi + 1):
                        owner.ids.remove(key)
                    self._emit(f"large delete {owner.name}", DeleteRange(owner.name, lo, hi))
                    return
        first = t.next_id
        n = self.large_txn_rows
        t.next_id += n
        for key in range(first, first + n):
            t.ids.add(key)
        t.bulk.append((first, first + n - 1))
        self._emit(f"large insert {t.name}", Generate(t.name, first, n, self._seed(), tuple(t.cols), t.roles["pad"]))

    def _oltp_txn(self) -> None:
        t = self.rng.choice(self.tables)
        kind = self.rng.choices(_OLTP_KINDS, _OLTP_WEIGHTS)[0]
        need = 2 if kind == "unique_swap" else 4 if kind == "sysbench" else 1
        if kind != "insert" and len(t.ids) < need:
            kind = "insert"
        rng = self.rng
        pad = t.roles["pad"]
        if kind == "insert":
            keys = [t.fresh_id() for _ in range(rng.randint(1, 3))]
            rows = tuple(self._row(t, k) for k in keys)
            for k in keys:
                t.ids.add(k)
            self._emit("insert", Insert(t.name, rows))
        elif kind == "point_update":
            self._emit("point update", Update(t.name, t.ids.choice(rng), self._some_values(t, 1, 3)))
        elif kind == "delete":
            key = t.ids.choice(rng)
            t.ids.remove(key)
            self._emit("delete", Delete(t.name, key))
        elif kind == "range_update":
            lo = t.ids.choice(rng)
            self._emit("range update", UpdateRange(t.name, lo, lo + rng.randint(5, 50), self._some_values(t, 1, 2)))
        elif kind == "range_delete":
            lo = t.ids.choice(rng)
            hi = lo + rng.randint(1, 8)
            for key in range(lo, hi + 1):
                t.ids.remove(key)
            self._emit("range delete", DeleteRange(t.name, lo, hi))
        elif kind == "pk_change":
            key = t.ids.choice(rng)
            new = t.fresh_id()
            t.ids.remove(key)
            t.ids.add(new)
            self._emit("primary-key change", ChangeKey(t.name, key, new))
        elif kind == "unique_swap":
            a = t.ids.choice(rng)
            b = a
            while b == a:
                b = t.ids.choice(rng)
            a, b = min(a, b), max(a, b)
            self._emit("unique swap", SwapUnique(t.name, a, b, pad))
        elif kind == "reinsert":
            key = t.ids.choice(rng)
            values = {k: v for k, v in self._row(t, key).items() if k not in ("id", pad)}
            self._emit("delete and re-insert", Reinsert(t.name, key, values, pad))
        elif kind == "unique_null":
            value = None if rng.random() < 0.6 else self._fresh_pad()
            self._emit("unique null", Update(t.name, t.ids.choice(rng), {pad: value}))
        elif kind == "wide":
            wide = tuple(t.col(r) for r in ("note", "data"))
            size = rng.randint(WIDE_BYTES - 4096, WIDE_BYTES + 4096)
            if rng.random() < 0.5:
                key = t.fresh_id()
                t.ids.add(key)
                self._emit("wide insert", Generate(t.name, key, 1, self._seed(), tuple(t.cols), pad,
                                                   tuple(c.name for c in wide), size))
            else:
                self._emit("wide update", WideUpdate(t.name, t.ids.choice(rng), self._seed(), wide, size))
        else:  # sysbench's write transaction: index update, non-index update, delete, insert
            # Rows touched in key order, as the sysbench statements' keys are
            # random anyway: concurrent ones then lock in one order.
            a, b, gone = sorted(t.ids.choice(rng) for _ in range(3))
            t.ids.remove(gone)
            new = t.fresh_id()
            t.ids.add(new)
            ops: list[Op] = [Update(t.name, a, {t.roles["k"]: _value(rng, t.col("k"))}),
                             Update(t.name, b, {t.roles["c"]: _value(rng, t.col("c"))}),
                             Delete(t.name, gone), Insert(t.name, (self._row(t, new),))]
            self._emit("sysbench write", *ops)

    # -- DDL
    def _ddl(self) -> None:
        action = _DDL_CYCLE[self.ddl_count % len(_DDL_CYCLE)]
        self.ddl_count += 1
        n = self._next_serial()
        rng = self.rng
        t = rng.choice(self.tables)
        if action == "change_column_type":
            cands = [(tb, r) for tb in self.tables for r in tb.extras if tb.col(r).type == "int"]
            if not cands:
                action = "add_column"
            else:
                t, role = cands[rng.randrange(len(cands))]
                old = t.col(role)
                new = ColumnDef(old.name, "decimal", True, precision=20, scale=2)
                t.cols = [new if c.name == old.name else c for c in t.cols]
                self._emit(f"change type {t.name}.{old.name}", DDL("change_column_type", t.name, (new,)))
                return
        if action == "drop_column":
            cands = [(tb, r) for tb in self.tables for r in tb.extras]
            if not cands:
                action = "add_column"
            else:
                t, role = cands[rng.randrange(len(cands))]
                name = t.roles.pop(role)
                t.extras.remove(role)
                t.cols = [c for c in t.cols if c.name != name]
                self._emit(f"drop column {t.name}.{name}", DDL("drop_column", t.name, (name,)))
                return
        if action == "add_column":
            role = f"x{n}"
            col = ColumnDef(role, rng.choice(("int", "int", "string", "datetime")), True)
            t.cols.append(col)
            t.roles[role] = role
            t.extras.append(role)
            self._emit(f"add column {t.name}.{role}", DDL("add_column", t.name, (col,)))
        elif action == "rename_column":
            role = rng.choice(["c", "note", *t.extras])
            old = t.roles[role]
            new = f"{role}_v{n}"
            t.roles[role] = new
            t.cols = [dataclasses.replace(c, name=new) if c.name == old else c for c in t.cols]
            self._emit(f"rename column {t.name}.{old}", DDL("rename_column", t.name, (old, new)))
        elif action == "toggle_unique":
            if t.unique_key is not None:
                key, t.unique_key = t.unique_key, None
                self._emit(f"drop unique key {t.name}.{key}", DDL("drop_unique_key", t.name, (key,)))
            else:
                t.unique_key = f"uk_t{t.uid}_pad_{n}"
                self._emit(f"add unique key {t.name}.{t.unique_key}",
                           DDL("add_unique_key", t.name, (t.unique_key, (t.roles["pad"],))))
        elif action == "rename_table":
            old = t.name
            base = old.split("_r")[0]
            t.name = f"{base}_r{n}"
            self._emit(f"rename table {old}", DDL("rename_table", old, (t.name,)))
        elif action == "truncate_table":
            t.ids.clear()
            t.bulk.clear()
            self._emit(f"truncate {t.name}", DDL("truncate_table", t.name))
        elif action == "create_or_drop":
            made = [tb for tb in self.tables if tb.created_by_ddl]
            if made:
                victim = made[0]
                self.tables.remove(victim)
                self._emit(f"drop table {victim.name}", DDL("drop_table", victim.name))
            else:
                new_t = self._new_table(f"ddl{n}", True)
                self.tables.append(new_t)
                self._emit(f"create {new_t.name}", self._create_ddl(new_t))


def plan(profile: str, tables: int = 4, txns: int = 10_000, seed: int = 1, *, large_txn_rows: int = 10_000,
         large_txn_every: int = 500, ddl_every: int = 50, table_rows: int = 1000,
         accounts: int = 100) -> list[LogicalTxn]:
    """Every logical transaction of a run, as a pure function of the arguments.

    The list starts with the setup (CREATE TABLE and initial rows: ``table_rows``
    per oltp table, ``accounts`` accounts for bank) followed by ``txns`` workload
    transactions. ``large_txn_every``: every that many workload transactions one
    is large (``large_txn_rows`` rows; 0 = never). ``ddl_every``: roughly that
    many transactions between DDLs (profiles ``ddl`` and ``mixed``).
    """
    if profile not in PROFILES:
        raise errors.InvalidArgument(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    for name, value, low in (("tables", tables, 1), ("txns", txns, 0), ("large_txn_rows", large_txn_rows, 1),
                             ("large_txn_every", large_txn_every, 0), ("ddl_every", ddl_every, 1),
                             ("table_rows", table_rows, 0), ("accounts", accounts, 2)):
        if not isinstance(value, int) or value < low:
            raise errors.InvalidArgument(f"{name} must be an integer >= {low}, got {value!r}")
    p = _Planner(profile, tables, seed, large_txn_rows=large_txn_rows, large_txn_every=large_txn_every,
                 ddl_every=ddl_every, table_rows=table_rows, accounts=accounts)
    p.setup()
    p.workload(txns)
    return p.out


# ---------------------------------------------------------------- running
@dataclasses.dataclass
class Summary:
    """What a run did. ``committed`` counts DML transactions that changed rows
    (each wrote a binlog); ``empty`` those that found nothing to change (no
    binlog, as a read-only TiDB transaction)."""

    planned: int = 0
    done: int = 0
    committed: int = 0
    empty: int = 0
    ddls: int = 0
    errors: int = 0
    retries: int = 0  # deadlock victims run again
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    elapsed_s: float = 0.0
    error_messages: list[str] = dataclasses.field(default_factory=list)
    interrupted: bool = False
    gave_up: str = ""
    start_ts: int = 0  # a TSO taken before the first transaction
    end_ts: int = 0  # a TSO taken after the last one: every commit_ts is in [start_ts, end_ts)

    @property
    def transactions(self) -> int:
        """Transactions that wrote a binlog: committed DML plus DDL."""
        return self.committed + self.ddls

    @property
    def txns_per_s(self) -> float:
        return self.transactions / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["transactions"] = self.transactions
        out["txns_per_s"] = round(self.txns_per_s, 2)
        return out


def format_summary(s: Summary, title: str = "workload") -> str:
    state = " (interrupted)" if s.interrupted else f" (stopped: {s.gave_up})" if s.gave_up else ""
    lines = [
        f"{title}: {s.done}/{s.planned} transactions in {s.elapsed_s:.1f}s{state}",
        f"  committed     {s.transactions} ({s.committed} DML + {s.ddls} DDL), {s.txns_per_s:.1f} txn/s",
        f"  no changes    {s.empty} (rows already gone: nothing to write, no binlog)",
        f"  row changes   {s.inserts + s.updates + s.deletes} "
        f"(insert {s.inserts}, update {s.updates}, delete {s.deletes})",
        f"  errors        {s.errors}" + (f" ({s.retries} deadlock retries)" if s.retries else ""),
    ]
    lines += [f"    {m}" for m in s.error_messages]
    if s.start_ts:
        lines.append(f"  window        [{s.start_ts}, {s.end_ts})")
    return "\n".join(lines)


class _TokenBucket:
    """``rate`` transactions/s shared by every client, with a small burst."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate / 20)
        self.tokens = 1.0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def acquire(self, stop: threading.Event) -> bool:
        while not stop.is_set():
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
                self.last = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return True
                wait = (1 - self.tokens) / self.rate
            stop.wait(min(wait, 0.5))
        return False


class _Dispenser:
    """Hands out the plan in order; a DDL waits until nothing is in flight and
    nothing else is handed out until it is done (the barrier that keeps every
    DML on the schema the planner assumed)."""

    def __init__(self, txns: Sequence[LogicalTxn], stop: threading.Event) -> None:
        self._txns = txns
        self._next = 0
        self._inflight = 0
        self._ddl_running = False
        self._stop = stop
        self._cond = threading.Condition()

    def take(self) -> LogicalTxn | None:
        with self._cond:
            while True:
                if self._stop.is_set() or self._next >= len(self._txns):
                    return None
                ltx = self._txns[self._next]
                if not self._ddl_running and (not ltx.is_ddl or self._inflight == 0):
                    self._next += 1
                    self._inflight += 1
                    self._ddl_running = ltx.is_ddl
                    return ltx
                self._cond.wait(0.2)

    def done(self, ltx: LogicalTxn) -> None:
        with self._cond:
            self._inflight -= 1
            if ltx.is_ddl:
                self._ddl_running = False
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


_RETRIES = 5
# PostgreSQL SQLSTATEs and MySQL/MariaDB error numbers of "rolled back, try again".
_PG_RETRY = {"40001", "40P01"}
_MYSQL_RETRY = {1205, 1213}


def _retryable(exc: sa.exc.DBAPIError) -> bool:
    orig = exc.orig
    if getattr(orig, "pgcode", None) in _PG_RETRY or getattr(orig, "sqlstate", None) in _PG_RETRY:
        return True
    args = getattr(orig, "args", ())
    return bool(args) and args[0] in _MYSQL_RETRY


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {text[0] if text else ''}"


class _Runner:
    def __init__(self, writer: Any, txns: Sequence[LogicalTxn], clients: int, rate: float | None,
                 max_consecutive_errors: int) -> None:
        self.writer = writer
        self.stop = threading.Event()
        self.dispenser = _Dispenser(txns, self.stop)
        self.bucket = _TokenBucket(rate) if rate else None
        self.lock = threading.Lock()
        self.summary = Summary(planned=len(txns))
        self.fatal: list[BaseException] = []
        self.consecutive_errors = 0
        self.max_consecutive_errors = max_consecutive_errors
        self.threads = [threading.Thread(target=self._client, name=f"workload-{i}", daemon=True)
                        for i in range(clients)]

    def _client(self) -> None:
        while not self.stop.is_set():
            if self.bucket is not None and not self.bucket.acquire(self.stop):
                return
            ltx = self.dispenser.take()
            if ltx is None:
                return
            try:
                self._one(ltx)
            except BaseException as exc:  # a bug, not a refused transaction: stop and surface it
                with self.lock:
                    self.fatal.append(exc)
                self.stop.set()
            finally:
                self.dispenser.done(ltx)

    def _attempt(self, ltx: LogicalTxn, counts: _Counts) -> bool:
        """Run ``ltx`` once; True if it wrote a binlog."""
        if ltx.is_ddl:
            for op in ltx.ops:
                assert isinstance(op, DDL)
                op.apply_ddl(self.writer)
            return True
        with self.writer.transaction() as txn:
            for op in ltx.ops:
                assert not isinstance(op, DDL)
                op.apply(txn, counts)
        return txn.info is not None

    def _one(self, ltx: LogicalTxn) -> None:
        attempt = 0
        try:
            while True:
                counts = _Counts()
                try:
                    wrote = self._attempt(ltx, counts)
                    break
                except sa.exc.DBAPIError as exc:
                    # A deadlock victim or serialization failure was rolled back
                    # whole (with its rollback binlog): run it again, as an
                    # application would.
                    if not _retryable(exc) or attempt >= _RETRIES or self.stop.is_set():
                        raise
                    attempt += 1
                    with self.lock:
                        self.summary.retries += 1
                    time.sleep(0.005 * attempt)
        except (errors.BinlakeError, sa.exc.SQLAlchemyError) as exc:
            message = str(exc) if isinstance(exc, errors.BinlakeError) else _first_line(exc)
            with self.lock:
                s = self.summary
                s.done += 1
                s.errors += 1
                if len(s.error_messages) < 5:
                    s.error_messages.append(f"txn {ltx.seq} ({ltx.label}): {message}")
                self.consecutive_errors += 1
                if self.consecutive_errors >= self.max_consecutive_errors and not s.gave_up:
                    s.gave_up = f"{self.consecutive_errors} transactions in a row failed"
                    self.stop.set()
            return
        with self.lock:
            s = self.summary
            s.done += 1
            self.consecutive_errors = 0
            if ltx.is_ddl:
                s.ddls += 1
            elif wrote:
                s.committed += 1
                s.inserts += counts.inserts
                s.updates += counts.updates
                s.deletes += counts.deletes
            else:
                s.empty += 1

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)


def _check_fresh(writer: Any, txns: Sequence[LogicalTxn]) -> None:
    existing = {t.name for t in writer.tables()}
    made = sorted({op.table if op.action == "create_table" else op.args[0]
                   for ltx in txns for op in ltx.ops
                   if isinstance(op, DDL) and op.action in ("create_table", "rename_table")})
    clash = [name for name in made if name in existing]
    if clash:
        raise errors.FailedPrecondition(
            f"the upstream already has table(s) {', '.join(clash)} that this workload creates; "
            "run it against a fresh database (or drop those tables first)"
        )


def run(writer: Any, txns: Sequence[LogicalTxn], clients: int = 8, rate: float | None = None,
        progress: bool = True, *, max_consecutive_errors: int = 100) -> Summary:
    """Execute ``txns`` (from ``plan``) through a started TxnWriter with ``clients``
    threads, at most ``rate`` transactions/s overall. Refused transactions are
    counted in the summary; Ctrl-C stops after the transactions in flight."""
    if clients < 1:
        raise errors.InvalidArgument(f"clients must be >= 1, got {clients}")
    if rate is not None and rate <= 0:
        raise errors.InvalidArgument(f"rate must be > 0 transactions/s, got {rate}")
    _check_fresh(writer, txns)
    runner = _Runner(writer, txns, clients, rate, max_consecutive_errors)
    s = runner.summary
    s.start_ts = writer.registry.get_ts()
    started = time.monotonic()
    bar = _progress_bar(progress)
    task = bar.add_task("workload", total=len(txns), tps="0.0") if bar is not None else None
    if bar is not None:
        bar.start()
    try:
        for t in runner.threads:
            t.start()
        try:
            while runner.alive():
                time.sleep(0.1)  # (a sleep, not a join: Ctrl-C reaches the main thread at once)
                if bar is not None and task is not None:
                    elapsed = max(time.monotonic() - started, 1e-9)
                    bar.update(task, completed=s.done, tps=f"{s.transactions / elapsed:.1f}")
        except KeyboardInterrupt:
            s.interrupted = True
            runner.stop.set()
            runner.dispenser.wake()
            try:
                # Let the transactions in flight commit or roll back.
                while runner.alive():
                    time.sleep(0.05)
            except KeyboardInterrupt:
                pass  # a second Ctrl-C: stop waiting (the client threads are daemons)
    finally:
        if bar is not None:
            bar.stop()
    s.elapsed_s = time.monotonic() - started
    try:
        s.end_ts = writer.registry.get_ts()
    except errors.BinlakeError:
        s.end_ts = 0
    if runner.fatal:
        raise runner.fatal[0]
    return s


def _progress_bar(enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[tps]} txn/s"), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=False)


# ---------------------------------------------------------------- helpers for checks
def bank_total(url: str, table: str = BANK_TABLE) -> Decimal:
    """The sum of all balances in ``url``'s accounts table (exact: summed here,
    not by the database, whose SQLite arithmetic on decimal text would use floats)."""
    try:
        engine = sa.create_engine(url)
    except (ImportError, sa.exc.ArgumentError) as exc:
        raise errors.InvalidArgument(f"cannot use {url!r}: {exc}") from None
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(table):
                raise errors.NotFound(f"no table {table!r} in {engine.url.render_as_string(hide_password=True)}")
            tb = sa.table(table, sa.column("balance"))
            total = Decimal(0)
            for (balance,) in conn.execution_options(yield_per=5000).execute(sa.select(tb.c.balance)):
                total += Decimal(str(balance))
            return total
    except sa.exc.OperationalError as exc:
        raise errors.Unavailable(f"cannot read {table}: {_first_line(exc)}") from None
    finally:
        engine.dispose()


# ---------------------------------------------------------------- the command
def command(args: argparse.Namespace, registry: str) -> int:
    """``binlake workload``: plan, run, print the summary."""
    txns = plan(args.profile, args.tables, args.txns, args.seed, large_txn_rows=args.large_txn_rows,
                large_txn_every=args.large_txn_every, ddl_every=args.ddl_every, table_rows=args.table_rows,
                accounts=args.accounts)
    with TxnWriter(args.upstream, registry=registry) as writer:
        summary = run(writer, txns, args.clients, args.rate, progress=not args.quiet)
    if args.json:
        print(json.dumps({"profile": args.profile, "seed": args.seed, **summary.to_dict()}))
    else:
        print(format_summary(summary, f"workload {args.profile} (seed {args.seed})"))
    return 130 if summary.interrupted else 0
