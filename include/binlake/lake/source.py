"""The Spark data source ``binlake``: a commit_ts window read from every Pump.

Usage (``register(spark)`` once per session)::

    spark.read.format("binlake")
        .option("registry", "127.0.0.1:8230")
        .option("start_ts", a).option("end_ts", b)
        .load()                       # change rows (CHANGE_COLUMNS)

Options (all strings, as Spark passes them):

``registry``        registry HOST:PORT (required)
``start_ts``        window start, inclusive, a TSO (required)
``end_ts``          window end, exclusive, a TSO (required)
``pumps``           comma-separated Pump ids to read (default: every Pump the
                    registry says may hold the window)
``kind``            ``changes`` (default) or ``ddl`` (``DDL_COLUMNS`` rows)
``sub_window``      split each Pump's window into sub-windows of this many ts
                    (one input partition each; default: one per Pump)
``schema_history``  the table definitions in force at ``start_ts``, as
                    ``SchemaHistory.to_json()`` (JSON of ``[commit_ts,
                    base64(TableInfo)]`` pairs). Default: none, which only
                    works when every table of the window is created in it.
``window_index``    what ``index_window`` found (``WindowIndex.to_json()``):
                    the window's DDLs, duplicate transactions and partition
                    splits. Default: the reader scans the window itself.

Planning (``partitions()``) asks the registry which Pumps to read
(``planner.plan_window``) and checks each one directly (``check_pumps``): an
unreachable Pump, a safe ts below the window end or a GC ts above the window
start fails the read with a message naming the Pump and the ts. Each input
partition streams one Pump's (sub-)window with ``reader.pull_pump`` and yields
Arrow record batches.

Why a scan before the read (``index_window``): a DDL goes to one Pump, but
the transactions after it that need its definition may be on any other Pump,
so no partition can decode its own Pump's rows before every DDL of the window
is known. The same scan finds transactions two Pumps hold (a prewrite retried
after a failed write; same start_ts and commit_ts): each is emitted by the
Pump with the lowest id only, so duplicates are dropped without a shuffle.
It reads the window's binlogs once more (without decoding rows); ``ingest``
runs it once in the driver and hands the result to the read.
"""

from __future__ import annotations

import array
import base64
import concurrent.futures
import dataclasses
import json
import logging
import re
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from binlake import errors, rpc, tso
from binlake.lake.change_decoder import ChangeDecoder
from binlake.lake.ddl_rows import ddl_row
from binlake.lake.native import StringColumn
from binlake.lake.planner import WindowPlan, check_window, plan_window
from binlake.lake.rows import CHANGE_COLUMNS, CHANGES_DDL, DDL_COLUMNS, DDL_HISTORY_DDL
from binlake.lake.schema_history import SchemaHistory, UnknownTableError
from binlake.lake.txn import CorruptBinlogError, parse_prewrite
from binlake.proto import binlog_pb2, pump_pb2, pump_pb2_grpc
from binlake.window import Readiness, gone_error, readiness, waiting_error

if TYPE_CHECKING:
    # pyspark is heavy; type checkers see it, runtime imports it where a session is used.
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FORMAT = "binlake"
KINDS = ("changes", "ddl")
# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch
# cost, small enough to keep a partition's memory bounded (~10 MB of images).
BATCH_ROWS = 16_384
STATUS_TIMEOUT_S = 5.0
# Arrow buffers are little-endian: machine integers are wrapped as they are only there.
_LITTLE_ENDIAN = sys.byteorder == "little"

try:  # pyspark is only needed where Spark runs the source, not to plan or scan
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - binlake without pyspark (e.g. on a Pump host)
    DataSource = DataSourceReader = InputPartition = object  # type: ignore[misc,assignment]


# ---------------------------------------------------------------- planning
def pump_statuses(plan: WindowPlan, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, pump_pb2.StatusResp]:
    """Every planned Pump's own Status; Unavailable naming the Pump when one does not answer."""
    out: dict[str, pump_pb2.StatusResp] = {}
    for node in plan.pumps:
        with rpc.channel(node.addr, rpc.client_options(16 << 20)) as channel:
            try:
                out[node.node_id] = pump_pb2_grpc.PumpStub(channel).Status(pump_pb2.StatusReq(), timeout=timeout_s)
            except grpc.RpcError as exc:
                raise errors.Unavailable(
                    f"pump {node.node_id} at {node.addr} is unreachable ({exc.code().name}: {exc.details()}); "
                    f"it may hold transactions of [{plan.start_ts}, {plan.end_ts}), which cannot be read "
                    "without it") from None
    return out


def check_pumps(plan: WindowPlan, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, pump_pb2.StatusResp]:
    """Ask every planned Pump itself (not the registry's last heartbeat) whether it
    can serve the window; raise naming the Pump and the ts when one cannot."""
    out = pump_statuses(plan, timeout_s)
    for node in plan.pumps:
        st = out[node.node_id]
        state = readiness(plan.window, st.safe_ts, st.gc_ts)
        if state is Readiness.GONE:
            raise gone_error(plan.window, node.node_id, st.gc_ts)
        if state is Readiness.WAITING:
            raise waiting_error(plan.window, node.node_id, st.safe_ts)
    return out


def plan_read(registry: str, start_ts: int, end_ts: int, pumps: list[str] | None = None) -> WindowPlan:
    """The Pumps to read for ``[start_ts, end_ts)``, each checked to be able to serve it."""
    plan = plan_window(registry, start_ts, end_ts, pumps)
    if not plan.pumps:
        raise errors.NotFound(f"no pumps are registered with {registry} for window [{start_ts}, {end_ts})")
    check_pumps(plan)
    return plan


# ---------------------------------------------------------------- reading a Pump
_TRANSIENT = (errors.Unavailable, errors.DeadlineExceeded)
PULL_ATTEMPTS = 4


def pull_resumable(pump: str, addr: str, start_ts: int, end_ts: int,
                   attempts: int = PULL_ATTEMPTS) -> Iterator[binlog_pb2.Binlog]:
    """``reader.pull_pump``, resumed after a transient failure (a Pump restarting, a
    connection timing out on a loaded host): a window is served in (commit_ts,
    start_ts) order, so the retry starts at the last transaction handed out and
    skips what was already given. Refusals (safe ts, GC ts) are not retried."""
    from binlake.client.reader import pull_pump

    last: tuple[int, int] | None = None
    for attempt in range(1, attempts + 1):
        try:
            for txn in pull_pump(addr, start_ts if last is None else last[0], end_ts, node_id=pump):
                key = (txn.commit_ts, txn.start_ts)
                if last is not None and key <= last:
                    continue
                yield txn
                last = key
            return
        except _TRANSIENT as exc:
            if attempt == attempts:
                raise
            log.warning("pump %s: %s; retrying (%d/%d)", pump, exc, attempt, attempts - 1)
            time.sleep(0.5 * 2 ** (attempt - 1))


# ---------------------------------------------------------------- the scan
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


# ---------------------------------------------------------------- options
@dataclasses.dataclass(frozen=True)
class ReadOptions:
    registry: str
    start_ts: int
    end_ts: int
    pumps: list[str] | None = None
    kind: str = "changes"
    sub_window: int | None = None
    schema_history: str = ""
    window_index: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Validate the data source's options; InvalidArgument names the bad one."""
        opts = {str(k).lower(): v for k, v in options.items()}
        known = {"registry", "start_ts", "end_ts", "pumps", "kind", "sub_window", "schema_history",
                 "window_index", "path"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise errors.InvalidArgument(
                f"binlake source: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known - {'path'}))}")
        registry = opts.get("registry") or ""
        if not registry:
            raise errors.InvalidArgument("binlake source: option 'registry' (HOST:PORT) is required")
        rpc.parse_addr(registry, "registry")

        def ts(name: str) -> int:
            raw = opts.get(name)
            if raw is None or str(raw).strip() == "":
                raise errors.InvalidArgument(f"binlake source: option '{name}' (a TSO) is required")
            try:
                value = int(str(raw).strip())
            except ValueError:
                raise errors.InvalidArgument(f"binlake source: option '{name}' must be an integer TSO, got {raw!r}") from None
            if not 0 <= value <= tso.MAX_TS:
                raise errors.InvalidArgument(f"binlake source: option '{name}' must be in [0, 2^63), got {value}")
            return value

        start_ts, end_ts = ts("start_ts"), ts("end_ts")
        if start_ts >= end_ts:
            raise errors.InvalidArgument(f"binlake source: window [{start_ts}, {end_ts}) is empty")
        pumps = None
        if opts.get("pumps"):
            pumps = [p.strip() for p in str(opts["pumps"]).split(",") if p.strip()]
            if not pumps:
                raise errors.InvalidArgument("binlake source: option 'pumps' lists no pump id")
        kind = str(opts.get("kind") or "changes").lower()
        if kind not in KINDS:
            raise errors.InvalidArgument(f"binlake source: option 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
        sub_window = None
        if opts.get("sub_window"):
            try:
                sub_window = int(str(opts["sub_window"]))
            except ValueError:
                sub_window = 0
            if sub_window <= 0:
                raise errors.InvalidArgument(
                    f"binlake source: option 'sub_window' must be a positive ts span, got {opts['sub_window']!r}")
        return cls(registry, start_ts, end_ts, pumps, kind, sub_window, opts.get("schema_history") or "",
                   opts.get("window_index") or "")


# ---------------------------------------------------------------- the data source
class PumpWindow(InputPartition):
    """One input partition: a Pump's sub-window, what to skip, how to decode."""

    def __init__(self, pump: str, addr: str, start_ts: int, end_ts: int, skip: list[int], history: str) -> None:
        self.pump = pump
        self.addr = addr
        self.start_ts = start_ts
        self.end_ts = end_ts
        self.skip = skip
        # Each partition carries the history: Spark pickles the reader before
        # partitions() runs, so nothing partitions() computes reaches read() otherwise.
        self.history = history

    def __repr__(self) -> str:
        return f"PumpWindow({self.pump}, [{self.start_ts}, {self.end_ts}))"


class DdlRows(InputPartition):
    """The window's DDL rows, found by the planning scan."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows


class BinlakeDataSource(DataSource):
    """``spark.read.format("binlake")``: see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        kind = ReadOptions.parse(self.options).kind
        return CHANGES_DDL if kind == "changes" else DDL_HISTORY_DDL

    def reader(self, schema: Any) -> BinlakeReader:
        return BinlakeReader(ReadOptions.parse(self.options))


class BinlakeReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[Any]:
        o = self.options
        plan = plan_read(o.registry, o.start_ts, o.end_ts, o.pumps)
        if o.window_index:
            index = WindowIndex.from_json(o.window_index)
            if (index.start_ts, index.end_ts) != (o.start_ts, o.end_ts):
                raise errors.InvalidArgument(
                    f"window_index is for [{index.start_ts}, {index.end_ts}), not the window read "
                    f"[{o.start_ts}, {o.end_ts})")
        else:
            index = index_window(plan.addrs, o.start_ts, o.end_ts)
        if o.kind == "ddl":
            return [DdlRows([ddl_row(t) for _pump, t in index.ddls])]
        history = SchemaHistory.from_json(o.schema_history) if o.schema_history else SchemaHistory()
        for _pump, ddl in index.ddls:
            history.apply(ddl)
        # Only what lookups at or after the window start can need travels to the executors.
        history_json = history.snapshot(o.start_ts).to_json()
        parts: list[Any] = []
        for node in plan.pumps:
            bounds = [o.start_ts]
            if index.splits.get(node.node_id):
                bounds += [b for b in index.splits[node.node_id] if o.start_ts < b < o.end_ts]
            elif o.sub_window:
                bounds += list(range(o.start_ts + o.sub_window, o.end_ts, o.sub_window))
            bounds.append(o.end_ts)
            skip = index.skip.get(node.node_id, [])
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                parts.append(PumpWindow(node.node_id, node.addr, lo, hi, skip, history_json))
        return parts

    def read(self, partition: Any) -> Iterator[Any]:
        if isinstance(partition, DdlRows):
            if partition.rows:
                yield _ddl_batch(partition.rows)
            return
        yield from read_changes(partition, SchemaHistory.from_json(partition.history))


def read_changes(part: PumpWindow, history: SchemaHistory, batch_rows: int = BATCH_ROWS) -> Iterator[Any]:
    """Stream one Pump's sub-window and yield its change rows as Arrow record batches."""
    decoder = ChangeDecoder(history, part.pump)
    skip = set(part.skip)
    for txn in pull_resumable(part.pump, part.addr, part.start_ts, part.end_ts):
        if txn.start_ts in skip:
            continue  # the lowest-id Pump holding this transaction emits it
        decoder.add(txn)
        if len(decoder) >= batch_rows:
            yield changes_batch(decoder.take())
    if len(decoder):
        yield changes_batch(decoder.take())


def _arrow_types() -> dict[str, Any]:
    import pyarrow as pa

    return {"long": pa.int64(), "int": pa.int32(), "date": pa.date32(), "string": pa.string(),
            "boolean": pa.bool_(), "binary": pa.binary()}


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


def _ddl_batch(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    types = _arrow_types()
    return pa.RecordBatch.from_arrays(
        [pa.array([r[name] for r in rows], types[kind]) for name, kind in DDL_COLUMNS],
        names=[n for n, _ in DDL_COLUMNS])


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("binlake")`` available in this session."""
    spark.dataSource.register(BinlakeDataSource)


# ---------------------------------------------------------------- errors out of Spark
_ERROR_LINE = re.compile(r"^binlake(?:\.\w+)*\.(\w+): (.+)$", re.MULTILINE)
# The decoding errors outside binlake.errors a worker may raise, by class name.
_DECODE_ERRORS: dict[str, type[errors.BinlakeError]] = {
    "CorruptBinlogError": CorruptBinlogError, "UnknownTableError": UnknownTableError}


def binlake_error(exc: BaseException) -> errors.BinlakeError | None:
    """The binlake error a failed Spark job carries (raised in a planner or executor
    Python worker), rebuilt as its class with its message; None when there is none."""
    matches = _ERROR_LINE.findall(str(exc))
    if not matches:
        return None
    name, message = matches[-1]
    cls = getattr(errors, name, None) or _DECODE_ERRORS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, errors.BinlakeError)):
        return None
    try:
        return cls(message.strip())
    except TypeError:  # an error class whose constructor takes more (UnknownTableError)
        return errors.FailedPrecondition(message.strip())
