"""SQL for the upstream databases binlake writes through: SQLite, PostgreSQL,
MySQL/MariaDB. Column types per dialect, a SQLAlchemy ``Table`` for a
``TableInfo``, and the text of each DDL statement.

Type choices keep every value the codec accepts: SQLite stores decimals and
unsigned 64-bit integers as text (its numbers are 64-bit signed or doubles),
PostgreSQL stores uint as NUMERIC(20,0), MySQL key strings as VARCHAR(n).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Engine

from binlake import coldefault, errors
from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef, column_def


class _DecimalText(sa.types.TypeDecorator):
    """Exact decimals in SQLite (stored as text)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else str(decimal.Decimal(value))

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else decimal.Decimal(value)


class _UintText(sa.types.TypeDecorator):
    """Unsigned 64-bit integers in SQLite (stored as text: SQLite integers are signed)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else str(int(value))

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else int(value)


class _UintNumeric(sa.types.TypeDecorator):
    """Unsigned 64-bit integers in PostgreSQL (NUMERIC(20,0))."""

    impl = sa.Numeric(20, 0)
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else int(value)


class _JsonText(sa.types.TypeDecorator):
    """JSON kept as canonical text where the driver hands back text (SQLite, MariaDB)."""

    impl = sa.JSON
    cache_ok = True


def sa_type(col: ColumnDef, dialect: str, keyed: bool = False) -> sa.types.TypeEngine:
    t = col.type
    if t == "int":
        return sa.BigInteger()
    if t == "uint":
        if dialect == "mysql":
            return mysql.BIGINT(unsigned=True)
        if dialect == "postgresql":
            return _UintNumeric()
        return _UintText()
    if t == "bool":
        return sa.Boolean(create_constraint=False)
    if t == "float":
        return sa.Double() if dialect != "postgresql" else postgresql.DOUBLE_PRECISION()
    if t == "decimal":
        if dialect == "sqlite":
            return _DecimalText()
        return sa.Numeric(col.precision, col.scale, asdecimal=True)
    if t == "string":
        if dialect == "mysql":
            if col.length:
                return sa.String(col.length, collation="utf8mb4_bin")
            return mysql.LONGTEXT(collation="utf8mb4_bin")
        return sa.String(col.length) if col.length else sa.Text()
    if t == "bytes":
        if dialect == "mysql":
            return mysql.VARBINARY(col.length) if col.length else mysql.LONGBLOB()
        return sa.LargeBinary()
    if t == "date":
        return sa.Date()
    if t == "datetime":
        if dialect == "mysql":
            return mysql.DATETIME(fsp=6)
        if dialect == "postgresql":
            return postgresql.TIMESTAMP(precision=6)
        return sa.DateTime()
    if t == "time":
        if dialect == "mysql":
            return mysql.TIME(fsp=6)
        if dialect == "postgresql":
            return postgresql.TIME(precision=6)
        return sa.Time()
    if t == "json":
        # none_as_null: Python None is SQL NULL, as the codec has it (is_null). The
        # default would store a JSON 'null' document, so `col IS NULL` in the
        # upstream would disagree with the binlog and with every restored target.
        if dialect == "postgresql":
            return postgresql.JSONB(none_as_null=True)
        return sa.JSON(none_as_null=True)
    raise errors.InvalidArgument(f"column {col.name}: unknown type {t}")


def _quote_text(text: str, dialect: str) -> str:
    if dialect == "mysql":  # backslash is an escape character in MySQL/MariaDB strings
        text = text.replace("\\", "\\\\")
    return "'" + text.replace("'", "''") + "'"


def default_sql(col: ColumnDef, dialect: str) -> str | None:
    """The DEFAULT clause's value for ``col`` in ``dialect``, None when it has none a
    target can be given: a constant in the form that dialect stores the column's values
    in (what ``sa_type`` chose), or CURRENT_TIMESTAMP for a "now" expression. Other
    expressions (``nextval(...)``, ``uuid()``) exist only upstream: None."""
    if col.default_expr is not None:
        if not coldefault.is_now(col.default_expr) or col.type not in ("datetime", "date", "time"):
            return None
        if col.type == "date":
            return "(CURRENT_DATE)" if dialect == "sqlite" else "CURRENT_DATE"
        if col.type == "time":
            return "CURRENT_TIME"
        return "CURRENT_TIMESTAMP(6)" if dialect == "mysql" else "CURRENT_TIMESTAMP"
    v = col.default
    if v is None:
        return None
    t = col.type
    if t == "bool":
        return ("TRUE" if v else "FALSE") if dialect == "postgresql" else ("1" if v else "0")
    if t in ("int", "float"):
        return repr(float(v)) if t == "float" else str(int(v))
    if t in ("uint", "decimal"):
        text = str(decimal.Decimal(v)) if t == "decimal" else str(int(v))
        return _quote_text(text, dialect) if dialect == "sqlite" else text  # SQLite keeps them as text
    if t == "string":
        return _quote_text(str(v), dialect)
    if t == "bytes":
        hexed = bytes(v).hex()
        return f"'\\x{hexed}'::bytea" if dialect == "postgresql" else f"X'{hexed}'"
    if t == "date":
        return _quote_text(v.isoformat(), dialect)
    if t == "datetime":
        if isinstance(v, dt.datetime) and v.tzinfo is not None:
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return _quote_text(v.isoformat(sep=" ", timespec="microseconds"), dialect)
    if t == "time":
        if isinstance(v, dt.timedelta):
            v = (dt.datetime(1970, 1, 1) + v).time()
        return _quote_text(v.isoformat(timespec="microseconds"), dialect)
    if t == "json":
        text = json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if not isinstance(v, str) \
            else v
        if dialect == "mysql":
            return "(" + _quote_text(text, dialect) + ")"  # MySQL takes a JSON default only as an expression
        return _quote_text(text, dialect)
    raise errors.InvalidArgument(f"column {col.name}: unknown type {t}")


def sa_table(info: binlog_pb2.TableInfo, dialect: str, metadata: sa.MetaData | None = None) -> sa.Table:
    """A SQLAlchemy Table for ``info`` (for DML and CREATE TABLE)."""
    md = metadata or sa.MetaData()
    pk = set(info.primary_key)
    cols = []
    for ci in info.columns:
        cd = column_def(ci)
        default = default_sql(cd, dialect)
        cols.append(sa.Column(ci.name, sa_type(cd, dialect), primary_key=ci.id in pk,
                              nullable=ci.nullable, autoincrement=False,
                              server_default=sa.text(default) if default is not None else None))
    kwargs: dict[str, Any] = {}
    if dialect == "mysql":
        kwargs = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
    # Unique keys are created as separate unique indexes (see create_table_sql):
    # that is the one form every dialect can later drop by name.
    return sa.Table(info.name, md, *cols, **kwargs)


def _q(engine: Engine, name: str) -> str:
    return engine.dialect.identifier_preparer.quote(name)


def create_table_sql(engine: Engine, info: binlog_pb2.TableInfo) -> list[str]:
    from sqlalchemy.schema import CreateTable

    stmts = [str(CreateTable(sa_table(info, engine.dialect.name)).compile(dialect=engine.dialect)).strip()]
    by_id = {c.id: c.name for c in info.columns}
    for k in info.unique_keys:
        stmts += add_unique_key_sql(engine, info.name, k.name, [by_id[i] for i in k.column_ids])
    return stmts


def _type_sql(engine: Engine, col: ColumnDef) -> str:
    return sa_type(col, engine.dialect.name).compile(dialect=engine.dialect)


def add_column_sql(engine: Engine, table: str, col: ColumnDef, fill: Any = None) -> list[str]:
    """ADD COLUMN with its DEFAULT, which the database gives the rows that exist.
    ``fill``: the value those rows hold upstream when its DEFAULT alone does not say
    (an expression the upstream evaluated at its ALTER): the column is added with it
    as a constant default, then given its own."""
    d = engine.dialect.name
    t, c = _q(engine, table), _q(engine, col.name)
    own = default_sql(col, d)
    first = own
    if fill is not None and (col.default is None or col.default != fill):
        first = default_sql(dataclasses.replace(col, default=fill, default_expr=None), d)
    null = "NULL" if col.nullable or first is None else "NOT NULL"
    stmts = [f"ALTER TABLE {t} ADD COLUMN {c} {_type_sql(engine, col)}"
             + (f" DEFAULT {first}" if first is not None else "") + f" {null}"]
    if first != own:
        if d == "sqlite":
            # SQLite cannot change a default, and cannot add a column with a non-constant one: the
            # constant stays (rows inserted later through binlake carry their own values).
            return stmts
        stmts += set_default_sql(engine, table, col)
    return stmts


def set_default_sql(engine: Engine, table: str, col: ColumnDef,
                    info: binlog_pb2.TableInfo | None = None) -> list[str]:
    """``col``'s DEFAULT as its definition now has it (none: DROP DEFAULT); rows that
    exist keep their values. ``info``: the table's new definition (SQLite rebuilds it)."""
    d = engine.dialect.name
    t, c = _q(engine, table), _q(engine, col.name)
    value = default_sql(col, d)
    if d == "sqlite":
        if info is None:
            raise errors.InvalidArgument("changing a default in SQLite needs the table's new definition")
        return _sqlite_rebuild(engine, info, col, convert=False)
    # PostgreSQL, MySQL and MariaDB all take ALTER COLUMN ... SET/DROP DEFAULT.
    return [f"ALTER TABLE {t} ALTER COLUMN {c} " + (f"SET DEFAULT {value}" if value is not None else "DROP DEFAULT")]


def drop_column_sql(engine: Engine, table: str, col: str) -> list[str]:
    return [f"ALTER TABLE {_q(engine, table)} DROP COLUMN {_q(engine, col)}"]


def rename_column_sql(engine: Engine, table: str, old: str, new: str) -> list[str]:
    return [f"ALTER TABLE {_q(engine, table)} RENAME COLUMN {_q(engine, old)} TO {_q(engine, new)}"]


def change_column_type_sql(engine: Engine, table: str, col: ColumnDef,
                           info: binlog_pb2.TableInfo | None = None) -> list[str]:
    """The column's new type; ``info`` is the table's definition after the change
    (SQLite needs all of it to rebuild the table)."""
    d = engine.dialect.name
    t, c = _q(engine, table), _q(engine, col.name)
    ty = _type_sql(engine, col)
    if d == "postgresql":
        using = f"{c}::text::{ty}" if col.type == "string" else f"{c}::{ty}"
        if col.type == "string":
            using = f"{c}::text"
        stmts = [f"ALTER TABLE {t} ALTER COLUMN {c} TYPE {ty} USING {using}"]
        stmts.append(f"ALTER TABLE {t} ALTER COLUMN {c} {'DROP' if col.nullable else 'SET'} NOT NULL")
        return stmts
    if d == "mysql":
        default = default_sql(col, d)  # MODIFY restates the whole column: keep its DEFAULT
        return [f"ALTER TABLE {t} MODIFY COLUMN {c} {ty}" + (f" DEFAULT {default}" if default is not None else "")
                + f" {'NULL' if col.nullable else 'NOT NULL'}"]
    if info is None:
        raise errors.InvalidArgument("changing a column type in SQLite needs the table's new definition")
    return _sqlite_rebuild(engine, info, col)


def _sqlite_rebuild(engine: Engine, info: binlog_pb2.TableInfo, col: ColumnDef, convert: bool = True) -> list[str]:
    """SQLite cannot change a column's declared type, and the declared type decides
    how SQLite stores a value (its affinity): text '1.2345' put in a column declared
    BIGINT becomes the REAL 1.2345 (15 digits kept), and an int cast to text turns
    back into an int. So rebuild the table with the new declaration, converting the
    column on the copy (SQLite's documented way to alter a table), inside the DDL's
    transaction."""
    t = _q(engine, info.name)
    tmp_name = f"_binlake_rebuild_{info.name}"[:63]
    tmp_info = binlog_pb2.TableInfo()
    tmp_info.CopyFrom(info)
    tmp_info.name = tmp_name
    del tmp_info.unique_keys[:]  # index names are per database: create them after the swap
    tmp = _q(engine, tmp_name)
    c = _q(engine, col.name)
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
    names = [_q(engine, ci.name) for ci in info.columns]
    select = ", ".join(f"{conv} AS {n}" if ci.name == col.name else n for ci, n in zip(info.columns, names, strict=True))
    stmts = create_table_sql(engine, tmp_info)
    stmts.append(f"INSERT INTO {tmp} ({', '.join(names)}) SELECT {select} FROM {t}")
    stmts.append(f"DROP TABLE {t}")
    stmts.append(f"ALTER TABLE {tmp} RENAME TO {t}")
    by_id = {ci.id: ci.name for ci in info.columns}
    for k in info.unique_keys:
        stmts += add_unique_key_sql(engine, info.name, k.name, [by_id[i] for i in k.column_ids])
    return stmts


def add_unique_key_sql(engine: Engine, table: str, name: str, cols: list[str]) -> list[str]:
    collist = ", ".join(_q(engine, c) for c in cols)
    return [f"CREATE UNIQUE INDEX {_q(engine, name)} ON {_q(engine, table)} ({collist})"]


def drop_unique_key_sql(engine: Engine, table: str, name: str) -> list[str]:
    if engine.dialect.name == "mysql":
        return [f"DROP INDEX {_q(engine, name)} ON {_q(engine, table)}"]
    return [f"DROP INDEX {_q(engine, name)}"]


def rename_table_sql(engine: Engine, old: str, new: str) -> list[str]:
    return [f"ALTER TABLE {_q(engine, old)} RENAME TO {_q(engine, new)}"]


def truncate_table_sql(engine: Engine, table: str) -> list[str]:
    if engine.dialect.name == "sqlite":
        return [f"DELETE FROM {_q(engine, table)}"]
    return [f"TRUNCATE TABLE {_q(engine, table)}"]


def drop_table_sql(engine: Engine, table: str) -> list[str]:
    return [f"DROP TABLE {_q(engine, table)}"]


def transactional_ddl(engine: Engine) -> bool:
    """PostgreSQL and SQLite run DDL inside a transaction; MySQL/MariaDB commit it at once."""
    return engine.dialect.name in ("postgresql", "sqlite")
