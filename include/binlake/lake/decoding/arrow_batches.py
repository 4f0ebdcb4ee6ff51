"""Arrow record batches of change rows and DDL rows, as the data source hands them to
Spark, and of ledger rows, as the ingest stages them."""

from __future__ import annotations

import array
import datetime as dt
import sys
from collections.abc import Mapping
from typing import Any

from binlake.lake.decoding.native import StringColumn
from binlake.lake.decoding.rows import CHANGE_COLUMNS, DDL_COLUMNS, WINDOW_COLUMNS

# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch
# cost, small enough to keep a partition's memory bounded (~10 MB of images).
BATCH_ROWS = 16_384
# Arrow buffers are little-endian: machine integers are wrapped as they are only there.
_LITTLE_ENDIAN = sys.byteorder == "little"


def _arrow_types() -> dict[str, Any]:
    import pyarrow as pa

    return {"long": pa.int64(), "int": pa.int32(), "date": pa.date32(), "string": pa.string(),
            "boolean": pa.bool_(), "binary": pa.binary(), "array<string>": pa.list_(pa.string()),
            "map<string,long>": pa.map_(pa.string(), pa.int64()), "timestamp": pa.timestamp("us", tz="UTC")}


def changes_batch(columns: Mapping[str, Any]) -> Any:
    """A pyarrow RecordBatch of change rows from ChangeDecoder columns.

    Whatever form a column has, the batch is the same (``batch.equals``): numbers in
    an ``array.array`` and the native decoder's ``StringColumn`` are wrapped as they
    are (no per-value conversion, which cost as much as the native decoding
    itself); lists (the Python path's strings) are converted value by value."""
    import pyarrow as pa

    types = _arrow_types()
    arrays = []
    for name, kind in CHANGE_COLUMNS:
        values = columns[name]
        arrow_type = pa.date32() if kind == "date" else types[kind]
        if isinstance(values, StringColumn):
            validity = None if values.validity is None else pa.py_buffer(values.validity)
            arrays.append(pa.Array.from_buffers(
                arrow_type, len(values), [validity, pa.py_buffer(values.offsets), pa.py_buffer(values.data)],
                null_count=values.null_count))
        elif isinstance(values, array.array) and _LITTLE_ENDIAN:
            # The array's own memory: no nulls, machine integers of the type's width
            # (int64 for long, int32 for int and date - Arrow's date32 is days as int32).
            arrays.append(pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)]))
        elif kind == "date":
            arrays.append(pa.array(list(values), pa.int32()).cast(pa.date32()))
        else:
            arrays.append(pa.array(list(values), arrow_type))
    return pa.RecordBatch.from_arrays(arrays, names=[n for n, _ in CHANGE_COLUMNS])


def changes_schema() -> Any:
    """The pyarrow schema of ``changes_batch``'s batches."""
    import pyarrow as pa

    types = _arrow_types()
    return pa.schema([(name, types[kind]) for name, kind in CHANGE_COLUMNS])


def ddl_batch(rows: list[dict[str, Any]]) -> Any:
    """A pyarrow RecordBatch of ``ddl_history`` rows (``DDL_COLUMNS``)."""
    import pyarrow as pa

    types = _arrow_types()
    return pa.RecordBatch.from_arrays(
        [pa.array([r[name] for r in rows], types[kind]) for name, kind in DDL_COLUMNS],
        names=[n for n, _ in DDL_COLUMNS])


def ledger_batch(rows: list[tuple[Any, ...]]) -> Any:
    """Ledger rows (tuples in ``WINDOW_COLUMNS`` order, ``ingested_at`` naive UTC) as one
    pyarrow RecordBatch."""
    import pyarrow as pa

    types = _arrow_types()
    arrays = []
    for (_name, kind), values in zip(WINDOW_COLUMNS, zip(*rows, strict=True), strict=True):
        if kind.startswith("map<"):  # maps as (key, value) pairs
            values = tuple(sorted(m.items()) for m in values)
        elif kind == "timestamp":
            values = tuple(t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t for t in values)
        arrays.append(pa.array(list(values), types[kind]))
    return pa.RecordBatch.from_arrays(arrays, names=[n for n, _ in WINDOW_COLUMNS])
