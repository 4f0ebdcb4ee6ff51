"""Column DEFAULTs as binlake carries them (``ColumnInfo.default_value`` and
``existing_value``), shared by the writers, the sources, restore and apply.

A default is either a constant (a ``Datum`` of the column's type) or an
expression kept as the upstream's own text. Of the expressions, only the
"now" family (``CURRENT_TIMESTAMP``, ``now()``, ``LOCALTIMESTAMP`` ...) means
the same on every database binlake writes to, so it is the only one a target
table is created with; the others (``nextval(...)``, ``uuid()``) stay in the
definition as information.

What rows hold for a column they predate (``fill``): the upstream fills the
rows that exist when a column is added, once, at the ALTER: with the constant
default, with an expression evaluated then (MySQL ``CURRENT_TIMESTAMP``: the
ALTER's time; PostgreSQL ``now()``: its transaction's), or with MySQL's implicit
default of a NOT NULL column declared without one. A writer that knows that
value puts it in ``existing_value``; otherwise the constant default is it, and a
column added without a default holds NULL. A later ``SET DEFAULT`` changes
``default_value`` only: it never touches rows that exist.
"""

from __future__ import annotations

import re
from typing import Any

from binlake import codec
from binlake.proto import binlog_pb2

# Expressions meaning "the current time", in the spellings MySQL, MariaDB and
# PostgreSQL show them (SHOW CREATE TABLE, pg_get_expr), with an optional precision.
_NOW = re.compile(
    r"^\s*(current_timestamp|now|localtimestamp|localtime|transaction_timestamp|statement_timestamp)"
    r"\s*(\(\s*\d*\s*\))?\s*$", re.IGNORECASE)


def is_now(expr: str) -> bool:
    """Whether ``expr`` is a "current time" expression (evaluated once per statement)."""
    return bool(_NOW.match(expr or ""))


def constant(value: Any, col_type: int, column: str = "default") -> binlog_pb2.ColumnDefault:
    """A constant default of a column of ``col_type`` (ValueError/TypeError when the
    codec cannot carry it as that type)."""
    return binlog_pb2.ColumnDefault(value=codec.encode_value(value, col_type, column))


def expression(text: str) -> binlog_pb2.ColumnDefault:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a default expression must be non-empty SQL text, got {text!r}")
    return binlog_pb2.ColumnDefault(expr=text.strip())


def has_default(col: binlog_pb2.ColumnInfo) -> bool:
    return col.HasField("default_value") and col.default_value.WhichOneof("kind") is not None


def constant_value(col: binlog_pb2.ColumnInfo) -> tuple[bool, Any]:
    """(True, value) when ``col``'s default is a constant (value None for DEFAULT NULL);
    (False, None) when it has none or an expression."""
    if not has_default(col) or col.default_value.WhichOneof("kind") != "value":
        return False, None
    return True, codec.decode_value(col.default_value.value, col.type)


def expr_of(col: binlog_pb2.ColumnInfo) -> str | None:
    """The default's expression text, None when it has none or a constant."""
    if has_default(col) and col.default_value.WhichOneof("kind") == "expr":
        return col.default_value.expr
    return None


def fill(added: binlog_pb2.ColumnInfo) -> binlog_pb2.Datum | None:
    """What the rows that existed when the column was added hold for it, given the
    column as the definition that added it has it; None: NULL (no default, or a
    value the binlog cannot tell, such as a volatile expression evaluated per row)."""
    if added.HasField("existing_value") and added.existing_value.WhichOneof("value") not in (None, "is_null"):
        return added.existing_value
    if has_default(added) and added.default_value.WhichOneof("kind") == "value":
        d = added.default_value.value
        return None if d.WhichOneof("value") in (None, "is_null") else d
    return None
