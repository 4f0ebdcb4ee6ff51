"""PostgreSQL values and table definitions as the postgres source carries them,
shared by the two ways a row reaches it: a ``pgoutput`` tuple (streaming) and
a row SELECTed from the initial snapshot.

Both paths hand over a column's value as the type's *text output* (pgoutput
sends text-format tuples; the snapshot reads the same output functions'
text with every type caster switched off), then go through ``decode_row`` and
the codec. The output functions depend on a few session settings, so both
connections pin them (``SESSION_OPTIONS``, the settings PostgreSQL's own
logical-replication worker pins): the same stored value is then the same text,
the same datum and the same bytes on either path.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
from collections.abc import Mapping, Sequence
from typing import Any

from binlake import errors
from binlake.source.tables import SourceColumn, SourceTable

# Startup options of every connection whose text output the source decodes:
# ISO dates (``fromisoformat``), shortest exact floats, hex bytea, UTC offsets.
SESSION_OPTIONS = ("-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3 "
                   "-c bytea_output=hex -c TimeZone=UTC")

# type oid -> binlake type
TYPES = {16: "bool", 20: "int", 21: "int", 23: "int", 26: "uint", 700: "float", 701: "float", 1700: "decimal",
         25: "string", 1043: "string", 1042: "string", 19: "string", 2950: "string", 17: "bytes",
         1082: "date", 1114: "datetime", 1184: "datetime", 1083: "time", 114: "json", 3802: "json"}



class Unchanged:
    """A value pgoutput left out ('u': an unchanged TOASTed column of an update)."""


# A sentinel object, not a string: a text column may well hold the word itself.
UNCHANGED = Unchanged()


@dataclasses.dataclass(frozen=True)
class Attr:
    """One published column as pgoutput's RELATION message describes it."""

    name: str
    type_oid: int
    typmod: int


def convert(text: bytes | str, oid: int, col: str) -> Any:
    """A type's text output -> the Python value the codec carries for it."""
    s = text.decode() if isinstance(text, bytes) else text
    try:
        if oid in (20, 21, 23, 26):
            return int(s)
        if oid == 16:
            return s == "t"
        if oid in (700, 701):
            return float(s)
        if oid == 1700:
            # decimal signals text it cannot read with InvalidOperation, an ArithmeticError
            # and no ValueError: turned into one here so the caller's line names the column.
            try:
                d = decimal.Decimal(s)
            except decimal.InvalidOperation:
                raise ValueError("not a decimal number") from None
            if not d.is_finite():
                raise ValueError("not a finite decimal (binlake carries finite NUMERICs only)")
            return d
        if oid == 17:
            return bytes.fromhex(s[2:]) if s.startswith("\\x") else s.encode()
        if oid == 1082:
            return dt.date.fromisoformat(s)
        if oid == 1114:
            return dt.datetime.fromisoformat(s)
        if oid == 1184:
            v = dt.datetime.fromisoformat(s if len(s) < 3 or s[-3] in "+-" and ":" in s[-6:] else s + ":00")
            return v.astimezone(dt.UTC).replace(tzinfo=None)
        if oid == 1083:
            return dt.time.fromisoformat(s)
        return s
    except ValueError as exc:
        raise errors.FailedPrecondition(f"{col}: value {s[:40]!r} cannot be carried: {exc}") from None


def columns(ns: str, name: str, attrs: Sequence[Attr]) -> list[SourceColumn]:
    """The binlake columns of a table's published attributes; a type binlake
    cannot carry is refused naming the column."""
    cols: list[SourceColumn] = []
    for a in attrs:
        kind = TYPES.get(a.type_oid)
        if kind is None:
            raise errors.FailedPrecondition(
                f"column {ns}.{name}.{a.name} has a type (oid {a.type_oid}) binlake cannot carry; leave the table "
                "out of the publication or change the column's type"
            )
        c = SourceColumn(name=a.name, kind=kind)
        if kind == "decimal":
            c.precision, c.scale = ((a.typmod - 4) >> 16, (a.typmod - 4) & 0xFFFF) if a.typmod > 0 else (65, 30)
        if a.type_oid in (1043, 1042) and a.typmod > 0:
            c.length = a.typmod - 4
        cols.append(c)
    return cols


def shape(cols: Sequence[SourceColumn]) -> list[tuple[Any, ...]]:
    """What a RELATION message can change about a table's columns (a change is a DDL binlog)."""
    return [(c.name, c.kind, c.precision, c.scale, c.length) for c in cols]


def set_defaults(cols: Sequence[SourceColumn], defaults: Mapping[str, Any], old: SourceTable | None) -> None:
    """Give ``cols`` their DEFAULTs (``snapshot.column_defaults``); a column ``old`` (the
    definition before) lacks was just added: it also gets what the rows that existed got."""
    had = {c.name: c for c in old.columns} if old is not None else None
    for c in cols:
        d = defaults.get(c.name)
        if d is None:
            continue
        c.default, c.default_expr = d.default, d.is_expr
        if had is not None and c.name not in had:
            c.existing = d.existing
        elif had is not None:
            c.existing = had[c.name].existing


def default_shape(cols: Sequence[SourceColumn]) -> list[tuple[Any, ...]]:
    """The DEFAULTs of a table's columns (a change, such as SET DEFAULT, is a DDL binlog)."""
    return [(c.name, c.default, c.default_expr) for c in cols]


def table(ns: str, name: str, cols: list[SourceColumn], primary_key: list[str]) -> SourceTable:
    """The definition the source sends for a table (its DDL binlog's TableInfo before ids)."""
    for c in cols:
        c.nullable = c.name not in primary_key
    return SourceTable(db=ns, name=name, columns=cols, primary_key=primary_key, unique_keys={})


def decode_row(t: SourceTable, oids: Sequence[int], values: Sequence[bytes | str | Unchanged | None]) -> dict[str, Any]:
    """One row's text values (in the table's column order) -> column name -> value."""
    out: dict[str, Any] = {}
    for c, toid, v in zip(t.columns, oids, values, strict=True):
        if isinstance(v, Unchanged):
            raise errors.FailedPrecondition(f"{t.full_name}.{c.name}: an unchanged TOAST value arrived "
                                            "without its data; set REPLICA IDENTITY FULL")
        out[c.name] = None if v is None else convert(v, toid, f"{t.full_name}.{c.name}")
    return out
