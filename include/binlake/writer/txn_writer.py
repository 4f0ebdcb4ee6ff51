"""TxnWriter: the upstream role. Runs an application's row changes in a SQL
database and emits each transaction's two binlogs around the database commit.

Per transaction (TiDB's two-phase binlog):

1. ``start_ts`` requested from the registry when the transaction begins;
2. the statements run in the upstream database; every changed row is read
   back, so the binlog carries exactly what the database holds (before and
   after images, in execution order);
3. at commit: the *prewrite* binlog (all TableMutations) goes to a Pump
   through the PumpClient; then ``commit_ts`` from the registry; then the
   database commit, which also inserts ``start_ts -> commit_ts`` into
   ``_binlake_txn_status`` in the same database transaction; then the
   *commit* binlog to the same Pump.
4. any failure before the database commit rolls the database back and sends
   a *rollback* binlog (if the prewrite went out).

If the writer dies between the database commit and the commit binlog, the Pump
asks the writer's TxnStatus service after its transaction timeout; the answer
comes from ``_binlake_txn_status``, so it is exactly what the database holds.
A restarted writer on the same database serves the same id and answers too.

DDL runs through the same protocol with the statement and the resulting table
definition in the binlog (``schema``/``dialect`` modules).

Timestamps, and why each is taken where it is (the application waits for one
durable prewrite round trip, one TSO round trip and its own commit):

* ``start_ts`` only has to be unique, positive and below commit_ts; the Pump's
  safe ts does not depend on its freshness (a pending prewrite holds the safe
  ts at ``max(start_ts, bound when it arrived)``, see ``pump.sorter``). So it
  is requested asynchronously when the transaction begins, batched with every
  concurrent caller's request into one registry round trip
  (``RegistryClient.get_ts_async``), and read only when the prewrite is built:
  by then the statements have run and the answer is normally there.
* ``commit_ts`` is fetched after the prewrite is acknowledged and after every
  statement ran, never earlier and never from a reserved block: (a) the Pump's
  safe ts promises that a transaction whose prewrite it has not seen commits
  above every ts it has seen, which holds only if commit_ts is taken after the
  acknowledgement; (b) commit_ts must exceed the commit_ts of every
  transaction whose effects this one could have observed in the database, and
  those were fetched before their database commit, hence before our reads,
  hence before this fetch. Concurrent callers still share one round trip
  (``RegistryClient.get_ts``).
* The commit binlog goes out in the background (``write_commit_async``): the
  database commit already decided the transaction, and a lost commit binlog is
  resolved by the Pump through the status service.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from binlake import codec, coldefault, errors, failpoint
from binlake.client.pump_client import PumpClient
from binlake.config import ClientSettings
from binlake.proto import binlog_pb2
from binlake.registry.model import NodeRecord
from binlake.sql import dialect as dl
from binlake.sql import schema as sc
from binlake.writer import txn_status

log = logging.getLogger(__name__)

# _binlake_txn_status: one row per committed upstream transaction.
# Invariant: a row exists iff the transaction with that start_ts committed in
# this database, with that commit_ts; it is written in the same database
# transaction as the data, so it can never disagree with the data.
STATUS_TABLE = "_binlake_txn_status"
# _binlake_schema: the current definition of every table binlake created.
# Invariant: updated in the same database transaction as the DDL where the
# dialect's DDL is transactional (PostgreSQL, SQLite); right after it on MySQL.
SCHEMA_TABLE = "_binlake_schema"
# _binlake_meta: writer_id, next_table_id, schema_version (text values).
META_TABLE = "_binlake_meta"

FAILPOINT_ENV = failpoint.ENV

_md = sa.MetaData()
_status = sa.Table(STATUS_TABLE, _md, sa.Column("start_ts", sa.BigInteger, primary_key=True, autoincrement=False),
                   sa.Column("commit_ts", sa.BigInteger, nullable=False))
_schema = sa.Table(SCHEMA_TABLE, _md, sa.Column("table_id", sa.BigInteger, primary_key=True, autoincrement=False),
                   sa.Column("name", sa.String(128), nullable=False),
                   sa.Column("info", sa.LargeBinary, nullable=False),
                   sa.Column("dropped", sa.Boolean(create_constraint=False), nullable=False))
_meta = sa.Table(META_TABLE, _md, sa.Column("k", sa.String(64), primary_key=True),
                 sa.Column("v", sa.String(255), nullable=False))


@dataclasses.dataclass(frozen=True)
class CommitInfo:
    start_ts: int
    commit_ts: int
    pump: str
    row_changes: int


class _RWLock:
    """Many DML transactions at once, or one DDL alone."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writer)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writer)
            self._writer = True
            self._cond.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class SQLStatusProvider:
    """Answers TxnStatus from ``_binlake_txn_status`` plus this writer's in-flight set."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._inflight: set[int] = set()

    def begin(self, start_ts: int) -> None:
        with self._lock:
            self._inflight.add(start_ts)

    def end(self, start_ts: int) -> None:
        with self._lock:
            self._inflight.discard(start_ts)

    def txn_status(self, start_ts: int) -> tuple[str, int]:
        with self._lock:
            if start_ts in self._inflight:
                return txn_status.RUNNING, 0
        with self._engine.connect() as conn:
            row = conn.execute(sa.select(_status.c.commit_ts).where(_status.c.start_ts == start_ts)).first()
        if row is not None:
            return txn_status.COMMITTED, int(row[0])
        # Not in flight here and not committed: its database transaction was
        # rolled back (or its writer died before committing, which rolls it back).
        return txn_status.ROLLED_BACK, 0


class TxnWriter:
    """Runs transactions in an upstream SQL database and writes their binlogs.

    Thread-safe: share one per process; each ``transaction()`` uses its own
    database connection.
    """

    def __init__(
        self,
        upstream_url: str,
        *,
        registry: str | None = None,
        pump_client: PumpClient | None = None,
        registry_client: Any = None,
        writer_id: str | None = None,
        db: str | None = None,
        status_addr: str = "127.0.0.1:0",
        client_settings: ClientSettings | None = None,
        sync_commit_binlog: bool = False,
    ) -> None:
        # False (default): the commit binlog goes out in the background, so a
        # transaction's latency holds one binlog round trip (the prewrite), as
        # in TiDB; True: the transaction returns after the commit binlog too.
        self.sync_commit_binlog = sync_commit_binlog
        if not isinstance(upstream_url, str) or not upstream_url:
            raise errors.InvalidArgument("upstream URL must be a SQLAlchemy URL such as sqlite:///data/app.db")
        try:
            url = sa.engine.make_url(upstream_url)
        except sa.exc.ArgumentError as exc:
            raise errors.InvalidArgument(f"upstream URL {upstream_url!r} is not a SQLAlchemy URL: {exc}") from None
        self.url = url
        kwargs: dict[str, Any] = {"future": True}
        if url.get_backend_name() == "sqlite":
            kwargs["connect_args"] = {"timeout": 60, "check_same_thread": False}
        else:
            kwargs["pool_size"] = 16
            kwargs["max_overflow"] = 16
            kwargs["pool_pre_ping"] = True
            if url.drivername.endswith("+psycopg"):  # (get_driver_name() would load the dialect first)
                # psycopg 3 prepares repeated statements per connection; after a
                # column type change those plans fail ("cached plan must not
                # change result type") on every other pooled connection.
                kwargs["connect_args"] = {"prepare_threshold": None}
        try:
            self.engine = sa.create_engine(url, **kwargs)
        except (ImportError, sa.exc.ArgumentError) as exc:
            raise errors.InvalidArgument(f"cannot use upstream {url.render_as_string(hide_password=True)}: {exc}") from None
        self.dialect = self.engine.dialect.name
        if self.dialect not in ("sqlite", "postgresql", "mysql"):
            raise errors.InvalidArgument(f"upstream dialect {self.dialect} is not supported (sqlite, postgresql, mysql)")
        if self.dialect == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_on_connect)
            sa.event.listen(self.engine, "begin", _sqlite_on_begin)
        self.db = db or (url.database if self.dialect != "sqlite" else "main") or "main"
        if registry_client is None:
            from binlake.registry.client import RegistryClient

            addr = registry or (client_settings.registry if client_settings else None)
            if addr is None:
                raise errors.InvalidArgument("TxnWriter needs a registry address (or a registry_client)")
            registry_client = RegistryClient(addr)
            self._own_registry = True
        else:
            self._own_registry = False
        self.registry = registry_client
        self._own_client = pump_client is None
        self._client_settings = client_settings
        self.pump_client = pump_client
        self._writer_id = writer_id
        self._status_addr = status_addr
        self.status = SQLStatusProvider(self.engine)
        self._status_server: txn_status.TxnStatusServer | None = None
        self._schema_lock = _RWLock()
        self._sqlite_lock = threading.Lock() if self.dialect == "sqlite" else None
        self._tables: dict[str, binlog_pb2.TableInfo] = {}
        # (table id, schema version) -> its SQLAlchemy table.
        self._sa_tables: dict[tuple[int, int], sa.Table] = {}
        self.schema_version = 0
        self.writer_id = ""
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> TxnWriter:
        try:
            _md.create_all(self.engine, checkfirst=True)
        except sa.exc.SQLAlchemyError as exc:
            raise errors.Unavailable(
                f"cannot reach upstream {self.url.render_as_string(hide_password=True)}: {exc.__class__.__name__}: "
                f"{str(exc).splitlines()[0]}"
            ) from None
        with self.engine.begin() as conn:
            meta = dict(conn.execute(sa.select(_meta.c.k, _meta.c.v)).all())
            if "writer_id" not in meta:
                meta["writer_id"] = f"writer-{uuid.uuid4().hex[:12]}"
                conn.execute(_meta.insert().values(k="writer_id", v=meta["writer_id"]))
            self.schema_version = int(meta.get("schema_version", "0"))
            for row in conn.execute(sa.select(_schema.c.info).where(_schema.c.dropped == sa.false())):
                info = binlog_pb2.TableInfo.FromString(row[0])
                self._tables[info.name] = info
        self.writer_id = self._writer_id or meta["writer_id"]
        self._status_server = txn_status.TxnStatusServer(self.status, self._status_addr).start()
        self.registry.register(NodeRecord(node_id=self.writer_id, kind="writer", addr=self._status_server.addr))
        if self.pump_client is None:
            settings = self._client_settings or ClientSettings(registry=self.registry.addr)
            self.pump_client = PumpClient(settings=settings, registry_client=self.registry)
        self._started = True
        log.info("writer %s on %s: %d tables, schema version %d, status service %s", self.writer_id,
                 self.url.render_as_string(hide_password=True), len(self._tables), self.schema_version,
                 self._status_server.addr)
        return self

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every background commit binlog was acknowledged (or given up)."""
        if self.pump_client is not None:
            self.pump_client.flush(timeout)

    def close(self) -> None:
        self.flush(timeout=60)
        if self._own_client and self.pump_client is not None:
            self.pump_client.close()
        if self._status_server is not None:
            self._status_server.stop()
            self._status_server = None
        if self._own_registry:
            self.registry.close()
        self.engine.dispose()

    def __enter__(self) -> TxnWriter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ schema
    def table(self, name: str) -> binlog_pb2.TableInfo:
        info = self._tables.get(name)
        if info is None:
            known = ", ".join(sorted(self._tables)) or "none"
            raise errors.InvalidArgument(f"unknown table {name!r} (tables: {known})")
        return info

    def tables(self) -> list[binlog_pb2.TableInfo]:
        return [self._tables[n] for n in sorted(self._tables)]

    def sa_table(self, name: str) -> sa.Table:
        info = self.table(name)
        key = (info.table_id, info.schema_version)
        t = self._sa_tables.get(key)
        if t is None:
            t = dl.sa_table(info, self.dialect)
            self._sa_tables[key] = t
        return t

    # ------------------------------------------------------------------ DML
    @contextlib.contextmanager
    def transaction(self) -> Iterator[Txn]:
        """A transaction: its changes commit (with their binlogs) when the block
        ends, or roll back if it raises."""
        if not self._started:
            raise errors.FailedPrecondition("TxnWriter.start() was not called")
        with self._schema_lock.read(), self._maybe_sqlite_lock():
            txn: Txn | None = None
            try:
                with self.engine.connect() as conn:
                    conn.begin()
                    # start_ts is requested now and read when first needed (at
                    # the prewrite, normally): see "Timestamps" above.
                    txn = Txn(self, conn, self._request_ts())
                    try:
                        yield txn
                    except BaseException:
                        conn.rollback()
                        raise
                    txn._commit()
            finally:
                if txn is not None and txn._start_ts is not None:
                    self.status.end(txn._start_ts)

    def run(self, fn: Callable[[Txn], Any]) -> CommitInfo | None:
        """Run ``fn(txn)`` in a transaction; return its CommitInfo."""
        with self.transaction() as txn:
            fn(txn)
        return txn.info

    def _request_ts(self) -> concurrent.futures.Future[int]:
        get_async = getattr(self.registry, "get_ts_async", None)
        if get_async is not None:
            future: concurrent.futures.Future[int] = get_async()
            return future
        future = concurrent.futures.Future()
        future.set_result(self.registry.get_ts())
        return future

    @contextlib.contextmanager
    def _maybe_sqlite_lock(self) -> Iterator[None]:
        # SQLite has one writer at a time; queue here rather than spin on SQLITE_BUSY.
        if self._sqlite_lock is None:
            yield
        else:
            with self._sqlite_lock:
                yield

    # ------------------------------------------------------------------ binlog plumbing
    def _two_phase(self, conn: Connection, start_ts: int, value: binlog_pb2.PrewriteValue,
                   ddl: tuple[str, binlog_pb2.TableInfo] | None = None,
                   before_commit: Callable[[], None] | None = None) -> tuple[int, str]:
        """prewrite -> commit_ts -> status row + database commit -> commit binlog."""
        assert self.pump_client is not None
        prewrite = binlog_pb2.Binlog(tp=binlog_pb2.PREWRITE, start_ts=start_ts,
                                     prewrite_key=self.writer_id.encode(), prewrite_value=value.SerializeToString())
        if ddl is not None:
            prewrite.ddl_query = ddl[0].encode()
            prewrite.ddl_job_id = ddl[1].schema_version
            prewrite.ddl_table.CopyFrom(ddl[1])
        pump = self.pump_client.write_prewrite(prewrite)
        try:
            if before_commit is not None:
                before_commit()
            commit_ts = self.registry.get_ts()
            conn.execute(_status.insert().values(start_ts=start_ts, commit_ts=commit_ts))
            failpoint.hit("before-db-commit")
            conn.commit()
        except BaseException:
            try:
                conn.rollback()
            finally:
                self._send_rollback(start_ts, pump)
            raise
        failpoint.hit("after-db-commit")
        commit = binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=start_ts, commit_ts=commit_ts)
        if self.sync_commit_binlog:
            try:
                self.pump_client.write_commit(commit, pump)
            except errors.BinlakeError as exc:
                # The database committed: the transaction stands. The Pump resolves
                # it through our status service after its transaction timeout.
                log.warning("commit binlog of %d not acknowledged (%s); the pump will resolve it", start_ts, exc)
        else:
            self.pump_client.write_commit_async(commit, pump)
        return commit_ts, pump

    def _send_rollback(self, start_ts: int, pump: str) -> None:
        assert self.pump_client is not None
        try:
            self.pump_client.write_rollback(binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=start_ts), pump)
        except errors.BinlakeError as exc:
            log.warning("rollback binlog of %d not acknowledged (%s); the pump will resolve it", start_ts, exc)

    # ------------------------------------------------------------------ DDL
    def _ddl(self, name: str | None, build: Callable[[int, int], binlog_pb2.TableInfo],
             statements: Callable[[binlog_pb2.TableInfo, binlog_pb2.TableInfo | None], list[str]]) -> binlog_pb2.TableInfo:
        if not self._started:
            raise errors.FailedPrecondition("TxnWriter.start() was not called")
        with self._schema_lock.write(), self._maybe_sqlite_lock():
            old = self.table(name) if name is not None else None
            version = self.schema_version + 1
            with self.engine.connect() as conn:
                conn.begin()
                meta = dict(conn.execute(sa.select(_meta.c.k, _meta.c.v)).all())
                next_id = int(meta.get("next_table_id", "100"))
                info = build(next_id, version)
                stmts = statements(info, old)
                start_ts = self.registry.get_ts()
                self.status.begin(start_ts)
                try:
                    def run_ddl() -> None:
                        for stmt in stmts:
                            conn.exec_driver_sql(stmt)
                        if not dl.transactional_ddl(self.engine):
                            # MySQL committed the DDL; record it right away.
                            conn.commit()
                            conn.begin()
                        self._record_schema(conn, info, old, version, max(next_id, info.table_id + 1))

                    self._two_phase(conn, start_ts, binlog_pb2.PrewriteValue(schema_version=version),
                                    ddl=("; ".join(stmts), info), before_commit=run_ddl)
                except sa.exc.SQLAlchemyError as exc:
                    raise errors.FailedPrecondition(
                        f"upstream refused the DDL: {str(exc.orig if hasattr(exc, 'orig') else exc).splitlines()[0]}"
                    ) from None
                finally:
                    self.status.end(start_ts)
            self.schema_version = version
            if old is not None:
                self._tables.pop(old.name, None)
            if not info.dropped:
                self._tables[info.name] = info
            log.info("DDL v%d: %s", version, "; ".join(stmts))
            return info

    def _record_schema(self, conn: Connection, info: binlog_pb2.TableInfo, old: binlog_pb2.TableInfo | None,
                       version: int, next_id: int) -> None:
        if old is not None and old.table_id != info.table_id:
            conn.execute(_schema.update().where(_schema.c.table_id == old.table_id).values(dropped=True))
        row = {"name": info.name, "info": info.SerializeToString(), "dropped": info.dropped}
        exists = conn.execute(sa.select(_schema.c.table_id).where(_schema.c.table_id == info.table_id)).first()
        if exists:
            conn.execute(_schema.update().where(_schema.c.table_id == info.table_id).values(**row))
        else:
            conn.execute(_schema.insert().values(table_id=info.table_id, **row))
        for k, v in (("schema_version", version), ("next_table_id", next_id)):
            updated = conn.execute(_meta.update().where(_meta.c.k == k).values(v=str(v))).rowcount
            if not updated:
                conn.execute(_meta.insert().values(k=k, v=str(v)))

    def _check_unique_names(self, names: Sequence[str], table: str | None = None) -> None:
        taken = {k.name for t in self._tables.values() if t.name != table for k in t.unique_keys}
        clash = [n for n in names if n in taken]
        if clash:
            raise errors.InvalidArgument(
                f"unique key name(s) {', '.join(clash)} already used by another table "
                "(index names are per database in PostgreSQL and SQLite)"
            )

    def create_table(self, name: str, columns: Sequence[sc.ColumnDef], primary_key: Sequence[str],
                     unique_keys: Mapping[str, Sequence[str]] | None = None) -> binlog_pb2.TableInfo:
        if name in self._tables:
            raise errors.InvalidArgument(f"table {name} already exists")
        self._check_unique_names(list(unique_keys or {}))
        return self._ddl(
            None,
            lambda tid, v: sc.new_table(tid, self.db, name, list(columns), list(primary_key),
                                        {k: list(c) for k, c in (unique_keys or {}).items()}, v),
            lambda info, _old: dl.create_table_sql(self.engine, info),
        )

    def add_column(self, table: str, column: sc.ColumnDef) -> binlog_pb2.TableInfo:
        return self._ddl(table, lambda _t, v: sc.add_column(self.table(table), column, v),
                         lambda _i, _o: dl.add_column_sql(self.engine, table, column))

    def set_default(self, table: str, column: str, default: Any) -> binlog_pb2.TableInfo:
        """``ALTER COLUMN column SET DEFAULT default`` (None: DROP DEFAULT): only rows
        inserted later without the column take it, as upstream."""
        return self._ddl(table, lambda _t, v: sc.set_default(self.table(table), column, default, v),
                         lambda info, _o: dl.set_default_sql(self.engine, table, sc.column_def(
                             next(c for c in info.columns if c.name == column)), info))

    def drop_column(self, table: str, column: str) -> binlog_pb2.TableInfo:
        return self._ddl(table, lambda _t, v: sc.drop_column(self.table(table), column, v),
                         lambda _i, _o: dl.drop_column_sql(self.engine, table, column))

    def rename_column(self, table: str, old: str, new: str) -> binlog_pb2.TableInfo:
        return self._ddl(table, lambda _t, v: sc.rename_column(self.table(table), old, new, v),
                         lambda _i, _o: dl.rename_column_sql(self.engine, table, old, new))

    def change_column_type(self, table: str, column: sc.ColumnDef) -> binlog_pb2.TableInfo:
        return self._ddl(table, lambda _t, v: sc.change_column_type(self.table(table), column, v),
                         lambda i, _o: dl.change_column_type_sql(self.engine, table, column, i))

    def add_unique_key(self, table: str, key: str, columns: Sequence[str]) -> binlog_pb2.TableInfo:
        self._check_unique_names([key])
        return self._ddl(table, lambda _t, v: sc.add_unique_key(self.table(table), key, list(columns), v),
                         lambda _i, _o: dl.add_unique_key_sql(self.engine, table, key, list(columns)))

    def drop_unique_key(self, table: str, key: str) -> binlog_pb2.TableInfo:
        return self._ddl(table, lambda _t, v: sc.drop_unique_key(self.table(table), key, v),
                         lambda _i, _o: dl.drop_unique_key_sql(self.engine, table, key))

    def rename_table(self, table: str, new: str) -> binlog_pb2.TableInfo:
        if new in self._tables:
            raise errors.InvalidArgument(f"table {new} already exists")
        return self._ddl(table, lambda _t, v: sc.rename_table(self.table(table), new, v),
                         lambda _i, _o: dl.rename_table_sql(self.engine, table, new))

    def truncate_table(self, table: str) -> binlog_pb2.TableInfo:
        return self._ddl(table, lambda tid, v: sc.truncate_table(self.table(table), tid, v),
                         lambda _i, _o: dl.truncate_table_sql(self.engine, table))

    def drop_table(self, table: str) -> binlog_pb2.TableInfo:
        return self._ddl(table, lambda _t, v: sc.drop_table(self.table(table), v),
                         lambda _i, _o: dl.drop_table_sql(self.engine, table))


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy emit BEGIN itself (pysqlite's implicit transactions would
    # start too late), and use WAL so readers never block the writer.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


def _sqlite_on_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


Key = Mapping[str, Any]


class Txn:
    """One upstream transaction's statements. Every change is read back from the
    database so the binlog holds exactly the stored images."""

    def __init__(self, writer: TxnWriter, conn: Connection, start_ts: concurrent.futures.Future[int]) -> None:
        self.writer = writer
        self.conn = conn
        self._start_future = start_ts
        self._start_ts: int | None = None
        self.info: CommitInfo | None = None
        self._mutations: dict[int, binlog_pb2.TableMutation] = {}
        self._order: list[int] = []
        self._changes = 0
        self._for_update = writer.dialect != "sqlite"

    @property
    def start_ts(self) -> int:
        """This transaction's start_ts (waits for the registry the first time)."""
        if self._start_ts is None:
            try:
                ts = self._start_future.result(timeout=30)
            except concurrent.futures.TimeoutError:
                raise errors.DeadlineExceeded("no start_ts from the registry within 30s") from None
            # From here until the transaction ends, the status service answers
            # RUNNING for it (its prewrite can only go out after this).
            self.writer.status.begin(ts)
            self._start_ts = ts
        return self._start_ts

    # -- helpers
    def _t(self, table: str) -> tuple[binlog_pb2.TableInfo, sa.Table, list[str]]:
        info = self.writer.table(table)
        return info, self.writer.sa_table(table), sc.key_columns(info)

    def _mut(self, info: binlog_pb2.TableInfo) -> binlog_pb2.TableMutation:
        m = self._mutations.get(info.table_id)
        if m is None:
            m = binlog_pb2.TableMutation(table_id=info.table_id)
            self._mutations[info.table_id] = m
            self._order.append(info.table_id)
        return m

    @staticmethod
    def _check_cols(info: binlog_pb2.TableInfo, values: Mapping[str, Any], what: str) -> None:
        known = {c.name for c in info.columns}
        bad = [k for k in values if k not in known]
        if bad:
            raise errors.InvalidArgument(f"{what}: table {info.name} has no column(s) {', '.join(bad)}")

    @staticmethod
    def _check_values(info: binlog_pb2.TableInfo, values: Mapping[str, Any]) -> None:
        """Refuse what the codec cannot carry before the database sees it, as insert
        does: otherwise SQLite stores NaN as NULL (and commits), and PyMySQL raises
        a raw driver error. SQL expressions are checked when the row is read back."""
        types = {c.name: c.type for c in info.columns}
        for name, value in values.items():
            if isinstance(value, sa.sql.ClauseElement):
                continue
            if types[name] == binlog_pb2.JSON and isinstance(value, str):
                value = json.dumps(value)
            try:
                codec.encode_value(value, types[name], f"{info.name}.{name}")
            except (TypeError, ValueError) as exc:
                raise errors.InvalidArgument(str(exc)) from None

    def _key_clause(self, t: sa.Table, keys: list[str], key: Key, info: binlog_pb2.TableInfo) -> Any:
        missing = [k for k in keys if k not in key]
        if missing or len(key) != len(keys):
            raise errors.InvalidArgument(
                f"table {info.name}: a key gives exactly the primary key columns {keys}, got {sorted(key)}"
            )
        return sa.and_(*[t.c[k] == key[k] for k in keys])

    def _rows(self, t: sa.Table, clause: Any, lock: bool) -> list[dict[str, Any]]:
        stmt = sa.select(t).where(clause)
        if lock and self._for_update:
            stmt = stmt.with_for_update()
        return [dict(r._mapping) for r in self.conn.execute(stmt)]

    def _by_keys(self, t: sa.Table, keys: list[str], key_tuples: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(0, len(key_tuples), 500):
            chunk = key_tuples[i:i + 500]
            if len(keys) == 1:
                clause = t.c[keys[0]].in_([k[0] for k in chunk])
            else:
                clause = sa.tuple_(*[t.c[k] for k in keys]).in_(chunk)
            out += [dict(r._mapping) for r in self.conn.execute(sa.select(t).where(clause))]
        return out

    def _encode(self, info: binlog_pb2.TableInfo, row: Mapping[str, Any]) -> bytes:
        # Values here follow SQLAlchemy's JSON type, where a Python str is a JSON
        # *string* document; the codec reads a str as JSON text, so quote it.
        json_cols = [c.name for c in info.columns if c.type == binlog_pb2.JSON]
        if json_cols and any(isinstance(row.get(c), str) for c in json_cols):
            row = {k: (json.dumps(v) if k in json_cols and isinstance(v, str) else v) for k, v in row.items()}
        try:
            return codec.encode_row(row, info)
        except (TypeError, ValueError) as exc:
            raise errors.InvalidArgument(str(exc)) from None

    def _exec(self, stmt: Any, params: Any = None) -> Any:
        try:
            return self.conn.execute(stmt, params) if params is not None else self.conn.execute(stmt)
        except sa.exc.IntegrityError as exc:
            raise errors.FailedPrecondition(f"upstream refused the change: {errors.first_line(exc)}") from None
        except sa.exc.DataError as exc:
            raise errors.InvalidArgument(f"upstream refused a value: {errors.first_line(exc)}") from None

    # -- statements
    def insert(self, table: str, row: Mapping[str, Any]) -> None:
        self.insert_many(table, [row])

    def insert_many(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        info, t, keys = self._t(table)
        for row in rows:
            self._check_cols(info, row, "insert")
        # A column the row leaves out takes its constant default, as the database would.
        defaults = {c.name: coldefault.constant_value(c)[1] for c in info.columns}
        full = [{c.name: row[c.name] if c.name in row else defaults[c.name] for c in info.columns} for row in rows]
        for row in full:
            self._encode(info, row)  # refuse what the codec cannot carry before the database sees it
        dialect = self.conn.dialect
        if dialect.insert_executemany_returning or (len(full) == 1 and dialect.insert_returning):
            # The stored images come back with the insert (one round trip, not two).
            result = self._exec(t.insert().returning(*t.c), full if len(full) > 1 else full[0])
            returned = [dict(r._mapping) for r in result]
        else:
            self._exec(t.insert(), full)
            returned = self._by_keys(t, keys, [tuple(r[k] for k in keys) for r in full])
        stored = {tuple(r[k] for k in keys): r for r in returned}
        m = self._mut(info)
        for row in full:
            after = stored[tuple(row[k] for k in keys)] if len(stored) == len(full) else None
            if after is None:
                after = self._rows(t, self._key_clause(t, keys, {k: row[k] for k in keys}, info), False)[0]
            m.inserted_rows.append(self._encode(info, after))
            m.sequence.append(binlog_pb2.INSERT)
        self._changes += len(full)

    def update(self, table: str, key: Key, values: Mapping[str, Any]) -> int:
        """Update the row with primary key ``key`` (``values`` may change the key)."""
        info, t, keys = self._t(table)
        self._check_cols(info, values, "update")
        self._check_values(info, values)
        before = self._rows(t, self._key_clause(t, keys, key, info), True)
        if not before:
            return 0
        old = before[0]
        self._exec(t.update().where(self._key_clause(t, keys, key, info)).values(**values))
        new_key = {k: values.get(k, old[k]) for k in keys}
        after = self._rows(t, self._key_clause(t, keys, new_key, info), False)[0]
        m = self._mut(info)
        m.updated_rows.append(binlog_pb2.UpdatedRow(
            old=binlog_pb2.Row.FromString(self._encode(info, old)),
            new=binlog_pb2.Row.FromString(self._encode(info, after))).SerializeToString())
        m.sequence.append(binlog_pb2.UPDATE)
        self._changes += 1
        return 1

    def update_where(self, table: str, where: Callable[[sa.Table], Any], values: Mapping[str, Any]) -> int:
        """Update every row matching ``where(table)`` (a range change). Values may be
        SQL expressions of the table's columns; primary-key columns cannot change here."""
        info, t, keys = self._t(table)
        self._check_cols(info, values, "update")
        self._check_values(info, values)
        if any(k in values for k in keys):
            raise errors.InvalidArgument("update_where cannot change primary-key columns; use update() per key")
        before = self._rows(t, where(t), True)
        if not before:
            return 0
        key_tuples = [tuple(r[k] for k in keys) for r in before]
        returning = self.conn.dialect.update_returning
        changed: list[dict[str, Any]] = []
        for i in range(0, len(key_tuples), 500):
            chunk = key_tuples[i:i + 500]
            clause = (t.c[keys[0]].in_([k[0] for k in chunk]) if len(keys) == 1
                      else sa.tuple_(*[t.c[k] for k in keys]).in_(chunk))
            stmt = t.update().where(clause).values(**values)
            if returning:
                # The after images come back with the update (one round trip, not two).
                changed += [dict(r._mapping) for r in self._exec(stmt.returning(*t.c))]
            else:
                self._exec(stmt)
        if not returning:
            changed = self._by_keys(t, keys, key_tuples)
        after = {tuple(r[k] for k in keys): r for r in changed}
        m = self._mut(info)
        for old in before:
            new = after[tuple(old[k] for k in keys)]
            m.updated_rows.append(binlog_pb2.UpdatedRow(
                old=binlog_pb2.Row.FromString(self._encode(info, old)),
                new=binlog_pb2.Row.FromString(self._encode(info, new))).SerializeToString())
            m.sequence.append(binlog_pb2.UPDATE)
        self._changes += len(before)
        return len(before)

    def delete(self, table: str, key: Key) -> int:
        info, t, keys = self._t(table)
        return self._delete(info, t, self._key_clause(t, keys, key, info))

    def delete_where(self, table: str, where: Callable[[sa.Table], Any]) -> int:
        info, t, _keys = self._t(table)
        return self._delete(info, t, where(t))

    def _delete(self, info: binlog_pb2.TableInfo, t: sa.Table, clause: Any) -> int:
        before = self._rows(t, clause, True)
        if not before:
            return 0
        self._exec(t.delete().where(clause))
        m = self._mut(info)
        for old in before:
            m.deleted_rows.append(self._encode(info, old))
            m.sequence.append(binlog_pb2.DELETE_ROW)
        self._changes += len(before)
        return len(before)

    def get(self, table: str, key: Key) -> dict[str, Any] | None:
        info, t, keys = self._t(table)
        rows = self._rows(t, self._key_clause(t, keys, key, info), False)
        return rows[0] if rows else None

    def select(self, table: str, where: Callable[[sa.Table], Any] | None = None) -> list[dict[str, Any]]:
        _info, t, _keys = self._t(table)
        return self._rows(t, where(t) if where is not None else sa.true(), False)

    # -- commit
    def _commit(self) -> None:
        if not self._mutations:
            # Read-only: nothing to back up, no binlog (as TiDB).
            self.conn.commit()
            return
        value = binlog_pb2.PrewriteValue(schema_version=self.writer.schema_version,
                                         mutations=[self._mutations[i] for i in self._order])
        commit_ts, pump = self.writer._two_phase(self.conn, self.start_ts, value)
        self.info = CommitInfo(self.start_ts, commit_ts, pump, self._changes)
