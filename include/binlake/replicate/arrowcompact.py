"""Compaction of one target table's changes as Arrow arrays: no Python per change.

``rawcompact.compact`` walks the changes one by one in Python (parse the image,
type its key, update a dict): about 25 µs a change, the wall the apply hit.
Here the same DM rules run as whole-array operations:

1. the before and after images of every change are parsed by Arrow's JSON
   reader in one call each (the images, one per line, form an NDJSON buffer),
   typed by the table definition: the key columns come out typed exactly as
   ``rawcompact.ImageDecoder.key_of`` types them;
2. every change becomes one or two *events* on a key: an image's key and a
   position ``2 * index + part`` (part 0: the delete side of a delete or of a
   key-changing update; part 1: the after side of an insert or update). A key
   change is thus delete(old) + insert(new) in that order, as
   ``compactor.split_key_updates`` does;
3. a group-by on the key takes each key's first and last event: the first says
   whether the key existed before the batch (it has a before image unless it
   is an insert side), the last whether it exists after it (an after side), and
   which images to keep (the first change's before, the last change's after),
   which is exactly ``compactor.compact``'s rule;
4. the final changes are ordered by their key's first event: the order in
   which the reference's dict first saw each key.

Only the final changes cross back to Python, and for PostgreSQL not even those:
``Compacted.rows_table`` gives the final rows as a typed Arrow table that
``targets.PostgreSQL.insert_arrow`` streams with COPY as CSV.

What Arrow cannot type the way ``decode.image_values`` does is not guessed:
``Unsupported`` (key columns other than integers and strings; a table with
several source tables in one batch) or ``pyarrow.ArrowInvalid`` (an image the
reader refuses: a bad value, an unknown column, ``{"$base64": ...}`` text)
sends the caller back to ``rawcompact``, which gives the same result (or the
clear error) the slow way. Dates and datetimes are cast from their text by
Arrow and go as Arrow too. Columns that have no such form (bytes, times, JSON)
still compact here; their final rows are typed per row by the decoder, a slice
at a time (``Compacted.iter_changes``). ``tests/replicate/test_arrowcompact.py``
checks the result equal to ``compactor.compact`` change for change.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from binlake.proto import binlog_pb2
from binlake.replicate.compactor import DELETE, INSERT, UPDATE, Change
from binlake.replicate.rawcompact import ImageDecoder

# Column types Arrow's JSON reader types exactly as ``image._value_of`` does
# (or refuses): these may be key columns here.
_KEY_TYPES: dict[int, pa.DataType] = {binlog_pb2.INT: pa.int64(), binlog_pb2.UINT: pa.uint64(),
                                      binlog_pb2.STRING: pa.string()}
# ... and the ones whose Arrow value, written as CSV text, is what PostgreSQL reads
# back as the decoder's Python value (decimals stay their exact JSON text).
_CSV_TYPES: dict[int, pa.DataType] = {**_KEY_TYPES, binlog_pb2.FLOAT: pa.float64(),
                                      binlog_pb2.DECIMAL: pa.string(), binlog_pb2.BOOL: pa.bool_()}
# Dates and datetimes: read as their image text (the JSON reader has no date
# parser), then cast by Arrow's strict ISO 8601 parser to the types the targets'
# ``insert_arrow`` take (``restore.stream`` sends the same). A text the cast
# refuses (a zone offset, more than six fraction digits) raises ArrowInvalid:
# the caller goes back to ``rawcompact``, which decodes it as the codec does.
_TEXT_TYPED: dict[int, pa.DataType] = {binlog_pb2.DATE: pa.date32(), binlog_pb2.DATETIME: pa.timestamp("us")}
# The type each column is read as from the images, and the type of its final rows.
_READ_TYPES: dict[int, pa.DataType] = {**_CSV_TYPES, **{t: pa.string() for t in _TEXT_TYPED}}
_ROW_TYPES: dict[int, pa.DataType] = {**_CSV_TYPES, **_TEXT_TYPED}
# Final changes decoded to Python at a time when a table's rows cannot go as Arrow
# (``Compacted.iter_changes``): the memory of a slice, not of the batch.
DECODE_SLICE = 10_000
# Bytes of images the JSON reader parses as one block (``parse_images``).
_BLOCK = 4 << 20
# The columns of the changes table ``compact`` takes, in commit order.
COLUMNS = ("op", "before", "after", "commit_ts", "seq")


class Unsupported(Exception):
    """This batch's table cannot be compacted as Arrow arrays (the caller uses rawcompact)."""


def _ndjson(images: pa.Array | pa.ChunkedArray) -> pa.Buffer:
    """The images one per line (a missing image as ``{}``), as one buffer."""
    if isinstance(images, pa.ChunkedArray):
        images = images.combine_chunks()
    lines = pc.binary_join_element_wise(pc.fill_null(images.cast(pa.string()), "{}"), "", "\n")
    # The joined strings' data buffer is the lines back to back; the offsets say where the slice starts.
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
    data = lines.buffers()[2]
    if data is None:
        return pa.py_buffer(b"")
    return data[int(offsets[0]):int(offsets[-1])]


def parse_images(images: pa.Array | pa.ChunkedArray, info: binlog_pb2.TableInfo) -> pa.Table:
    """The images as a table with one row per image (all null for a missing one):
    columns of ``_CSV_TYPES`` typed, others as Arrow infers them (unused here but
    checked: an image column the definition does not have is refused); dates and
    datetimes as their text (``typed_rows`` casts them)."""
    n = len(images)
    if n == 0:
        return pa.table({c.name: pa.nulls(0, _READ_TYPES.get(int(c.type), pa.null())) for c in info.columns})
    schema = pa.schema([(c.name, _READ_TYPES[int(c.type)]) for c in info.columns if int(c.type) in _READ_TYPES])
    # Blocks of a few MB are parsed on every core and stay in cache: 4x faster than
    # one block for the whole buffer (measured on 100,000 images of a sysbench row).
    # Only when every column's type is given: a column Arrow infers could be typed
    # differently in two blocks; one block keeps that case as it always was.
    block = _BLOCK if len(schema) == len(info.columns) else 1 << 30
    out = pj.read_json(pa.BufferReader(_ndjson(images)),
                       read_options=pj.ReadOptions(use_threads=True, block_size=block),
                       parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer",
                                                     newlines_in_values=False))
    names = {c.name for c in info.columns}
    unknown = [name for name in out.column_names if name not in names]
    if unknown:
        raise pa.ArrowInvalid(f"image has column(s) {', '.join(sorted(unknown))} that {info.db}.{info.name} does not")
    if out.num_rows != n:  # an image that spans lines: not the ingest's format, let the slow path judge
        raise pa.ArrowInvalid(f"{out.num_rows} images parsed out of {n}")
    return out


def typed_rows(rows: pa.Table, info: binlog_pb2.TableInfo) -> pa.Table:
    """``rows`` (as ``parse_images`` gives them) with their date and datetime texts cast
    to Arrow dates and timestamps; ArrowInvalid for a text the strict cast refuses."""
    for c in info.columns:
        typ = _TEXT_TYPED.get(int(c.type))
        if typ is not None and c.name in rows.column_names:
            i = rows.column_names.index(c.name)
            rows = rows.set_column(i, c.name, pc.cast(rows.column(i), typ))
    return rows


def _column(t: pa.Table, name: str, dtype: pa.DataType) -> pa.Array:
    if name in t.column_names:
        return t.column(name).combine_chunks()
    return pa.nulls(t.num_rows, dtype)  # no image has the column: every value is null


class Compacted:
    """The final changes of one target table in a batch (one per key), kept as
    Arrow until the writer asks: typed rows for COPY, key tuples for the deletes,
    or ``Change`` objects for everything else."""

    __slots__ = ("table", "dec", "ops", "before", "after", "commit_ts", "seq", "_keys", "_rows", "_csv")

    def __init__(self, table: str, dec: ImageDecoder, ops: pa.Array, before: pa.Array, after: pa.Array,
                 commit_ts: pa.Array, seq: pa.Array, keys: list[pa.Array], rows: pa.Table, csv: bool) -> None:
        self.table, self.dec = table, dec
        self.ops, self.before, self.after, self.commit_ts, self.seq = ops, before, after, commit_ts, seq
        self._keys = keys  # per key column (extract column excluded), the final change's key
        self._rows = rows  # the after images parsed, one per final change (null for a delete)
        self._csv = csv

    def __len__(self) -> int:
        return len(self.ops)

    def changes(self) -> list[Change]:
        """The final changes as ``rawcompact.compact`` returns them."""
        return [c for part in self.iter_changes(max(1, len(self))) for c in part]

    def iter_changes(self, size: int = DECODE_SLICE) -> Iterator[list[Change]]:
        """The final changes (``changes``) decoded ``size`` at a time: what a writer
        that needs Python values holds is one slice, whatever the batch."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        dec, name = self.dec, self.table
        for at in range(0, len(self), size):
            cols = [a.slice(at, size).to_pylist() for a in (self.ops, self.before, self.after, self.commit_ts, self.seq)]
            yield [Change(name, op, dec.typed(dec.parse(b)), dec.typed(dec.parse(a)), ts, seq)
                   for op, b, a, ts, seq in zip(*cols, strict=True)]

    def iter_rows(self, size: int = DECODE_SLICE) -> Iterator[list[dict[str, Any]]]:
        """The final rows (inserts' and updates' after images, in order) decoded ``size``
        at a time; only the after images are decoded."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        dec = self.dec
        after = self.after.filter(pc.not_equal(self.ops, DELETE))
        for at in range(0, len(after), size):
            yield [row for a in after.slice(at, size).to_pylist() if (row := dec.typed(dec.parse(a))) is not None]

    def final_rows(self) -> Iterator[dict[str, Any]]:
        """The final rows (``iter_rows``) one after the other, a slice decoded at a time."""
        for part in self.iter_rows():
            yield from part

    def _key_tuples(self, mask: pa.Array) -> list[tuple[Any, ...]]:
        cols = [k.filter(mask).to_pylist() for k in self._keys]
        plan: list[list[Any] | None] = []
        it = iter(cols)
        for name in self.dec.key:
            if self.dec.extract is not None and name == self.dec.extract[0]:
                plan.append(None)
            else:
                plan.append(next(it))
        n = int(pc.sum(mask).as_py() or 0)
        const = self.dec.extract[1] if self.dec.extract is not None else None
        columns = [c if c is not None else [const] * n for c in plan]
        return list(zip(*columns, strict=True)) if columns else []

    def gone_keys(self) -> list[tuple[Any, ...]]:
        """The keys of the final updates and deletes (their rows go away first), in order."""
        return self._key_tuples(pc.not_equal(self.ops, INSERT))

    def insert_keys(self) -> list[tuple[Any, ...]]:
        return self._key_tuples(pc.equal(self.ops, INSERT))

    @property
    def copyable(self) -> bool:
        """Whether every column has a verbatim CSV form (``rows_table`` is not None)."""
        return self._csv

    def buckets(self, count: int) -> np.ndarray:
        """The bucket (0 .. count-1) of every final change, from its key alone: the
        same key lands in the same bucket in any process and on any rerun."""
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive integer, got {count!r}")
        if len(self._keys) == 1 and pa.types.is_integer(self._keys[0].type) and self._keys[0].null_count == 0:
            return np.asarray(np.mod(self._keys[0].to_numpy(), count), dtype=np.int64)
        # Strings and composite keys: a checksum of the key's text (Python's hash() of
        # a string differs between processes).
        tuples = self._key_tuples(pa.array(np.ones(len(self), dtype=bool)))
        return np.fromiter((zlib.crc32(repr(t).encode()) % count for t in tuples), dtype=np.int64, count=len(self))

    def split(self, count: int) -> list[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], pa.Table]]:
        """The final changes dealt into ``count`` buckets by key (``buckets``), each
        as (keys to delete, keys inserted, rows to write): ``gone_keys``,
        ``insert_keys`` and ``rows_table`` of the bucket's changes. Only for a
        ``copyable`` table."""
        rows = self.rows_table()
        if rows is None:
            raise ValueError(f"{self.table}: a column has no CSV form; write its changes one by one")
        which = self.buckets(count)
        written = which[np.asarray(pc.not_equal(self.ops, DELETE).to_numpy(zero_copy_only=False), dtype=bool)]
        gone = pc.not_equal(self.ops, INSERT).to_numpy(zero_copy_only=False)
        inserted = pc.equal(self.ops, INSERT).to_numpy(zero_copy_only=False)
        out = []
        for i in range(count):
            mine = which == i
            out.append((self._key_tuples(pa.array(mine & gone)), self._key_tuples(pa.array(mine & inserted)),
                        rows.filter(pa.array(written == i))))
        return out

    def rows_table(self) -> pa.Table | None:
        """The final rows (updates' and inserts' after images) typed for CSV, in the
        target's column order (with the extract column); None when a column's type
        has no verbatim CSV form (the rows then come from ``changes``)."""
        if not self._csv:
            return None
        keep = pc.not_equal(self.ops, DELETE)
        info = self.dec.info
        cols = {c.name: _column(self._rows, c.name, _ROW_TYPES[int(c.type)]).filter(keep) for c in info.columns}
        if self.dec.extract is not None:
            n = len(next(iter(cols.values())))
            cols[self.dec.extract[0]] = pa.array([self.dec.extract[1]] * n, pa.string())
        return pa.table(cols)


def compact(table: str, changes: pa.Table, dec: ImageDecoder) -> Compacted:
    """The final change per key of ``changes`` (columns ``COLUMNS``, one target
    table, commit order, every image of ``dec``'s definition), as
    ``rawcompact.compact(..., keyed=True)`` gives it. ``Unsupported`` or
    ``pyarrow.ArrowInvalid`` when the caller must use ``rawcompact`` instead."""
    if not isinstance(changes, pa.Table):
        raise TypeError(f"changes must be a pyarrow Table, got {type(changes).__name__}")
    if not isinstance(dec, ImageDecoder):
        raise TypeError(f"dec must be a rawcompact.ImageDecoder, got {type(dec).__name__}")
    info = dec.info
    types = {c.name: int(c.type) for c in info.columns}
    key = [c for c in dec.key if not (dec.extract is not None and c == dec.extract[0])]
    if not key or any(types[c] not in _KEY_TYPES for c in key):
        raise Unsupported(f"{info.db}.{info.name}: key columns {', '.join(dec.key)} are not integers or strings")
    m = changes.num_rows
    ops = changes.column("op").combine_chunks()
    before_json = changes.column("before").combine_chunks()
    after_json = changes.column("after").combine_chunks()
    bad = pc.sum(pc.invert(pc.is_in(ops, pa.array([INSERT, UPDATE, DELETE])))).as_py()
    if bad:
        raise Unsupported("an op other than insert, update or delete")
    before = parse_images(before_json, info)
    after = parse_images(after_json, info)
    kb = [_column(before, c, _KEY_TYPES[types[c]]) for c in key]
    ka = [_column(after, c, _KEY_TYPES[types[c]]) for c in key]
    is_upd, is_del = pc.equal(ops, UPDATE), pc.equal(ops, DELETE)
    # An update that keeps its key (null equals null, as tuples of None compare in the reference).
    same = is_upd
    for b, a in zip(kb, ka, strict=True):
        eq = pc.fill_null(pc.equal(b, a), False)
        same = pc.and_(same, pc.or_(eq, pc.and_(pc.is_null(b), pc.is_null(a))))
    idx = pa.array(np.arange(m, dtype=np.int64))
    # After side: inserts and updates, at 2i+1; delete side: deletes and key-changing updates, at 2i.
    a_side = pc.invert(is_del)
    b_side = pc.or_(is_del, pc.and_(is_upd, pc.invert(same)))
    names = [f"k{j}" for j in range(len(key))]
    events = pa.concat_tables([
        pa.table({**{n: k.filter(a_side) for n, k in zip(names, ka, strict=True)},
                  "pos": pc.add(pc.multiply(idx.filter(a_side), 2), 1)}),
        pa.table({**{n: k.filter(b_side) for n, k in zip(names, kb, strict=True)},
                  "pos": pc.multiply(idx.filter(b_side), 2)}),
    ])
    grouped = events.group_by(names, use_threads=False).aggregate([("pos", "min"), ("pos", "max")])
    first = grouped.column("pos_min").combine_chunks()
    last = grouped.column("pos_max").combine_chunks()
    fidx = pc.divide(first, 2)  # integer division on int64
    lidx = pc.divide(last, 2)
    first_delete_side = pc.equal(pc.bit_wise_and(first, 1), 0)
    existed = pc.or_(first_delete_side, pc.take(same, fidx))  # the key had a row before the batch
    exists = pc.equal(pc.bit_wise_and(last, 1), 1)  # ... and has one after it
    keep = pc.or_(existed, exists)  # inserted and deleted inside the batch: nothing
    order = pc.sort_indices(first.filter(keep))  # the reference's first-touch order
    fidx = fidx.filter(keep).take(order)
    lidx = lidx.filter(keep).take(order)
    existed = existed.filter(keep).take(order)
    exists = exists.filter(keep).take(order)
    final_ops = pc.if_else(pc.invert(existed), INSERT, pc.if_else(exists, UPDATE, DELETE))
    null_str = pa.scalar(None, pa.string())
    out_before = pc.if_else(existed, before_json.cast(pa.string()).take(fidx), null_str)
    out_after = pc.if_else(exists, after_json.cast(pa.string()).take(lidx), null_str)
    keys = [grouped.column(n).combine_chunks().filter(keep).take(order) for n in names]
    rows = typed_rows(after.take(lidx), info)
    csv = all(int(c.type) in _ROW_TYPES for c in info.columns)
    return Compacted(table, dec, final_ops, out_before, out_after,
                     changes.column("commit_ts").combine_chunks().take(lidx),
                     changes.column("seq").combine_chunks().take(lidx), keys, rows, csv)
