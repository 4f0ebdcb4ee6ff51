"""The planning scan of a window (``index_window``) and DDL scanning (``scan_ddls``).

Why a scan before the read: a DDL goes to one Pump, but the transactions after
it that need its definition may be on any other Pump, so no partition can
decode its own Pump's rows before every DDL of the window is known. The same
scan finds transactions two Pumps hold (a prewrite retried after a failed
write; same start_ts and commit_ts): each is emitted by the Pump with the
lowest id only, so duplicates are dropped without a shuffle. It reads the
window's binlogs once more (without decoding rows); ``ingest`` runs it once in
the driver and hands the result to the read (``WindowIndex.to_json()``).
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import json
from collections.abc import Mapping

from binlake import errors
from binlake.lake.decoding.txn import parse_prewrite
from binlake.lake.pumps.planner import check_window
from binlake.lake.pumps.pump_pull import pull_resumable
from binlake.proto import binlog_pb2


@dataclasses.dataclass
class WindowIndex:
    """What one pass over a window's transactions finds, without decoding rows."""

    start_ts: int
    end_ts: int
    ddls: list[tuple[str, binlog_pb2.Binlog]] = dataclasses.field(default_factory=list)  # (pump, txn), commit order
    txns: dict[str, int] = dataclasses.field(default_factory=dict)  # per Pump, duplicates excluded
    rows: dict[str, int] = dataclasses.field(default_factory=dict)  # row changes per Pump, duplicates excluded
    skip: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # Pump -> start_ts it must not emit
    tables: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # table id -> first/last commit_ts
    splits: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # Pump -> inner partition bounds
    # (commit_ts, table id, inserts, updates, deletes) of every mutation, duplicates excluded:
    # enough to count rows per table name and op once the window's DDLs are known.
    mutations: list[tuple[int, int, int, int, int]] = dataclasses.field(default_factory=list)
    duplicates: int = 0

    @property
    def total_txns(self) -> int:
        return sum(self.txns.values())

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def to_json(self) -> str:
        """The parts a read needs (DDLs, skips, splits) as the ``window_index`` option."""
        return json.dumps({
            "start_ts": self.start_ts, "end_ts": self.end_ts,
            "ddls": [[pump, base64.b64encode(b.SerializeToString()).decode()] for pump, b in self.ddls],
            "skip": self.skip, "splits": self.splits,
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> WindowIndex:
        try:
            doc = json.loads(text)
            index = cls(int(doc["start_ts"]), int(doc["end_ts"]))
            index.ddls = [(str(p), binlog_pb2.Binlog.FromString(base64.b64decode(raw))) for p, raw in doc["ddls"]]
            index.skip = {str(k): [int(x) for x in v] for k, v in doc.get("skip", {}).items()}
            index.splits = {str(k): [int(x) for x in v] for k, v in doc.get("splits", {}).items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.InvalidArgument(f"window_index is not what WindowIndex.to_json() writes: {exc}") from None
        return index


def merge_consecutive(indexes: list[WindowIndex]) -> WindowIndex:
    """One index for consecutive windows (each one's end the next one's start), as
    if ``[first start, last end)`` had been scanned at once: what one read of
    several windows in one Spark job needs. Each window keeps its own index for
    its ledger row."""
    if not indexes:
        raise ValueError("merge_consecutive needs at least one window index")
    for a, b in zip(indexes, indexes[1:], strict=False):
        if a.end_ts != b.start_ts:
            raise ValueError(f"windows [{a.start_ts}, {a.end_ts}) and [{b.start_ts}, {b.end_ts}) are not consecutive")
    if len(indexes) == 1:
        return indexes[0]
    out = WindowIndex(indexes[0].start_ts, indexes[-1].end_ts)
    for index in indexes:  # in commit_ts order, so ddls, skips, splits and mutations stay sorted
        out.ddls.extend(index.ddls)
        for pump, n in index.txns.items():
            out.txns[pump] = out.txns.get(pump, 0) + n
        for pump, n in index.rows.items():
            out.rows[pump] = out.rows.get(pump, 0) + n
        for pump, starts in index.skip.items():
            out.skip.setdefault(pump, []).extend(starts)
        for pump, bounds in index.splits.items():
            out.splits.setdefault(pump, []).extend(bounds)
        for table_id, (lo, hi) in index.tables.items():
            seen = out.tables.get(table_id)
            out.tables[table_id] = (lo, hi) if seen is None else (min(seen[0], lo), max(seen[1], hi))
        out.mutations.extend(index.mutations)
        out.duplicates += index.duplicates
    return out


@dataclasses.dataclass
class _PumpScan:
    txns: list[tuple[int, int, int]]  # (commit_ts, start_ts, row changes)
    ddls: list[binlog_pb2.Binlog]
    mutations: dict[int, list[tuple[int, int, int, int, int]]]  # start_ts -> its mutations' counts


def _scan_pump(node_id: str, addr: str, start_ts: int, end_ts: int) -> _PumpScan:
    scan = _PumpScan([], [], {})
    for txn in pull_resumable(node_id, addr, start_ts, end_ts):
        if txn.ddl_query:
            scan.ddls.append(txn)
        value = parse_prewrite(txn)
        muts = [(txn.commit_ts, m.table_id, len(m.inserted_rows), len(m.updated_rows), len(m.deleted_rows))
                for m in value.mutations]
        if muts:
            scan.mutations[txn.start_ts] = muts
        scan.txns.append((txn.commit_ts, txn.start_ts, sum(len(m.sequence) for m in value.mutations)))
    return scan


def index_window(addrs: Mapping[str, str], start_ts: int, end_ts: int, *,
                 partitions: int | None = None, min_rows_per_partition: int = 20_000) -> WindowIndex:
    """Scan ``[start_ts, end_ts)`` on every Pump (``node id -> addr``) in parallel.

    Finds the window's DDLs, the transactions two Pumps hold (kept on the Pump
    with the lowest id: the others list them in ``skip``) and the commit_ts
    range each table id is used in. With ``partitions``, it also cuts each
    Pump's window (at transaction bounds) into parts of about total rows /
    ``partitions`` row changes (at least ``min_rows_per_partition``), so the
    read's tasks are of even size whatever the Pumps' shares.
    """
    if not addrs:
        raise errors.InvalidArgument("index_window needs at least one pump")
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    if min_rows_per_partition < 1:
        raise ValueError(f"min_rows_per_partition must be >= 1, got {min_rows_per_partition}")
    check_window(start_ts, end_ts)
    pumps = sorted(addrs)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(pumps), thread_name_prefix="binlake-scan") as pool:
        futures = {p: pool.submit(_scan_pump, p, addrs[p], start_ts, end_ts) for p in pumps}
        scans = {p: f.result() for p, f in futures.items()}
    index = WindowIndex(start_ts, end_ts)
    owner: dict[int, str] = {}
    for pump in pumps:  # sorted: the lowest pump id claims a transaction first
        scan = scans[pump]
        skipped: list[int] = []
        txns = rows = 0
        for _commit_ts, start, n in scan.txns:
            if start in owner:
                skipped.append(start)
                index.duplicates += 1
                continue
            owner[start] = pump
            txns += 1
            rows += n
        index.txns[pump] = txns
        index.rows[pump] = rows
        if skipped:
            index.skip[pump] = skipped
        for ddl in scan.ddls:
            if owner.get(ddl.start_ts) == pump:
                index.ddls.append((pump, ddl))
        for start, muts in scan.mutations.items():
            if owner.get(start) != pump:
                continue
            index.mutations.extend(muts)
            for commit_ts, table_id, *_ in muts:
                seen = index.tables.get(table_id)
                index.tables[table_id] = (commit_ts, commit_ts) if seen is None else (
                    min(seen[0], commit_ts), max(seen[1], commit_ts))
    if partitions and index.total_rows:
        rows_per_split = max(min_rows_per_partition, -(-index.total_rows // partitions))
        for pump in pumps:
            if index.rows[pump] > rows_per_split:
                index.splits[pump] = _splits(scans[pump].txns, set(index.skip.get(pump, ())), rows_per_split)
    index.ddls.sort(key=lambda item: (item[1].commit_ts, item[1].start_ts))
    index.mutations.sort()
    return index


def _splits(txns: list[tuple[int, int, int]], skipped: set[int], rows_per_split: int) -> list[int]:
    """commit_ts bounds after every ~rows_per_split row changes (never inside a transaction)."""
    bounds: list[int] = []
    acc = 0
    for i, (commit_ts, start, n) in enumerate(txns):
        if start in skipped:
            continue
        if acc >= rows_per_split and commit_ts > (bounds[-1] if bounds else -1) and i > 0 \
                and txns[i - 1][0] < commit_ts:
            bounds.append(commit_ts)
            acc = 0
        acc += n
    return bounds


def scan_ddls(addrs: Mapping[str, str], ranges: list[tuple[str, int, int]]) -> list[binlog_pb2.Binlog]:
    """The DDL transactions of ``(pump, start_ts, end_ts)`` ranges (deduplicated, commit order)."""
    found: dict[int, binlog_pb2.Binlog] = {}

    def one(pump: str, lo: int, hi: int) -> list[binlog_pb2.Binlog]:
        return [t for t in pull_resumable(pump, addrs[pump], lo, hi) if t.ddl_query]

    if not ranges:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(ranges)),
                                               thread_name_prefix="binlake-ddl") as pool:
        for ddls in pool.map(lambda r: one(*r), ranges):
            for t in ddls:
                found.setdefault(t.start_ts, t)
    return sorted(found.values(), key=lambda t: (t.commit_ts, t.start_ts))
