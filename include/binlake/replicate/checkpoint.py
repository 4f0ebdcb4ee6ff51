"""The apply checkpoint, kept in the target database itself.

``_binlake_checkpoint`` rows are written in the same target transaction as the
data they cover, so the checkpoint and the data can never disagree: after a
crash anywhere, the checkpoint says exactly what the target holds.

Rows (primary key ``task, grp, seg_end``):

* ``grp = -1, seg_end = 0`` - the task's checkpoint. Invariant: every selected
  change with ``commit_ts < ts`` is in the target, and none with a later one.
  ``window_start``/``window_end`` are the ingested window the ts lies in.
* ``grp >= 0`` (parallel mode) - conflict group ``grp`` of the batch of changes
  ending at ``seg_end`` (a DDL's commit_ts or a window's end) is in the target.
  Written with the group's data; deleted when the task's checkpoint moves to
  ``seg_end`` (then the whole batch is in).
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


def mark_group(conn: Connection, task: str, seg_end: int, grp: int, window_start: int, window_end: int) -> None:
    conn.execute(table.insert().values(task=task, grp=grp, seg_end=seg_end, ts=seg_end,
                                       window_start=window_start, window_end=window_end))
