"""The workload planner: ``plan(profile, tables, txns, seed)``, a pure function
from its arguments to the list of logical transactions of a run.

It keeps a model of the schema and of the primary keys that exist "on paper"
and draws every transaction from one ``random.Random(seed)``, so equal
arguments always give an equal plan (see ``binlake.workload``).
"""

from __future__ import annotations

import dataclasses
import random
from decimal import Decimal
from typing import Any

from binlake import errors
from binlake.sql.schema import ColumnDef
from binlake.workload.ops import (
    _LOAD_ROWS_PER_TXN,
    BANK_INITIAL_BALANCE,
    BANK_TABLE,
    DDL,
    PROFILES,
    WIDE_BYTES,
    ChangeKey,
    Delete,
    DeleteRange,
    Generate,
    Insert,
    LogicalTxn,
    Op,
    Reinsert,
    SwapUnique,
    Transfer,
    Update,
    UpdateRange,
    WideUpdate,
    _value,
)


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
            old_name = t.roles[role]
            new_name = f"{role}_v{n}"
            t.roles[role] = new_name
            t.cols = [dataclasses.replace(c, name=new_name) if c.name == old_name else c for c in t.cols]
            self._emit(f"rename column {t.name}.{old_name}", DDL("rename_column", t.name, (old_name, new_name)))
        elif action == "toggle_unique":
            if t.unique_key is not None:
                key, t.unique_key = t.unique_key, None
                self._emit(f"drop unique key {t.name}.{key}", DDL("drop_unique_key", t.name, (key,)))
            else:
                t.unique_key = f"uk_t{t.uid}_pad_{n}"
                self._emit(f"add unique key {t.name}.{t.unique_key}",
                           DDL("add_unique_key", t.name, (t.unique_key, (t.roles["pad"],))))
        elif action == "rename_table":
            old_table = t.name
            base = old_table.split("_r")[0]
            t.name = f"{base}_r{n}"
            self._emit(f"rename table {old_table}", DDL("rename_table", old_table, (t.name,)))
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
