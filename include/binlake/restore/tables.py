"""The tables a restore or a snapshot rebuilds at T, and their writing.

``Plan``/``TablePlan``: each table and its base (``binlake.restore.restore.plan``
and ``binlake.restore.snapshot`` make them); ``shared_changes``, ``frames`` and
``items``: one pass over the lake for every table; ``write_tables``: each table
written as a typed Delta table, several at once. Below both ``restore`` and
``snapshot``, which write through it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from binlake import failpoint
from binlake.lake.decoding import decode
from binlake.proto import binlog_pb2
from binlake.restore import direct as _direct
from binlake.restore import onepass, rebuild

Progress = Callable[[str], None]


@dataclasses.dataclass
class TablePlan:
    table_id: int
    info: binlog_pb2.TableInfo
    base: rebuild.Base

    @property
    def name(self) -> str:
        return f"{self.info.db}.{self.info.name}"


@dataclasses.dataclass
class Plan:
    lake: str
    ts: int
    schema: decode.SchemaHistory
    tables: list[TablePlan]
    source: str
    # Tables of a restore of every table left out because their initial snapshot was in
    # progress at ts ("db.table: why, and from which ts it is restorable"): said, never silent.
    skipped: list[str] = dataclasses.field(default_factory=list)


def shared_changes(spark: Any, p: Plan) -> Any:
    """The last change per (table, key) of every planned table, computed in one pass
    over the change table and materialized (``onepass``); None when no table reads
    changes (every base already at T)."""
    return shared_changes_sized(spark, p)[0]


def shared_changes_sized(spark: Any, p: Plan) -> tuple[Any, dict[int, tuple[int, int]]]:
    """``shared_changes`` and its ``onepass.sizes`` (empty without a result)."""
    slices = [onepass.slice_for(p.schema, t.table_id, p.ts, t.base) for t in p.tables if t.base.ts < p.ts]
    if not slices:
        return None, {}
    return onepass.materialize_sized(spark, onepass.last_changes(spark, rebuild.changes_frame(spark, p.lake),
                                                                 p.schema, slices))


def base_alone(p: Plan, t: TablePlan, found: dict[int, tuple[int, int]] | None) -> bool:
    """Whether ``t``'s base is its table at T with no change to apply: taken at T, or
    no change row of the table in the one pass over ``(base ts, T]`` (``found``: its
    ``onepass.sizes``; None when not counted). A restore to a time when a table had
    not changed since its last snapshot then copies the snapshot's rows instead of
    aggregating every one of them by key."""
    return t.base.ts >= p.ts or (found is not None and found.get(t.table_id, (0, 0))[0] == 0)


def frames(spark: Any, p: Plan, shared: Any = None, found: dict[int, tuple[int, int]] | None = None
           ) -> dict[int, Any]:
    """table id -> the lazy typed DataFrame of the table at T, each reading its slice of
    ``shared`` (``shared_changes``, computed here when not given; ``found``: its sizes,
    when known): the lake is read once whatever the number of tables."""
    if shared is None:
        shared, found = shared_changes_sized(spark, p)
    out = {}
    for t in p.tables:
        reads = shared is not None and not base_alone(p, t, found)
        final = reads and onepass.slice_for(p.schema, t.table_id, p.ts, t.base).final
        out[t.table_id] = rebuild.state_from(spark, onepass.of_table(shared, t.table_id) if reads else None,
                                             p.schema, t.table_id, p.ts, t.base, final)
    return out


# One table's work: its plan, and either its one-pass change rows (decoded in Python)
# or its typed Spark frame.
Item = tuple[TablePlan, list[Any], Any]


def direct_tables(p: Plan, found: dict[int, tuple[int, int]], fits: Callable[[TablePlan], bool]) -> set[int]:
    """The tables decoded in this process (``direct``): those ``fits`` accepts whose rows
    at T are at most ``[memory] direct_rows`` and whose images take at most
    ``partition_bytes`` (``found``: the one-pass result's ``onepass.sizes``). The others
    are rebuilt by Spark's executors, so no table's size reaches this process's memory."""
    return {t.table_id for t in p.tables if onepass.streamable(*found.get(t.table_id, (0, 0))) and fits(t)}


def items(spark: Any, p: Plan, shared: Any, direct: set[int], found: dict[int, tuple[int, int]] | None = None
          ) -> Iterator[Item]:
    """Every planned table's work, the ``direct`` ones first, as their rows stream out
    of ``shared`` (one small table's rows in memory at a time per worker: see
    ``direct_tables``), then the others with their typed frames."""
    seen: set[int] = set()
    by_id = {t.table_id: t for t in p.tables}
    if shared is not None and direct:
        stream = onepass.of_tables(shared, sorted(direct)).toLocalIterator(prefetchPartitions=True)
        for table_id, rows in onepass.grouped(stream):
            seen.add(table_id)
            yield by_id[table_id], rows, None
    for table_id in sorted(direct - seen):  # no change row left: the table is empty at T
        yield by_id[table_id], [], None
    typed = [t for t in p.tables if t.table_id not in direct]
    if typed:
        for t, df in zip(typed, frames(spark, dataclasses.replace(p, tables=typed), shared, found).values(),
                         strict=True):
            yield t, [], df


def in_plan_order(p: Plan, done: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    order = {t.name: i for i, t in enumerate(p.tables)}
    return sorted(done, key=lambda d: order[d[0]])


class Tally:
    """Progress over tables and rows, shared by the threads writing tables."""

    def __init__(self, total: int, say: Progress) -> None:
        self.total, self.say = total, say
        self.tables = self.rows = 0
        self._lock = threading.Lock()

    def done(self, name: str, rows: int, what: str = "rows") -> None:
        with self._lock:
            self.tables += 1
            self.rows += rows
            self.say(f"[{self.tables}/{self.total} tables, {self.rows:,} rows] {name}: {rows:,} {what}")
        failpoint.hit("restore-after-table")


def written_rows(spark: Any, path: str) -> int:
    """The rows of the Delta table just written at ``path`` by one overwrite: its last
    commit's ``numOutputRows`` (a file read; loading the table's state would be a
    Spark job per table), else a count."""
    log = path.removeprefix("file:") if path.startswith(("/", "file:/")) else None
    if log is not None:
        try:
            commits = sorted(f for f in os.listdir(os.path.join(log, "_delta_log")) if f.endswith(".json"))
            with open(os.path.join(log, "_delta_log", commits[-1])) as fh:
                for line in fh:
                    action = json.loads(line)
                    if "commitInfo" in action:
                        metrics = action["commitInfo"].get("operationMetrics", {})
                        if "numOutputRows" in metrics:
                            return int(metrics["numOutputRows"])
        except (OSError, IndexError, ValueError):
            pass
    return int(spark.read.format("delta").load(path).count())


def write_tables(spark: Any, p: Plan, path_of: Callable[[TablePlan], str], parallelism: int,
                 say: Progress) -> list[tuple[str, int, str]]:
    """Every planned table rebuilt and written as a typed Delta table at ``path_of(table)``
    (each one commit), from one pass over the lake, ``parallelism`` tables at once.
    Tables rebuilt from changes alone go to local paths through delta-rs (``direct``);
    the others through Spark. (db.table, rows, base kind) per table, in plan order."""
    say(f"reading the lake once for {len(p.tables)} table(s)")
    shared, found = shared_changes_sized(spark, p)
    direct = direct_tables(p, found, lambda t: "://" not in path_of(t)
                           and _direct.delta_eligible(p.schema, t.table_id, p.ts, t.base))
    tally = Tally(len(p.tables), say)

    def one(item: Item) -> tuple[str, int, str]:
        t, raw, df = item
        path = path_of(t)
        if df is None:
            rows = _direct.rows_at(p.schema, t.table_id, p.ts, raw)
            _direct.write_delta(path, _direct.arrow_table(t.info, rows))
            n = len(rows)
        else:
            df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
            n = written_rows(spark, path)
        tally.done(t.name, n, "rows from " + t.base.kind)
        return (t.name, n, t.base.kind)

    return in_plan_order(p, onepass.each_table(items(spark, p, shared, direct, found), one, parallelism))
