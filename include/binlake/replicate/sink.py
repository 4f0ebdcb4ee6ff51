"""Target databases: open one from a SQLAlchemy URL, create tables from binlake's
table definitions, load rows in bulk, and write compacted changes in batches.

Dialects: SQLite, PostgreSQL (psycopg) and MySQL/MariaDB (pymysql). Column
types are the upstream writer's (``binlake.sql.dialect``), so a value reads
back from a target exactly as it does from an upstream of the same dialect.

Every table the sink creates is recorded in the target's ``_binlake_schema``
(the shape the upstream writer uses), so ``binlake.oracle`` and ``diff`` type
the target's columns by binlake's definitions (SQLite stores decimals as text).

Writes are whole batches, never a statement per row:

* deletes: PostgreSQL ``DELETE ... WHERE key = ANY(array)`` (one statement, one
  array parameter), SQLite one prepared ``DELETE`` run over every key
  (``executemany``), elsewhere ``DELETE ... WHERE key IN (...)`` (a row-value IN
  for composite keys);
* inserts: PostgreSQL ``COPY`` into the table, SQLite one prepared INSERT run
  over every row (``executemany``), elsewhere multi-row INSERT;
* upserts (safe mode): multi-row ``INSERT ... ON CONFLICT DO UPDATE``
  (PostgreSQL, SQLite) or ``ON DUPLICATE KEY UPDATE`` (MySQL/MariaDB).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import mysql as sa_mysql
from sqlalchemy.dialects import postgresql as sa_pg
from sqlalchemy.dialects import sqlite as sa_sqlite
from sqlalchemy.engine import Connection

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.sql import dialect as dl
from binlake.sql.url import open_engine

# _binlake_schema in a target: one row per table the sink created, keyed by table_id.
# Invariant: ``info`` is the definition the target table ``name`` has now (``name``
# is the target's name, which a route may have changed), written in the same
# transaction as the DDL where the dialect's DDL is transactional, right after it on MySQL.
SCHEMA_TABLE = "_binlake_schema"

IF_EXISTS = ("fail", "skip", "replace")
# Bound parameters per statement stay below every dialect's limit (SQLite 32766,
# PostgreSQL 65535); 1,000 rows a statement is where larger batches stop paying.
_MAX_PARAMS = 30_000
_MAX_ROWS = 1_000
# Rows per CSV slice of ``copy_arrow``: a few MB of text at a time.
_COPY_SLICE = 20_000

_md = sa.MetaData()
_schema = sa.Table(SCHEMA_TABLE, _md, sa.Column("table_id", sa.BigInteger, primary_key=True, autoincrement=False),
                   sa.Column("name", sa.String(128), nullable=False),
                   sa.Column("info", sa.LargeBinary, nullable=False),
                   sa.Column("dropped", sa.Boolean(create_constraint=False), nullable=False))


def open_target(url: str) -> Target:
    """Connect to the target at ``url`` (checked with one round trip)."""
    return Target(open_engine(url))


class Target:
    """One target database."""

    def __init__(self, engine: sa.Engine) -> None:
        if not isinstance(engine, sa.Engine):
            raise TypeError(f"engine must be a SQLAlchemy Engine, got {type(engine).__name__}")
        self.engine = engine
        self.dialect: str = engine.dialect.name

    def __str__(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    __repr__ = __str__

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ schema
    def table_names(self) -> list[str]:
        return sa.inspect(self.engine).get_table_names()

    def has_table(self, name: str, conn: Connection | None = None) -> bool:
        return sa.inspect(conn if conn is not None else self.engine).has_table(name)

    def sa_table(self, info: binlog_pb2.TableInfo) -> sa.Table:
        return dl.sa_table(info, self.dialect)

    def create_table(self, info: binlog_pb2.TableInfo, *, if_exists: str = "fail") -> None:
        """Create ``info.name`` with binlake's column types and unique keys.
        ``if_exists``: "fail" (errors.FailedPrecondition), "skip" (leave it) or "replace"."""
        _check_info(info)
        if if_exists not in IF_EXISTS:
            raise ValueError(f"if_exists must be one of {', '.join(IF_EXISTS)}, got {if_exists!r}")
        with self.engine.connect() as conn:
            conn.begin()
            self.create_table_in(conn, info, if_exists=if_exists)
            conn.commit()

    def create_table_in(self, conn: Connection, info: binlog_pb2.TableInfo, *, if_exists: str = "fail") -> bool:
        """``create_table`` inside the caller's transaction; whether a table was created."""
        if self.has_table(info.name, conn):
            if if_exists == "skip":
                return False
            if if_exists == "fail":
                raise errors.FailedPrecondition(
                    f"target {self} already has a table {info.name}: drop it, or load with if_exists='replace'")
            self.execute_ddl(conn, dl.drop_table_sql(self.engine, info.name))
        self.execute_ddl(conn, dl.create_table_sql(self.engine, info))
        self.record_schema(conn, info)
        return True

    def execute_ddl(self, conn: Connection, statements: Sequence[str]) -> None:
        for stmt in statements:
            conn.exec_driver_sql(stmt)

    def ensure_schema_table(self) -> None:
        """Create ``_binlake_schema`` now if missing, so concurrent table creations
        (a restore's parallel loads) do not race to create it."""
        with self.engine.connect() as conn:
            conn.begin()
            _schema.create(conn, checkfirst=True)
            conn.commit()

    def record_schema(self, conn: Connection, info: binlog_pb2.TableInfo, *, dropped: bool = False) -> None:
        """Record ``info`` as the definition of target table ``info.name``."""
        _schema.create(conn, checkfirst=True)
        conn.execute(_schema.delete().where(sa.or_(_schema.c.name == info.name,
                                                   _schema.c.table_id == info.table_id)))
        if not dropped:
            conn.execute(_schema.insert().values(table_id=info.table_id, name=info.name,
                                                 info=info.SerializeToString(), dropped=False))

    def forget_schema(self, conn: Connection, name: str) -> None:
        if self.has_table(SCHEMA_TABLE, conn):
            conn.execute(_schema.delete().where(_schema.c.name == name))

    def recorded_schema(self, conn: Connection | None = None) -> dict[str, binlog_pb2.TableInfo]:
        """Target table name -> the definition the sink recorded for it."""
        def read(c: Connection) -> dict[str, binlog_pb2.TableInfo]:
            if not self.has_table(SCHEMA_TABLE, c):
                return {}
            rows = c.execute(sa.select(_schema.c.name, _schema.c.info).where(_schema.c.dropped.is_(False)))
            return {name: binlog_pb2.TableInfo.FromString(bytes(raw)) for name, raw in rows}

        if conn is not None:
            return read(conn)
        with self.engine.connect() as c:
            return read(c)

    # ------------------------------------------------------------------ rows
    def bulk_load(self, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """Append ``rows`` (column name -> Python value; missing columns are NULL) to
        table ``info.name`` in one transaction; the number of rows loaded."""
        _check_info(info)
        with self.engine.connect() as conn:
            conn.begin()
            n = self.insert_rows(conn, info, rows)
            conn.commit()
        return n

    def insert_rows(self, conn: Connection, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """Plain INSERT of ``rows`` (PostgreSQL: COPY) in the caller's transaction."""
        names = [c.name for c in info.columns]
        if self.dialect == "postgresql":
            return _copy_rows(conn, info, names, rows)
        table = self.sa_table(info)
        if self.dialect == "sqlite":
            procs = _bind_processors(table, names, conn)
            params = [tuple(v if v is None or p is None else p(v) for v, p in zip(map(row.get, names), procs,
                                                                                 strict=True))
                      for row in rows]
            return _sqlite_insert(conn, info.name, names, params)
        n = 0
        for batch in _batches(rows, names):
            conn.execute(table.insert(), batch)
            n += len(batch)
        return n

    def insert_arrow(self, conn: Connection, info: binlog_pb2.TableInfo, rows: pa.Table) -> int:
        """Append ``rows`` (an Arrow table, columns named as the target's, values as
        ``arrowcompact`` types them: decimals as their exact text) in the caller's
        transaction: PostgreSQL ``copy_arrow``; SQLite one prepared INSERT run over
        the rows, each column's values converted as SQLAlchemy would bind them;
        elsewhere ``insert_rows`` of the rows as dictionaries."""
        if not isinstance(rows, pa.Table):
            raise TypeError(f"rows must be a pyarrow Table, got {type(rows).__name__}")
        if self.dialect == "postgresql":
            return self.copy_arrow(conn, info, rows)
        if self.dialect != "sqlite":
            return self.insert_rows(conn, info, rows.to_pylist())
        names = rows.column_names
        procs = _bind_processors(self.sa_table(info), names, conn)
        columns = []
        for name, proc in zip(names, procs, strict=True):
            values = rows.column(name).to_pylist()
            if proc is not None:
                values = [v if v is None else proc(v) for v in values]
            columns.append(values)
        return _sqlite_insert(conn, info.name, names, list(zip(*columns, strict=True)))

    def copy_arrow(self, conn: Connection, info: binlog_pb2.TableInfo, rows: pa.Table) -> int:
        """PostgreSQL: append ``rows`` (an Arrow table, columns named as the target's)
        with one ``COPY ... (FORMAT csv)`` in the caller's transaction, the CSV
        written by Arrow in slices (memory bounded by a slice, not the table).

        Every non-null value is quoted and a null is an empty unquoted field, so
        PostgreSQL reads NULL and the empty string apart."""
        import pyarrow.csv as pa_csv
        from psycopg.copy import QueuedLibpqWriter

        if self.dialect != "postgresql":
            raise ValueError(f"copy_arrow writes to PostgreSQL, the target is {self.dialect}")
        if not isinstance(rows, pa.Table):
            raise TypeError(f"rows must be a pyarrow Table, got {type(rows).__name__}")
        q = conn.dialect.identifier_preparer.quote
        sql = f"COPY {q(info.name)} ({', '.join(q(n) for n in rows.column_names)}) FROM STDIN (FORMAT csv)"
        options = pa_csv.WriteOptions(include_header=False, quoting_style="all_valid")
        raw: Any = conn.connection.dbapi_connection
        # The queued writer sends from a thread of its own: the next slice's CSV is
        # written while the server parses the last one.
        with raw.cursor() as cur, cur.copy(sql, writer=QueuedLibpqWriter(cur)) as copy:
            for batch in rows.to_batches(max_chunksize=_COPY_SLICE):
                out = pa.BufferOutputStream()
                pa_csv.write_csv(batch, out, options)
                copy.write(memoryview(out.getvalue()))
        return int(rows.num_rows)

    def upsert_rows(self, conn: Connection, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """Multi-row upsert on the primary key (insert, or overwrite every column)."""
        table = self.sa_table(info)
        names = [c.name for c in info.columns]
        key = _key_names(info)
        n = 0
        for batch in _batches(rows, names):
            if self.dialect == "postgresql":
                pg = sa_pg.insert(table).values(batch)
                stmt: Any = pg.on_conflict_do_update(
                    index_elements=key, set_={c: pg.excluded[c] for c in names if c not in key} or None)
                if len(names) == len(key):
                    stmt = pg.on_conflict_do_nothing(index_elements=key)
            elif self.dialect == "mysql":
                my = sa_mysql.insert(table).values(batch)
                stmt = my.on_duplicate_key_update({c: my.inserted[c] for c in names})
            else:
                lite = sa_sqlite.insert(table).values(batch)
                stmt = lite.on_conflict_do_update(
                    index_elements=key, set_={c: lite.excluded[c] for c in names if c not in key})
                if len(names) == len(key):
                    stmt = lite.on_conflict_do_nothing(index_elements=key)
            conn.execute(stmt)
            n += len(batch)
        return n

    def delete_keys(self, conn: Connection, info: binlog_pb2.TableInfo, keys: Sequence[tuple[Any, ...]]) -> int:
        """``DELETE ... WHERE key IN (...)`` in batches; the number of rows deleted."""
        table = self.sa_table(info)
        names = _key_names(info)
        cols = [table.c[name] for name in names]
        if not keys:
            return 0
        if len(cols) == 1 and self.dialect in ("postgresql", "sqlite"):
            return _delete_single_key(conn, table, names[0], keys)
        per = max(1, min(_MAX_ROWS, _MAX_PARAMS // len(cols)))
        n = 0
        for i in range(0, len(keys), per):
            chunk = list(keys[i:i + per])
            if len(cols) == 1:
                clause = cols[0].in_([k[0] for k in chunk])
            else:
                clause = sa.tuple_(*cols).in_(chunk)
            n += conn.execute(table.delete().where(clause)).rowcount
        return n

    def existing_keys(self, conn: Connection, info: binlog_pb2.TableInfo,
                      keys: Sequence[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
        """Which of ``keys`` the target table holds (as the target returns them)."""
        table = self.sa_table(info)
        cols = [table.c[name] for name in _key_names(info)]
        found: set[tuple[Any, ...]] = set()
        per = max(1, min(_MAX_ROWS, _MAX_PARAMS // len(cols)))
        for i in range(0, len(keys), per):
            chunk = list(keys[i:i + per])
            clause = cols[0].in_([k[0] for k in chunk]) if len(cols) == 1 else sa.tuple_(*cols).in_(chunk)
            found.update(tuple(r) for r in conn.execute(sa.select(*cols).where(clause)))
        return found

    def delete_one(self, conn: Connection, info: binlog_pb2.TableInfo, row: Mapping[str, Any]) -> int:
        """Delete one row equal to ``row`` in every column (tables without a key)."""
        table = self.sa_table(info)
        cond = sa.and_(*[table.c[c.name].is_(None) if row.get(c.name) is None
                         else table.c[c.name] == row[c.name] for c in info.columns
                         if c.type != binlog_pb2.JSON])
        if self.dialect == "mysql":
            return conn.execute(table.delete().where(cond).with_dialect_options(mysql_limit=1)).rowcount
        rid = "ctid" if self.dialect == "postgresql" else "rowid"
        inner = sa.select(sa.literal_column(rid)).select_from(table).where(cond).limit(1).scalar_subquery()
        return conn.execute(table.delete().where(sa.literal_column(rid) == inner)).rowcount


def _key_names(info: binlog_pb2.TableInfo) -> list[str]:
    by_id = {c.id: c.name for c in info.columns}
    names = [by_id[i] for i in info.primary_key]
    if not names:
        raise errors.FailedPrecondition(f"table {info.name} has no primary key")
    return names


def _check_info(info: Any) -> None:
    if not isinstance(info, binlog_pb2.TableInfo):
        raise TypeError(f"info must be a binlog_pb2.TableInfo, got {type(info).__name__}")
    if not info.name or not info.columns:
        raise ValueError("info must name the table and list its columns")


def _bind_processors(table: sa.Table, names: Sequence[str], conn: Connection) -> list[Any]:
    """Each column's SQLAlchemy bind processor (None when the driver takes the value
    as is): what SQLAlchemy applies to a parameter, for statements run on the driver."""
    dialect = conn.dialect
    return [table.c[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names]


def _delete_single_key(conn: Connection, table: sa.Table, name: str, keys: Sequence[tuple[Any, ...]]) -> int:
    """Delete the rows whose one-column key is in ``keys``; the number deleted."""
    (proc,) = _bind_processors(table, [name], conn)
    values = [k[0] if k[0] is None or proc is None else proc(k[0]) for k in keys]
    q = conn.dialect.identifier_preparer.quote
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        if conn.dialect.name == "postgresql":
            # One array parameter cast to the column's own type, so the key's index is used.
            col_type = table.c[name].type.compile(dialect=conn.dialect)
            literal = _pg_array_literal(values)
            cur.execute(f"DELETE FROM {q(table.name)} WHERE {q(name)} = ANY(%s::{col_type}[])",
                        (values if literal is None else literal,))
            return int(cur.rowcount)
        cur.executemany(f"DELETE FROM {q(table.name)} WHERE {q(name)} = ?", [(v,) for v in values])
        return int(cur.rowcount)
    finally:
        cur.close()


def _sqlite_insert(conn: Connection, table: str, names: Sequence[str], params: list[tuple[Any, ...]]) -> int:
    """One prepared INSERT of ``names`` run over ``params`` by the driver (SQLAlchemy's
    own per-row work would cost more than SQLite's insert); the rows inserted."""
    q = conn.dialect.identifier_preparer.quote
    sql = f"INSERT INTO {q(table)} ({', '.join(q(n) for n in names)}) VALUES ({', '.join('?' for _ in names)})"
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cur.executemany(sql, params)
    finally:
        cur.close()
    return len(params)


def _pg_array_literal(values: Sequence[Any]) -> str | None:
    """PostgreSQL's text form of an array of integers or of strings (every element
    quoted, ``"`` and ``\\`` escaped), or None for other values. The server parses
    it with the cast in the statement; built in one join, it costs a tenth of the
    driver's element-by-element array adaptation."""
    if all(type(v) is int for v in values):
        return "{" + ",".join(map(str, values)) + "}"
    if all(type(v) is str for v in values):
        return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"
    return None


def _batches(rows: Iterable[Mapping[str, Any]], names: Sequence[str]) -> Iterable[list[dict[str, Any]]]:
    per = max(1, min(_MAX_ROWS, _MAX_PARAMS // max(1, len(names))))
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append({n: row.get(n) for n in names})
        if len(batch) >= per:
            yield batch
            batch = []
    if batch:
        yield batch


def _copy_rows(conn: Connection, info: binlog_pb2.TableInfo, names: Sequence[str],
               rows: Iterable[Mapping[str, Any]]) -> int:
    """PostgreSQL COPY FROM STDIN on the caller's connection (inside its transaction)."""
    from psycopg.types.json import Jsonb

    json_cols = {c.name for c in info.columns if c.type == binlog_pb2.JSON}
    q = conn.dialect.identifier_preparer.quote
    sql = f"COPY {q(info.name)} ({', '.join(q(n) for n in names)}) FROM STDIN"
    raw: Any = conn.connection.dbapi_connection
    n = 0
    with raw.cursor() as cur, cur.copy(sql) as copy:
        write = copy.write_row
        if not json_cols:  # the common case: the values go as they are
            for row in rows:
                write(list(map(row.get, names)))
                n += 1
            return n
        for row in rows:
            write([Jsonb(row.get(c)) if c in json_cols and row.get(c) is not None else row.get(c)
                   for c in names])
            n += 1
    return n
