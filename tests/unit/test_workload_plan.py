"""The workload planner is a pure function of its arguments, and every plan it
makes is valid on paper: bank transfers keep the total, DML only names tables
and columns that exist at that point, fresh keys are never reused. The runner
keeps DDL a barrier and counts refused transactions."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from binlake import errors
from binlake.workload import ops as wops
from binlake.workload import plan as wplan
from binlake.workload import run as wrun

SMALL = {"large_txn_rows": 50, "large_txn_every": 40, "table_rows": 30, "accounts": 20}


@pytest.mark.parametrize("profile", wops.PROFILES)
def test_same_arguments_same_plan(profile: str) -> None:
    a = wplan.plan(profile, 3, 400, 11, **SMALL)
    b = wplan.plan(profile, 3, 400, 11, **SMALL)
    assert a == b
    assert len(a) > 400  # setup first, then the 400 workload transactions
    assert [t.seq for t in a] == list(range(len(a)))


@pytest.mark.parametrize("profile", wops.PROFILES)
def test_seed_changes_plan(profile: str) -> None:
    a = wplan.plan(profile, 2, 200, 1, **SMALL)
    b = wplan.plan(profile, 2, 200, 2, **SMALL)
    assert a != b
    # The setup's schema is the same; the transactions are not.
    assert [t.label for t in a[:3]] == [t.label for t in b[:3]]


def test_plan_rejects_bad_arguments() -> None:
    with pytest.raises(errors.InvalidArgument, match="profile"):
        wplan.plan("tpcc", 1, 10, 1)
    with pytest.raises(errors.InvalidArgument, match="tables"):
        wplan.plan("oltp", 0, 10, 1)
    with pytest.raises(errors.InvalidArgument, match="accounts"):
        wplan.plan("bank", 1, 10, 1, accounts=1)


def _bank_balances(plan: list[wops.LogicalTxn]) -> dict[int, Decimal]:
    balances: dict[int, Decimal] = {}
    for ltx in plan:
        for op in ltx.ops:
            if isinstance(op, wops.Insert) and op.table == wops.BANK_TABLE:
                for row in op.rows:
                    balances[row["id"]] = row["balance"]
    return balances


def _apply_transfers(balances: dict[int, Decimal], txns: list[wops.LogicalTxn], total: Decimal) -> None:
    for ltx in txns:
        for op in ltx.ops:
            if not isinstance(op, wops.Transfer):
                continue
            assert 1 <= len(op.legs) <= 3
            for src, dst, amount in op.legs:
                assert src != dst
                assert src in balances and dst in balances
                assert amount > 0
                moved = min(amount, balances[src])  # the rule Transfer.apply follows
                balances[src] -= moved
                balances[dst] += moved
        # The invariant at every commit.
        assert sum(balances.values()) == total
        assert min(balances.values()) >= 0


@pytest.mark.parametrize("profile", ["bank", "mixed"])
def test_bank_plan_keeps_the_total_in_any_order(profile: str) -> None:
    plan = wplan.plan(profile, 2, 600, 5, **SMALL)
    balances = _bank_balances(plan)
    assert len(balances) == SMALL["accounts"]
    total = SMALL["accounts"] * wops.BANK_INITIAL_BALANCE
    assert sum(balances.values()) == total
    transfers = [t for t in plan if any(isinstance(op, wops.Transfer) for op in t.ops)]
    assert len(transfers) > (100 if profile == "mixed" else 500)
    _apply_transfers(dict(balances), transfers, total)
    # Concurrent clients may run them in another order: still the same total.
    shuffled = transfers[:]
    random.Random(1).shuffle(shuffled)
    _apply_transfers(dict(balances), shuffled, total)


class _Schema:
    """The schema a plan implies, replayed from its DDL ops."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, str]] = {}  # table -> column -> type
        self.uniques: dict[str, set[str]] = {}
        self.uid: dict[str, int] = {}  # current name -> logical table (stable across renames)
        self.index_names: set[str] = set()
        self.seen_uids = 0

    def ddl(self, op: wops.DDL) -> None:
        t = op.table
        if op.action == "create_table":
            assert t not in self.tables, f"create of existing {t}"
            cols, pk, uniques = op.args
            self.tables[t] = {c.name: c.type for c in cols}
            assert list(pk) == ["id"]
            self.uniques[t] = set()
            for name, key_cols in uniques:
                assert name not in self.index_names
                assert set(key_cols) <= set(self.tables[t])
                self.index_names.add(name)
                self.uniques[t].add(name)
            self.seen_uids += 1
            self.uid[t] = self.seen_uids
            return
        assert t in self.tables, f"{op.action} on missing table {t}"
        cols = self.tables[t]
        if op.action == "add_column":
            (col,) = op.args
            assert col.name not in cols and col.nullable
            cols[col.name] = col.type
        elif op.action == "drop_column":
            (name,) = op.args
            assert name in cols and name != "id"
            del cols[name]
        elif op.action == "rename_column":
            old, new = op.args
            assert old in cols and new not in cols
            cols[new] = cols.pop(old)
        elif op.action == "change_column_type":
            (col,) = op.args
            assert (cols[col.name], col.type) == ("int", "decimal")
            cols[col.name] = col.type
        elif op.action == "add_unique_key":
            name, key_cols = op.args
            assert name not in self.index_names and set(key_cols) <= set(cols)
            self.index_names.add(name)
            self.uniques[t].add(name)
        elif op.action == "drop_unique_key":
            (name,) = op.args
            assert name in self.uniques[t]
            self.uniques[t].remove(name)
            self.index_names.discard(name)
        elif op.action == "rename_table":
            (new,) = op.args
            assert new not in self.tables
            self.tables[new] = self.tables.pop(t)
            self.uniques[new] = self.uniques.pop(t)
            self.uid[new] = self.uid.pop(t)
        elif op.action == "truncate_table":
            pass
        elif op.action == "drop_table":
            del self.tables[t]
            self.index_names -= self.uniques.pop(t)
            del self.uid[t]
        else:
            raise AssertionError(f"unknown DDL {op.action}")


@pytest.mark.parametrize("profile", ["ddl", "mixed"])
def test_ddl_plan_dml_refers_to_the_schema_of_its_point(profile: str) -> None:
    plan = wplan.plan(profile, 3, 1500, 3, **SMALL)
    schema = _Schema()
    actions: set[str] = set()
    fresh: dict[int, set[int]] = {}  # logical table -> primary keys handed out as new
    for ltx in plan:
        if ltx.is_ddl:
            assert len(ltx.ops) == 1, "a DDL runs alone"
            op = ltx.ops[0]
            assert isinstance(op, wops.DDL)
            schema.ddl(op)
            actions.add(op.action)
            continue
        for op in ltx.ops:
            assert op.table in schema.tables, f"txn {ltx.seq} ({ltx.label}) names missing table {op.table}"
            cols = schema.tables[op.table]
            missing = [c for c in op.columns() if c not in cols]
            assert not missing, f"txn {ltx.seq} ({ltx.label}) names missing columns {missing} of {op.table}"
            if isinstance(op, (wops.Update, wops.UpdateRange, wops.Reinsert)):
                for name, value in op.values.items():
                    if cols[name] == "decimal" and value is not None:
                        assert isinstance(value, Decimal)
                    if cols[name] == "int" and value is not None:
                        assert isinstance(value, int)
            if op.table == wops.BANK_TABLE:
                continue
            # Keys handed out as new are new for good: valid in any execution order.
            new = {wops.Insert: lambda o: [r["id"] for r in o.rows],
                   wops.Generate: lambda o: range(o.first_id, o.first_id + o.count),
                   wops.ChangeKey: lambda o: [o.new_key]}.get(type(op))
            if new is not None:
                seen = fresh.setdefault(schema.uid[op.table], set())
                keys = list(new(op))
                assert not seen.intersection(keys), f"txn {ltx.seq} reuses a key"
                seen.update(keys)
    assert actions >= {"create_table", "add_column", "rename_column", "change_column_type", "add_unique_key",
                       "drop_unique_key", "rename_table", "truncate_table", "drop_table", "drop_column"}


def test_oltp_plan_has_every_kind_and_large_txns() -> None:
    plan = wplan.plan("oltp", 2, 800, 9, **SMALL)
    labels = {t.label for t in plan}
    for kind in ("insert", "point update", "delete", "range update", "range delete", "primary-key change",
                 "unique swap", "delete and re-insert", "unique null", "sysbench write"):
        assert kind in labels
    assert {"wide insert", "wide update"} & labels
    large = [t for t in plan if t.label.startswith("large")]
    assert len(large) == 800 // SMALL["large_txn_every"]
    inserts = [op for t in large for op in t.ops if isinstance(op, wops.Generate)]
    assert inserts and all(op.count == SMALL["large_txn_rows"] for op in inserts)
    assert any(t.label.startswith("large delete") for t in large)
    assert not any(t.is_ddl for t in plan[len(plan) - 800:])  # oltp has no DDL after the setup
    nulls = [op for t in plan for op in t.ops if isinstance(op, wops.Update) and op.values.get("pad", 1) is None]
    assert nulls
    # Generated rows are a pure function of the op; wide rows are ~64 KiB.
    wide = next(op for t in plan for op in t.ops if isinstance(op, wops.Generate) and op.wide)
    assert list(wide.rows()) == list(wide.rows())
    assert len(next(wide.rows())["data"]) > 60_000


# ------------------------------------------------------------------ the runner, with a fake writer
class _FakeTxn:
    def __init__(self, writer: _FakeWriter) -> None:
        self.writer = writer
        self.info: object | None = None
        self.changes = 0

    def _work(self, n: int = 1) -> int:
        time.sleep(0.0005)
        self.changes += n
        return n

    def insert_many(self, table: str, rows: Any) -> None:
        self._work(len(rows))

    def update(self, table: str, key: Any, values: Any) -> int:
        return self._work()

    def update_where(self, table: str, where: Any, values: Any) -> int:
        return self._work(3)

    def delete(self, table: str, key: Any) -> int:
        return self._work()

    def delete_where(self, table: str, where: Any) -> int:
        return self._work(2)

    def get(self, table: str, key: Any) -> dict[str, Any]:
        return {"id": key["id"], "balance": Decimal("10.00"), "pad": f"p{key['id']}"}


class _Deadlock(Exception):
    pgcode = "40P01"  # PostgreSQL's deadlock_detected


class _FakeRegistry:
    def __init__(self) -> None:
        self.ts = 100

    def get_ts(self) -> int:
        self.ts += 1
        return self.ts


class _FakeWriter:
    """Records overlaps: a DML running while a DDL runs (or the reverse) is a bug."""

    dialect = "sqlite"

    def __init__(self, fail_every: int = 0, deadlock_every: int = 0) -> None:
        self.registry = _FakeRegistry()
        self.lock = threading.Lock()
        self.dml = 0
        self.ddl = 0
        self.overlaps = 0
        self.ddl_log: list[tuple[str, str]] = []
        self.count = 0
        self.fail_every = fail_every
        self.deadlock_every = deadlock_every

    def tables(self) -> list[Any]:
        return []

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_FakeTxn]:
        with self.lock:
            self.dml += 1
            self.overlaps += self.ddl
            self.count += 1
            fail = self.fail_every and self.count % self.fail_every == 0
            deadlock = self.deadlock_every and self.count % self.deadlock_every == 0
        try:
            txn = _FakeTxn(self)
            yield txn
            if fail:
                raise errors.FailedPrecondition("upstream refused the change: UNIQUE constraint failed")
            if deadlock:
                raise sa.exc.OperationalError("UPDATE accounts ...", None, _Deadlock("deadlock detected"))
            txn.info = object() if txn.changes else None
        finally:
            with self.lock:
                self.dml -= 1

    def __getattr__(self, action: str) -> Any:
        def ddl(*args: Any, **kwargs: Any) -> None:
            with self.lock:
                self.overlaps += self.dml + self.ddl
                self.ddl += 1
            time.sleep(0.002)
            with self.lock:
                self.ddl -= 1
                self.ddl_log.append((action, args[0]))

        return ddl


def test_run_keeps_ddl_a_barrier_and_counts() -> None:
    plan = wplan.plan("mixed", 2, 300, 4, **{**SMALL, "large_txn_every": 0}, ddl_every=10)
    writer = _FakeWriter()
    summary = wrun.run(writer, plan, clients=6, progress=False)
    assert writer.overlaps == 0
    ddls = [t for t in plan if t.is_ddl]
    assert summary.ddls == len(ddls) > 20
    # DDLs ran in plan order.
    assert [a for a, _t in writer.ddl_log] == [t.ops[0].action for t in ddls]
    assert summary.done == summary.planned == len(plan)
    assert summary.errors == 0
    assert summary.committed + summary.ddls + summary.empty == summary.done
    assert summary.inserts and summary.updates and summary.deletes
    assert summary.start_ts < summary.end_ts
    assert "committed" in wrun.format_summary(summary)


def test_run_counts_refused_transactions_and_throttles() -> None:
    plan = wplan.plan("bank", 1, 60, 4, **SMALL)
    writer = _FakeWriter(fail_every=7)
    started = time.monotonic()
    summary = wrun.run(writer, plan, clients=3, rate=200.0, progress=False)
    elapsed = time.monotonic() - started
    assert summary.errors == sum(1 for i in range(1, writer.count + 1) if i % 7 == 0) > 0
    assert summary.done == len(plan)
    assert 1 <= len(summary.error_messages) <= 5
    assert "UNIQUE constraint failed" in summary.error_messages[0]
    assert elapsed >= (len(plan) - 10) / 200.0  # the token bucket holds ~200 txn/s
    text = wrun.format_summary(summary)
    assert "errors" in text and "UNIQUE" in text


def test_run_retries_deadlock_victims() -> None:
    plan = wplan.plan("bank", 1, 90, 4, **SMALL)
    writer = _FakeWriter(deadlock_every=3)  # a retry is the next call: it succeeds
    # One client: with several, other clients' calls can land a retry on the next
    # multiple of 3 again and again until its retries run out (seen in CI).
    summary = wrun.run(writer, plan, clients=1, progress=False)
    assert summary.errors == 0
    assert summary.retries == writer.count // 3 > 0
    assert summary.done == len(plan)
    assert "deadlock retries" in wrun.format_summary(summary)


def test_run_refuses_an_upstream_that_has_the_tables() -> None:
    class Existing(_FakeWriter):
        def tables(self) -> list[Any]:
            return [type("Info", (), {"name": "sbtest1"})()]

    with pytest.raises(errors.FailedPrecondition, match="sbtest1"):
        wrun.run(Existing(), wplan.plan("oltp", 1, 5, 1, **SMALL), clients=1, progress=False)
