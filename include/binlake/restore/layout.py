"""Where point-in-time data lives in the lake, and the catalogs that make it valid.

::

    LAKE/snapshots/ts=<T>/t<table_id>   one typed Delta table per table at commit_ts T
    LAKE/snapshots/_catalog             Delta: which snapshots exist (SNAPSHOT_CATALOG_DDL)
    LAKE/history/t<table_id>            one SCD2 Delta table per upstream table id
    LAKE/history/_catalog               Delta: one row per history table (HISTORY_CATALOG_DDL)

Tables are named by table *id*: a renamed table keeps its data; TRUNCATE (a
new id) and DROP + CREATE give a new table, as the upstream's own ids do.
The catalogs carry the names and the table definitions.
"""

from __future__ import annotations

from binlake.lake.store import location

SNAPSHOTS = "snapshots"
HISTORY = "history"

# One row per table of a snapshot, plus one *marker* row (table_id 0) per snapshot.
# Invariant: the marker row is written last, after every table of the snapshot is
# written and has its row; a snapshot without a marker (a crash half way) is
# ignored by every reader and replaced by the next snapshot at the same ts.
# ``complete``: the snapshot holds every table that existed at snapshot_ts, so a
# table absent from it did not exist then (its base at snapshot_ts is empty).
# The ``proof_*``/``changes_*`` columns (``proven``): the table's whole history at
# snapshot_ts as a checksum (rows, checksum, bytes, and the column signature it renders),
# equal to the snapshot table read back, and the digest of its change rows at or below
# snapshot_ts, when the snapshot was taken; ``proven_from_ts``: the proven snapshot the
# sum extended (0: summed from the lake's start). Null in a snapshot taken before
# snapshots were proven (and in marker rows).
SNAPSHOT_CATALOG_DDL = ("snapshot_ts long, table_id long, db string, tbl string, path string, rows long, "
                        "table_info binary, complete boolean, taken_at timestamp, proof_rows long, "
                        "proof_checksum string, proof_bytes long, proof_columns string, changes_rows long, "
                        "changes_digest string, proven_from_ts long")
MARKER_TABLE_ID = 0

# One row per history table. Invariant: ``applied`` lists the ``windows`` ledger
# rows (start_ts, end_ts, ingested_at) whose changes the table holds, contiguous from
# the lake's first window; ``applied_end_ts`` is the end of the last: the table holds
# every version that began at a commit_ts below it. ``columns`` is the table's column
# list (id, name, type code, sql_type; see ``columns.to_json``). Written after the
# table's data, so a crash half way re-applies the windows (idempotent: it rewinds to
# the first one not recorded before applying).
HISTORY_CATALOG_DDL = ("table_id long, db string, tbl string, path string, columns string, key_columns string, "
                       "applied string, applied_end_ts long, ended_ts long, updated_at timestamp")


def snapshot_catalog(lake: str) -> str:
    return location.join(lake, SNAPSHOTS, "_catalog")


def snapshot_table(lake: str, snapshot_ts: int, table_id: int) -> str:
    return location.join(lake, SNAPSHOTS, f"ts={int(snapshot_ts)}", f"t{int(table_id)}")


def history_catalog(lake: str) -> str:
    return location.join(lake, HISTORY, "_catalog")


def history_table(lake: str, table_id: int) -> str:
    return location.join(lake, HISTORY, f"t{int(table_id)}")


# The catalogs' ``path`` column holds a table's location *relative to the lake*
# (``history/t42``), so a lake copied, moved or synced to a bucket stays valid;
# ``stored_path``/``table_location`` convert (an absolute path written by an older
# binlake is read as it is).

def stored_path(lake: str, path: str) -> str:
    """What a catalog keeps for the table at ``path``: its name relative to the lake
    (a location outside the lake, which only an older catalog can hold, is kept)."""
    try:
        return location.relative(lake, path)
    except ValueError:
        return path


def table_location(lake: str, stored: str) -> str:
    """Where the table a catalog row names is now."""
    return location.resolve(lake, stored)
