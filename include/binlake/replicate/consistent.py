"""``consistent`` mode: each window in one target transaction, in this process.

The window's batches, their DDLs and the checkpoint at the window's end commit
together (PostgreSQL and SQLite run DDL inside the transaction too), so the
target always equals the upstream at the end of some window. A window read in
pieces (``read.LakeReader.pieces``) writes them one after the other, in commit
order, in that one transaction: each piece's changes are compacted against what
the pieces before it left, and a crash between pieces leaves nothing of the
window. On MySQL/MariaDB
a DDL commits by itself: the batch before it commits with the checkpoint at the
DDL's commit_ts, then the DDL runs and the checkpoint moves past it (a crash
between the two re-runs the DDL, which is idempotent, see ``target_ddl``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy.engine import Connection

from binlake import failpoint
from binlake.replicate import checkpoint, target_ddl
from binlake.replicate.batch import Batch, DDLChange
from binlake.replicate.report import ApplySummary
from binlake.replicate.table_write import Mismatch, diagnose, write_changes
from binlake.sql import targets

# Writes one piece of a window (its batches) in the window's transaction; the
# second argument says whether in safe mode.
PieceWriter = Callable[[list[Batch], bool], None]


@contextlib.contextmanager
def window(target: targets.Target, task_name: str, a: int, b: int, summary: ApplySummary,
           ddl_change: Callable[[dict[str, Any]], DDLChange | None]) -> Iterator[PieceWriter]:
    """Window ``[a, b)`` in one target transaction (on MySQL/MariaDB, one per DDL:
    see the module docstring): the caller writes its pieces, in commit order, with
    the writer this yields; when the block ends the checkpoint moves to ``b`` and
    the transaction commits. A target that does not match the log raises
    ``TargetDiverged``, nothing of the window committed; any other error leaves
    nothing of it either (the connection closes without a commit)."""
    with target.engine.connect() as conn:
        conn.begin()
        try:
            yield functools.partial(_write_piece, target, conn, task_name, a, b, summary, ddl_change)
            checkpoint.write(conn, task_name, b, a, b)
            failpoint.hit("apply-before-commit")
            conn.commit()
        except Mismatch as m:
            conn.rollback()
            raise diagnose(target, m, f"window [{a}, {b})") from None


def _write_piece(target: targets.Target, conn: Connection, task_name: str, a: int, b: int, summary: ApplySummary,
                 ddl_change: Callable[[dict[str, Any]], DDLChange | None], batches: list[Batch],
                 safe: bool) -> None:
    """One piece's batches and their DDLs in the window's transaction ``conn``."""
    transactional = target.transactional_ddl
    for batch in batches:
        summary.rows_written += write_batch(target, conn, batch, safe)
        if batch.ddl is None:
            continue
        change = ddl_change(batch.ddl)
        ddl_ts = int(batch.ddl["commit_ts"])
        if change is None:
            continue
        if not transactional:
            checkpoint.write(conn, task_name, ddl_ts, a, b)
            conn.commit()
            conn.begin()
        target_ddl.apply_ddl(target, conn, change[0], change[2], change[1])
        summary.ddls += 1
        if not transactional:
            checkpoint.write(conn, task_name, ddl_ts + 1, a, b)
            conn.commit()
            conn.begin()


def write_batch(target: targets.Target, conn: Connection, batch: Batch, safe: bool) -> int:
    """A batch's changes, table after table, in the caller's transaction; rows written."""
    n = 0
    for name, changes in batch.tables.items():
        n += write_changes(target, conn, batch.infos[name], changes, safe, batch.compacted)
    return n
