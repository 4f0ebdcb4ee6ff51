"""The workload runner: ``run(writer, plan, clients, rate)`` executes a plan through
TxnWriter with concurrent client threads, and ``Summary`` says what it did.

Clients take transactions from one shared dispenser in plan order; a DDL is a
barrier (it starts after every earlier transaction finished and nothing after
it starts before it is done). Deadlock victims are run again a bounded number
of times. ``bank_total`` reads the invariant of the bank profile back.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from binlake import errors
from binlake.workload.ops import BANK_TABLE, DDL, LogicalTxn, _Counts


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
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] in _MYSQL_RETRY


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
            message = str(exc) if isinstance(exc, errors.BinlakeError) else errors.first_line(exc, with_type=True)
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
        progress: bool = True, *, max_consecutive_errors: int = 100,
        stop: threading.Event | None = None) -> Summary:
    """Execute ``txns`` (from ``plan``) through a started TxnWriter with ``clients``
    threads, at most ``rate`` transactions/s overall. Refused transactions are
    counted in the summary; Ctrl-C stops after the transactions in flight, and so
    does ``stop`` once set (a caller running the workload in another thread, which
    Ctrl-C never reaches); either way the summary says ``interrupted``."""
    if stop is not None and not isinstance(stop, threading.Event):
        raise TypeError(f"stop must be a threading.Event, got {type(stop).__name__}")
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
                if stop is not None and stop.is_set() and not runner.stop.is_set():
                    # As Ctrl-C: no new transaction starts; those in flight finish.
                    s.interrupted = True
                    runner.stop.set()
                    runner.dispenser.wake()
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
        raise errors.Unavailable(f"cannot read {table}: {errors.first_line(exc, with_type=True)}") from None
    finally:
        engine.dispose()
