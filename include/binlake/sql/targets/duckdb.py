"""DuckDB: a file an analyst opens on a laptop (``duckdb:///restored.duckdb``).

Through ``duckdb-engine`` (SQLAlchemy's dialect for DuckDB, which speaks
PostgreSQL's SQL). Unsigned 64-bit integers are UBIGINT and JSON is DuckDB's
JSON type; DECIMAL stops at 38 digits, so a wider decimal is kept as its exact
text. DDL is transactional. Rows are written as Arrow: each batch of rows
becomes an Arrow table the database reads in place (``INSERT ... SELECT`` from
it), so a load costs DuckDB's columnar insert, not a statement per row.

DuckDB refuses to rename a table or to rename, drop or retype a column while
the table has a secondary index: the apply drops a table's unique indexes before
such a DDL and creates them again after it (``alter_keeps_indexes``).

One process writes a DuckDB file at a time (DuckDB locks the file), and inside
that process binlake writes through one connection at a time
(``concurrent_writers``): concurrent transactions of DuckDB conflict rather
than wait.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import functools
import itertools
import json
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as sa_pg
from sqlalchemy.engine import Connection

from binlake import codec
from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef, column_def
from binlake.sql.targets.base import DecimalText, Target, key_names, on_conflict_upsert

# DuckDB's widest DECIMAL.
MAX_PRECISION = 38
# Rows per Arrow batch handed to DuckDB: a few MB of typical rows.
BATCH_ROWS = 50_000


class _UBigInt(sa.types.UserDefinedType[int]):
    """DuckDB's unsigned 64-bit integer."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "UBIGINT"


class DuckDB(Target):
    name = "duckdb"
    title = "DuckDB"
    schemes: ClassVar[Mapping[str, str]] = {"duckdb": "duckdb"}
    drivers = frozenset({"duckdb"})
    example_url = "duckdb:///PATH"
    transactional_ddl = True
    native_arrow = True
    concurrent_writers = False
    # DuckDB refuses most ALTER TABLE on a table with an index ("entries that depend on it").
    alter_keeps_indexes = False
    file_database = True
    names_ignore_case = True
    # No FOR UPDATE: one writing transaction at a time holds the engine's lock (below).
    row_locks = False

    @classmethod
    def prepare_engine(cls, engine: sa.Engine, *, writer: bool = True) -> None:
        # duckdb-engine quotes identifiers by PostgreSQL's list of reserved words, and
        # DuckDB reserves others (AT, for one): quote every word DuckDB does not leave
        # unreserved, so a column named like one is created and named right.
        preparer = engine.dialect.identifier_preparer
        preparer.reserved_words = set(preparer.reserved_words) | _duckdb_keywords()
        if not writer:
            return
        # One writing transaction at a time: a transaction takes the engine's lock when
        # it begins and gives it back when it ends, as SQLite's BEGIN IMMEDIATE does,
        # so the apply's parallel workers queue instead of conflicting. Re-entrant: a
        # thread may read on a second connection while its own transaction is open.
        lock = threading.RLock()
        sa.event.listen(engine, "begin", lambda _conn: lock.acquire())
        sa.event.listen(engine, "commit", lambda _conn: _release(lock))
        sa.event.listen(engine, "rollback", lambda _conn: _release(lock))

    @classmethod
    def sa_type(cls, col: ColumnDef, keyed: bool = False) -> sa.types.TypeEngine[Any]:
        if col.type == "uint":
            return _UBigInt()
        if col.type == "decimal" and (col.precision or 0) > MAX_PRECISION:
            return DecimalText()  # wider than DuckDB's DECIMAL(38): its exact text
        return super().sa_type(col, keyed)

    # ------------------------------------------------------------ the catalog
    # duckdb-engine's reflection runs PostgreSQL's catalog queries, which DuckDB's
    # pg_catalog cannot all answer: read DuckDB's own catalog functions instead.
    @classmethod
    def column_names(cls, conn: Connection, table: str) -> list[str]:
        return [str(name) for name, _type in _columns(conn, table)]

    @classmethod
    def index_names(cls, conn: Connection, table: str) -> set[str]:
        rows = conn.exec_driver_sql(
            "SELECT index_name FROM duckdb_indexes() WHERE table_name = ? AND schema_name = current_schema()",
            (table,))
        return {str(r[0]) for r in rows}

    @classmethod
    def unique_keys(cls, conn: Connection, table: str) -> list[list[str]]:
        out = [list(cols) for cols in _constraint_columns(conn, table, "UNIQUE")]
        rows = conn.exec_driver_sql(
            "SELECT expressions FROM duckdb_indexes() WHERE table_name = ? AND schema_name = current_schema() "
            "AND is_unique", (table,))
        for (expressions,) in rows:
            # "[a, b]" for an index on plain columns (an expression index names no column).
            cols = [c.strip().strip('"') for c in str(expressions).strip("[]").split(",") if c.strip()]
            out.append(cols)
        return out

    @classmethod
    def reflect(cls, conn: Connection, table: str) -> sa.Table:
        pk = set(next(iter(_constraint_columns(conn, table, "PRIMARY KEY")), []))
        cols = [sa.Column(name, _sa_type_of(str(type_name)), primary_key=name in pk)
                for name, type_name in _columns(conn, table)]
        return sa.Table(table, sa.MetaData(), *cols)

    @classmethod
    def text_stored(cls, col: ColumnDef) -> bool:
        return col.type == "decimal" and (col.precision or 0) > MAX_PRECISION

    @classmethod
    def bytes_literal(cls, value: bytes) -> str:
        return "'" + "".join(f"\\x{b:02x}" for b in value) + "'::BLOB"

    @classmethod
    def literal(cls, value: Any) -> str:
        if isinstance(value, (dict, list)):
            return cls.quote_text(codec.canonical_json(value)) + "::JSON"
        return super().literal(value)

    @classmethod
    def change_column_type_sql(cls, engine: sa.Engine, table: str, col: ColumnDef,
                               info: binlog_pb2.TableInfo | None = None) -> list[str]:
        t, c = cls.q(engine, table), cls.q(engine, col.name)
        ty = cls.type_sql(engine, col)
        return [f"ALTER TABLE {t} ALTER COLUMN {c} TYPE {ty} USING CAST({c} AS {ty})",
                f"ALTER TABLE {t} ALTER COLUMN {c} {'DROP' if col.nullable else 'SET'} NOT NULL"]

    # ------------------------------------------------------------ rows
    def insert_rows(self, conn: Connection, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """The rows in Arrow batches of ``BATCH_ROWS``, each inserted by DuckDB from Arrow."""
        cols = [column_def(c) for c in info.columns]
        n = 0
        it = iter(rows)
        while batch := list(itertools.islice(it, BATCH_ROWS)):
            arrays = [pa.array([_transport(r.get(c.name), c) for r in batch], type=_arrow_type(c)) for c in cols]
            n += self._insert_from(conn, info.name, pa.Table.from_arrays(arrays, names=[c.name for c in cols]))
        return n

    def insert_arrow(self, conn: Connection, info: binlog_pb2.TableInfo, rows: pa.Table) -> int:
        """DuckDB reads the Arrow columns in place; it casts each to the column's type
        (decimals given as text included)."""
        if not isinstance(rows, pa.Table):
            raise TypeError(f"rows must be a pyarrow Table, got {type(rows).__name__}")
        n = 0
        for batch in rows.to_batches(max_chunksize=BATCH_ROWS):
            n += self._insert_from(conn, info.name, pa.Table.from_batches([batch]))
        return n

    def _insert_from(self, conn: Connection, table: str, rows: pa.Table) -> int:
        q = conn.dialect.identifier_preparer.quote
        raw: Any = conn.connection.dbapi_connection
        view = f"_binlake_rows_{uuid.uuid4().hex[:12]}"
        names = ", ".join(q(n) for n in rows.column_names)
        sql = f"INSERT INTO {q(table)} ({names}) SELECT {names} FROM {q(view)}"
        with _registered(raw, view, rows):
            try:
                raw.execute(sql)
            except _duckdb().ConstraintException as exc:
                # As SQLAlchemy reports it for a statement it ran: the apply tells a target
                # that does not match the log (a key already there) by this.
                raise sa.exc.IntegrityError(sql, None, exc) from None
        return int(rows.num_rows)

    def upsert_statement(self, table: sa.Table, batch: list[dict[str, Any]], names: Sequence[str],
                         key: Sequence[str]) -> Any:
        # duckdb-engine compiles PostgreSQL's INSERT ... ON CONFLICT, which DuckDB runs as is.
        return on_conflict_upsert(sa_pg.insert(table).values(batch), names, key)

    def delete_keys(self, conn: Connection, info: binlog_pb2.TableInfo, keys: Sequence[tuple[Any, ...]]) -> int:
        """The keys as one Arrow table per batch, deleted with one join (``DELETE ... USING``)."""
        if not keys:
            return 0
        names = key_names(info)
        by_name = {c.name: column_def(c) for c in info.columns}
        q = conn.dialect.identifier_preparer.quote
        raw: Any = conn.connection.dbapi_connection
        n = 0
        for i in range(0, len(keys), BATCH_ROWS):
            chunk = keys[i:i + BATCH_ROWS]
            arrays = [pa.array([_transport(k[j], by_name[name]) for k in chunk], type=_arrow_type(by_name[name]))
                      for j, name in enumerate(names)]
            view = f"_binlake_keys_{uuid.uuid4().hex[:12]}"
            with _registered(raw, view, pa.Table.from_arrays(arrays, names=names)):
                on = " AND ".join(f"{q(info.name)}.{q(c)} = {q(view)}.{q(c)}" for c in names)
                result = raw.execute(f"DELETE FROM {q(info.name)} USING {q(view)} WHERE {on}").fetchone()
                n += int(result[0]) if result else 0
        return n


def _duckdb() -> Any:
    # Imported when a DuckDB target is used: every command loads the targets' registry,
    # and most never touch DuckDB (its import costs about 0.1 s).
    import duckdb

    return duckdb


@contextlib.contextmanager
def _registered(raw: Any, view: str, rows: pa.Table) -> Iterator[None]:
    """``rows`` readable as view ``view`` of connection ``raw`` while the block runs."""
    raw.register(view, rows)
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        try:
            raw.unregister(view)
        except _duckdb().Error:
            # A failed statement aborted the transaction, and DuckDB refuses every call
            # until the rollback; the view goes with the connection (its name is unique).
            if not failed:
                raise


def _columns(conn: Connection, table: str) -> list[tuple[str, str]]:
    rows = conn.exec_driver_sql(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
        "AND table_schema = current_schema() ORDER BY ordinal_position", (table,))
    return [(str(r[0]), str(r[1])) for r in rows]


def _constraint_columns(conn: Connection, table: str, kind: str) -> list[list[str]]:
    rows = conn.exec_driver_sql(
        "SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = ? "
        "AND schema_name = current_schema() AND constraint_type = ?", (table, kind))
    return [[str(c) for c in r[0]] for r in rows]


def _sa_type_of(type_name: str) -> sa.types.TypeEngine[Any]:
    """The SQLAlchemy type values of DuckDB's type ``type_name`` read back as."""
    t = type_name.upper()
    if t in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "UINTEGER", "USMALLINT", "UTINYINT"):
        return sa.BigInteger()
    if t in ("UBIGINT", "UHUGEINT") or t.startswith("DECIMAL"):
        return sa.Numeric()
    if t in ("DOUBLE", "FLOAT", "REAL"):
        return sa.Double()
    if t == "BOOLEAN":
        return sa.Boolean()
    if t == "BLOB":
        return sa.LargeBinary()
    if t == "DATE":
        return sa.Date()
    if t.startswith("TIMESTAMP"):
        return sa.DateTime()
    if t.startswith("TIME"):
        return sa.Time()
    if t == "JSON":
        return sa.JSON()
    return sa.Text()


@functools.cache
def _duckdb_keywords() -> frozenset[str]:
    rows = _duckdb().sql("SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category <> 'unreserved'")
    return frozenset(str(r[0]).lower() for r in rows.fetchall())


def _release(lock: Any) -> None:
    try:
        lock.release()
    except RuntimeError:  # a rollback of a transaction this thread never began (a pool reset)
        pass


def _arrow_type(col: ColumnDef) -> pa.DataType:
    """The Arrow type a column's values travel in; DuckDB casts it to the column's type."""
    t = col.type
    if t == "int":
        return pa.int64()
    if t == "uint":
        return pa.uint64()
    if t == "bool":
        return pa.bool_()
    if t == "float":
        return pa.float64()
    if t == "bytes":
        return pa.binary()
    if t == "date":
        return pa.date32()
    if t == "datetime":
        return pa.timestamp("us")
    if t == "time":
        return pa.time64("us")
    return pa.string()  # string; decimal and JSON as their exact text


def _transport(value: Any, col: ColumnDef) -> Any:
    """``value`` (a codec Python value) as ``_arrow_type(col)`` takes it."""
    if value is None:
        return None
    t = col.type
    if t == "decimal":
        return str(decimal.Decimal(value))
    if t == "json":
        # The document's own JSON text: a string value is the JSON string "…".
        return codec.canonical_json(value) if not isinstance(value, str) else json.dumps(value)
    if t == "datetime" and getattr(value, "tzinfo", None) is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if t == "time" and not hasattr(value, "hour"):
        return (dt.datetime(1970, 1, 1) + value).time()  # a timedelta inside one day
    return value
