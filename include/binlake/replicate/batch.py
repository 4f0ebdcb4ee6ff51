"""Cutting a window into batches: filtered, routed and compacted per target table.

A window ``[a, b)`` is cut at its DDLs, so no DDL falls inside a batch: each
batch has one table definition, one filter verdict and one route per table id
for all of it. The filters and event filters drop what the task excludes (as
Arrow masks), the routes name the target table, and each target table's
changes are compacted to one final change per key as whole Arrow arrays
(``arrowcompact``), or by ``rawcompact`` one change at a time for what Arrow
cannot type; safe mode decodes every change instead, since it deletes every key
a batch touches. A DDL row becomes the change the target runs (``ddl_change``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from binlake.lake.decoding import decode
from binlake.proto import binlog_pb2
from binlake.replicate import arrowcompact, rawcompact, rules
from binlake.replicate.compactor import DELETE, INSERT, UPDATE, Change
from binlake.replicate.report import ApplySummary
from binlake.replicate.table_write import key_names

# The changes of a window from the lake (``read.LakeReader.window_rows``): the
# read's columns, their commit_ts as NumPy, the (commit_ts, seq) expression
# filters skip, and the window's first and end row in them.
WindowRows = tuple[pa.Table, np.ndarray, set[tuple[int, int]], int, int]
# A DDL as the target runs it: (kind, new target definition, old target definition).
DDLChange = tuple[str, binlog_pb2.TableInfo, binlog_pb2.TableInfo | None]


@dataclasses.dataclass
class Batch:
    """The changes before one DDL (or the window's end), then that DDL."""

    end: int  # the DDL's commit_ts, or the window's end
    # target table -> its changes (compacted per key when ``compacted``; as Arrow when arrowcompact took them)
    tables: dict[str, list[Change] | arrowcompact.Compacted]
    infos: dict[str, binlog_pb2.TableInfo]  # target table -> its definition during the batch
    ddl: dict[str, Any] | None = None
    compacted: bool = False

    def changes(self) -> list[Change]:
        """Every change of the batch, table after table (commit order within each)."""
        return [c for changes in self.tables.values()
                for c in (changes.changes() if isinstance(changes, arrowcompact.Compacted) else changes)]


def raw_changes(part: pa.Table, decoders: dict[int, rawcompact.ImageDecoder]) -> list[rawcompact.RawChange]:
    """The rows of ``part`` as ``rawcompact`` changes (commit order)."""
    cols = [part.column(c).to_pylist() for c in ("op", "before", "after", "commit_ts", "seq", "table_id")]
    return [(op, b, a, ts, seq, decoders[tid]) for op, b, a, ts, seq, tid in zip(*cols, strict=True)]



class Batcher:
    """Cuts one apply run's windows into batches for a task (its rules, the lake's
    DDL history); one per run."""

    def __init__(self, task_rules: rules.Rules, history: decode.SchemaHistory, ddl_rows: list[dict[str, Any]]
                 ) -> None:
        self.rules = task_rules
        self.history = history
        self.ddl_rows = ddl_rows
        # id(source definition) -> (it, its target definition): routed once per definition.
        self._tinfo: dict[int, tuple[binlog_pb2.TableInfo, binlog_pb2.TableInfo]] = {}

    def batches(self, rows: WindowRows, lo: int, hi: int, summary: ApplySummary, safe: bool) -> list[Batch]:
        """The window ``[lo, hi)`` (its ``rows``) cut at its DDLs into batches;
        what they hold and filter out is counted in ``summary``."""
        ddls = [d for d in self.ddl_rows if lo <= int(d["commit_ts"]) < hi]
        data, stamps, skip, i, stop = rows
        batches: list[Batch] = []
        cuts = [int(d["commit_ts"]) for d in ddls] + [hi]
        for j, end in enumerate(cuts):
            batch = Batch(end, {}, {}, ddls[j] if j < len(ddls) else None, compacted=not safe)
            # the changes before the DDL (or the end)
            k = i + int(np.searchsorted(stamps[i:stop], end, "left"))
            if k > i:
                self._fill(batch, data.slice(i, k - i), skip, summary, safe)
            i = k
            batches.append(batch)
        return batches

    def _fill(self, batch: Batch, part: pa.Table, skip: set[tuple[int, int]], summary: ApplySummary,
              safe: bool) -> None:
        """The changes in ``part`` (a slice of the window with no DDL in it) into
        ``batch``: filtered, routed, and per target table compacted (normal mode)
        or decoded in commit order (safe mode, which deletes every key a batch
        touches).

        The filters and routes are decided once per table id (no DDL inside a
        batch: one definition for all of it) and applied as Arrow masks; a target
        table fed by one source table is compacted as Arrow arrays
        (``arrowcompact``), anything it refuses by ``rawcompact`` in Python."""
        ids = part.column("table_id")
        ops = part.column("op")
        stamps = part.column("commit_ts")
        keep_all = np.zeros(part.num_rows, dtype=bool)
        if skip:  # expression filters: few windows have them, a Python pass is fine
            skipped = np.fromiter(((t, q) in skip for t, q in zip(stamps.to_pylist(), part.column("seq").to_pylist(),
                                                                  strict=True)), dtype=bool, count=part.num_rows)
        else:
            skipped = None
        # target table -> [(table id, decoder, its rows in ``part``)], in order of first appearance
        targets: dict[str, list[tuple[int, rawcompact.ImageDecoder, np.ndarray]]] = {}
        for table_id in pc.unique(ids).to_pylist():
            rows = pc.equal(ids, table_id)
            first = int(pc.index(ids, table_id).as_py())
            dec, name, ignored = self._table_entry(batch, table_id, int(stamps[first].as_py()))
            if dec is None:
                continue
            if ignored:
                rows = pc.and_(rows, pc.invert(pc.is_in(ops, pa.array(sorted(ignored), pa.string()))))
            mask = rows.to_numpy(zero_copy_only=False)
            if skipped is not None:
                mask = mask & ~skipped
            keep_all |= mask
            targets.setdefault(name, []).append((table_id, dec, mask))
        kept = int(keep_all.sum())
        summary.filtered += part.num_rows - kept
        if kept:
            counts = pc.value_counts(ops.filter(pa.array(keep_all)))
            summary.changes_by_op.update({str(v["values"]): int(v["counts"]) for v in counts.to_pylist()})
        for name, sources in targets.items():
            if len(sources) == 1:
                mask = sources[0][2]
            else:
                mask = np.logical_or.reduce([m for _t, _d, m in sources])
            if not mask.any():
                continue
            sub = part.filter(pa.array(mask))
            keyed = bool(key_names(batch.infos[name]))
            if not safe and keyed and len(sources) == 1:
                try:
                    batch.tables[name] = arrowcompact.compact(name, sub.select(arrowcompact.COLUMNS), sources[0][1])
                    continue
                except (arrowcompact.Unsupported, pa.ArrowInvalid):
                    pass  # rawcompact gives the same result (or the clear error) the slow way
            raw = raw_changes(sub, {t: d for t, d, _m in sources})
            if safe:
                batch.tables[name] = rawcompact.decode_all(name, raw)
            else:
                batch.tables[name] = rawcompact.compact(name, raw, keyed)

    def _table_entry(self, batch: Batch, table_id: int, ts: int
                     ) -> tuple[rawcompact.ImageDecoder | None, str, frozenset[str]]:
        """(decoder, target table, ignored ops) of a table id; no decoder when the
        task does not replicate the table."""
        info = self.history.table(table_id, ts)
        if not self.rules.replicated(info.db, info.name):
            return None, "", frozenset()
        ignored = frozenset(op for op in (INSERT, UPDATE, DELETE) if op in self.rules.ignored(info.db, info.name))
        tinfo = self._target_info(info)
        place = self.rules.place(info.db, info.name)
        batch.infos[tinfo.name] = tinfo
        extract = (place.extract_column, place.extract_value) if place.extract_column else None
        return rawcompact.ImageDecoder(info, key_names(tinfo), extract), tinfo.name, ignored

    def _target_info(self, info: binlog_pb2.TableInfo) -> binlog_pb2.TableInfo:
        cached = self._tinfo.get(id(info))
        if cached is None or cached[0] is not info:
            cached = (info, self.rules.target_info(info))
            self._tinfo[id(info)] = cached
        return cached[1]

    def ddl_change(self, ddl: dict[str, Any]) -> DDLChange | None:
        """(kind, new target definition, old target definition) of a DDL row, or None
        when the task does not replicate it."""
        raw = ddl.get("table_info")
        if not raw:
            return None
        info = binlog_pb2.TableInfo.FromString(bytes(raw))
        ts = int(ddl["commit_ts"])
        prev_id = info.previous_table_id or info.table_id
        try:
            old = self.history.table(prev_id, ts)
        except decode.UnknownTableError:
            old = None
        kind = rules.ddl_kind(old, info)
        name_db = (old.db, old.name) if kind == "drop table" and old is not None else (info.db, info.name)
        if not self.rules.replicated(*name_db) or kind in self.rules.ignored(*name_db):
            return None
        new_t = self.rules.target_info(info)
        old_t = self.rules.target_info(old) if old is not None else None
        if kind == "drop table":
            new_t = old_t if old_t is not None else new_t
        return kind, new_t, old_t
