"""MySQL and MariaDB through PyMySQL.

Strings are ``utf8mb4_bin`` (binary order and comparison, as binlake's keys
compare), unsigned integers are BIGINT UNSIGNED, times keep microseconds.
Backslash escapes in string literals. DDL commits at once (not transactional):
the apply records the table definition right after it, and a window with DDL
is applied in steps (``binlake.replicate.consistent``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql as sa_mysql
from sqlalchemy.engine import Connection, Engine

from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef
from binlake.sql.targets.base import Target, row_condition


class MySQL(Target):
    name = "mysql"
    title = "MySQL/MariaDB"
    schemes: ClassVar[Mapping[str, str]] = {"mysql": "mysql+pymysql", "mariadb": "mysql+pymysql"}
    drivers = frozenset({"mysql+pymysql", "mariadb+pymysql"})
    example_url = "mysql://USER@HOST/DB"
    transactional_ddl = False
    snapshot_isolation = "REPEATABLE READ"
    namespace = "database"
    current_namespace_sql = "SELECT DATABASE()"
    has_namespace_sql = "SELECT 1 FROM information_schema.schemata WHERE schema_name = :n"
    name_chars = 64

    @classmethod
    def name_problem(cls, name: str, namespace: bool = False) -> str | None:
        if isinstance(name, str) and any(ord(ch) > 0xFFFF for ch in name):
            return "holds a character outside the Basic Multilingual Plane, which MySQL/MariaDB names cannot"
        return super().name_problem(name, namespace)

    @classmethod
    def namespace_url(cls, url: sa.engine.URL, name: str) -> sa.engine.URL:
        return url.set(database=name)

    @classmethod
    def create_namespace_sql(cls, engine: Engine, name: str) -> list[str]:
        return [f"CREATE DATABASE IF NOT EXISTS {cls.q(engine, name)} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"]

    def name_key(self, name: str) -> str:
        # lower_case_table_names 1 or 2: the server keeps or compares names in lower case.
        if not hasattr(self, "_folds"):
            with self.engine.connect() as conn:
                self._folds = bool(int(conn.exec_driver_sql("SELECT @@lower_case_table_names").scalar() or 0))
        return name.lower() if self._folds else super().name_key(name)

    @classmethod
    def prepare_url(cls, url: sa.engine.URL) -> sa.engine.URL:
        # PyMySQL speaks to both; SQLAlchemy's mariadb dialect would only add checks of its version.
        if url.drivername.startswith("mariadb"):
            url = url.set(drivername="mysql+pymysql")
        return super().prepare_url(url)

    @classmethod
    def sa_type(cls, col: ColumnDef, keyed: bool = False) -> sa.types.TypeEngine[Any]:
        t = col.type
        if t == "uint":
            return sa_mysql.BIGINT(unsigned=True)
        if t == "string":
            if col.length:
                return sa.String(col.length, collation="utf8mb4_bin")
            return sa_mysql.LONGTEXT(collation="utf8mb4_bin")
        if t == "bytes":
            return sa_mysql.VARBINARY(col.length) if col.length else sa_mysql.LONGBLOB()
        if t == "datetime":
            return sa_mysql.DATETIME(fsp=6)
        if t == "time":
            return sa_mysql.TIME(fsp=6)
        return super().sa_type(col, keyed)

    @classmethod
    def quote_text(cls, text: str) -> str:
        # Backslash is an escape character in MySQL/MariaDB strings.
        return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"

    @classmethod
    def bool_literal(cls, value: bool) -> str:
        return "1" if value else "0"

    @classmethod
    def json_default(cls, text: str) -> str:
        return "(" + cls.quote_text(text) + ")"  # MySQL takes a JSON default only as an expression

    @classmethod
    def now_default(cls, col: ColumnDef) -> str:
        return "CURRENT_TIMESTAMP(6)" if col.type == "datetime" else super().now_default(col)

    @classmethod
    def table_options(cls) -> dict[str, Any]:
        return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

    @classmethod
    def change_column_type_sql(cls, engine: Engine, table: str, col: ColumnDef,
                               info: binlog_pb2.TableInfo | None = None) -> list[str]:
        t, c = cls.q(engine, table), cls.q(engine, col.name)
        default = cls.default_sql(col)  # MODIFY restates the whole column: keep its DEFAULT
        return [f"ALTER TABLE {t} MODIFY COLUMN {c} {cls.type_sql(engine, col)}"
                + (f" DEFAULT {default}" if default is not None else "")
                + f" {'NULL' if col.nullable else 'NOT NULL'}"]

    @classmethod
    def drop_unique_key_sql(cls, engine: Engine, table: str, name: str) -> list[str]:
        return [f"DROP INDEX {cls.q(engine, name)} ON {cls.q(engine, table)}"]

    # ------------------------------------------------------------ rows
    def upsert_statement(self, table: sa.Table, batch: list[dict[str, Any]], names: Sequence[str],
                         key: Sequence[str]) -> Any:
        my = sa_mysql.insert(table).values(batch)
        return my.on_duplicate_key_update({c: my.inserted[c] for c in names})

    def delete_one(self, conn: Connection, info: binlog_pb2.TableInfo, row: Mapping[str, Any]) -> int:
        # No row id to name one row by, but DELETE takes a LIMIT.
        table = self.table(info)
        stmt = table.delete().where(row_condition(table, info, row)).with_dialect_options(mysql_limit=1)
        return conn.execute(stmt).rowcount
