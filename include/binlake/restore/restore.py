"""``binlake restore``: every table (or the chosen ones) as of commit_ts T.

Semantics are Reparo's stop-tso: every transaction with commit_ts <= T is in,
none after. A datetime converts to a TSO as Reparo does: the first TSO of that
millisecond, in local time unless a zone is given (``resolve_ts``).

Steps (each a function, so the ``binlake_restore`` DAG runs them as tasks):

1. ``resolve_ts``   commit_ts or datetime (+ zone) -> T
2. ``plan``         the tables at T (renamed tables follow their id; dropped or
                    truncated ones are absent, as are tables created after T), each
                    with its base (newest snapshot at or below T, the history tables,
                    or the lake's start), every one checked against the ``windows``
                    ledger. Nothing is written before every check passed.
3. ``rebuild``      a typed DataFrame per table (``rebuild.state_at``)
4. ``write_out``    Delta tables ``OUT/<db>.<table>``, then ``OUT/_binlake_restore.json``
                    (written last: its presence says the restore completed)
   ``load_target``  tables created from the definitions at T and bulk-loaded through
                    the target's ``Target`` (``binlake.sql.targets``)
5. ``verify``       ``binlake diff`` of the target against a source database
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import time
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from binlake import errors, failpoint, tso
from binlake.lake.store.ledger import BOUNDS, is_delta, read_windows
from binlake.lake.store.location import check_lake, table_path
from binlake.proto import binlog_pb2
from binlake.restore import claims, coverage, history, layout, naming, onepass, rebuild, snapshot, stream
from binlake.restore import direct as _direct
from binlake.restore import fills as fill_mod
from binlake.restore import patch as _patch
from binlake.restore.tables import (
    Item,
    Plan,
    TablePlan,
    Tally,
    base_alone,
    direct_tables,
    in_plan_order,
    items,
    shared_changes_sized,
    write_tables,
)
from binlake.sql import targets
from binlake.sql import url as sql_url
from binlake.sql.diff import diff_databases

Progress = Callable[[str], None]
MANIFEST = "_binlake_restore.json"
SOURCES = ("auto", "changes", "history")


def resolve_ts(commit_ts: int | None = None, datetime: str | None = None, tz: str | None = None) -> int:
    """T from exactly one of ``commit_ts`` or ``datetime`` (ISO-8601; local time, or
    ``tz`` (an IANA zone such as Europe/Paris, or UTC), unless it carries an offset)."""
    if (commit_ts is None) == (datetime is None or datetime == ""):
        raise errors.InvalidArgument("give exactly one of a commit_ts (--ts) or a datetime (--datetime)")
    if commit_ts is not None:
        if isinstance(commit_ts, bool) or not isinstance(commit_ts, int) or not 0 < commit_ts < tso.MAX_TS:
            raise errors.InvalidArgument(f"commit_ts must be a positive integer TSO, got {commit_ts!r}")
        if tz:
            raise errors.InvalidArgument("--tz applies to --datetime only")
        return commit_ts
    zone: dt.tzinfo | None
    if tz:
        try:
            zone = dt.UTC if tz.upper() == "UTC" else zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise errors.InvalidArgument(f"unknown time zone {tz!r}; use an IANA name such as Europe/Paris or UTC") from None
    else:
        zone = dt.datetime.now().astimezone().tzinfo  # local time, as Reparo reads --stop-datetime
    try:
        return tso.parse_datetime(str(datetime), zone)
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc)) from None


def plan(spark: Any, lake: str, ts: int, tables: Sequence[str] | None = None, source: str = "auto") -> Plan:
    """The tables to rebuild at ``ts`` and where each starts; refuses (nothing written)
    when the ledger does not cover the restore or a table is unknown."""
    if spark is None or not hasattr(spark, "read"):
        raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
    check_lake(lake)
    if source not in SOURCES:
        raise errors.InvalidArgument(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if tables is not None and (isinstance(tables, str) or not all(isinstance(t, str) and t.strip() for t in tables)):
        raise errors.InvalidArgument(f"tables must be a list of table names, got {tables!r}")
    if not is_delta(spark, table_path(lake, "windows")):
        raise errors.NotFound(f"no lake at {lake}: nothing was ingested there (binlake ingest ...)")
    windows = read_windows(spark, lake, BOUNDS)
    coverage.check(windows, ts)  # T above the lake, in no window: refused before anything else
    schema = rebuild.load_schema(spark, lake, ts)
    chosen = rebuild.select_tables(rebuild.tables_at(schema, ts), tables, ts, schema,
                                   lambda: rebuild.load_schema(spark, lake, tso.MAX_TS))
    entries = snapshot.catalog(spark, lake) if source == "auto" else []
    hist = history.catalog(spark, lake) if source == "history" else {}
    plans = []
    for table_id, info in sorted(chosen.items()):
        name = f"{info.db}.{info.name}"
        if source == "history":
            base = history.base_at(spark, lake, hist, table_id, ts, name)
        else:
            base = snapshot.base_for(spark, entries, schema, table_id, ts)
        snapshot.check_base(windows, schema, table_id, ts, base, name)
        plans.append(TablePlan(table_id, info, base))
    skipped = rebuild.pending_at(schema, ts, lambda: rebuild.load_schema(spark, lake, tso.MAX_TS)) \
        if tables is None else []
    return Plan(lake, ts, schema, plans, source, skipped)


@dataclasses.dataclass
class RestoreResult:
    ts: int
    tables: list[tuple[str, int, str]]  # (db.table, rows, base)
    elapsed_s: float
    out: str | None = None
    target: str | None = None
    verified: str | None = None
    renamed: dict[str, str] = dataclasses.field(default_factory=dict)  # db.table -> where it went
    run_id: str | None = None  # the run a target's tables are claimed for
    skipped: list[str] = dataclasses.field(default_factory=list)  # Plan.skipped: not restored, and why

    @property
    def rows(self) -> int:
        return sum(n for _t, n, _b in self.tables)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "datetime": tso.to_datetime(self.ts).isoformat(), "rows": self.rows,
                "tables": [{"table": t, "rows": n, "base": b} for t, n, b in self.tables],
                "elapsed_s": round(self.elapsed_s, 3), "rows_per_s": round(self.rows_per_s, 1), "out": self.out,
                "target": self.target, "verified": self.verified, "renamed": dict(self.renamed),
                "run_id": self.run_id, "not_restored": list(self.skipped)}

    def summary(self) -> str:
        where = self.out or self.target or "-"
        lines = [f"restored to commit_ts {tso.format_ts(self.ts)} -> {where}",
                 f"  tables   {len(self.tables)}", f"  rows     {self.rows}",
                 f"  elapsed  {self.elapsed_s:.1f}s ({self.rows_per_s:,.0f} rows/s)"]
        lines += [f"    {name:<40} {rows:>10}  from {base}"
                  + (f"  -> {self.renamed[name]}" if name in self.renamed else "") for name, rows, base in self.tables]
        lines += [f"  NOT restored: {line}" for line in self.skipped]
        if self.verified:
            lines.append(f"  verify   {self.verified}")
        return "\n".join(lines)


def out_path(out: str, info: binlog_pb2.TableInfo, name: str | None = None) -> str:
    """Where table ``info`` is written under ``out``: ``OUT/<db>.<table>``, or ``OUT/<name>``."""
    base = out if "://" in out else os.path.abspath(out)
    return f"{base.rstrip('/')}/{name or f'{info.db}.{info.name}'}"


def check_out(spark: Any, out: str, p: Plan, replace: bool, names: naming.Naming | None = None,
              flags: naming.Flags = naming.CLI) -> None:
    """``out`` usable, every table's directory name too (``names``: renamed ones), none
    taken unless ``replace``."""
    if not isinstance(out, str) or not out.strip():
        raise errors.InvalidArgument(f"out must be a directory path or URI, got {out!r}")
    names = names or naming.Naming()
    naming.check_out(p, names, flags)
    if replace:
        return
    taken = [names.out_name(t) for t in p.tables if is_delta(spark, out_path(out, t.info, names.out_name(t)))]
    if taken:
        raise errors.AlreadyExists(
            f"{out} already holds table(s) {', '.join(taken)}: choose an empty --out directory or pass --replace")


def write_out(spark: Any, p: Plan, out: str, replace: bool = False, progress: Progress | None = None,
              parallelism: int = onepass.DEFAULT_PARALLELISM, names: naming.Naming | None = None) -> RestoreResult:
    """Rebuild every planned table and write it as a typed Delta table under ``out``
    (``names``: the renamed tables' directories): one pass over the lake, then up to
    ``parallelism`` tables written at once (each one Delta commit: a table is there
    whole or not at all)."""
    onepass.check_parallelism(parallelism)
    say = progress or (lambda _m: None)
    started = time.monotonic()
    names = names or naming.Naming()
    check_out(spark, out, p, replace, names)
    done = write_tables(spark, p, lambda t: out_path(out, t.info, names.out_name(t)), parallelism, say)
    result = RestoreResult(p.ts, done, time.monotonic() - started, out=out, renamed=names.renamed(p))
    failpoint.hit("restore-before-manifest")
    if "://" not in out:
        # Written last, through a rename: present only once every table is complete.
        os.makedirs(out, exist_ok=True)
        tmp = os.path.join(out, MANIFEST + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(result.to_dict(), fh, indent=1)
        os.replace(tmp, os.path.join(out, MANIFEST))
    return result


def open_target(url: str) -> targets.Target:
    """Connect to the target first: an unreachable one is refused before any work."""
    if not isinstance(url, str) or "://" not in url:
        raise errors.InvalidArgument(f"target must be a database URL such as sqlite:///restored.db or "
                                     f"duckdb:///restored.duckdb, got {url!r}")
    return sql_url.open_target(url)


@dataclasses.dataclass(frozen=True)
class Claim:
    """The run a restore's tables are claimed for in the target (``claims``)."""

    run_id: str
    ts: int
    replace: bool = False


def load_table(target: targets.Target, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]] = (),
               *, tables: Iterable[pa.Table] = (), claim: Claim | None = None,
               changed: _patch.Changed | None = None) -> int:
    """Create table ``info`` in ``target`` and load ``rows`` (or ``tables``: Arrow tables
    from ``stream.arrow_tables``), then apply ``changed`` (``patch``: the keys changed
    since the base ``tables`` holds), in one transaction: where DDL is transactional
    (``Target.transactional_ddl``) a crash leaves no table at all rather than an empty or
    partial one; MySQL commits its DDL. An existing table is refused, or with ``claim``
    replaced when that run created it (or ``claim.replace``), and the table claimed."""
    with target.engine.connect() as conn:
        conn.begin()
        if claim is None:
            target.create_table_in(conn, info, if_exists="fail")
        else:
            claims.create_in(target, conn, info, claim.run_id, claim.ts, claim.replace)
        n = int(target.insert_rows(conn, info, rows))
        n += int(target.insert_arrow_stream(conn, info, tables))
        if changed is not None:
            n += changed.apply(target, conn)
        conn.commit()
    return n


def load_target(spark: Any, p: Plan, target: targets.Target, url: str, progress: Progress | None = None,
                parallelism: int = onepass.DEFAULT_PARALLELISM, *, placement: naming.Placement | None = None,
                claim: Claim | None = None) -> RestoreResult:
    """Create every table from its definition at T and bulk-load its rows, up to
    ``parallelism`` tables at once; ``placement`` (checked by ``naming.check_target``)
    says where each goes (its own name in ``target`` without one), ``claim`` for which
    run (see ``load_table``). Small tables rebuilt from the lake's changes alone
    are decoded in Python from the one-pass result as it streams out of Spark (no
    Spark job per table); big ones, and tables with base rows (a snapshot, the history
    tables) or a retyped column, take the typed Spark rebuild (``frames``), streamed
    to the target in bounded batches (``stream``)."""
    onepass.check_parallelism(parallelism)
    if not target.concurrent_writers:
        parallelism = 1  # one writer at a time (SQLite, DuckDB): concurrent loads would only wait on its lock
    say = progress or (lambda _m: None)
    started = time.monotonic()
    if placement is None:
        placement = naming.Placement(target, naming.Naming(), None)
        if parallelism > 1:
            target.ensure_schema_table()
    else:
        placement.prepare(p, say)
    say(f"reading the lake once for {len(p.tables)} table(s)")
    shared, found = shared_changes_sized(spark, p)
    direct = direct_tables(p, found, lambda t: _direct.eligible(p.schema, t.table_id, p.ts, t.base))
    tally = Tally(len(p.tables), say)

    def load(item: Item) -> tuple[str, int, str]:
        t, raw, df = item
        into, info = placement.target_for(t), placement.naming.info(t)
        files: Iterable[pa.Table] | None = None
        rows: Iterable[Mapping[str, Any]] | None = None
        changed, kind = None, t.base.kind
        alone = df is not None and base_alone(p, t, found)
        if alone or (df is not None and _patch.eligible(p, t)):
            # The base's own files, read here: the table at T as it is, or patched with
            # the keys changed since (``patch``).
            fills = fill_mod.base_fills(p.schema, t.table_id, t.base.ts)
            if stream.arrow_ready(t.info):
                files = stream.base_tables(t.base, t.info, fills)
            else:
                rows = stream.base_rows(t.base, t.info, fills)
            if (files is not None or rows is not None) and not alone:
                changed, kind = _patch.changed(p, t, shared, info), f"{t.base.kind} + changes"
        if df is None:
            n = load_table(into, info, _direct.rows_at(p.schema, t.table_id, p.ts, raw), claim=claim)
        elif files is not None or rows is not None:
            n = load_table(into, info, rows or (), tables=files or (), claim=claim, changed=changed)
        else:
            if t.base.frame is not None or not onepass.slice_for(p.schema, t.table_id, p.ts, t.base).final:
                # An aggregating rebuild: its partitions are Spark's shuffle's, sized here
                # (the base's rows taken as wide as the changes' images).
                changes, nbytes = found.get(t.table_id, (0, 0))
                based = int(t.base.frame.count()) if t.base.frame is not None else 0
                df = stream.bounded(df, changes + based, nbytes + based * (nbytes // changes if changes else 256))
            if stream.arrow_ready(t.info):
                n = load_table(into, info, tables=stream.arrow_tables(df, t.info), claim=claim)
            else:
                n = load_table(into, info, stream.python_rows(df, t.info), claim=claim)
        tally.done(t.name, n, "rows from " + kind)
        return (t.name, n, kind)

    done = in_plan_order(p, onepass.each_table(items(spark, p, shared, direct, found), load, parallelism))
    return RestoreResult(p.ts, done, time.monotonic() - started, target=url, renamed=placement.naming.renamed(p))


def verify(source_url: str, target_url: str, tables: Sequence[str] | None = None) -> tuple[bool, str]:
    """``binlake diff`` of ``target_url`` against ``source_url`` on ``tables`` (None: every table)."""
    report = diff_databases(source_url, target_url, tables=list(tables) if tables is not None else None)
    return bool(report.ok), str(report.summary())


def check_options(out: str | None, target: str | None, verify_url: str | None,
                  renames: Sequence[tuple[str, str]], into_schema: str | None) -> None:
    """The combinations refused before anything is read: exactly one destination, --verify
    with --target only and not with renamed tables, --into-schema where the target's kind
    has schemas."""
    if (out is None) == (target is None):
        raise errors.InvalidArgument("give exactly one destination: --out DIR or --target URL")
    if verify_url is not None and target is None:
        raise errors.InvalidArgument("--verify compares a target database: use it with --target")
    if verify_url is not None and (renames or into_schema):
        raise errors.InvalidArgument("--verify compares tables under their own names: it cannot check tables "
                                     "restored with --rename or --into-schema; run binlake diff on them instead")
    if target is not None:
        naming.check_kind(targets.for_scheme(sql_url.normalize_url(target).drivername), into_schema)


def run(spark: Any, lake: str, ts: int, *, tables: Sequence[str] | None = None, out: str | None = None,
        target: str | None = None, verify_url: str | None = None, replace: bool = False, source: str = "auto",
        progress: Progress | None = None, parallelism: int = onepass.DEFAULT_PARALLELISM,
        renames: Sequence[tuple[str, str]] = (), into_schema: str | None = None,
        run_id: str | None = None) -> RestoreResult:
    """The whole restore: plan (every refusal before any write), rebuild, write or load, verify.
    ``parallelism``: how many tables are written or loaded at once. ``renames`` (OLD, NEW)
    and ``into_schema``: where the tables go (``binlake.restore.naming``). Into a target,
    the tables are claimed for run ``run_id`` (None: a run of its own): a rerun under the
    same id replaces what that run created; anything else already there is refused
    unless ``replace``."""
    onepass.check_parallelism(parallelism)
    check_options(out, target, verify_url, renames, into_schema)
    say = progress or (lambda _m: None)
    started = time.monotonic()
    conn = open_target(target) if target is not None else None
    placement = None
    try:
        say(f"planning the restore to {tso.format_ts(ts)}")
        p = plan(spark, lake, ts, tables, source)
        for line in p.skipped:
            say(f"not restored: {line}")
        names = naming.resolve(p, renames, into_schema)
        if conn is None:
            assert out is not None  # exactly one destination, checked above
            check_out(spark, out, p, replace, names)
            result = write_out(spark, p, out, replace, say, parallelism, names)
        else:
            run_id = naming.check_run_id(run_id) if run_id is not None else naming.new_run_id(ts)
            say(f"restore run {run_id}: to finish it if it is stopped, run it again with --run-id {run_id}")
            placement = naming.check_target(conn, p, names, run_id, replace)
            result = load_target(spark, p, conn, str(target), say, parallelism, placement=placement,
                                 claim=Claim(run_id, ts, replace))
            result.run_id = run_id
    finally:
        if placement is not None:
            placement.close()
        if conn is not None:
            conn.close()
    result.skipped = list(p.skipped)
    if verify_url is not None and target is not None:
        say("verifying the target against the source (binlake diff)")
        ok, text = verify(verify_url, target, [t.info.name for t in p.tables])
        result.verified = ("clean: " if ok else "DIFFERENCES: ") + text.splitlines()[0] if text else str(ok)
        if not ok:
            raise errors.FailedPrecondition(f"restore verified against {verify_url}: the tables differ: {text}")
    result.elapsed_s = time.monotonic() - started
    return result


__all__ = ["Plan", "RestoreResult", "coverage", "layout", "plan", "resolve_ts", "run"]
