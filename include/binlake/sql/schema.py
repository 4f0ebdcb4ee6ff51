"""Table definitions and the DDL operations binlake's upstream writer supports,
as pure functions on ``TableInfo`` (no SQL here; ``sql.dialect`` renders SQL).

Invariants kept here: column ids are never reused within a table (a dropped
column's id stays retired, so old rows never decode into a new column); a
primary key is required and its columns are NOT NULL; TRUNCATE gives the table
a new table id.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from binlake import codec, coldefault, errors
from binlake.proto import binlog_pb2

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
RESERVED_PREFIX = "_binlake_"


@dataclasses.dataclass(frozen=True)
class ColumnDef:
    """A column as an application declares it."""

    name: str
    type: str
    nullable: bool = True
    # decimal: precision and scale; string/bytes: max length (required for key columns).
    precision: int | None = None
    scale: int | None = None
    length: int | None = None
    # DEFAULT: a constant of the column's type (None: no default), or an expression
    # as the upstream's SQL text (informational: binlake never evaluates one).
    default: Any = None
    default_expr: str | None = None

    def sql_type(self) -> str:
        """The type as binlake names it in table definitions (informational)."""
        if self.type == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.type in ("string", "bytes") and self.length:
            return f"{self.type}({self.length})"
        return self.type


def check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise errors.InvalidArgument(
            f"{what} {name!r} is not a valid name: use letters, digits and _ (not starting with a digit), "
            "at most 63 characters"
        )
    if name.lower().startswith(RESERVED_PREFIX):
        raise errors.InvalidArgument(f"{what} {name!r}: names starting with {RESERVED_PREFIX} are binlake's own")


def check_column(col: ColumnDef) -> None:
    check_name(col.name, "column")
    try:
        codec.type_code(col.type)
    except ValueError as exc:
        raise errors.InvalidArgument(f"column {col.name}: {exc}") from None
    if col.type == "decimal":
        if col.precision is None or col.scale is None or not 1 <= col.precision <= 65 or not 0 <= col.scale <= min(
            col.precision, 30
        ):
            raise errors.InvalidArgument(
                f"column {col.name}: decimal needs precision in 1..65 and scale in 0..min(precision, 30) "
                f"(got {col.precision}, {col.scale})"
            )
    elif col.precision is not None or col.scale is not None:
        raise errors.InvalidArgument(f"column {col.name}: precision/scale apply to decimal columns only")
    if col.length is not None:
        if col.type not in ("string", "bytes"):
            raise errors.InvalidArgument(f"column {col.name}: length applies to string and bytes columns only")
        if not 1 <= col.length <= 16383:
            raise errors.InvalidArgument(f"column {col.name}: length must be in 1..16383 (got {col.length})")
    if col.default is not None and col.default_expr is not None:
        raise errors.InvalidArgument(f"column {col.name}: give a constant default or a default expression, not both")
    if col.default is not None:
        try:
            coldefault.constant(col.default, codec.type_code(col.type), col.name)
        except (TypeError, ValueError) as exc:
            raise errors.InvalidArgument(f"column {col.name}: default {col.default!r} is not a {col.type}: {exc}") \
                from None
    if col.default_expr is not None and (not isinstance(col.default_expr, str) or not col.default_expr.strip()):
        raise errors.InvalidArgument(f"column {col.name}: default_expr must be SQL text, got {col.default_expr!r}")


def column_info(col: ColumnDef, col_id: int) -> binlog_pb2.ColumnInfo:
    info = binlog_pb2.ColumnInfo(
        id=col_id, name=col.name, type=codec.type_code(col.type), nullable=col.nullable, sql_type=col.sql_type()
    )
    _set_default(info, col)
    return info


def _set_default(info: binlog_pb2.ColumnInfo, col: ColumnDef) -> None:
    info.ClearField("default_value")
    if col.default is not None:
        info.default_value.CopyFrom(coldefault.constant(col.default, info.type, col.name))
    elif col.default_expr is not None:
        info.default_value.CopyFrom(coldefault.expression(col.default_expr))


def column_def(info: binlog_pb2.ColumnInfo) -> ColumnDef:
    """Back from ColumnInfo to the declaration (sql_type carries precision/length)."""
    name = codec.TYPE_OF_CODE[info.type]
    precision = scale = length = None
    m = re.match(r"^\w+\((\d+)(?:,(\d+))?\)$", info.sql_type)
    if m:
        if name == "decimal":
            precision, scale = int(m.group(1)), int(m.group(2) or 0)
        else:
            length = int(m.group(1))
    _known, default = coldefault.constant_value(info)
    return ColumnDef(info.name, name, info.nullable, precision, scale, length, default, coldefault.expr_of(info))


def _col(table: binlog_pb2.TableInfo, name: str) -> binlog_pb2.ColumnInfo:
    for c in table.columns:
        if c.name == name:
            return c
    raise errors.InvalidArgument(f"table {table.name} has no column {name!r}")


def key_columns(table: binlog_pb2.TableInfo) -> list[str]:
    by_id = {c.id: c.name for c in table.columns}
    return [by_id[i] for i in table.primary_key]


def _check_key_column(table: str, col: ColumnDef, what: str) -> None:
    if col.type in ("json", "float"):
        raise errors.InvalidArgument(f"{table}.{col.name}: {col.type} columns cannot be in a {what}")
    if col.type in ("string", "bytes") and not col.length:
        raise errors.InvalidArgument(
            f"{table}.{col.name}: a {col.type} column in a {what} needs a length (MySQL/MariaDB index them "
            "only with one), e.g. ColumnDef(..., length=64)"
        )


def new_table(
    table_id: int, db: str, name: str, columns: list[ColumnDef], primary_key: list[str],
    unique_keys: dict[str, list[str]] | None, schema_version: int,
) -> binlog_pb2.TableInfo:
    check_name(name, "table")
    if not columns:
        raise errors.InvalidArgument(f"table {name} needs at least one column")
    seen: set[str] = set()
    for col in columns:
        check_column(col)
        if col.name.lower() in seen:
            raise errors.InvalidArgument(f"table {name}: column {col.name} appears twice")
        seen.add(col.name.lower())
    if not primary_key:
        raise errors.InvalidArgument(
            f"table {name} needs a primary key: binlake applies changes by key, as TiDB Binlog and DM do"
        )
    by_name = {c.name: c for c in columns}
    cols = []
    for i, col in enumerate(columns, start=1):
        if col.name in primary_key:
            _check_key_column(name, col, "primary key")
            col = dataclasses.replace(col, nullable=False)
        cols.append(column_info(col, i))
    info = binlog_pb2.TableInfo(
        table_id=table_id, db=db, name=name, columns=cols, schema_version=schema_version,
        next_column_id=len(columns) + 1,
    )
    for k in primary_key:
        if k not in by_name:
            raise errors.InvalidArgument(f"table {name}: primary key column {k!r} is not a column")
        info.primary_key.append(_col(info, k).id)
    for key_name, key_cols in (unique_keys or {}).items():
        _add_unique(info, key_name, key_cols)
    return info


def _add_unique(info: binlog_pb2.TableInfo, key_name: str, cols: list[str]) -> None:
    check_name(key_name, "unique key")
    if not cols:
        raise errors.InvalidArgument(f"unique key {key_name} needs at least one column")
    if any(k.name == key_name for k in info.unique_keys):
        raise errors.InvalidArgument(f"table {info.name} already has a unique key {key_name}")
    ids = []
    for c in cols:
        ci = _col(info, c)
        _check_key_column(info.name, column_def(ci), "unique key")
        ids.append(ci.id)
    info.unique_keys.add(name=key_name, column_ids=ids)


def _next(table: binlog_pb2.TableInfo, version: int) -> binlog_pb2.TableInfo:
    out = binlog_pb2.TableInfo()
    out.CopyFrom(table)
    out.schema_version = version
    out.previous_table_id = 0
    return out


def add_column(table: binlog_pb2.TableInfo, col: ColumnDef, version: int) -> binlog_pb2.TableInfo:
    check_column(col)
    if any(c.name.lower() == col.name.lower() for c in table.columns):
        raise errors.InvalidArgument(f"table {table.name} already has a column {col.name}")
    if not col.nullable and col.default is None:
        raise errors.InvalidArgument(
            f"{table.name}.{col.name}: an added NOT NULL column needs a constant default (the value existing "
            "rows get)"
        )
    if col.default_expr is not None:
        raise errors.InvalidArgument(
            f"{table.name}.{col.name}: an added column takes a constant default here (existing rows get it; "
            "an expression would be evaluated differently by each database)"
        )
    out = _next(table, version)
    out.columns.append(column_info(col, out.next_column_id))
    out.next_column_id += 1
    return out


def set_default(table: binlog_pb2.TableInfo, name: str, default: Any, version: int) -> binlog_pb2.TableInfo:
    """``ALTER COLUMN name SET DEFAULT default`` (None: DROP DEFAULT). Rows that exist
    keep their values; only rows inserted later without the column take it."""
    ci = _col(table, name)
    col = dataclasses.replace(column_def(ci), default=default, default_expr=None)
    check_column(col)
    out = _next(table, version)
    _set_default(_col(out, name), col)
    return out


def drop_column(table: binlog_pb2.TableInfo, name: str, version: int) -> binlog_pb2.TableInfo:
    ci = _col(table, name)
    if ci.id in table.primary_key:
        raise errors.InvalidArgument(f"{table.name}.{name} is in the primary key and cannot be dropped")
    for k in table.unique_keys:
        if ci.id in k.column_ids:
            raise errors.InvalidArgument(f"{table.name}.{name} is in unique key {k.name}; drop the key first")
    if len(table.columns) == 1:
        raise errors.InvalidArgument(f"{table.name}.{name} is the table's only column")
    out = _next(table, version)
    del out.columns[:]
    out.columns.extend(c for c in table.columns if c.name != name)
    return out


def rename_column(table: binlog_pb2.TableInfo, old: str, new: str, version: int) -> binlog_pb2.TableInfo:
    check_name(new, "column")
    _col(table, old)
    if any(c.name.lower() == new.lower() for c in table.columns):
        raise errors.InvalidArgument(f"table {table.name} already has a column {new}")
    out = _next(table, version)
    _col(out, old).name = new
    return out


# Type changes whose every value survives (and that all three databases convert).
_WIDENINGS = {
    ("int", "decimal"), ("int", "float"), ("int", "string"), ("uint", "decimal"), ("uint", "string"),
    ("bool", "int"), ("float", "string"), ("decimal", "string"), ("date", "datetime"),
    ("date", "string"), ("datetime", "string"), ("time", "string"), ("string", "string"),
    ("decimal", "decimal"), ("bytes", "bytes"),
}


def change_column_type(table: binlog_pb2.TableInfo, col: ColumnDef, version: int) -> binlog_pb2.TableInfo:
    check_column(col)
    old = column_def(_col(table, col.name))
    pair = (old.type, col.type)
    if pair not in _WIDENINGS:
        raise errors.InvalidArgument(
            f"{table.name}.{col.name}: changing {old.sql_type()} to {col.sql_type()} may not keep every value; "
            f"supported: {', '.join(sorted(f'{a}->{b}' for a, b in _WIDENINGS))}"
        )
    if col.type in ("string", "bytes") and old.type == col.type and (col.length or 1 << 30) < (old.length or 1 << 30):
        raise errors.InvalidArgument(f"{table.name}.{col.name}: a shorter length could truncate values")
    if pair == ("decimal", "decimal") and (
        (col.precision or 0) - (col.scale or 0) < (old.precision or 0) - (old.scale or 0)
        or (col.scale or 0) < (old.scale or 0)
    ):
        raise errors.InvalidArgument(f"{table.name}.{col.name}: decimal({col.precision},{col.scale}) is narrower")
    ci = _col(table, col.name)
    if ci.id in table.primary_key or any(ci.id in k.column_ids for k in table.unique_keys):
        _check_key_column(table.name, col, "key")
    out = _next(table, version)
    target = _col(out, col.name)
    target.type = codec.type_code(col.type)
    target.sql_type = col.sql_type()
    target.nullable = col.nullable if ci.id not in table.primary_key else False
    _set_default(target, col)
    return out


def add_unique_key(table: binlog_pb2.TableInfo, name: str, cols: list[str], version: int) -> binlog_pb2.TableInfo:
    out = _next(table, version)
    _add_unique(out, name, cols)
    return out


def drop_unique_key(table: binlog_pb2.TableInfo, name: str, version: int) -> binlog_pb2.TableInfo:
    if not any(k.name == name for k in table.unique_keys):
        raise errors.InvalidArgument(f"table {table.name} has no unique key {name!r}")
    out = _next(table, version)
    del out.unique_keys[:]
    out.unique_keys.extend(k for k in table.unique_keys if k.name != name)
    return out


def rename_table(table: binlog_pb2.TableInfo, new: str, version: int) -> binlog_pb2.TableInfo:
    check_name(new, "table")
    out = _next(table, version)
    out.name = new
    return out


def truncate_table(table: binlog_pb2.TableInfo, new_id: int, version: int) -> binlog_pb2.TableInfo:
    out = _next(table, version)
    out.table_id = new_id
    out.previous_table_id = table.table_id
    return out


def drop_table(table: binlog_pb2.TableInfo, version: int) -> binlog_pb2.TableInfo:
    out = _next(table, version)
    out.dropped = True
    return out
