"""The planning scan of a window (``index_window``) and DDL scanning (``scan_ddls``).

Why a scan before the read: a DDL goes to one Pump, but the transactions after
it that need its definition may be on any other Pump, so no partition can
decode its own Pump's rows before every DDL of the window is known. The same
scan finds transactions two Pumps hold (a prewrite retried after a failed
write; same start_ts and commit_ts): each is emitted by the Pump with the
lowest id only, so duplicates are dropped without a shuffle. It reads the
window's binlogs once more (without decoding rows); ``ingest`` runs it once in
the driver and hands the result to the read (``WindowIndex.to_json()``).

Memory: the scan runs in the ingest's own process, so what it keeps must not
grow with the window's transactions. Every Pump serves its window in
(commit_ts, start_ts) order, so the scan merges the Pumps' streams (each read
ahead by a thread, a bounded queue of transaction summaries) and decides every
transaction as it passes: the two copies of a duplicate are neighbours in the
merge. It keeps running counts (per Pump, per table), the DDLs, the duplicates
(rare: a retried prewrite) and a bounded number of candidate partition bounds
per Pump (``_SplitPoints``).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import dataclasses
import heapq
import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import cast

from binlake import errors, handoff
from binlake.lake.decoding.txn import parse_prewrite
from binlake.lake.pumps.planner import check_window
from binlake.lake.pumps.pump_pull import pull_resumable
from binlake.proto import binlog_pb2

# A Pump's reading thread hands the merge its transaction summaries in chunks of
# this many (a queue operation per chunk, not per transaction), and may be at most
# READ_AHEAD chunks ahead of it.
CHUNK = 256
READ_AHEAD = 4
# Candidate partition bounds a Pump keeps at most (and 8 per requested partition,
# when more): when there would be more, each candidate part doubles in rows.
SPLIT_CANDIDATES = 1024


@dataclasses.dataclass
class WindowIndex:
    """What one pass over a window's transactions finds, without decoding rows.

    Its size does not grow with the window's transactions: counts, the DDLs, the
    duplicates and at most ``SPLIT_CANDIDATES`` bounds per Pump."""

    start_ts: int
    end_ts: int
    ddls: list[tuple[str, binlog_pb2.Binlog]] = dataclasses.field(default_factory=list)  # (pump, txn), commit order
    txns: dict[str, int] = dataclasses.field(default_factory=dict)  # per Pump, duplicates excluded
    rows: dict[str, int] = dataclasses.field(default_factory=dict)  # row changes per Pump, duplicates excluded
    skip: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # Pump -> start_ts it must not emit
    tables: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # table id -> first/last commit_ts
    splits: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # Pump -> inner partition bounds
    # (commit_ts, table id, inserts, updates, deletes), duplicates excluded: one per
    # table and stretch between two DDLs of that table in the window, at the stretch's
    # first commit_ts. A table's name changes only at its DDLs, so this names every
    # row change of the stretch as it was named when it committed.
    table_counts: list[tuple[int, int, int, int, int]] = dataclasses.field(default_factory=list)
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
    for index in indexes:  # in commit_ts order, so ddls, skips, splits and counts stay sorted
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
        out.table_counts.extend(index.table_counts)
        out.duplicates += index.duplicates
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class TxnSummary:
    """What the scan needs of one transaction: no row is decoded."""

    commit_ts: int
    start_ts: int
    rows: int  # row changes
    mutations: tuple[tuple[int, int, int, int], ...]  # (table id, inserts, updates, deletes) per table mutation
    ddl: binlog_pb2.Binlog | None  # the transaction itself when it is a DDL

    @classmethod
    def of(cls, txn: binlog_pb2.Binlog) -> TxnSummary:
        value = parse_prewrite(txn)
        return cls(txn.commit_ts, txn.start_ts, sum(len(m.sequence) for m in value.mutations),
                   tuple((m.table_id, len(m.inserted_rows), len(m.updated_rows), len(m.deleted_rows))
                         for m in value.mutations),
                   txn if txn.ddl_query else None)


class _SplitPoints:
    """Candidate partition bounds of one Pump's window, found as its transactions
    pass, at most ``cap`` of them whatever the window's size.

    A candidate is a commit_ts at which a part may end (never between two
    transactions of one commit_ts) after at least ``grain`` row changes. The grain
    starts at one row change (every transaction bound is a candidate) and doubles,
    merging neighbouring parts, whenever there would be more than ``cap``: so a
    part's rows stay within a grain of what ``bounds`` is asked for once the
    window's total is known."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.grain = 1
        self.parts: list[tuple[int, int]] = []  # (bound commit_ts, row changes of the part before it)
        self.acc = 0  # row changes since the last candidate
        self.last_ts = -1  # commit_ts of this Pump's previous transaction (a duplicate copy included)

    def add(self, commit_ts: int, rows: int, emitted: bool) -> None:
        """The Pump's next transaction (``emitted`` False: a duplicate copy it skips)."""
        if emitted:
            if self.acc >= self.grain and commit_ts > self.last_ts:
                self.parts.append((commit_ts, self.acc))
                self.acc = 0
                if len(self.parts) > self.cap:
                    self.grain *= 2
                    self.parts, carried = _coarsen(self.parts, self.grain)
                    self.acc += carried
            self.acc += rows
        self.last_ts = commit_ts

    def bounds(self, rows_per_split: int) -> list[int]:
        """commit_ts bounds after every ~``rows_per_split`` row changes."""
        return [ts for ts, _rows in _coarsen(self.parts, rows_per_split)[0]]


def _coarsen(parts: list[tuple[int, int]], rows: int) -> tuple[list[tuple[int, int]], int]:
    """The bounds of ``parts`` that end parts of at least ``rows`` row changes (each
    dropped bound's rows join the next part), and the rows after the last bound kept."""
    kept: list[tuple[int, int]] = []
    acc = 0
    for ts, n in parts:
        acc += n
        if acc >= rows:
            kept.append((ts, acc))
            acc = 0
    return kept, acc


class _TableCounts:
    """Running row-change counts per table and stretch between two of its DDLs
    (``WindowIndex.table_counts``)."""

    def __init__(self) -> None:
        # table id -> (commit_ts of its latest DDL seen, of the one before it)
        self.ddl_ts: dict[int, tuple[int, int]] = {}
        # (table id, stretch) -> [first commit_ts, inserts, updates, deletes]
        self.counts: dict[tuple[int, int], list[int]] = {}

    def ddl(self, txn: binlog_pb2.Binlog) -> None:
        if not txn.HasField("ddl_table"):
            return
        info = txn.ddl_table
        for table_id in (info.table_id, info.previous_table_id):  # TRUNCATE retires the id it replaces
            if table_id:
                last, prev = self.ddl_ts.get(table_id, (-1, -1))
                if txn.commit_ts > last:
                    self.ddl_ts[table_id] = (txn.commit_ts, last)

    def add(self, commit_ts: int, table_id: int, ins: int, upd: int, dele: int) -> None:
        # A transaction uses the definitions of DDLs committed strictly before it
        # (SchemaHistory.table); a DDL of the same commit_ts may come later in the merge.
        last, prev = self.ddl_ts.get(table_id, (-1, -1))
        stretch = last if last < commit_ts else prev
        c = self.counts.get((table_id, stretch))
        if c is None:
            self.counts[(table_id, stretch)] = [commit_ts, ins, upd, dele]
        else:
            c[1] += ins
            c[2] += upd
            c[3] += dele

    def rows(self) -> list[tuple[int, int, int, int, int]]:
        return sorted((c[0], table_id, c[1], c[2], c[3]) for (table_id, _s), c in self.counts.items())


def index_window(addrs: Mapping[str, str], start_ts: int, end_ts: int, *,
                 partitions: int | None = None, min_rows_per_partition: int = 20_000) -> WindowIndex:
    """Scan ``[start_ts, end_ts)`` on every Pump (``node id -> addr``) at once.

    Finds the window's DDLs, the transactions two Pumps hold (kept on the Pump
    with the lowest id: the others list them in ``skip``) and the commit_ts
    range each table id is used in. With ``partitions``, it also cuts each
    Pump's window (at transaction bounds) into parts of about total rows /
    ``partitions`` row changes (at least ``min_rows_per_partition``), so the
    read's tasks are of even size whatever the Pumps' shares.
    """
    if not addrs:
        raise errors.InvalidArgument("index_window needs at least one pump")
    _check_partitions(partitions, min_rows_per_partition)
    check_window(start_ts, end_ts)
    with _read_ahead({p: _pump_reader(p, addrs[p], start_ts, end_ts) for p in addrs}) as streams:
        return _index(start_ts, end_ts, streams, partitions, min_rows_per_partition)


def index_streams(start_ts: int, end_ts: int, streams: Mapping[str, Iterable[binlog_pb2.Binlog]], *,
                  partitions: int | None = None, min_rows_per_partition: int = 20_000) -> WindowIndex:
    """``index_window`` of Pump streams already open (``pump id -> its window's
    transactions in (commit_ts, start_ts) order``), read in this thread."""
    if not streams:
        raise errors.InvalidArgument("index_streams needs at least one pump")
    _check_partitions(partitions, min_rows_per_partition)
    check_window(start_ts, end_ts)
    return _index(start_ts, end_ts, {p: map(TxnSummary.of, s) for p, s in streams.items()},
                  partitions, min_rows_per_partition)


def _check_partitions(partitions: int | None, min_rows_per_partition: int) -> None:
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    if min_rows_per_partition < 1:
        raise ValueError(f"min_rows_per_partition must be >= 1, got {min_rows_per_partition}")


def _index(start_ts: int, end_ts: int, streams: Mapping[str, Iterator[TxnSummary]], partitions: int | None,
           min_rows_per_partition: int) -> WindowIndex:
    """The merge: every transaction of every Pump once, in (commit_ts, start_ts,
    pump id) order, so the lowest pump id's copy of a duplicate comes first."""
    pumps = sorted(streams)
    index = WindowIndex(start_ts, end_ts)
    index.txns = dict.fromkeys(pumps, 0)
    index.rows = dict.fromkeys(pumps, 0)
    cap = max(SPLIT_CANDIDATES, 8 * partitions) if partitions else 0
    points = {p: _SplitPoints(cap) for p in pumps} if partitions else {}
    counts = _TableCounts()
    last_key: dict[str, tuple[int, int]] = {}
    heap: list[tuple[int, int, int, TxnSummary]] = []

    def pull(rank: int) -> None:
        pump = pumps[rank]
        txn = next(streams[pump], None)
        if txn is None:
            return
        key = (txn.commit_ts, txn.start_ts)
        if pump in last_key and key <= last_key[pump]:
            raise errors.FailedPrecondition(
                f"pump {pump} served transaction start_ts {txn.start_ts} (commit_ts {txn.commit_ts}) after "
                f"start_ts {last_key[pump][1]} (commit_ts {last_key[pump][0]}): not in commit order")
        last_key[pump] = key
        heapq.heappush(heap, (txn.commit_ts, txn.start_ts, rank, txn))

    for rank in range(len(pumps)):
        pull(rank)
    previous: tuple[int, int] | None = None
    while heap:
        commit_ts, start, rank, txn = heapq.heappop(heap)
        pull(rank)
        pump = pumps[rank]
        emitted = (commit_ts, start) != previous
        previous = (commit_ts, start)
        if points:
            points[pump].add(commit_ts, txn.rows, emitted)
        if not emitted:  # a copy of the transaction a lower pump id holds
            index.skip.setdefault(pump, []).append(start)
            index.duplicates += 1
            continue
        index.txns[pump] += 1
        index.rows[pump] += txn.rows
        if txn.ddl is not None:
            index.ddls.append((pump, txn.ddl))
            counts.ddl(txn.ddl)
        for table_id, ins, upd, dele in txn.mutations:
            counts.add(commit_ts, table_id, ins, upd, dele)
            seen = index.tables.get(table_id)
            index.tables[table_id] = (commit_ts, commit_ts) if seen is None else (seen[0], commit_ts)
    if partitions and index.total_rows:
        rows_per_split = max(min_rows_per_partition, -(-index.total_rows // partitions))
        for pump in pumps:
            if index.rows[pump] > rows_per_split:
                index.splits[pump] = points[pump].bounds(rows_per_split)
    index.table_counts = counts.rows()
    return index


def _pump_reader(pump: str, addr: str, start_ts: int, end_ts: int) -> Callable[[], Iterator[TxnSummary]]:
    return lambda: map(TxnSummary.of, pull_resumable(pump, addr, start_ts, end_ts))


_END = object()


@contextlib.contextmanager
def _read_ahead(readers: Mapping[str, Callable[[], Iterator[TxnSummary]]]) -> Iterator[dict[str, Iterator[TxnSummary]]]:
    """Each reader's summaries, read by a thread of its own at most ``READ_AHEAD``
    chunks ahead of the consumer (the Pumps' reads overlap; memory stays bounded).
    On leaving, the threads stop at their next chunk."""
    stop = threading.Event()
    queues: dict[str, queue.Queue[object]] = {p: queue.Queue(READ_AHEAD) for p in readers}

    def produce(pump: str) -> None:
        q = queues[pump]
        try:
            chunk: list[TxnSummary] = []
            for txn in readers[pump]():
                chunk.append(txn)
                if len(chunk) >= CHUNK:
                    if not handoff.put_until(q, chunk, stop):
                        return
                    chunk = []
            if chunk and not handoff.put_until(q, chunk, stop):
                return
        except BaseException as exc:  # handed to the consumer, which raises it
            handoff.put_until(q, exc, stop)
            return
        handoff.put_until(q, _END, stop)

    def consume(q: queue.Queue[object]) -> Iterator[TxnSummary]:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield from cast(list[TxnSummary], item)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(readers), thread_name_prefix="binlake-scan") as pool:
        try:
            for pump in readers:
                pool.submit(produce, pump)
            yield {p: consume(q) for p, q in queues.items()}
        finally:
            stop.set()


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
