"""The apply checkpoint, kept in the target database itself.

``_binlake_checkpoint`` rows are written in the same target transaction as the
data they cover, so the checkpoint and the data can never disagree: after a
crash anywhere, the checkpoint says exactly what the target holds. That needs a
target whose DML is transactional, which the ``Target`` interface requires of
every database (``binlake.sql.targets.base``); where DDL is not transactional
(MySQL/MariaDB), the checkpoint moves to each DDL's commit_ts right before it
(``consistent``), and ``target_ddl`` makes a DDL applied twice harmless.

Rows (primary key ``task, grp, seg_end``):

* ``grp = -1, seg_end = 0`` - the task's checkpoint. Invariant: every selected
  change with ``commit_ts < ts`` is in the target, and none with a later one.
  ``window_start``/``window_end`` are the ingested window the ts lies in.
* ``grp >= 0`` (parallel mode) - bucket ``grp`` of the batch of changes ending
  at ``seg_end`` (a DDL's commit_ts or a window's end) is in the target. A
  bucket is a set of conflict groups; ``grp`` encodes the bucket's index and
  how many buckets the batch was dealt into (``bucket_id``), so a rerun deals
  the groups the same way. Written with the bucket's data; deleted when the
  task's checkpoint moves to ``seg_end`` (then the whole batch is in).
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Connection

CHECKPOINT_TABLE = "_binlake_checkpoint"
MAIN = -1

_md = sa.MetaData()
table = sa.Table(
    CHECKPOINT_TABLE, _md,
    sa.Column("task", sa.String(128), primary_key=True),
    sa.Column("grp", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("seg_end", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("ts", sa.BigInteger, nullable=False),
    sa.Column("window_start", sa.BigInteger, nullable=False),
    sa.Column("window_end", sa.BigInteger, nullable=False),
)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    ts: int  # every change with commit_ts < ts is applied
    window_start: int
    window_end: int


_BUCKET_BITS = 16  # grp = count << 16 | index (count <= 256 parallel tasks)


def bucket_id(index: int, count: int) -> int:
    """The ``grp`` of bucket ``index`` of a batch dealt into ``count`` buckets."""
    if not 0 <= index < count < (1 << _BUCKET_BITS):
        raise ValueError(f"bucket {index} of {count} is out of range")
    return count << _BUCKET_BITS | index


def bucket_count(grp: int) -> int:
    """How many buckets the batch of bucket row ``grp`` was dealt into."""
    return max(1, grp >> _BUCKET_BITS)


def ensure(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        table.create(conn, checkfirst=True)


def read(conn: Connection, task: str) -> Checkpoint | None:
    if not sa.inspect(conn).has_table(CHECKPOINT_TABLE):
        return None
    row = conn.execute(sa.select(table.c.ts, table.c.window_start, table.c.window_end)
                       .where(table.c.task == task, table.c.grp == MAIN)).first()
    return Checkpoint(int(row[0]), int(row[1]), int(row[2])) if row else None


def write(conn: Connection, task: str, ts: int, window_start: int, window_end: int) -> None:
    """Move the task's checkpoint to ``ts`` (and drop group rows it covers)."""
    values = {"ts": ts, "window_start": window_start, "window_end": window_end}
    n = conn.execute(table.update().where(table.c.task == task, table.c.grp == MAIN).values(**values)).rowcount
    if not n:
        conn.execute(table.insert().values(task=task, grp=MAIN, seg_end=0, **values))
    conn.execute(table.delete().where(table.c.task == task, table.c.grp != MAIN, table.c.seg_end <= ts))


def done_groups(conn: Connection, task: str, seg_end: int) -> set[int]:
    rows = conn.execute(sa.select(table.c.grp).where(table.c.task == task, table.c.seg_end == seg_end,
                                                     table.c.grp != MAIN))
    return {int(r[0]) for r in rows}


def mark_groups(conn: Connection, task: str, seg_end: int, groups: list[int], window_start: int,
                window_end: int) -> None:
    if groups:
        conn.execute(table.insert(), [{"task": task, "grp": g, "seg_end": seg_end, "ts": seg_end,
                                       "window_start": window_start, "window_end": window_end} for g in groups])
