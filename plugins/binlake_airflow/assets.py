"""The Assets binlake's DAGs produce and consume.

Defined once here so the producer (``binlake_ingest``) and its consumers
(``binlake_apply`` and friends) cannot drift apart on a URI. The URI names the
change table logically rather than by its storage path: the lake's location
is a run-time setting (``binlake_lake``), and an Asset is part of the parsed
DAG, which must not depend on run-time settings. The asset events carry the
concrete path and window in their ``extra``.
"""

from __future__ import annotations

from airflow.sdk import Asset

# The Delta change table: one asset event per ingested window, whose extra holds
# {"start_ts", "end_ts", "start", "end", "pumps", "safe_ts", "lake", "table", "mode", ...}.
LAKE_CHANGES = Asset(name="binlake_changes", uri="binlake://lake/changes", group="binlake")

# The lake's ``drills`` table: one asset event per restore drill, whose extra holds the
# drill's figures {"drill_id", "verdict", "ts", "seed", "until_ts", "tables", "rows",
# "restore_s", "drill_s", "proving_share", "rpo_s", "rows_per_s", "gb_per_h", "failure", ...}.
LAKE_DRILLS = Asset(name="binlake_drills", uri="binlake://lake/drills", group="binlake")
