"""``binlake drill``: restore some tables at some commit_ts into a scratch target,
prove the result by independent means (``proofs``), measure RTO and RPO against
the objectives, and record the drill in the lake's ``drills`` table.

The ts and tables are given, or drawn with a seed from what the lake covers up to
``until_ts`` (default: the newest ingested window end): the same seed and until_ts
draw the same ts and tables again, since the ledger below until_ts never changes.

A drill fails (``DrillFailed``, one line naming the table and the first differing
key, or the objective missed) on a difference, a restore error or a missed
objective; it is recorded as failed first. The default scratch target is a SQLite
file in a fresh temporary directory (below ``[drill] scratch_dir`` when set), removed afterwards, so a drill killed mid-way
leaves nothing a rerun trips over (and no row in ``drills``: rows are written only
with a verdict).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import random
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from binlake import errors, tso
from binlake.drill import proofs as prove
from binlake.lake import freshness
from binlake.lake.store import drills as drills_table
from binlake.replicate.task import Task

Progress = Callable[[str], None]


class DrillFailed(errors.FailedPrecondition):
    """A drill that ran and failed: a difference, a restore error or a missed objective."""


@dataclasses.dataclass
class Choice:
    ts: int
    tables: list[str]
    seed: int | None
    until_ts: int


def choose(spark: Any, lake: str, *, ts: int | None, tables: Sequence[str] | None, seed: int | None,
           until_ts: int | None, count: int) -> Choice:
    """The drill's ts and tables: those given, the rest drawn with ``seed`` (a fresh one,
    recorded, when none is given) from the windows ending at or below ``until_ts``."""
    from binlake.restore import rebuild

    windows = freshness.ledger(lake)
    if not windows:
        raise errors.NotFound(f"no lake at {lake}: nothing was ingested there (binlake ingest ...)")
    newest = max(e for _s, e in windows)
    until = newest if until_ts is None else until_ts
    if until > newest:
        raise errors.InvalidArgument(f"--until-ts {until} is above the newest ingested window end {newest}")
    drawn = ts is None or tables is None
    if drawn and seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    # The schema below until never changes either: the draw stays replayable.
    schema = rebuild.load_schema(spark, lake, until) if drawn else None
    if ts is None:
        assert schema is not None
        # Drawn where a table exists: a lake's first window usually opens before its first
        # CREATE TABLE, and a drill of nothing proves nothing.
        first = min((c for c, _info in schema.entries()), default=None)
        if first is None:
            raise errors.FailedPrecondition(f"no table exists at or below --until-ts {until}: nothing to drill")
        eligible = [(max(s, first, 1), e) for s, e in windows if e <= until and e > max(s, first, 1)]
        if not eligible:
            raise errors.InvalidArgument(f"no ingested window ends at or below --until-ts {until} after the "
                                         f"first table was created (commit_ts {first})")
        s, e = rng.choice(eligible)
        ts = rng.randrange(s, e)
    if tables is None:
        assert schema is not None
        at = rebuild.tables_at(schema, ts)
        names = sorted(f"{i.db}.{i.name}" for i in at.values())
        if not names:
            raise errors.FailedPrecondition(f"no table exists at commit_ts {ts}: nothing to drill")
        tables = sorted(rng.sample(names, min(count, len(names))))
    return Choice(ts, list(tables), seed if drawn else None, until)


@dataclasses.dataclass
class Drill:
    """A finished drill: its figures, proofs and verdict (``to_row`` for ``drills``)."""

    drill_id: str
    started_at: dt.datetime
    choice: Choice
    rows: int = 0
    bytes: int = 0
    restore_s: float = 0.0
    drill_s: float = 0.0
    proving_s: float = 0.0
    rpo_s: float | None = None
    pump_lag_s: dict[str, float] = dataclasses.field(default_factory=dict)
    rpo_objective_s: float | None = None
    rto_objective_s: float | None = None
    proofs: list[prove.Proof] = dataclasses.field(default_factory=list)
    failure: str | None = None
    tables: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "failed" if self.failure else "passed"

    @property
    def proving_share(self) -> float:
        return self.proving_s / self.drill_s if self.drill_s > 0 else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.restore_s if self.restore_s > 0 else 0.0

    @property
    def gb_per_h(self) -> float:
        return self.bytes / 1e9 / (self.restore_s / 3600) if self.restore_s > 0 else 0.0

    @property
    def drill_rows_per_s(self) -> float:
        """Of the whole drill (restore and proofs): what restoring with proof costs."""
        return self.rows / self.drill_s if self.drill_s > 0 else 0.0

    @property
    def drill_gb_per_h(self) -> float:
        return self.bytes / 1e9 / (self.drill_s / 3600) if self.drill_s > 0 else 0.0

    def proof(self, name: str) -> prove.Proof | None:
        return next((p for p in self.proofs if p.name == name), None)

    def to_row(self) -> dict[str, Any]:
        def text(name: str) -> str | None:
            p = self.proof(name)
            return p.text() if p is not None else "not run"

        return {
            "drill_id": self.drill_id, "started_at": self.started_at.replace(tzinfo=None), "ts": self.choice.ts,
            "seed": self.choice.seed, "until_ts": self.choice.until_ts, "tables": ",".join(self.choice.tables),
            "rows": self.rows, "bytes": self.bytes, "restore_s": round(self.restore_s, 3),
            "drill_s": round(self.drill_s, 3), "proving_share": round(self.proving_share, 4),
            "rows_per_s": round(self.rows_per_s, 1), "gb_per_h": round(self.gb_per_h, 6),
            # Not columns of ``drills`` (derived from rows, bytes and drill_s): in the JSON and the Asset event.
            "drill_rows_per_s": round(self.drill_rows_per_s, 1), "drill_gb_per_h": round(self.drill_gb_per_h, 6),
            "rpo_s": self.rpo_s, "pump_lag_s": json.dumps(self.pump_lag_s, sort_keys=True),
            "rpo_objective_s": self.rpo_objective_s, "rto_objective_s": self.rto_objective_s,
            "verdict": self.verdict, "failure": self.failure, "proof_apply": text("apply"),
            "proof_paths": text("paths"), "proof_upstream": text("upstream"),
            "details": json.dumps({"tables": self.tables, "proofs": {p.name: p.to_dict() for p in self.proofs},
                                   "proving_s": round(self.proving_s, 3)}, sort_keys=True),
        }

    def to_dict(self) -> dict[str, Any]:
        row = self.to_row()
        row["started_at"] = self.started_at.isoformat()
        row["details"] = json.loads(row["details"])
        row["pump_lag_s"] = self.pump_lag_s
        return row

    def summary(self) -> str:
        c = self.choice
        lines = [f"drill {self.drill_id}: {self.verdict.upper()}",
                 f"  ts        {tso.format_ts(c.ts)}" + (f"  (seed {c.seed}, until-ts {c.until_ts})" if c.seed is not None
                                                         else ""),
                 f"  tables    {len(c.tables)}: {', '.join(c.tables)}",
                 f"  restore   {self.rows:,} rows, {self.bytes / 1e6:.1f} MB in {self.restore_s:.1f}s "
                 f"({self.rows_per_s:,.0f} rows/s, {self.gb_per_h:.3f} GB/h)  RTO objective {self.rto_objective_s}s",
                 f"  drill     {self.drill_s:.1f}s ({self.drill_rows_per_s:,.0f} rows/s, {self.drill_gb_per_h:.3f} GB/h), "
                 f"proving {self.proving_s:.1f}s ({self.proving_share:.0%})",
                 f"  RPO       {'-' if self.rpo_s is None else f'{self.rpo_s:.1f}s'}  objective {self.rpo_objective_s}s"
                 + "".join(f"  pump {k} {v:.1f}s" for k, v in sorted(self.pump_lag_s.items()))]
        for label, name in (("(a) apply", "apply"), ("(b) paths", "paths"), ("(c) upstream", "upstream")):
            p = self.proof(name)
            lines.append(f"  {label:<13}{p.text() if p is not None else 'not run'}")
        if self.failure:
            lines.append(f"  FAILED    {self.failure}")
        return "\n".join(lines)


_JAVA_ERROR = re.compile(r"((?:[a-z]\w*\.)+\w*(?:Exception|Error)): (.+)$", re.MULTILINE)


def why(exc: BaseException) -> str:
    """One line for an error of the restore: a binlake error's message, else the first
    Java exception a failed Spark job names (not py4j's "error occurred while calling")."""
    if isinstance(exc, errors.BinlakeError):
        return errors.first_line(exc)
    try:
        text = str(exc)
    except Exception:  # the JVM that would render it is gone
        text = type(exc).__name__
    for name, message in _JAVA_ERROR.findall(text):
        if not name.startswith("py4j."):
            return f"{name.rsplit('.', 1)[-1]}: {message.strip()[:300]}"
    return errors.first_line(exc) or type(exc).__name__


def _rpo(lake: str, registry: str | None, now_ms: int) -> tuple[float | None, dict[str, float], int | None]:
    """(now - the newest ingested window end, each Pump's safe-ts lag, the newest end);
    the Pumps' lags only when the registry answers."""
    try:
        f = freshness.measure(lake, registry)
    except errors.BinlakeError:
        f = freshness.measure(lake, None)
    rpo = (now_ms - tso.physical_ms(f.newest_end_ts)) / 1000 if f.newest_end_ts else None
    lags = {str(p["pump"]): max(0.0, (now_ms - tso.physical_ms(int(p["safe_ts"]))) / 1000)
            for p in f.pumps if p.get("safe_ts")}
    return rpo, lags, f.newest_end_ts


def run(spark: Any, lake: str, *, ts: int | None = None, tables: Sequence[str] | None = None,
        seed: int | None = None, until_ts: int | None = None, count: int = 10, target: str | None = None,
        tasks: Sequence[tuple[Task, str]] = (), task_notes: Sequence[str] = (), upstream: str | None = None, registry: str | None = None,
        rpo_objective_s: float | None = None, rto_objective_s: float | None = None, record: bool = True,
        progress: Progress | None = None, scratch_dir: str | None = None) -> Drill:
    """One drill; raises ``DrillFailed`` (after recording it) when it fails. ``scratch_dir``:
    where the default scratch target's directory goes (None: the system's temporary one)."""
    from binlake.restore import restore

    say = progress or (lambda _m: None)
    began = time.monotonic()
    started = dt.datetime.now(dt.UTC)
    rpo, lags, newest = _rpo(lake, registry, int(started.timestamp() * 1000))
    choice = choose(spark, lake, ts=ts, tables=tables, seed=seed, until_ts=until_ts, count=count)
    d = Drill(str(uuid.uuid4()), started, choice, rpo_s=rpo, pump_lag_s=lags, rpo_objective_s=rpo_objective_s,
              rto_objective_s=rto_objective_s)
    try:
        # A ts the ledger does not cover or an unknown table: the user's mistake, refused
        # before anything is written. Any other error reading the plan is a damaged lake.
        auto: restore.Plan | None = restore.plan(spark, lake, choice.ts, choice.tables, "auto")
        planned = True
    except errors.BinlakeError:
        raise
    except Exception as exc:
        d.failure = f"restore at {choice.ts} failed: {why(exc)}"
        planned, auto = False, None
    scratch = None
    if target is None:
        if scratch_dir is not None:
            os.makedirs(scratch_dir, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="binlake-drill-", dir=scratch_dir)
        target = f"sqlite:///{os.path.join(scratch, 'drill.db')}"
    try:
        say(f"restoring {len(choice.tables)} table(s) at {tso.format_ts(choice.ts)} into {target}")
        result = None
        try:
            if planned:
                result = restore.run(spark, lake, choice.ts, tables=choice.tables, target=target, progress=say)
        except errors.InvalidArgument:
            raise
        except Exception as exc:  # a damaged lake shows as any error of the restore: the drill's finding
            d.failure = f"restore at {choice.ts} failed: {why(exc)}"
        if result is not None:
            d.restore_s = result.elapsed_s
            d.rows = result.rows
            proving = time.monotonic()
            try:
                _prove(spark, lake, d, target, auto, tasks, task_notes, upstream, newest, say)
            except errors.InvalidArgument:
                raise
            except Exception as exc:
                d.failure = d.failure or f"proving failed: {why(exc)}"
            d.proving_s = time.monotonic() - proving
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if d.failure is None:
        d.failure = next((f"proof ({p.name}): {p.first}" for p in d.proofs if p.verdict == prove.FAILED), None)
    if d.failure is None and rto_objective_s is not None and d.restore_s > rto_objective_s:
        d.failure = f"RTO objective missed: the restore took {d.restore_s:.2f}s, above rto_s {rto_objective_s:g}s"
    if d.failure is None and rpo_objective_s is not None and rpo is not None and rpo > rpo_objective_s:
        d.failure = f"RPO objective missed: the newest ingested window ended {rpo:.1f}s ago, above rpo_s " \
                    f"{rpo_objective_s:g}s"
    d.drill_s = time.monotonic() - began
    if record:
        drills_table.append(spark, lake, d.to_row())
    if d.failure:
        raise DrillFailed(f"drill {d.drill_id} failed: {d.failure}")
    return d


def _prove(spark: Any, lake: str, d: Drill, target: str, auto: Any, tasks: Sequence[tuple[Task, str]], task_notes: Sequence[str],
           upstream: str | None, newest: int | None, say: Progress) -> None:
    c = d.choice
    # The restore's plan, made before it ran, serves the proofs too: the lake below the
    # ts never changes, and re-planning reads the ledger, schema and catalogs again.
    paths, figures = prove.paths(spark, lake, c.ts, c.tables, target, say, auto)
    d.proofs.append(paths)
    d.bytes = sum(b for _r, _h, b in figures.values())
    d.tables = [{"table": name, "rows": r, "checksum": h, "bytes": b} for name, (r, h, b) in sorted(figures.items())]
    applied = prove.apply_targets(spark, lake, tasks, c.tables, say)
    applied.notes[:0] = list(task_notes)
    d.proofs.append(applied)
    if upstream is not None:
        d.proofs.append(prove.upstream(spark, lake, c.ts, c.tables, target, upstream, newest or c.ts, say, auto))
    else:
        d.proofs.append(prove.Proof("upstream", notes=["no --upstream given"]))


def task_files(text: str | None, root: str = ".") -> list[str]:
    """The task files of the ``[apply] tasks`` setting (a directory of ``*.toml`` or
    comma-separated files, relative to ``root``); None: ``config/tasks`` if it exists."""
    import glob

    explicit = text is not None
    out: list[str] = []
    for part in (p.strip() for p in (text if text is not None else "config/tasks").split(",")):
        if not part:
            continue
        path = part if os.path.isabs(part) else os.path.join(root, part)
        if os.path.isdir(path):
            out.extend(sorted(glob.glob(os.path.join(path, "*.toml"))))
        elif os.path.isfile(path):
            out.append(path)
        elif explicit:
            raise errors.InvalidArgument(f"apply tasks: {path} is neither a task file nor a directory; fix --tasks "
                                         "or [apply] tasks (env BINLAKE_APPLY_TASKS)")
    return out


def load_tasks(files: Sequence[str], resolve: Callable[[str], str | None] | None = None
               ) -> tuple[list[tuple[Task, str]], list[str]]:
    """Each task file's (task, target URL), and a note naming each task whose target
    cannot be reached from here (an Airflow Connection id outside Airflow)."""
    from binlake.replicate import task as task_file

    found: list[tuple[Task, str]] = []
    notes: list[str] = []
    for f in files:
        t = task_file.load(f)
        url = t.target if t.target_is_url else (resolve(t.target) if resolve is not None else None)
        if url is None:
            notes.append(f"task {t.name}: not compared (its target {t.target!r} is an Airflow Connection id; "
                         "the binlake_drill DAG resolves it)")
            continue
        found.append((t, url))
    return found, notes
