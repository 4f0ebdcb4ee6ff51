"""The lake: binlake's Delta Lake side, written and read by Spark.

It holds the Delta change table (one row per row change, keyed by commit_ts),
the DDL history, the windows ledger that makes ingests idempotent, the Spark
data source that reads commit_ts windows from the Pumps, and the snapshots used
for point-in-time restores. ``binlake.lake.spark`` is the one place that builds
a SparkSession with Delta configured.
"""

from __future__ import annotations
