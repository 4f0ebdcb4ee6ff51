"""Typed columns: binlake's codec types as Spark types, and image JSON read back typed.

The change table keeps row images as canonical JSON text (``lake.decode``).
Snapshots, history tables and restores hold real typed columns instead:

=========  =========================  ================================================
codec      Spark type                 why / how it is read from image JSON
=========  =========================  ================================================
int        long                       a JSON number, exact
uint       decimal(20,0)              2^64-1 does not fit a long; exact
bool       boolean                    true / false
float      double                     shortest round-trip text, exact
decimal    decimal(p,s) from the      the image holds the exact digits as a string;
           table's ``decimal(p,s)``   ``p > 38`` (Spark's limit) stays a string
string     string
bytes      binary                     ``{"$base64": ...}`` -> unbase64
date       date                       ``YYYY-MM-DD``
datetime   timestamp_ntz              naive UTC, microseconds (as the codec keeps it)
time       string ``HH:MM:SS.ffffff`` Spark 4.0 has no TIME type; the text sorts right
json       string (the JSON text)     the document as canonical JSON text
=========  =========================  ================================================

Columns are matched by column *id*, never by name, so a renamed column keeps
its values and a dropped-then-re-added name never inherits old values. A column
whose type changed is read with the type of the image's own version and cast to
the type asked for (Spark ANSI casts: a value that does not fit fails loudly).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from binlake.proto import binlog_pb2

SPARK_DECIMAL_MAX_PRECISION = 38
_DECIMAL = re.compile(r"^\s*(?:decimal|numeric)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Column:
    """One typed output column: the upstream column id it comes from, its name and type."""

    id: int
    name: str
    type: int  # binlog_pb2.ColumnType
    sql_type: str = ""

    def spark_type(self) -> str:
        return spark_type(self.type, self.sql_type)


def decimal_spec(sql_type: str) -> tuple[int, int] | None:
    """(precision, scale) of a ``decimal(p,s)`` type text, None when it names none."""
    m = _DECIMAL.match(sql_type or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


def spark_type(col_type: int, sql_type: str = "") -> str:
    """The Spark SQL type (DDL text) of a codec column type (see the module table)."""
    if col_type == binlog_pb2.INT:
        return "bigint"
    if col_type == binlog_pb2.UINT:
        return "decimal(20,0)"
    if col_type == binlog_pb2.BOOL:
        return "boolean"
    if col_type == binlog_pb2.FLOAT:
        return "double"
    if col_type == binlog_pb2.DECIMAL:
        spec = decimal_spec(sql_type)
        if spec is None or spec[0] > SPARK_DECIMAL_MAX_PRECISION:
            return "string"
        return f"decimal({spec[0]},{spec[1]})"
    if col_type == binlog_pb2.BYTES:
        return "binary"
    if col_type == binlog_pb2.DATE:
        return "date"
    if col_type == binlog_pb2.DATETIME:
        return "timestamp_ntz"
    if col_type in (binlog_pb2.STRING, binlog_pb2.TIME, binlog_pb2.JSON):
        return "string"
    raise ValueError(f"unknown column type code {col_type}")


def json_type(col_type: int) -> str:
    """How a value of this type is read out of image JSON (before the cast to its Spark type)."""
    if col_type == binlog_pb2.INT:
        return "bigint"
    if col_type == binlog_pb2.UINT:
        return "decimal(20,0)"
    if col_type == binlog_pb2.BOOL:
        return "boolean"
    if col_type == binlog_pb2.FLOAT:
        return "double"
    if col_type == binlog_pb2.BYTES:
        return "struct<`$base64`: string>"
    # decimal (exact digits), date, datetime, time: strings; json: Spark hands back
    # an object or array read into a string field as its JSON text.
    return "string"


def columns_of(info: binlog_pb2.TableInfo) -> list[Column]:
    """The table's columns in definition order."""
    if not isinstance(info, binlog_pb2.TableInfo):
        raise TypeError(f"expected a TableInfo, got {type(info).__name__}")
    return [Column(c.id, c.name, c.type, c.sql_type) for c in info.columns]


def key_names(info: binlog_pb2.TableInfo) -> list[str]:
    names = {c.id: c.name for c in info.columns}
    return [names[i] for i in info.primary_key]


def image_schema(info: binlog_pb2.TableInfo) -> str:
    """The ``from_json`` schema of an image written with ``info``."""
    return "struct<" + ", ".join(f"`{c.name}`: {json_type(c.type)}" for c in info.columns) + ">"


def _from_json_value(field: Any, col: binlog_pb2.ColumnInfo) -> Any:
    """A parsed image field as its Spark type."""
    from pyspark.sql import functions as F

    target = spark_type(col.type, col.sql_type)
    if col.type == binlog_pb2.BYTES:
        return F.unbase64(field.getField("$base64"))
    if col.type in (binlog_pb2.DECIMAL, binlog_pb2.DATE, binlog_pb2.DATETIME) and target != "string":
        return field.cast(target)
    return field


def fill_literal(value: binlog_pb2.Datum, src: binlog_pb2.ColumnInfo, target: str) -> Any:
    """A Datum of column ``src`` as a Spark literal of type ``target``, read exactly as an
    image's value of that column is (its image JSON, parsed and cast the same way).
    The Column form of ``fill_sql``: one expression, on classic and Connect sessions."""
    from pyspark.sql import functions as F

    return F.expr(fill_sql(value, src, target))


def fill_sql(value: binlog_pb2.Datum, src: binlog_pb2.ColumnInfo, target: str) -> str:
    """``fill_literal`` as Spark SQL text, for statements (``UPDATE ... SET c = <this>``):
    ``from_json`` of the value's image JSON, the field read as an image's is
    (``_from_json_value``), then cast to ``target``. SQL text rather than a PySpark
    Column so that it goes through a SQL statement, which runs over Spark Connect as
    on a classic session (Delta's Python ``DeltaTable.update`` needs a server plugin
    over Connect)."""
    from binlake import codec
    from binlake.lake.decoding.image import value_json

    if not isinstance(value, binlog_pb2.Datum) or not isinstance(src, binlog_pb2.ColumnInfo):
        raise TypeError(f"fill_sql takes a Datum and a ColumnInfo, got {type(value).__name__}, "
                        f"{type(src).__name__}")
    text = '{"v":' + value_json(codec.decode_value(value, src.type), src.type) + "}"
    field = f"from_json({sql_string(text)}, {sql_string(f'struct<`v`: {json_type(src.type)}>')}).`v`"
    own = spark_type(src.type, src.sql_type)
    if src.type == binlog_pb2.BYTES:
        field = f"unbase64({field}.`$base64`)"
    elif src.type in (binlog_pb2.DECIMAL, binlog_pb2.DATE, binlog_pb2.DATETIME) and own != "string":
        field = f"CAST({field} AS {own})"
    return field if own == target else f"CAST({field} AS {target})"


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (Spark reads backslash escapes in literals)."""
    if not isinstance(text, str):
        raise TypeError(f"sql_string takes a str, got {type(text).__name__}")
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _missing(col: Column, fills: Mapping[int, Any] | None) -> Any:
    """A column an image or base row lacks: its fill (``restore.fills.Fill``) or null."""
    from pyspark.sql import functions as F

    fill = (fills or {}).get(col.id)
    if fill is None:
        return F.lit(None).cast(col.spark_type())
    return fill_literal(fill.value, fill.column, col.spark_type())


def typed_field(parsed: Any, info: binlog_pb2.TableInfo, col: Column, fills: Mapping[int, Any] | None = None) -> Any:
    """Column ``col`` (by id, cast to its type) of a struct parsed with ``image_schema(info)``;
    when ``info`` has no such column, its fill in ``fills`` (column id -> ``Fill``), else null."""
    target = col.spark_type()
    src = next((c for c in info.columns if c.id == col.id), None)
    if src is None:
        return _missing(col, fills)
    return _cast(_from_json_value(parsed.getField(src.name), src), spark_type(src.type, src.sql_type), target)


def _cast(expr: Any, source: str, target: str) -> Any:
    return expr if source == target else expr.cast(target)


def typed_columns(source: Sequence[Column], out: Sequence[Column], fills: Mapping[int, Any] | None = None) -> list[Any]:
    """Expressions for ``out`` from a typed frame with columns ``source`` (matched by id);
    a column ``source`` lacks is its fill in ``fills`` (column id -> ``Fill``), else null."""
    from pyspark.sql import functions as F

    by_id = {c.id: c for c in source}
    exprs = []
    for col in out:
        src = by_id.get(col.id)
        if src is None:
            exprs.append(_missing(col, fills).alias(col.name))
        else:
            exprs.append(_cast(F.col(f"`{src.name}`"), src.spark_type(), col.spark_type()).alias(col.name))
    return exprs


def to_json(cols: Sequence[Column]) -> list[list[Any]]:
    return [[c.id, c.name, c.type, c.sql_type] for c in cols]


def from_json(doc: Sequence[Sequence[Any]]) -> list[Column]:
    return [Column(int(i), str(n), int(t), str(s)) for i, n, t, s in doc]


def python_value(value: Any, col_type: int) -> Any:
    """A typed Spark value back to the Python value ``binlake.codec`` decodes (for checksums)."""
    import datetime as dt
    import decimal
    import json

    if value is None:
        return None
    if col_type == binlog_pb2.UINT and isinstance(value, decimal.Decimal):
        return int(value)
    if col_type == binlog_pb2.DECIMAL and isinstance(value, str):
        return decimal.Decimal(value)
    if col_type == binlog_pb2.BYTES:
        return bytes(value)
    if col_type == binlog_pb2.TIME and isinstance(value, str):
        return dt.time.fromisoformat(value)
    if col_type == binlog_pb2.JSON and isinstance(value, str):
        return json.loads(value)
    return value
