"""SQLite: a file on this machine (the default target of the demo and of ``binlake up``).

SQLite's integers are signed 64-bit and its numbers doubles, so exact decimals
and unsigned 64-bit integers are kept as text; it cannot alter a column's type
or default, so those DDL rebuild the table inside the DDL's transaction. One
writer at a time: a transaction takes the write lock at its start (``BEGIN
IMMEDIATE``) and waits for it, so concurrent writers queue instead of failing.
"""

from __future__ import annotations

import decimal
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sa_sqlite
from sqlalchemy.engine import Connection, Engine

from binlake import config, errors
from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef
from binlake.sql.targets.base import DecimalText, Target, bind_processors, key_names, on_conflict_upsert


class _UintText(sa.types.TypeDecorator[Any]):
    """Unsigned 64-bit integers in SQLite (stored as text: SQLite integers are signed)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else str(int(value))

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else int(value)


class SQLite(Target):
    name = "sqlite"
    title = "SQLite"
    schemes: ClassVar[Mapping[str, str]] = {"sqlite": "sqlite"}
    drivers = frozenset({"sqlite", "sqlite+pysqlite"})
    example_url = "sqlite:///PATH"
    transactional_ddl = True
    native_arrow = True
    concurrent_writers = False
    # No FOR UPDATE in SQLite: a writer's BEGIN IMMEDIATE already holds the database's write lock.
    row_locks = False
    file_database = True
    reserved_prefixes = ("sqlite_",)
    names_ignore_case = True

    @classmethod
    def engine_options(cls, url: sa.engine.URL) -> dict[str, Any]:
        # A parallel apply writes from several connections: wait for the lock, do not fail.
        return {**super().engine_options(url), "connect_args": {"timeout": 120}}

    @classmethod
    def prepare_engine(cls, engine: Engine, *, writer: bool = True) -> None:
        if not writer:
            return
        sa.event.listen(engine, "connect", _on_connect)
        sa.event.listen(engine, "begin", _on_begin)

    @classmethod
    def sa_type(cls, col: ColumnDef, keyed: bool = False) -> sa.types.TypeEngine[Any]:
        if col.type == "uint":
            return _UintText()
        if col.type == "decimal":
            return DecimalText()
        return super().sa_type(col, keyed)

    @classmethod
    def bool_literal(cls, value: bool) -> str:
        return "1" if value else "0"

    @classmethod
    def text_stored(cls, col: ColumnDef) -> bool:
        return col.type in ("uint", "decimal")

    @classmethod
    def now_default(cls, col: ColumnDef) -> str:
        # SQLite's CURRENT_DATE is a keyword default only inside parentheses here (an expression).
        return "(CURRENT_DATE)" if col.type == "date" else super().now_default(col)

    @classmethod
    def literal(cls, value: Any) -> str:
        # Unsigned 64-bit values and decimals are kept as text (see sa_type).
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            return f"'{value}'"
        if isinstance(value, decimal.Decimal):
            return f"'{value}'"
        return super().literal(value)

    @classmethod
    def own_default_after_fill(cls, engine: Engine, table: str, col: ColumnDef) -> list[str]:
        # SQLite cannot change a default, and cannot add a column with a non-constant one: the
        # constant stays (rows inserted later through binlake carry their own values).
        return []

    @classmethod
    def set_default_sql(cls, engine: Engine, table: str, col: ColumnDef,
                        info: binlog_pb2.TableInfo | None = None) -> list[str]:
        if info is None:
            raise errors.InvalidArgument("changing a default in SQLite needs the table's new definition")
        return cls._rebuild(engine, info, col, convert=False)

    @classmethod
    def change_column_type_sql(cls, engine: Engine, table: str, col: ColumnDef,
                               info: binlog_pb2.TableInfo | None = None) -> list[str]:
        if info is None:
            raise errors.InvalidArgument("changing a column type in SQLite needs the table's new definition")
        return cls._rebuild(engine, info, col)

    @classmethod
    def _rebuild(cls, engine: Engine, info: binlog_pb2.TableInfo, col: ColumnDef, convert: bool = True) -> list[str]:
        """SQLite cannot change a column's declared type, and the declared type decides
        how SQLite stores a value (its affinity): text '1.2345' put in a column declared
        BIGINT becomes the REAL 1.2345 (15 digits kept), and an int cast to text turns
        back into an int. So rebuild the table with the new declaration, converting the
        column on the copy (SQLite's documented way to alter a table), inside the DDL's
        transaction."""
        q = cls.q
        t = q(engine, info.name)
        tmp_name = f"_binlake_rebuild_{info.name}"[:63]
        tmp_info = binlog_pb2.TableInfo()
        tmp_info.CopyFrom(info)
        tmp_info.name = tmp_name
        del tmp_info.unique_keys[:]  # index names are per database: create them after the swap
        tmp = q(engine, tmp_name)
        c = q(engine, col.name)
        if not convert:
            conv = c
        elif col.type in ("string", "decimal"):
            conv = f"CAST({c} AS TEXT)"
        elif col.type == "float":
            conv = f"CAST({c} AS REAL)"
        elif col.type == "int":
            conv = f"CAST({c} AS INTEGER)"
        elif col.type == "datetime":
            # A date kept as 'YYYY-MM-DD' reads back as a datetime once it has a time part.
            conv = f"CASE WHEN length({c}) = 10 THEN {c} || ' 00:00:00.000000' ELSE {c} END"
        else:
            conv = c
        names = [q(engine, ci.name) for ci in info.columns]
        select = ", ".join(f"{conv} AS {n}" if ci.name == col.name else n
                           for ci, n in zip(info.columns, names, strict=True))
        stmts = cls.create_table_sql(engine, tmp_info)
        stmts.append(f"INSERT INTO {tmp} ({', '.join(names)}) SELECT {select} FROM {t}")
        stmts.append(f"DROP TABLE {t}")
        stmts.append(f"ALTER TABLE {tmp} RENAME TO {t}")
        by_id = {ci.id: ci.name for ci in info.columns}
        for k in info.unique_keys:
            stmts += cls.add_unique_key_sql(engine, info.name, k.name, [by_id[i] for i in k.column_ids])
        return stmts

    @classmethod
    def truncate_table_sql(cls, engine: Engine, table: str) -> list[str]:
        return [f"DELETE FROM {cls.q(engine, table)}"]

    # ------------------------------------------------------------ rows
    def insert_rows(self, conn: Connection, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """One prepared INSERT run by the driver over the rows, each value converted as
        SQLAlchemy would bind it (SQLAlchemy's own per-row work costs more than SQLite's
        insert); the rows' parameters are built ``[memory] batch_rows`` at a time, so the
        memory is one batch whatever the number of rows (in the caller's transaction)."""
        names = [c.name for c in info.columns]
        procs = bind_processors(self.table(info), names, conn)
        batch = config.memory().batch_rows
        it = iter(rows)
        done = 0
        while chunk := list(itertools.islice(it, batch)):
            params = [tuple(v if v is None or p is None else p(v) for v, p in zip(map(row.get, names), procs,
                                                                                 strict=True))
                      for row in chunk]
            done += _insert(conn, info.name, names, params)
        return done

    def insert_arrow(self, conn: Connection, info: binlog_pb2.TableInfo, rows: pa.Table) -> int:
        """One prepared INSERT run over the Arrow columns' values, converted as SQLAlchemy
        binds them, one record batch (of at most ``[memory] batch_rows`` rows) at a time."""
        if not isinstance(rows, pa.Table):
            raise TypeError(f"rows must be a pyarrow Table, got {type(rows).__name__}")
        names = rows.column_names
        procs = bind_processors(self.table(info), names, conn)
        done = 0
        for record_batch in rows.to_batches(max_chunksize=config.memory().batch_rows):
            columns = []
            for name, proc in zip(names, procs, strict=True):
                values = record_batch.column(name).to_pylist()
                if proc is not None:
                    values = [v if v is None else proc(v) for v in values]
                columns.append(values)
            done += _insert(conn, info.name, names, list(zip(*columns, strict=True)))
        return done

    def upsert_statement(self, table: sa.Table, batch: list[dict[str, Any]], names: Sequence[str],
                         key: Sequence[str]) -> Any:
        return on_conflict_upsert(sa_sqlite.insert(table).values(batch), names, key)

    def delete_keys(self, conn: Connection, info: binlog_pb2.TableInfo, keys: Sequence[tuple[Any, ...]]) -> int:
        """One-column keys: one prepared DELETE run over every key (``executemany``)."""
        names = key_names(info)
        if len(names) != 1 or not keys:
            return super().delete_keys(conn, info, keys)
        (proc,) = bind_processors(self.table(info), names, conn)
        values = [k[0] if k[0] is None or proc is None else proc(k[0]) for k in keys]
        q = conn.dialect.identifier_preparer.quote
        cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.executemany(f"DELETE FROM {q(info.name)} WHERE {q(names[0])} = ?", [(v,) for v in values])
            return int(cur.rowcount)
        finally:
            cur.close()


def _insert(conn: Connection, table: str, names: Sequence[str], params: list[tuple[Any, ...]]) -> int:
    """One prepared INSERT of ``names`` run over ``params`` by the driver; the rows inserted."""
    q = conn.dialect.identifier_preparer.quote
    sql = f"INSERT INTO {q(table)} ({', '.join(q(n) for n in names)}) VALUES ({', '.join('?' for _ in names)})"
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cur.executemany(sql, params)
    finally:
        cur.close()
    return len(params)


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    # SQLAlchemy emits BEGIN itself: pysqlite's implicit transactions start only at
    # the first INSERT/UPDATE/DELETE, which would leave a leading DDL outside the
    # window's transaction. WAL keeps readers (diff, status) from blocking the apply.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def _on_begin(conn: Connection) -> None:
    # Take the write lock at the start: parallel groups then wait for each other
    # (busy timeout) instead of failing when a read lock cannot be upgraded.
    conn.exec_driver_sql("BEGIN IMMEDIATE")
