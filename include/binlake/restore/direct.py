"""A table's rows at T decoded in Python from the one-pass result, for target loads.

``onepass.last_changes`` leaves one change row per (table, key text): the image
the key holds at T, or its last delete. For a table rebuilt from the lake's
changes alone, loading a database needs nothing more than those images typed
as the sinks take them, so they are decoded here, in the driver, with the
apply's own decoder (``rawcompact.ImageDecoder``: the values
``decode.image_values`` gives) instead of one Spark job per table.

Each image is read with the definition it was written with and mapped by
column *id* onto the definition at T (a renamed column keeps its values; one
added later holds what the upstream gave the rows then, ``restore.fills``, or
null; a dropped one disappears), exactly as ``rebuild`` maps them. The last event per *typed* key wins, ordered by (commit_ts, seq, sub) as
in ``rebuild``; so two texts of one key resolve as Spark's typed rebuild does.
A table with base rows, or whose columns changed type (Spark casts those),
is not ``eligible`` and takes the typed Spark rebuild instead.

``--out`` uses the same rows: ``arrow_table`` types them as the Spark rebuild
types its columns (``columns.spark_type``) and ``write_delta`` writes the table
with delta-rs in one commit, tens of milliseconds instead of a Spark job and a
Delta commit through the JVM per table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from binlake import errors, tso
from binlake.lake.decoding import decode
from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.restore import fills as fill_mod
from binlake.restore import rebuild


def _at(schema: decode.SchemaHistory, table_id: int, ts: int) -> binlog_pb2.TableInfo:
    return schema.table(table_id, min(ts + 1, tso.MAX_TS))


def eligible(schema: decode.SchemaHistory, table_id: int, ts: int, base: rebuild.Base) -> bool:
    """Whether the table at ``ts`` can be decoded here: no base rows, and every column of
    every version has the type (and for decimals the declared type) it has at ``ts``."""
    return base.frame is None and same_types(schema, table_id, ts)


def same_types(schema: decode.SchemaHistory, table_id: int, ts: int) -> bool:
    """Whether every column of every version of the table has the type (and for decimals
    the declared type) it has at ``ts``: its images decode here as Spark casts them."""
    want = {c.id: c for c in _at(schema, table_id, ts).columns}
    for info in rebuild.versions(schema, table_id).values():
        for c in info.columns:
            w = want.get(c.id)
            if w is not None and (w.type != c.type or (c.type == binlog_pb2.DECIMAL and w.sql_type != c.sql_type)):
                return False
    return True


def rows_at(schema: decode.SchemaHistory, table_id: int, ts: int, changes: Iterable[Any]) -> list[dict[str, Any]]:
    """The table's rows at ``ts`` (column name at ``ts`` -> Python value) from its
    one-pass change rows (mappings with commit_ts, seq, op, before, after, schema_version)."""
    from binlake.replicate.compactor import hashable

    info = _at(schema, table_id, ts)
    key = [next(c.name for c in info.columns if c.id == i) for i in info.primary_key]
    if not key:
        raise errors.FailedPrecondition(f"table {info.db}.{info.name} has no primary key: rows cannot be keyed")
    read = image_reader(schema, table_id, ts)
    last: dict[tuple[Any, ...], tuple[tuple[int, int, int], bool, dict[str, Any]]] = {}
    for r in changes:
        gone = r["op"] == "delete"
        row = read(int(r["schema_version"]), r["before"] if gone else r["after"])
        k = tuple(hashable(row[n]) for n in key)
        order = (int(r["commit_ts"]), int(r["seq"]), 0 if gone else 1)
        held = last.get(k)
        if held is None or order > held[0]:
            last[k] = (order, gone, row)
    return [row for _order, gone, row in last.values() if not gone]


def image_reader(schema: decode.SchemaHistory, table_id: int, ts: int) -> Callable[[int, str | None], dict[str, Any]]:
    """(schema_version, image JSON) -> the image as a row of the definition at ``ts``
    (column name -> Python value, as ``decode.image_values`` types them), mapped by
    column id as ``rebuild`` maps images."""
    from binlake.replicate.rawcompact import ImageDecoder

    info = _at(schema, table_id, ts)
    # A column an image lacks because it was added after the image's version: the
    # value the upstream gave the rows then, decoded as an image's value of it is.
    vfills = fill_mod.version_fills(schema, table_id)
    fill_values = {cid: _fill_value(f) for per in vfills.values() for cid, f in per.items()}
    plans: dict[int, tuple[ImageDecoder, list[tuple[str, str | None]], dict[str, Any]]] = {}
    for version, vinfo in rebuild.versions(schema, table_id).items():
        names = {c.id: c.name for c in vinfo.columns}
        filled = vfills.get(version, {})
        plans[version] = (ImageDecoder(vinfo, []), [(c.name, names.get(c.id)) for c in info.columns],
                          {c.name: fill_values[c.id] for c in info.columns
                           if c.id not in names and c.id in filled})

    def read(version: int, image: str | None) -> dict[str, Any]:
        dec, mapping, missing = plans[version]
        doc = dec.typed(dec.parse(image)) or {}
        return {name: (doc.get(src) if src is not None else missing.get(name)) for name, src in mapping}

    return read


def _fill_value(fill: fill_mod.Fill) -> Any:
    """A fill's Python value as ``ImageDecoder.typed`` gives an image's value of its column
    (through the image JSON, so both paths type it alike)."""
    from binlake import codec
    from binlake.lake.decoding.image import value_json
    from binlake.replicate.rawcompact import ImageDecoder

    col = fill.column
    dec = ImageDecoder(binlog_pb2.TableInfo(columns=[col]), [])
    doc = dec.typed(dec.parse('{' + json.dumps(col.name) + ':' + value_json(codec.decode_value(fill.value, col.type),
                                                                         col.type) + '}'))
    return (doc or {}).get(col.name)


def delta_eligible(schema: decode.SchemaHistory, table_id: int, ts: int, base: rebuild.Base) -> bool:
    """``eligible``, and no JSON column (whose text Spark writes in its own form), so the
    Delta table written here equals the one Spark's typed rebuild writes."""
    return eligible(schema, table_id, ts, base) and all(
        c.type != binlog_pb2.JSON for c in _at(schema, table_id, ts).columns)


def _arrow_type(spark_type: str) -> Any:
    import pyarrow as pa

    spec = C.decimal_spec(spark_type)
    if spec is not None:
        return pa.decimal128(*spec)
    types = {"bigint": pa.int64(), "boolean": pa.bool_(), "double": pa.float64(), "binary": pa.binary(),
             "date": pa.date32(), "timestamp_ntz": pa.timestamp("us"), "string": pa.string()}
    return types[spark_type]


def arrow_table(info: binlog_pb2.TableInfo, rows: Sequence[Mapping[str, Any]]) -> Any:
    """``rows`` (from ``rows_at``) as an Arrow table with the Spark types of ``columns``
    (what the typed rebuild writes): times as ``HH:MM:SS.ffffff`` text, decimals
    wider than Spark's as their digits."""
    import pyarrow as pa

    arrays, fields = [], []
    for c in C.columns_of(info):
        kind = c.spark_type()
        values: list[Any] = [r.get(c.name) for r in rows]
        if c.type == binlog_pb2.TIME:
            values = [None if v is None else v.isoformat(timespec="microseconds") for v in values]
        elif kind == "string" and c.type == binlog_pb2.DECIMAL:
            values = [None if v is None else str(v) for v in values]
        fields.append(pa.field(c.name, _arrow_type(kind)))
        arrays.append(pa.array(values, type=_arrow_type(kind)))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def write_delta(path: str, table: Any) -> None:
    """Replace the Delta table at local ``path`` with ``table`` in one commit (delta-rs,
    in this process: no Spark job). A crash before the commit leaves the path as it was."""
    from deltalake import write_deltalake

    write_deltalake(path, table, mode="overwrite", schema_mode="overwrite")
