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

The parts live in their own modules: ``read_options`` (the options),
``pump_check`` (planning: Pump status and readiness), ``pump_pull`` (resumable
pulls), ``window_index`` (the planning scan, ``scan_ddls``), ``arrow_batches``
(rows -> Arrow) and ``spark_errors`` (errors out of Spark). The names other code
has always read from here are re-exported below.

Why a scan before the read: see ``binlake.lake.pumps.window_index``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from binlake import errors
from binlake.lake.decoding.arrow_batches import BATCH_ROWS, changes_batch, ddl_batch
from binlake.lake.decoding.change_decoder import ChangeDecoder
from binlake.lake.decoding.ddl_rows import ddl_row
from binlake.lake.decoding.rows import CHANGES_DDL, DDL_HISTORY_DDL
from binlake.lake.decoding.schema_history import SchemaHistory
from binlake.lake.pumps.pump_check import STATUS_TIMEOUT_S, check_pumps, plan_read, pump_statuses
from binlake.lake.pumps.pump_pull import PULL_ATTEMPTS, pull_resumable
from binlake.lake.pumps.read_options import KINDS, ReadOptions
from binlake.lake.pumps.window_index import WindowIndex, index_window, scan_ddls
from binlake.lake.sparkenv.spark_errors import binlake_error

if TYPE_CHECKING:
    # pyspark is heavy; type checkers see it, runtime imports it where a session is used.
    from pyspark.sql import SparkSession

__all__ = [
    "BATCH_ROWS", "FORMAT", "KINDS", "PULL_ATTEMPTS", "STATUS_TIMEOUT_S", "BinlakeDataSource", "BinlakeReader",
    "DdlRows", "PumpWindow", "ReadOptions", "WindowIndex", "binlake_error", "changes_batch",
    "check_pumps", "index_window", "plan_read", "pull_resumable", "pump_statuses", "read_changes", "register",
    "scan_ddls",
]

# The name Spark knows the source by: spark.read.format(FORMAT).
FORMAT = "binlake"

try:  # pyspark is only needed where Spark runs the source, not to plan or scan
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - binlake without pyspark (e.g. on a Pump host)
    DataSource = DataSourceReader = InputPartition = object  # type: ignore[misc,assignment]


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
                yield ddl_batch(partition.rows)
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


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("binlake")`` available in this session."""
    spark.dataSource.register(BinlakeDataSource)
