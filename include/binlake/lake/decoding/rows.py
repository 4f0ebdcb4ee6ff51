"""The lake's row shapes: change rows (``changes``), DDL rows (``ddl_history``) and
ledger rows (``windows``).

Change rows (the ``changes`` table, ``CHANGE_COLUMNS``)::

    commit_ts long, start_ts long, seq int, commit_date date, db string, tbl string,
    table_id long, op string, keys string, before string, after string,
    schema_version long, pump string

* ``seq`` - position of the change inside its transaction: the mutations in
  their order in the prewrite (one per table, in order of first touch), each
  one's changes in its ``sequence`` order, numbered from 0 across tables.
* ``commit_date`` - the UTC date of ``commit_ts`` (the partition column).
* ``op`` - ``insert``, ``update`` or ``delete``.
* ``keys`` - image JSON of the primary-key columns only: the after image's for
  insert/update (an update that changes the key carries the new key here and
  the old one in ``before``), the before image's for delete.
* ``before``/``after`` - image JSON of the whole row (``before`` is null for an
  insert, ``after`` for a delete); the format is described in ``binlake.lake.decoding.image``.
* ``schema_version`` - the version of the table definition the images were
  decoded with: the ``ddl_history`` row with this ``table_id`` and
  ``schema_version`` holds the column types needed to read them back typed.

DDL rows (the ``ddl_history`` table, ``DDL_COLUMNS``, made by ``binlake.lake.decoding.ddl_rows``)::

    commit_ts long, start_ts long, schema_version long, db string, tbl string,
    table_id long, previous_table_id long, dropped boolean, query string,
    table_info binary (a serialized TableInfo), table_json string

Ledger rows (the ``windows`` table, ``WINDOW_COLUMNS``, one per ingested window,
written by ``binlake.lake.ingest``)::

    start_ts long, end_ts long, pumps array<string>, rows_per_pump map<string,long>,
    rows_per_table_op map<string,long>, txns long, rows long, ddls long, status string,
    ingested_at timestamp
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from binlake import tso

CHANGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("commit_ts", "long"), ("start_ts", "long"), ("seq", "int"), ("commit_date", "date"),
    ("db", "string"), ("tbl", "string"), ("table_id", "long"), ("op", "string"), ("keys", "string"),
    ("before", "string"), ("after", "string"), ("schema_version", "long"), ("pump", "string"),
)
DDL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("commit_ts", "long"), ("start_ts", "long"), ("schema_version", "long"), ("db", "string"),
    ("tbl", "string"), ("table_id", "long"), ("previous_table_id", "long"), ("dropped", "boolean"),
    ("query", "string"), ("table_info", "binary"), ("table_json", "string"),
)
WINDOW_COLUMNS: tuple[tuple[str, str], ...] = (
    ("start_ts", "long"), ("end_ts", "long"), ("pumps", "array<string>"), ("rows_per_pump", "map<string,long>"),
    ("rows_per_table_op", "map<string,long>"), ("txns", "long"), ("rows", "long"), ("ddls", "long"),
    ("status", "string"), ("ingested_at", "timestamp"),
)
# Spark DDL strings of the row shapes (DataFrame schemas and the data source's).
CHANGES_DDL = ", ".join(f"{name} {kind}" for name, kind in CHANGE_COLUMNS)
DDL_HISTORY_DDL = ", ".join(f"{name} {kind}" for name, kind in DDL_COLUMNS)
WINDOWS_DDL = ", ".join(f"{name} {kind}" for name, kind in WINDOW_COLUMNS)

OPS = ("insert", "update", "delete")
_DAY_MS = 86_400_000
EPOCH_DATE = dt.date(1970, 1, 1)  # day 0 of commit_date_days (Arrow's date32 epoch)


def check_ts(name: str, value: Any) -> int:
    """``value`` if it is a TSO (an int in [0, 2^63)); TypeError/ValueError naming ``name`` if not."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer TSO, got {type(value).__name__}")
    if not 0 <= value <= tso.MAX_TS:
        raise ValueError(f"{name} must be a TSO in [0, 2^63), got {value}")
    return value


def commit_date_days(commit_ts: int) -> int:
    """Days since 1970-01-01 of ``commit_ts``'s UTC date (Arrow's date32)."""
    return (commit_ts >> tso.LOGICAL_BITS) // _DAY_MS


def commit_date(commit_ts: int) -> dt.date:
    """The UTC date of ``commit_ts``: the partition value of its change rows."""
    check_ts("commit_ts", commit_ts)
    return EPOCH_DATE + dt.timedelta(days=commit_date_days(commit_ts))
