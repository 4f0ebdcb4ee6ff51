"""ChangeDecoder: complete transactions -> change-row columns (Arrow-ready).

Each transaction's row changes are decoded with the table definitions in force
at its commit_ts (``SchemaHistory``) into the ``CHANGE_COLUMNS`` shape
(``binlake.lake.decoding.rows``), images as image JSON (``binlake.lake.decoding.image``).
"""

from __future__ import annotations

import array
import datetime as dt
import struct
from typing import Any

from google.protobuf.message import DecodeError

from binlake import errors
from binlake.lake.decoding import native as native_mod
from binlake.lake.decoding.image import TablePlan
from binlake.lake.decoding.native import IMAGE_COLUMNS, StringColumn, native_enabled
from binlake.lake.decoding.rows import CHANGE_COLUMNS, EPOCH_DATE, commit_date_days
from binlake.lake.decoding.schema_history import SchemaHistory
from binlake.lake.decoding.txn import CorruptBinlogError, check_txn, parse_prewrite
from binlake.proto import binlog_pb2

# Change-row columns as ChangeDecoder keeps them. Numbers are array.array (machine
# integers: extending one by a repeated packed value is one C call per mutation,
# and Arrow wraps the memory as is instead of converting Python ints one by one).
# Images (and op) are lists of str in the Python path; natively they are
# StringColumn, Arrow's string layout built by the C decoder.
_ARRAY_CODES = {"long": "q", "int": "i", "date": "i"}
_PACK = {"q": struct.Struct("=q"), "i": struct.Struct("=i")}
assert array.array("q").itemsize == 8 and array.array("i").itemsize == 4


def _new_columns() -> dict[str, Any]:
    return {name: array.array(_ARRAY_CODES[kind]) if kind in _ARRAY_CODES else []
            for name, kind in CHANGE_COLUMNS}


class ChangeDecoder:
    """Decodes complete transactions into change-row columns (Arrow-ready).

    Keeps one decoding plan per table definition, so a window of many
    transactions over few tables pays the per-definition work once.
    ``take()`` hands over the columns: numbers as ``array.array``, strings as
    lists, except op / keys / before / after on the native path, which are
    ``StringColumn`` (the C decoder writes the images straight into Arrow's
    layout; rows it hands back to Python are appended in their place).
    """

    def __init__(self, history: SchemaHistory, pump: str = "", native: bool | None = None) -> None:
        """``native``: decode rows with the C extension (None: ``native_enabled()``;
        True without the extension built is an error)."""
        if not isinstance(history, SchemaHistory):
            raise TypeError(f"history must be a SchemaHistory, got {type(history).__name__}")
        if not isinstance(pump, str):
            raise TypeError(f"pump must be a str, got {type(pump).__name__}")
        if native and native_mod.imagec() is None:
            raise errors.FailedPrecondition(
                "the native decoder binlake.lake.decoding._imagec is not built (reinstall with a C compiler: make setup)")
        self.history = history
        self.pump = pump
        self.native = native_enabled() if native is None else bool(native)
        self._plans: dict[int, TablePlan] = {}  # keyed by id() of the TableInfo the history holds
        self.columns: dict[str, Any] = _new_columns()
        # Natively, op/keys/before/after accumulate in C buffers (these list entries stay empty).
        self._images: Any = native_mod.imagec().Columns() if self.native else None
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def take(self) -> dict[str, Any]:
        """The rows decoded so far (column name -> column), and start anew."""
        out = self.columns
        if self._images is not None:
            rows, images = self._images.take()
            for name, (offsets, data, validity, nulls) in zip(IMAGE_COLUMNS, images, strict=True):
                out[name] = StringColumn(rows, offsets, data, validity, nulls)
        self.columns = _new_columns()
        self._rows = 0
        return out

    def _plan(self, table_id: int, commit_ts: int) -> TablePlan:
        info = self.history.table(table_id, commit_ts)
        plan = self._plans.get(id(info))
        if plan is None or plan.info is not info:
            plan = TablePlan(info, self.native)
            self._plans[id(info)] = plan
        return plan

    def add(self, txn: binlog_pb2.Binlog) -> int:
        """Decode one complete transaction's row changes; return how many."""
        check_txn(txn)
        value = parse_prewrite(txn)
        cols = self.columns
        images = self._images
        commit_ts, start_ts = txn.commit_ts, txn.start_ts
        q, i = _PACK["q"].pack, _PACK["i"].pack
        commit_ts_b, start_ts_b, day_b = q(commit_ts), q(start_ts), i(commit_date_days(commit_ts))
        seq = 0
        for m in value.mutations:
            plan = self._plan(m.table_id, commit_ts)
            n_ins, n_upd, n_del = len(m.inserted_rows), len(m.updated_rows), len(m.deleted_rows)
            if len(m.sequence) != n_ins + n_upd + n_del:
                raise CorruptBinlogError(
                    f"transaction start_ts {start_ts}, table id {m.table_id}: sequence lists {len(m.sequence)} "
                    f"changes but the mutation holds {n_ins + n_upd + n_del}")
            try:
                if images is not None:
                    n = plan.mutation_into(images, m.sequence, m.inserted_rows, m.updated_rows, m.deleted_rows)
                else:
                    ops, keys, befores, afters = plan.mutation_py(m.sequence, m.inserted_rows, m.updated_rows,
                                                               m.deleted_rows)
                    n = len(ops)
            except (DecodeError, UnicodeDecodeError, OverflowError, IndexError, CorruptBinlogError) as exc:
                # (bytes that are not a Row, text that is not UTF-8, a datetime beyond year 9999)
                raise CorruptBinlogError(
                    f"transaction start_ts {start_ts}, table id {m.table_id}: a row does not decode: {exc}"
                ) from None
            if images is None:
                cols["op"].extend(ops)
                cols["keys"].extend(keys)
                cols["before"].extend(befores)
                cols["after"].extend(afters)
            # The per-transaction / per-table values: one packed value repeated n times.
            cols["commit_ts"].frombytes(commit_ts_b * n)
            cols["start_ts"].frombytes(start_ts_b * n)
            cols["seq"].extend(range(seq, seq + n))
            cols["commit_date"].frombytes(day_b * n)
            cols["db"].extend([plan.db] * n)
            cols["tbl"].extend([plan.tbl] * n)
            cols["table_id"].frombytes(q(m.table_id) * n)
            cols["schema_version"].frombytes(q(plan.version) * n)
            cols["pump"].extend([self.pump] * n)
            seq += n
            self._rows += n
        return seq


def change_rows(txn: binlog_pb2.Binlog, history: SchemaHistory, pump: str = "") -> list[dict[str, Any]]:
    """One complete transaction's row changes as dicts (``CHANGE_COLUMNS``;
    ``commit_date`` as a ``datetime.date``), with the definitions in force at its commit_ts."""
    decoder = ChangeDecoder(history, pump)
    decoder.add(txn)
    cols = decoder.take()
    cols["commit_date"] = [EPOCH_DATE + dt.timedelta(days=d) for d in cols["commit_date"]]
    names = [name for name, _ in CHANGE_COLUMNS]
    columns = [list(cols[n]) for n in names]  # plain Python values (ints, str, None)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]

