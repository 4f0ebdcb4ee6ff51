"""The undo's target side: compare, then put the before images back, in one transaction.

For every planned key the target's current row is read (in batches of
``[memory] batch_rows`` keys, with the rows' write locks on databases that
have them) and compared value by value with the image the chosen changes left:

* equal: the key is reverted to its before image (the row deleted, inserted
  or replaced);
* equal to the before image already: nothing to do;
* anything else is a **conflict** (the row changed since): by default nothing
  at all is written and the first conflicts are listed with counts per table;
  ``skip_conflicts`` reverts the other keys; ``force`` overwrites.

Why two passes per table, every delete before any insert: a revert is a set
of row images put back at once; written key by key, a key change (one key
deleted, the other re-inserted) or two rows that swapped a unique value
would meet a unique index half way. Deleting every reverted key's current row
first and inserting the before images after means no two rows ever hold the
same unique value in between, whichever batches the keys fall in.

Everything runs in one target transaction that also writes the selection's
``_binlake_undo`` row (``record``): a rerun finds it and writes nothing, and a
run killed before the commit leaves the target as it was (failpoints
``undo-after-batch``, ``undo-before-commit``). ``dry_run`` reads and counts
only; ``sql_file`` writes the same statements, in the target's dialect and
with its literals, to a file instead of running them.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake import config, errors, failpoint, tso
from binlake.proto import binlog_pb2
from binlake.replicate import checkpoint
from binlake.sql import checksum, targets
from binlake.sql.targets.base import MAX_ROWS
from binlake.undo import record
from binlake.undo.fold import TablePlan, UndoPlan
from binlake.undo.selection import Selection

Progress = Callable[[str], None]
T = TypeVar("T")
Image = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Options:
    dry_run: bool = False
    sql_file: str | None = None
    skip_conflicts: bool = False
    force: bool = False
    max_conflicts: int = 20

    def __post_init__(self) -> None:
        if self.skip_conflicts and self.force:
            raise errors.InvalidArgument("give --skip-conflicts or --force, not both")
        if self.dry_run and self.sql_file is not None:
            raise errors.InvalidArgument("give --dry-run or --sql FILE, not both (--sql writes nothing to the target)")
        if isinstance(self.max_conflicts, bool) or not isinstance(self.max_conflicts, int) or self.max_conflicts < 0:
            raise errors.InvalidArgument(f"--max-conflicts must be 0 or more, got {self.max_conflicts!r}")

    @property
    def writes(self) -> bool:
        return not self.dry_run and self.sql_file is None


@dataclasses.dataclass
class TableOutcome:
    name: str
    planned: dict[str, int]
    reverted: dict[str, int] = dataclasses.field(default_factory=lambda: {"update": 0, "insert": 0, "delete": 0})
    conflicts: int = 0
    already: int = 0  # keys the target already holds as their before image


@dataclasses.dataclass
class UndoResult:
    selection: str
    target: str
    mode: str  # "undone", "dry run", "sql", "conflicts", "already undone", "nothing to do"
    tables: list[TableOutcome]
    conflicts: list[str]  # the first ones, one line each
    elapsed_s: float = 0.0
    already_at: str | None = None
    sql_file: str | None = None
    apply_tasks: list[str] = dataclasses.field(default_factory=list)
    first_ts: int = 0
    last_ts: int = 0

    @property
    def conflict_count(self) -> int:
        return sum(t.conflicts for t in self.tables)

    @property
    def reverted(self) -> int:
        return sum(sum(t.reverted.values()) for t in self.tables)

    def to_dict(self) -> dict[str, Any]:
        return {"selection": self.selection, "target": self.target, "mode": self.mode,
                "tables": [dataclasses.asdict(t) for t in self.tables], "conflicts": self.conflict_count,
                "first_conflicts": self.conflicts, "reverted": self.reverted, "already_at": self.already_at,
                "sql_file": self.sql_file, "elapsed_s": round(self.elapsed_s, 3), "apply_tasks": self.apply_tasks}

    def summary(self) -> str:
        head = {"undone": "undone", "dry run": "dry run (nothing written): the plan",
                "sql": f"statements written to {self.sql_file} (nothing run)",
                "conflicts": "NOT undone: conflicts (nothing written)",
                "nothing to do": "nothing to do: the changes left no row to put back",
                "already undone": f"already undone at {self.already_at}: nothing written"}[self.mode]
        lines = [f"{head}", f"  changes  {self.selection}", f"  target   {self.target}"]
        if self.mode != "already undone":
            lines.append(f"  {'table':<36} {'updates':>9} {'inserts':>9} {'deletes':>9} {'conflicts':>9} "
                         f"{'already':>8}")
            for t in self.tables:
                shown = t.reverted if self.mode in ("undone",) else t.planned
                lines.append(f"  {t.name:<36} {shown['update']:>9,} {shown['insert']:>9,} {shown['delete']:>9,} "
                             f"{t.conflicts:>9,} {t.already:>8,}")
        if self.conflicts:
            more = self.conflict_count - len(self.conflicts)
            lines.append(f"  first {len(self.conflicts)} of {self.conflict_count:,} conflict(s):")
            lines += [f"    {c}" for c in self.conflicts]
            if more > 0:
                lines.append(f"    ... and {more:,} more (--max-conflicts N lists more)")
        if self.apply_tasks and self.mode == "undone":
            lines.append(f"  apply    task(s) {', '.join(self.apply_tasks)} write here; their checkpoints are past "
                         f"commit_ts {self.last_ts}, so resuming them does not replay the undone changes. Do not "
                         f"move a checkpoint back to or below {self.last_ts} (that would replay them over the undo).")
        lines.append(f"  elapsed  {self.elapsed_s:.1f}s")
        return "\n".join(lines)


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _json_cols(info: binlog_pb2.TableInfo) -> set[str]:
    return {c.name for c in info.columns if c.type == binlog_pb2.JSON}


def _text(row: Mapping[str, Any] | None, names: Sequence[str], js: set[str]) -> tuple[str | None, ...] | None:
    if row is None:
        return None
    return tuple(checksum.canonical(row.get(n), n in js) for n in names)


def _shown(row: Mapping[str, Any] | None, names: Sequence[str]) -> str:
    if row is None:
        return "no row"
    return "(" + ", ".join(f"{n}={row.get(n)!r}" for n in names) + ")"


def check_target(p: UndoPlan, target: targets.Target) -> list[str]:
    """Refuse (before any write) a target without a planned table or with other columns,
    or an apply target whose checkpoint has not passed the last chosen change; the
    apply tasks writing there."""
    with target.engine.connect() as conn:
        for t in p.tables:
            if not target.has_table(t.info.name, conn):
                raise errors.NotFound(
                    f"target {target} has no table {t.info.name} (the lake's {t.name}): restore it there first "
                    f"(binlake restore --tables {t.name} --target URL), or leave it out with --tables")
            have = set(target.column_names(conn, t.info.name))
            want = {c.name for c in t.info.columns}
            if have != want:
                raise errors.FailedPrecondition(
                    f"target table {t.info.name} has columns {', '.join(sorted(have))}, the lake's {t.name} has "
                    f"{', '.join(sorted(want))} today: bring the target to the lake's definition first")
        tasks: list[str] = []
        if target.has_table(checkpoint.CHECKPOINT_TABLE, conn):
            rows = conn.execute(sa.select(checkpoint.table.c.task, checkpoint.table.c.ts)
                                .where(checkpoint.table.c.grp == checkpoint.MAIN)).all()
            for task, ts in rows:
                if int(ts) <= p.last_ts:
                    raise errors.FailedPrecondition(
                        f"target {target} is an apply target and apply task {task}'s checkpoint ({ts}, "
                        f"{tso.iso(int(ts), millis=True)}) is not past the last change to undo ({p.last_ts}): it "
                        f"would apply them again over the undo. Let the apply pass {p.last_ts} (binlake apply ... "
                        "through a window ending after it), pause it, then undo")
                tasks.append(str(task))
    return tasks


class _Statements:
    """The ``--sql`` file: written next to its name and renamed at the end (a file
    that exists is whole)."""

    def __init__(self, path: str, target: targets.Target) -> None:
        self.path = path
        self.tmp = path + ".tmp"
        self.kind = type(target)
        self.engine = target.engine
        self.out = open(self.tmp, "w", encoding="utf-8")  # closed by finish() or abort()
        self.count = 0

    def q(self, name: str) -> str:
        return self.kind.q(self.engine, name)

    def write(self, stmt: str) -> None:
        self.out.write(stmt + "\n")
        self.count += 1

    def delete(self, info: binlog_pb2.TableInfo, keys: Sequence[tuple[Any, ...]]) -> None:
        names = targets.base.key_names(info)
        for chunk in _chunks(keys, MAX_ROWS):
            if len(names) == 1:
                cond = f"{self.q(names[0])} IN ({', '.join(self.kind.literal(k[0]) for k in chunk)})"
            else:
                cols = ", ".join(self.q(n) for n in names)
                vals = ", ".join("(" + ", ".join(self.kind.literal(v) for v in k) + ")" for k in chunk)
                cond = f"({cols}) IN ({vals})"
            self.write(f"DELETE FROM {self.q(info.name)} WHERE {cond};")

    def insert(self, info: binlog_pb2.TableInfo, rows: Sequence[Image]) -> None:
        names = [c.name for c in info.columns]
        cols = ", ".join(self.q(n) for n in names)
        for chunk in _chunks(rows, MAX_ROWS):
            vals = ",\n  ".join("(" + ", ".join(self.kind.literal(r.get(n)) for n in names) + ")" for r in chunk)
            self.write(f"INSERT INTO {self.q(info.name)} ({cols}) VALUES\n  {vals};")

    def finish(self) -> None:
        self.out.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.out.close()
        if os.path.exists(self.tmp):
            os.remove(self.tmp)


def _begin_sql(target: targets.Target) -> str:
    return "START TRANSACTION;" if target.name == "mysql" else "BEGIN;"


def already(target: targets.Target, selection: Selection) -> UndoResult | None:
    """The result of a rerun when the target's record says ``selection`` was undone there."""
    with target.engine.connect() as conn:
        done = record.find(conn, selection.digest())
    if done is None:
        return None
    return UndoResult(selection.describe(), str(target), "already undone", [], [],
                      already_at=f"{done[0]} ({done[1]:,} row(s))")


def run(p: UndoPlan, target: targets.Target, opts: Options, progress: Progress | None = None) -> UndoResult:
    """Compare and revert (see the module doc); conflicts without ``skip_conflicts``/``force``
    leave the target untouched and come back as ``mode == "conflicts"``."""
    say = progress or (lambda _m: None)
    started = time.monotonic()
    tasks = check_target(p, target)
    digest, described = p.selection.digest(), p.selection.describe()
    outcomes = [TableOutcome(t.name, dict(t.counts)) for t in p.tables]
    result = UndoResult(described, str(target), "dry run", outcomes, [], apply_tasks=tasks, first_ts=p.first_ts,
                        last_ts=p.last_ts, sql_file=opts.sql_file)
    if opts.writes and not target.transactional_ddl:
        # DDL would commit the undo's transaction half way here (MariaDB): made first, on its own.
        record.ensure(target)
    sql = _Statements(opts.sql_file, target) if opts.sql_file is not None else None
    per = config.memory().batch_rows
    try:
        with target.engine.connect() as conn:
            conn.begin()
            done = record.find(conn, digest)
            if done is not None:
                conn.rollback()
                if sql is not None:
                    sql.abort()
                result.mode, result.already_at = "already undone", f"{done[0]} ({done[1]:,} row(s))"
                return result
            if sql is not None:
                if target.name == "mysql":
                    sql.write(record.create_sql(target.engine))
                sql.write(_begin_sql(target))
                if target.name != "mysql":
                    sql.write(record.create_sql(target.engine))
            writing = opts.writes
            for t, out in zip(p.tables, outcomes, strict=True):
                skipped = _check_and_delete(conn, target, t, out, result, opts, per, sql, say,
                                            lambda: writing and (result.conflict_count == 0 or opts.skip_conflicts
                                                                 or opts.force))
                if result.conflict_count and not (opts.skip_conflicts or opts.force):
                    continue  # nothing will be written: only the conflicts are counted on
                if opts.writes or sql is not None:
                    _insert_befores(conn, target, t, out, skipped, per, sql, say)
            if result.conflict_count and not (opts.skip_conflicts or opts.force):
                conn.rollback()
                if sql is not None:
                    sql.abort()
                # A dry run shows the conflicts as part of its plan; a real run refuses.
                result.mode = "dry run" if opts.dry_run else "conflicts"
                result.elapsed_s = time.monotonic() - started
                return result
            rows = result.reverted
            if sql is not None:
                sql.write(f"INSERT INTO {sql.q(record.UNDO_TABLE)} (id, undone_at, selection, rows) VALUES ("
                          + ", ".join(target.literal(v) for v in record.values(digest, described, rows).values())
                          + ");")
                sql.write("COMMIT;")
                conn.rollback()
                sql.finish()
                result.mode = "sql"
            elif not opts.writes:
                conn.rollback()
                result.mode = "dry run"
            else:
                record.table.create(conn, checkfirst=True)  # inside the transaction: no trace of a rollback
                record.write(conn, digest, described, rows)
                failpoint.hit("undo-before-commit")
                conn.commit()
                result.mode = "undone" if rows or result.conflict_count else "nothing to do"
    except BaseException:
        if sql is not None and not sql.out.closed:
            sql.abort()
        raise
    result.elapsed_s = time.monotonic() - started
    return result


def _check_and_delete(conn: Connection, target: targets.Target, t: TablePlan, out: TableOutcome, result: UndoResult,
                      opts: Options, per: int, sql: _Statements | None, say: Progress,
                      may_write: Callable[[], bool]) -> set[tuple[str | None, ...]]:
    """Pass 1 over a table's plan: compare every key, count, list conflicts, and delete the
    current rows of the keys to revert. The keys not to insert later (conflicts skipped,
    keys already at their before image) are returned: at most the table's conflicts."""
    info = t.info
    js = _json_cols(info)
    key = targets.base.key_names(info)
    names = [c.name for c in info.columns]
    skipped: set[tuple[str | None, ...]] = set()
    seen = 0
    for batch in _chunks(t.stream(), per):
        now = {_text(r, key, js): r for r in target.rows_of_keys(conn, info, [kv for kv, _a, _b in batch],
                                                                  lock=opts.writes)}
        deletes: list[tuple[Any, ...]] = []
        for kv, pre, post in batch:
            kt = tuple(checksum.canonical(v, n in js) for v, n in zip(kv, key, strict=True))
            cur = now.get(kt)
            action = "delete" if pre is None else "insert" if post is None else "update"
            if _text(cur, names, js) == _text(post, names, js):
                pass
            elif _text(cur, names, js) == _text(pre, names, js):
                out.already += 1
                skipped.add(kt)
                continue
            else:
                out.conflicts += 1
                if len(result.conflicts) < opts.max_conflicts:
                    result.conflicts.append(f"{t.name} key {_shown(dict(zip(key, kv, strict=True)), key)}: the "
                                            f"target holds {_shown(cur, names)}, the changes left {_shown(post, names)}")
                if not opts.force:
                    skipped.add(kt)
                    continue
            out.reverted[action] += 1
            if cur is not None:
                deletes.append(kv)
        if deletes and may_write():
            target.delete_keys(conn, info, deletes)
            failpoint.hit("undo-after-batch")
        elif deletes and sql is not None and (not result.conflict_count or opts.skip_conflicts or opts.force):
            sql.delete(info, deletes)
        seen += len(batch)
        say(f"{t.name}: {seen:,} of {t.rows:,} key(s) compared, {out.conflicts:,} conflict(s)")
    return skipped


def _insert_befores(conn: Connection, target: targets.Target, t: TablePlan, out: TableOutcome,
                    skipped: set[tuple[str | None, ...]], per: int, sql: _Statements | None, say: Progress) -> None:
    """Pass 2: the before images of the reverted keys, after every delete of pass 1."""
    info = t.info
    js = _json_cols(info)
    key = targets.base.key_names(info)
    written = 0
    for batch in _chunks(t.stream(), per):
        rows = [pre for kv, pre, _post in batch if pre is not None
                and tuple(checksum.canonical(v, n in js) for v, n in zip(kv, key, strict=True)) not in skipped]
        if not rows:
            continue
        if sql is not None:
            sql.insert(info, rows)
        else:
            target.insert_rows(conn, info, rows)
            failpoint.hit("undo-after-batch")
        written += len(rows)
        say(f"{t.name}: {written:,} before image(s) put back")
