"""PostgreSQL through psycopg 3.

Unsigned 64-bit integers are NUMERIC(20,0), JSON is JSONB. Rows go in with
``COPY`` (text rows, or CSV written by Arrow in slices), keys go out with one
``DELETE ... = ANY(array)``; upserts are ``INSERT ... ON CONFLICT DO UPDATE``.
DDL is transactional, so a window's DDL commits with its data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as sa_pg
from sqlalchemy.engine import Connection, Engine

from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef
from binlake.sql.targets.base import Target, bind_processors, key_names, on_conflict_upsert

# Rows per CSV slice of ``insert_arrow``: a few MB of text at a time.
COPY_SLICE = 20_000


class _UintNumeric(sa.types.TypeDecorator[Any]):
    """Unsigned 64-bit integers in PostgreSQL (NUMERIC(20,0))."""

    impl = sa.Numeric(20, 0)
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else int(value)


class PostgreSQL(Target):
    name = "postgresql"
    title = "PostgreSQL"
    schemes: ClassVar[Mapping[str, str]] = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}
    drivers = frozenset({"postgresql+psycopg"})
    example_url = "postgresql://USER@HOST/DB"
    transactional_ddl = True
    native_arrow = True
    snapshot_isolation = "REPEATABLE READ"
    row_id = "ctid"
    namespace = "schema"
    current_namespace_sql = "SELECT current_schema()"
    has_namespace_sql = "SELECT 1 FROM pg_namespace WHERE nspname = :n"
    name_bytes = 63  # NAMEDATALEN - 1: a longer name is cut without an error

    @classmethod
    def name_problem(cls, name: str, namespace: bool = False) -> str | None:
        if namespace and isinstance(name, str) and name.lower().startswith("pg_"):
            return "begins with pg_, which PostgreSQL keeps for its system schemas"
        return super().name_problem(name, namespace)

    @classmethod
    def namespace_url(cls, url: sa.engine.URL, name: str) -> sa.engine.URL:
        # The server sets search_path from the connection's options before anything runs,
        # so SQLAlchemy's default schema, its reflection and COPY all see schema ``name``.
        quoted = '"' + name.replace('"', '""') + '"'
        option = "-csearch_path=" + quoted.replace("\\", "\\\\").replace(" ", "\\ ")
        given = url.query.get("options")
        options = f"{given} {option}" if isinstance(given, str) and given else option
        return url.update_query_dict({"options": options})

    @classmethod
    def create_namespace_sql(cls, engine: Engine, name: str) -> list[str]:
        return [f"CREATE SCHEMA IF NOT EXISTS {cls.q(engine, name)}"]


    @classmethod
    def sa_type(cls, col: ColumnDef, keyed: bool = False) -> sa.types.TypeEngine[Any]:
        t = col.type
        if t == "uint":
            return _UintNumeric()
        if t == "float":
            return sa_pg.DOUBLE_PRECISION()
        if t == "datetime":
            return sa_pg.TIMESTAMP(precision=6)
        if t == "time":
            return sa_pg.TIME(precision=6)
        if t == "json":
            return sa_pg.JSONB(none_as_null=True)
        return super().sa_type(col, keyed)

    @classmethod
    def bytes_literal(cls, value: bytes) -> str:
        return f"'\\x{value.hex()}'::bytea"

    @classmethod
    def change_column_type_sql(cls, engine: Engine, table: str, col: ColumnDef,
                               info: binlog_pb2.TableInfo | None = None) -> list[str]:
        t, c = cls.q(engine, table), cls.q(engine, col.name)
        ty = cls.type_sql(engine, col)
        using = f"{c}::text" if col.type == "string" else f"{c}::{ty}"
        return [f"ALTER TABLE {t} ALTER COLUMN {c} TYPE {ty} USING {using}",
                f"ALTER TABLE {t} ALTER COLUMN {c} {'DROP' if col.nullable else 'SET'} NOT NULL"]

    # ------------------------------------------------------------ rows
    def insert_rows(self, conn: Connection, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """``COPY ... FROM STDIN`` on the caller's connection (inside its transaction)."""
        from psycopg.types.json import Jsonb

        names = [c.name for c in info.columns]
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

    def insert_arrow(self, conn: Connection, info: binlog_pb2.TableInfo, rows: pa.Table) -> int:
        """One ``COPY ... (FORMAT csv)`` in the caller's transaction, the CSV written by
        Arrow in slices (memory bounded by a slice, not the table); ``rows`` is checked
        there."""
        return self.insert_arrow_stream(conn, info, (rows,))

    def insert_arrow_stream(self, conn: Connection, info: binlog_pb2.TableInfo, tables: Iterable[pa.Table]) -> int:
        """Every table of ``tables`` (one schema) in one ``COPY ... (FORMAT csv)``: a
        restore's stream of batches costs one statement, not one per batch.

        Text and bytes are always quoted and a null is an empty unquoted field, so
        PostgreSQL reads NULL and the empty string apart; numbers, dates and datetimes
        go unquoted (less for the server to parse than quoting every value)."""
        import pyarrow.csv as pa_csv
        from psycopg.copy import QueuedLibpqWriter

        options = pa_csv.WriteOptions(include_header=False, quoting_style="needed")
        q = conn.dialect.identifier_preparer.quote
        raw: Any = conn.connection.dbapi_connection
        n = 0
        with contextlib.ExitStack() as stack:
            cur = stack.enter_context(raw.cursor())
            copy: Any = None
            for rows in tables:
                if not isinstance(rows, pa.Table):
                    raise TypeError(f"rows must be a pyarrow Table, got {type(rows).__name__}")
                if copy is None:
                    sql = f"COPY {q(info.name)} ({', '.join(q(c) for c in rows.column_names)}) FROM STDIN (FORMAT csv)"
                    # The queued writer sends from a thread of its own: the next slice's CSV
                    # is written while the server parses the last one.
                    copy = stack.enter_context(cur.copy(sql, writer=QueuedLibpqWriter(cur)))
                for batch in rows.to_batches(max_chunksize=COPY_SLICE):
                    out = pa.BufferOutputStream()
                    pa_csv.write_csv(batch, out, options)
                    copy.write(memoryview(out.getvalue()))
                n += int(rows.num_rows)
        return n

    def upsert_statement(self, table: sa.Table, batch: list[dict[str, Any]], names: Sequence[str],
                         key: Sequence[str]) -> Any:
        return on_conflict_upsert(sa_pg.insert(table).values(batch), names, key)

    def delete_keys(self, conn: Connection, info: binlog_pb2.TableInfo, keys: Sequence[tuple[Any, ...]]) -> int:
        """One-column keys: one ``DELETE ... = ANY(%s::type[])`` (one array parameter cast
        to the column's own type, so the key's index is used)."""
        names = key_names(info)
        if len(names) != 1 or not keys:
            return super().delete_keys(conn, info, keys)
        table = self.table(info)
        (proc,) = bind_processors(table, names, conn)
        values = [k[0] if k[0] is None or proc is None else proc(k[0]) for k in keys]
        q = conn.dialect.identifier_preparer.quote
        col_type = table.c[names[0]].type.compile(dialect=conn.dialect)
        literal = array_literal(values)
        cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute(f"DELETE FROM {q(info.name)} WHERE {q(names[0])} = ANY(%s::{col_type}[])",
                        (values if literal is None else literal,))
            return int(cur.rowcount)
        finally:
            cur.close()


def array_literal(values: Sequence[Any]) -> str | None:
    """PostgreSQL's text form of an array of integers or of strings (every element
    quoted, ``"`` and ``\\`` escaped), or None for other values. The server parses
    it with the cast in the statement; built in one join, it costs a tenth of the
    driver's element-by-element array adaptation."""
    if all(type(v) is int for v in values):
        return "{" + ",".join(map(str, values)) + "}"
    if all(type(v) is str for v in values):
        return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"
    return None
