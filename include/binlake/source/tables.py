"""Table definitions as a log-reading source tracks them, shared by every source:
``SourceColumn`` and ``SourceTable`` (a column's binlake type plus what decoding
its upstream value needs; a table with its binlake identity: table id, schema
version, column ids by name), and ``assign_ids``, which gives a new definition
its identity when the source sends its DDL binlog.

How each source fills them is its own: the MySQL/MariaDB source parses DDL
(``mysql.tables``), the PostgreSQL source reads RELATION messages and the
catalog (``postgres.values``). Column ids follow column *names* across
versions, so a renamed column keeps its id, a dropped column's id is retired
for good, and a new column takes ``next_column_id`` (the invariants of
``sql.schema``). The checkpoint stores definitions as ``to_json``'s dicts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
from typing import Any

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef


@dataclasses.dataclass
class SourceColumn:
    """One column: its binlake type plus what decoding its upstream value needs."""

    name: str
    kind: str  # binlake codec type name
    nullable: bool = True
    charset: str | None = None  # text columns: the charset its bytes are in
    length: int | None = None  # CHAR/VARCHAR/BINARY/VARBINARY length
    precision: int | None = None  # DECIMAL
    scale: int | None = None
    values: list[str] = dataclasses.field(default_factory=list)  # ENUM/SET members
    mysql_type: str = ""  # MySQL/MariaDB: the type as written, lowercase (the is_* tests read it)
    # DEFAULT as the upstream states it: a constant's value as text (``default_expr``
    # False) or an expression's SQL (True); None: no DEFAULT (or DEFAULT NULL).
    default: str | None = None
    default_expr: bool = False
    # Set when an ALTER added the column: what the rows existing then got, as text,
    # when its DEFAULT alone does not say (``binlake.coldefault``).
    existing: str | None = None

    @property
    def is_set(self) -> bool:
        return self.mysql_type.startswith("set")

    @property
    def is_enum(self) -> bool:
        return self.mysql_type.startswith("enum")

    @property
    def is_bit(self) -> bool:
        return self.mysql_type.startswith("bit")

    @property
    def is_fixed_binary(self) -> bool:
        return self.mysql_type.startswith("binary")

    @property
    def is_float32(self) -> bool:
        return self.mysql_type.startswith("float")

    def column_def(self) -> ColumnDef:
        length = self.length if self.kind in ("string", "bytes") and self.length and self.length <= 16383 else None
        return ColumnDef(self.name, self.kind, self.nullable, self.precision, self.scale, length)

    def typed(self, text: str) -> Any:
        """A default's value text as the Python value the codec takes for this column;
        None when binlake's type cannot hold it (a zero date, a TIME past a day)."""
        try:
            if self.kind in ("int", "uint"):
                return int(decimal.Decimal(text.strip()))
            if self.kind == "bool":  # PostgreSQL's boolean columns
                return text.strip().lower() in ("1", "t", "true")
            if self.kind == "decimal":
                return decimal.Decimal(text).quantize(decimal.Decimal(1).scaleb(-(self.scale or 0)))
            if self.kind == "float":
                return float(text)
            if self.kind == "string":
                return text
            if self.kind == "bytes":
                raw = bytes.fromhex(text[2:]) if text.startswith("0x") else text.encode(self.charset or "utf-8")
                if self.is_fixed_binary and self.length:
                    raw = raw.ljust(self.length, b"\0")  # BINARY(n) pads, as its values do
                return raw
            if self.kind == "date":
                return dt.date.fromisoformat(text)
            if self.kind == "datetime":
                return dt.datetime.fromisoformat(text)
            if self.kind == "time":
                return dt.time.fromisoformat(text)
            if self.kind == "json":
                return text
        except (ValueError, ArithmeticError):
            return None
        return None

    def default_info(self) -> tuple[binlog_pb2.ColumnDefault | None, binlog_pb2.Datum | None]:
        """(ColumnInfo.default_value, ColumnInfo.existing_value) of this column. A constant
        binlake's type cannot hold (``'0000-00-00'``) is kept as an expression: the text
        survives, and restore reads NULL for it rather than a wrong value."""
        from binlake import codec, coldefault

        default = existing = None
        if self.default is not None:
            value = None if self.default_expr else self.typed(self.default)
            if value is not None:
                try:
                    default = coldefault.constant(value, codec.type_code(self.kind), self.name)
                except (TypeError, ValueError):
                    value = None
            if value is None:
                default = coldefault.expression(self.default if self.default_expr else repr(self.default))
        if self.existing is not None:
            value = self.typed(self.existing)
            if value is not None:
                try:
                    existing = codec.encode_value(value, codec.type_code(self.kind), self.name)
                except (TypeError, ValueError):
                    existing = None
        return default, existing


@dataclasses.dataclass
class SourceTable:
    db: str
    name: str
    columns: list[SourceColumn]
    primary_key: list[str]
    unique_keys: dict[str, list[str]]
    charset: str | None = None
    # binlake identity: table id, schema version, column ids by name, next id.
    table_id: int = 0
    schema_version: int = 0
    column_ids: dict[str, int] = dataclasses.field(default_factory=dict)
    next_column_id: int = 1

    @property
    def full_name(self) -> str:
        return f"{self.db}.{self.name}"

    def column(self, name: str) -> SourceColumn:
        for c in self.columns:
            if c.name.lower() == name.lower():
                return c
        raise errors.FailedPrecondition(f"table {self.full_name} has no column {name!r} (schema out of step)")

    def to_info(self) -> binlog_pb2.TableInfo:
        info = binlog_pb2.TableInfo(table_id=self.table_id, db=self.db, name=self.name,
                                    schema_version=self.schema_version, next_column_id=self.next_column_id)
        for c in self.columns:
            d = c.column_def()
            ci = info.columns.add(id=self.column_ids[c.name], name=c.name, type=_code(c.kind),
                                  nullable=c.nullable and c.name not in self.primary_key, sql_type=d.sql_type())
            default, existing = c.default_info()
            if default is not None:
                ci.default_value.CopyFrom(default)
            if existing is not None:
                ci.existing_value.CopyFrom(existing)
        info.primary_key.extend(self.column_ids[k] for k in self.primary_key)
        for key, cols in self.unique_keys.items():
            info.unique_keys.add(name=key, column_ids=[self.column_ids[c] for c in cols])
        return info

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SourceTable:
        d = dict(d)
        d["columns"] = [SourceColumn(**c) for c in d["columns"]]
        return cls(**d)


def _code(kind: str) -> int:
    from binlake import codec

    return codec.type_code(kind)


def assign_ids(new: SourceTable, old: SourceTable | None, table_id: int, version: int) -> None:
    """Give ``new`` its binlake identity: ``table_id``, ``version``, column ids
    carried over by name from ``old`` (renames were carried by ``Catalog``), new
    ids for new columns; the primary key is required."""
    if not new.primary_key:
        raise errors.FailedPrecondition(
            f"table {new.full_name} has no primary key: binlake applies changes by key, as DM and TiDB Binlog "
            "do; add one, or exclude the table with --tables"
        )
    new.table_id = table_id
    new.schema_version = version
    # ``new`` was copied from ``old`` with its ids, renames already carried over.
    ids = dict(new.column_ids) if old is not None else {}
    nxt = old.next_column_id if old is not None else 1
    out: dict[str, int] = {}
    for c in new.columns:
        if c.name in ids:
            out[c.name] = ids[c.name]
        else:
            out[c.name] = nxt
            nxt += 1
    new.column_ids = out
    new.next_column_id = nxt
