"""The lake: binlake's Delta Lake side, written and read by Spark.

It holds the Delta change table (one row per row change, keyed by commit_ts),
the DDL history, the windows ledger that makes ingests idempotent, the Spark
data source that reads commit_ts windows from the Pumps, and the snapshots used
for point-in-time restores.

Layers, each importing only those below it (``make lint`` checks it):

* ``ingest``, ``freshness``, ``commands``: the ingest and the ``binlake ingest``/``lake`` commands;
* ``pumps``: reading commit_ts windows from the Pumps (the ``binlake`` Spark data source);
* ``store``: paths, S3, the ledger, staging and the writers' locks;
* ``sparkenv``: the one place that builds a SparkSession, Spark Connect, Spark's errors;
* ``s3settings``: the S3 settings in force and each engine's form of them;
* ``decoding``: binlog transactions into the lake's rows, no Spark.
"""

from __future__ import annotations
