"""The ``drills`` table: one row per restore drill (``binlake drill``), the record an
auditor reads to see that restores work and how fast.

Invariant: a row is appended once, in one Delta commit, when its drill has reached a
verdict (passed or failed, every proof's outcome and every figure known); a drill
killed before that leaves no row, and a drill is never updated afterwards. So the
table lists exactly the drills that finished, and a replay (same seed and until_ts)
is a new row that must agree with the old one.

Written through Spark (any lake: local or S3); read without Spark through delta-rs
(``arrowread``), so ``binlake lake status`` and the metrics show the last drill in a
second.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import Any

from binlake.lake.store import arrowread, location

DRILLS = "drills"

# (name, Spark type): the table's schema, in order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("drill_id", "string"),        # a UUID
    ("started_at", "timestamp"),   # UTC
    ("ts", "bigint"),              # the commit_ts restored (0: none could be chosen)
    ("seed", "bigint"),            # the seed the ts and tables were drawn with (null: both given)
    ("until_ts", "bigint"),        # the newest window end drawn from (replays give it back)
    ("tables", "string"),          # comma-separated db.table
    ("rows", "bigint"),            # rows restored
    ("bytes", "bigint"),           # bytes of the restored rows' canonical text
    ("restore_s", "double"),       # the restore's seconds: the RTO measured
    ("drill_s", "double"),         # the whole drill's seconds
    ("proving_share", "double"),   # the share of drill_s spent proving
    ("rows_per_s", "double"),      # of the restore
    ("gb_per_h", "double"),        # of the restore
    ("rpo_s", "double"),           # now - the newest ingested window end, at the drill
    ("pump_lag_s", "string"),      # JSON {pump: seconds its safe ts is behind now}
    ("rpo_objective_s", "double"),
    ("rto_objective_s", "double"),
    ("verdict", "string"),         # passed | failed
    ("failure", "string"),         # the one line of a failed drill (null when passed)
    ("proof_apply", "string"),     # (a) against the apply targets: the verdict and first differences
    ("proof_paths", "string"),     # (b) the restore paths agree
    ("proof_upstream", "string"),  # (c) the upstream's checksums now
    ("details", "string"),         # JSON: every table's figures and each proof's per-table outcome
)


def path(lake: str) -> str:
    return location.join(lake, DRILLS)


def append(spark: Any, lake: str, row: Mapping[str, Any]) -> None:
    """Append one drill's row (one Delta commit)."""
    from pyspark.sql import Row

    schema = ", ".join(f"`{n}` {t}" for n, t in COLUMNS)
    df = spark.createDataFrame([Row(**{n: row.get(n) for n, _ in COLUMNS})], schema)
    df.write.format("delta").mode("append").save(path(lake))


def exists(lake: str) -> bool:
    local = arrowread.local_path(path(lake))
    if local is not None:
        return os.path.isdir(os.path.join(local, "_delta_log"))
    try:
        arrowread.TableReader(path(lake))
    except arrowread.NotReadable:
        return False
    return True


def read(lake: str, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every drill, oldest first (empty when none ran)."""
    if not exists(lake):
        return []
    names = list(columns) if columns is not None else [n for n, _ in COLUMNS]
    table = arrowread.TableReader(path(lake)).read(names)
    rows: list[dict[str, Any]] = table.to_pylist()
    for r in rows:  # Spark's timestamps are UTC instants; delta-rs may hand them back naive
        at = r.get("started_at")
        if isinstance(at, dt.datetime) and at.tzinfo is None:
            r["started_at"] = at.replace(tzinfo=dt.UTC)
    return sorted(rows, key=lambda r: (r.get("started_at") is None, r.get("started_at") or 0))


def last(lake: str) -> dict[str, Any] | None:
    rows = read(lake)
    return rows[-1] if rows else None


# The figures of a drill that ``lake status`` and the gauges show.
SUMMARY = ("drill_id", "started_at", "verdict", "failure", "ts", "seed", "until_ts", "tables", "rows", "restore_s",
           "drill_s", "proving_share", "rows_per_s", "gb_per_h", "rpo_s", "rpo_objective_s", "rto_objective_s")


def summary(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = {k: row.get(k) for k in SUMMARY}
    at = out["started_at"]
    out["started_at"] = at.isoformat() if isinstance(at, dt.datetime) else at
    return out


def line(row: Mapping[str, Any] | None) -> str:
    """The last drill in one line (``binlake lake status``)."""
    if row is None:
        return "none (binlake drill)"
    at = row.get("started_at")
    when = at.strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(at, dt.datetime) else str(at)
    rpo = "-" if row.get("rpo_s") is None else f"{float(row['rpo_s']):.1f}s"
    text = (f"{when}  {row.get('verdict')}  RTO {float(row.get('restore_s') or 0):.1f}s "
            f"({float(row.get('rows_per_s') or 0):,.0f} rows/s)  RPO {rpo}  {row.get('rows')} rows, "
            f"tables {row.get('tables')}")
    if row.get("failure"):
        text += f"  -- {row['failure']}"
    return text
