"""Reading the Pumps: a commit_ts window from every Pump, for the ingest.

Which Pumps may hold a window (``planner``), each one checked directly before a
read (``pump_check``), a window pulled and resumed after transient failures
(``pump_pull``), its planning scan (``window_index``), the lake's consumer
checkpoint in the registry (``checkpoint``), and the ``binlake`` Spark data
source over all of it (``datasource``, options in ``read_options``). Unrelated
to ``binlake.source``, which writes an existing database's log into the Pumps.
"""

from __future__ import annotations
