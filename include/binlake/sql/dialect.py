"""SQL by dialect name, for callers that hold an engine or a dialect name rather
than a ``Target`` (the upstream writer renders its own DDL with these).

Nothing here knows a database: each function asks the database's module in
``binlake.sql.targets`` (``kind(name)``), which owns its types, literals and DDL.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef
from binlake.sql.targets import kind


def _of(engine: Engine) -> Any:
    return kind(engine.dialect.name)


def sa_type(col: ColumnDef, dialect: str, keyed: bool = False) -> sa.types.TypeEngine[Any]:
    return kind(dialect).sa_type(col, keyed)


def default_sql(col: ColumnDef, dialect: str) -> str | None:
    return kind(dialect).default_sql(col)


def sa_table(info: binlog_pb2.TableInfo, dialect: str, metadata: sa.MetaData | None = None) -> sa.Table:
    """A SQLAlchemy Table for ``info`` (for DML and CREATE TABLE)."""
    return kind(dialect).sa_table(info, metadata)


def create_table_sql(engine: Engine, info: binlog_pb2.TableInfo) -> list[str]:
    return list(_of(engine).create_table_sql(engine, info))


def add_column_sql(engine: Engine, table: str, col: ColumnDef, fill: Any = None) -> list[str]:
    return list(_of(engine).add_column_sql(engine, table, col, fill))


def set_default_sql(engine: Engine, table: str, col: ColumnDef,
                    info: binlog_pb2.TableInfo | None = None) -> list[str]:
    return list(_of(engine).set_default_sql(engine, table, col, info))


def drop_column_sql(engine: Engine, table: str, col: str) -> list[str]:
    return list(_of(engine).drop_column_sql(engine, table, col))


def rename_column_sql(engine: Engine, table: str, old: str, new: str) -> list[str]:
    return list(_of(engine).rename_column_sql(engine, table, old, new))


def change_column_type_sql(engine: Engine, table: str, col: ColumnDef,
                           info: binlog_pb2.TableInfo | None = None) -> list[str]:
    return list(_of(engine).change_column_type_sql(engine, table, col, info))


def add_unique_key_sql(engine: Engine, table: str, name: str, cols: list[str]) -> list[str]:
    return list(_of(engine).add_unique_key_sql(engine, table, name, cols))


def drop_unique_key_sql(engine: Engine, table: str, name: str) -> list[str]:
    return list(_of(engine).drop_unique_key_sql(engine, table, name))


def rename_table_sql(engine: Engine, old: str, new: str) -> list[str]:
    return list(_of(engine).rename_table_sql(engine, old, new))


def truncate_table_sql(engine: Engine, table: str) -> list[str]:
    return list(_of(engine).truncate_table_sql(engine, table))


def drop_table_sql(engine: Engine, table: str) -> list[str]:
    return list(_of(engine).drop_table_sql(engine, table))


def transactional_ddl(engine: Engine) -> bool:
    """Whether the database runs DDL inside a transaction (PostgreSQL, SQLite, DuckDB)."""
    return bool(_of(engine).transactional_ddl)
