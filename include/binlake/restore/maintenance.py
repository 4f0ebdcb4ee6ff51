"""Lake upkeep for the ``binlake_maintenance`` DAG: OPTIMIZE + VACUUM, and the Pump GC report.

VACUUM and restores: a restore reads the *current* version of ``changes``,
``ddl_history``, ``windows``, the snapshots and the history tables, and VACUUM
only removes files no version within its retention references, never those
of the current version. So VACUUM never takes away a restore the ledger
promises; its retention (never under an hour here) only protects jobs that
are still reading an older version while it runs. Snapshots are never
removed by maintenance: they are bases restores may start from.

GC report: the Pumps keep binlogs for their retention; the lake must ingest a
window before every Pump's GC ts passes its start. The report compares each
Pump's GC ts with the oldest ts the lake has not ingested (the end of the
ledger's contiguous windows) and fails when a Pump has already passed it
(binlogs lost) or will within the margin (its GC ts advances with the clock).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

from binlake import tso
from binlake.lake.store import writelock
from binlake.lake.store.ledger import BOUNDS, is_delta, read_windows
from binlake.lake.store.location import CHANGES, DDL_HISTORY, WINDOWS, table_path
from binlake.restore import coverage, history, layout, snapshot

DEFAULT_RETENTION_DAYS = 7.0  # a Pump's default GC retention (binlake pump --gc-retention-days)


def lake_tables(spark: Any, lake: str) -> list[str]:
    """Every Delta table of the lake: its own three, each snapshot table and catalog,
    each history table and catalog."""
    paths = [table_path(lake, n) for n in (CHANGES, DDL_HISTORY, WINDOWS)]
    paths += [e.path for e in snapshot.catalog(spark, lake) if e.path]
    paths += [layout.snapshot_catalog(lake)]
    paths += [row["path"] for row in history.catalog(spark, lake).values()]
    paths += [layout.history_catalog(lake)]
    return [p for p in dict.fromkeys(paths) if is_delta(spark, p)]


def optimize_vacuum(spark: Any, lake: str, retention_hours: float,
                    progress: Callable[[str], None] | None = None) -> list[str]:
    if retention_hours < 1:
        raise ValueError(f"retention_hours must be >= 1, got {retention_hours}")
    from binlake.lake.sparkenv import connect

    say = progress or (lambda _m: None)
    done = []
    # VACUUM lists a table's directories with this many tasks (10,000 by default):
    # minutes of task overhead for a lake's small tables. A few per core is plenty.
    key = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    before = spark.conf.get(key, None)
    spark.conf.set(key, str(max(2, 2 * connect.default_parallelism(spark))))
    try:
        for path in lake_tables(spark, lake):
            # SQL rather than Delta's Python DeltaTable API: the same commands, and
            # they run over Spark Connect too (DeltaTable needs a server plugin there).
            table = connect.delta_table(path)
            # One table per turn at the lake's writes: an ingest waits for one
            # table's OPTIMIZE/VACUUM, not for the whole lake's.
            with writelock.lake_writes(lake, what=f"OPTIMIZE/VACUUM {path}", spark=spark, progress=say) as turn:
                turn.check()
                spark.sql(f"OPTIMIZE {table}").collect()
                turn.check()
                spark.sql(f"VACUUM {table} RETAIN {float(retention_hours)} HOURS").collect()
            say(f"optimized and vacuumed {path} (retention {retention_hours:g} h)")
            done.append(path)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    return done


@dataclasses.dataclass
class GcReport:
    oldest_uningested_ts: int
    rows: list[dict[str, Any]]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        out = [f"oldest ts not ingested: {tso.format_ts(self.oldest_uningested_ts)}"]
        out += [f"  {r['pump']:<16} GC ts {tso.format_ts(r['gc_ts'])}  {r['status']}" for r in self.rows]
        return out


def gc_report(spark: Any, lake: str, registry: str, margin_hours: float, now: dt.datetime,
              retention_days: float = DEFAULT_RETENTION_DAYS, *,
              windows: list[dict[str, Any]] | None = None) -> GcReport:
    """Compare every Pump's GC ts with the oldest ts the lake has not ingested.
    ``windows``: the lake's ledger rows when the caller has read them (``spark`` may
    then be None); else they are read through ``spark``."""
    from binlake.registry.client import RegistryClient

    if windows is None:
        if spark is None:
            raise ValueError("gc_report needs a Spark session or the ledger's windows")
        windows = read_windows(spark, lake, BOUNDS)
    oldest = coverage.last_restorable(windows) + 1 if windows else 0
    with RegistryClient(registry) as reg:
        nodes, _ = reg.list_nodes("pump")
    # The GC ts reaches ``oldest`` when the clock passes oldest + retention.
    lost_at = tso.to_datetime(oldest) + dt.timedelta(days=retention_days) if oldest else None
    rows, problems = [], []
    for node in sorted(nodes, key=lambda n: n.node_id):
        if node.gc_ts > oldest:
            status = "LOST: binlogs below its GC ts were never ingested"
            problems.append(f"pump {node.node_id} GC ts {tso.format_ts(node.gc_ts)} passed the oldest window not "
                            f"ingested ({tso.format_ts(oldest)}): backfill from there is impossible")
        elif lost_at is not None and lost_at - now < dt.timedelta(hours=margin_hours):
            status = f"AT RISK: GC reaches it at {lost_at.isoformat()}"
            problems.append(f"pump {node.node_id} will GC the oldest window not ingested "
                            f"({tso.format_ts(oldest)}) at {lost_at.isoformat()}: ingest it now")
        else:
            status = "ok"
        rows.append({"pump": node.node_id, "gc_ts": node.gc_ts, "status": status})
    return GcReport(oldest, rows, problems)
