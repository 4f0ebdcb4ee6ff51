"""Where each restored table goes: its name, and its schema, in a target or under --out.

A restore normally creates each table under its own name (``shop.orders`` becomes
``orders`` in the target's own schema or database; ``OUT/shop.orders`` for --out).
Into a live database, that name is usually taken, so ``binlake restore`` takes:

* ``--rename OLD=NEW`` (several, or comma-separated): OLD is one of the restored
  tables (``TABLE`` or ``DB.TABLE`` as named at T); NEW is ``TABLE``, or
  ``DB.TABLE``. A DB equal to OLD's own keeps the table where the restore puts every
  table (so ``shop.orders=shop.orders_0903`` is a plain rename on every target);
  another DB puts it in that schema (PostgreSQL) or database (MySQL/MariaDB), created
  if missing. SQLite and DuckDB have none: another DB is refused.
* ``--into-schema S``: every restored table goes into schema/database S (created if
  missing). A --rename may then give ``TABLE`` or ``S.TABLE``; any other DB is a
  conflict and refused. Refused on SQLite and DuckDB (restore into another file).

With --out the schema part is the first part of the directory name
(``OUT/<schema>.<table>``; the table's db when none is given).

Every name is checked before the first write (``check_target``, ``check_out``): a
valid name for the database (length, reserved prefixes, ``_binlake_*``), no two
tables onto one name (as the database compares names), and no table already in
the target that this run did not create (``claims``) unless replace; a table
another restore made is named with that run, so a stopped restore is finished by
running it again under its run id (``--run-id``, the DAG run's own id). A table
restored under another name is recorded in the target's ``_binlake_schema`` under
a table id of its own (``renamed_id``), so the row of a live table of the same
source table (an apply's) is left alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.restore import claims
from binlake.restore.tables import Plan, Progress, TablePlan
from binlake.sql import targets
from binlake.sql import url as sql_url


@dataclasses.dataclass(frozen=True)
class Flags:
    """How messages name the two settings (the CLI's flags, the DAG's params)."""

    rename: str = "--rename"
    into_schema: str = "--into-schema"
    replace: str = "pass --replace"  # what to do to overwrite
    rerun: str = "run it again with --run-id {run}"  # what to do to finish a stopped run


CLI = Flags()
PARAMS = Flags("rename", "into_schema", "set replace", "retry or clear that DAG run ({run})")


@dataclasses.dataclass(frozen=True)
class Dest:
    """Where one table goes: ``namespace`` None is where the restore puts tables by
    default (the target's own schema/database; for --out, the table's db)."""

    namespace: str | None
    table: str


@dataclasses.dataclass(frozen=True)
class Naming:
    """table id -> where it goes, for the planned tables (only the moved ones listed)."""

    moved: Mapping[int, Dest] = dataclasses.field(default_factory=dict)
    into_schema: str | None = None

    def dest(self, t: TablePlan) -> Dest:
        return self.moved.get(t.table_id, Dest(None, t.info.name))

    def info(self, t: TablePlan) -> binlog_pb2.TableInfo:
        """``t``'s definition as created in the target: its new name, and, when renamed,
        a table id of its own (``renamed_id``)."""
        d = self.dest(t)
        if d.table == t.info.name:
            return t.info
        info = binlog_pb2.TableInfo()
        info.CopyFrom(t.info)
        info.name = d.table
        info.table_id = renamed_id(d)
        return info

    def out_name(self, t: TablePlan) -> str:
        """The directory name of ``t`` under --out: ``<schema or db>.<table>``."""
        d = self.dest(t)
        return f"{d.namespace or t.info.db}.{d.table}"

    def shown(self, t: TablePlan) -> str | None:
        """How messages name ``t``'s destination when it moved (None when it did not)."""
        if t.table_id not in self.moved:
            return None
        d = self.moved[t.table_id]
        return f"{d.namespace}.{d.table}" if d.namespace else d.table

    def renamed(self, p: Plan) -> dict[str, str]:
        """db.table -> its destination, for the tables that moved (the result's record)."""
        return {t.name: shown for t in p.tables if (shown := self.shown(t)) is not None}

    def namespaces(self) -> set[str]:
        return {d.namespace for d in self.moved.values() if d.namespace is not None}


def renamed_id(d: Dest) -> int:
    """A table id for a table restored under another name: negative (no source table's id
    is), and the same for the same destination (a retry records over its own row)."""
    digest = hashlib.blake2b(f"{d.namespace or ''}.{d.table}".encode(), digest_size=8).digest()
    return -(int.from_bytes(digest, "big") >> 2) - 1


def _split(text: str, flag: str, whole: str) -> tuple[str | None, str]:
    parts = text.strip().split(".")
    if len(parts) > 2 or not all(p.strip() for p in parts):
        raise errors.InvalidArgument(f"{flag} {whole!r}: {text.strip()!r} is not TABLE or DB.TABLE")
    if len(parts) == 1:
        return None, parts[0].strip()
    return parts[0].strip(), parts[1].strip()


def parse_renames(values: str | Iterable[str] | None, flag: str = CLI.rename) -> list[tuple[str, str]]:
    """``OLD=NEW`` pairs from the flag's values (each separated by commas or spaces); syntax only."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    pairs = []
    for value in values:
        if not isinstance(value, str):
            raise errors.InvalidArgument(f"{flag}: give OLD=NEW pairs (e.g. shop.orders=orders_0903), got {value!r}")
        items = [v for v in re.split(r"[,\s]+", value) if v]
        if not items:
            raise errors.InvalidArgument(f"{flag} is empty: give OLD=NEW, e.g. shop.orders=shop.orders_0903")
        for item in items:
            old, eq, new = item.partition("=")
            if not eq or not old.strip() or not new.strip() or "=" in new:
                raise errors.InvalidArgument(
                    f"{flag} {item!r}: give OLD=NEW (TABLE or DB.TABLE each), e.g. shop.orders=shop.orders_0903")
            _split(old, flag, item)
            _split(new, flag, item)
            pairs.append((old.strip(), new.strip()))
    return pairs


def parse_schema(value: str | None, flag: str = CLI.into_schema) -> str | None:
    """The --into-schema name (syntax only: one name, no dots)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "." in value or "," in value or value != value.strip():
        raise errors.InvalidArgument(f"{flag} {value!r}: give one schema (PostgreSQL) or database (MariaDB) name, "
                                     "e.g. restored_0903")
    return value


def check_kind(kind: type[targets.Target] | None, into_schema: str | None, flags: Flags = CLI) -> None:
    """What the kind of target alone refuses, before connecting: --into-schema where the
    database has no schemas. (A NEW in another schema is refused by ``check_target``.)"""
    if kind is not None and kind.namespace is None and into_schema is not None:
        raise errors.InvalidArgument(
            f"{flags.into_schema}: {kind.title} has no schemas; restore into another {kind.title} file "
            f"(e.g. {kind.example_url}), or name the tables with {flags.rename}")


def resolve(p: Plan, renames: Sequence[tuple[str, str]], into_schema: str | None,
            flags: Flags = CLI) -> Naming:
    """Each planned table's destination; refuses an OLD that is not among the restored
    tables (or is ambiguous, or given twice) and a NEW whose schema conflicts with
    ``into_schema``. Names against a database: ``check_target``/``check_out``."""
    moved: dict[int, Dest] = {}
    given: dict[int, str] = {}
    restored = ", ".join(t.name for t in p.tables) or "none"
    for old, new in renames:
        old_db, old_tbl = _split(old, flags.rename, f"{old}={new}")
        hits = [t for t in p.tables if t.info.name == old_tbl and (old_db is None or t.info.db == old_db)]
        if not hits:
            raise errors.InvalidArgument(
                f"{flags.rename} {old}={new}: {old} is not among the restored tables ({restored}); "
                f"name one of them, or add it to the tables")
        if len(hits) > 1:
            raise errors.InvalidArgument(f"{flags.rename} {old}={new}: {old} is ambiguous; give DB.TABLE")
        t = hits[0]
        if t.table_id in given:
            raise errors.InvalidArgument(f"{flags.rename}: {t.name} is renamed twice ({given[t.table_id]} and {new}); "
                                         "give one NEW per table")
        given[t.table_id] = new
        new_db, new_tbl = _split(new, flags.rename, f"{old}={new}")
        ns: str | None
        if into_schema is not None:
            if new_db is not None and new_db != into_schema:
                raise errors.InvalidArgument(
                    f"{flags.rename} {old}={new} conflicts with {flags.into_schema} {into_schema}: every table goes "
                    f"into {into_schema}; give NEW as {new_tbl} (or {into_schema}.{new_tbl})")
            ns = into_schema
        else:
            ns = None if new_db is None or new_db == t.info.db else new_db
        moved[t.table_id] = Dest(ns, new_tbl)
    if into_schema is not None:
        for t in p.tables:
            moved.setdefault(t.table_id, Dest(into_schema, t.info.name))
    return Naming(moved, into_schema)


def _collisions(p: Plan, naming: Naming, key: Callable[[TablePlan], Hashable], flags: Flags = CLI) -> None:
    """Refuse two tables whose ``key`` (where each lands, as the destination compares names) is one."""
    seen: dict[Hashable, TablePlan] = {}
    for t in p.tables:
        k = key(t)
        if k in seen:
            first = seen[k]
            where = naming.shown(t) or naming.shown(first) or t.info.name
            raise errors.InvalidArgument(
                f"{first.name} and {t.name} would both be {where} in the destination: "
                f"give one of them another name with {flags.rename}")
        seen[k] = t


def check_out(p: Plan, naming: Naming, flags: Flags = CLI) -> None:
    """The --out directory names: usable as one directory each, visible to Delta readers
    (no leading ``_`` or ``.``), and no two tables onto one."""
    for t in p.tables:
        name = naming.out_name(t)
        bad = next((ch for ch in ("/", "\\", "\x00") if ch in name), None)
        problem = (f"holds {bad!r}" if bad is not None else
                   "begins with _ or . (Delta and Spark readers skip such directories)" if name[0] in "._" else
                   None)
        if problem is not None:
            raise errors.InvalidArgument(f"the output directory {name!r} of {t.name} {problem}: choose another name")
    _collisions(p, naming, naming.out_name, flags)


class Placement:
    """The target's namespaces a restore writes to: checked (``check_target``) before any
    write, made (``prepare``) before the first table, each a ``Target`` of its own."""

    def __init__(self, target: targets.Target, naming: Naming, current: str | None) -> None:
        self.target, self.naming, self.current = target, naming, current
        self._open: dict[str, targets.Target] = {}

    def namespace_of(self, t: TablePlan) -> str | None:
        """``t``'s namespace, None for the target's own."""
        ns = self.naming.dest(t).namespace
        return None if ns is None or ns == self.current else ns

    def target_for(self, t: TablePlan) -> targets.Target:
        """The ``Target`` that creates ``t`` (after ``prepare``)."""
        ns = self.namespace_of(t)
        if ns is None:
            return self.target
        if ns not in self._open:
            self._open[ns] = in_namespace(self.target, ns)
        return self._open[ns]

    def prepare(self, p: Plan, say: Progress) -> None:
        """Create the missing namespaces (said in the log), and the claims table of each."""
        for ns in sorted({n for t in p.tables if (n := self.namespace_of(t)) is not None}):
            if not self.target.has_namespace(ns):
                say(f"creating {self.target.namespace} {ns} in the target")
                with self.target.engine.connect() as conn:
                    conn.begin()
                    self.target.execute_ddl(conn, self.target.create_namespace_sql(self.target.engine, ns))
                    conn.commit()
        for scoped in {id(x): x for x in (self.target_for(t) for t in p.tables)}.values():
            # Made now, so tables created at once do not race to make them.
            scoped.ensure_schema_table()
            claims.ensure_table(scoped)

    def close(self) -> None:
        for t in self._open.values():
            t.close()
        self._open.clear()


def in_namespace(target: targets.Target, ns: str) -> targets.Target:
    """A ``Target`` on ``target``'s database whose unqualified names land in ``ns``."""
    url = type(target).namespace_url(target.engine.url, ns)
    return sql_url.open_target(url.render_as_string(hide_password=False))


def check_target(target: targets.Target, p: Plan, naming: Naming, run_id: str, replace: bool,
                 flags: Flags = CLI) -> Placement:
    """Every destination checked against the target before the first write: names it can
    take, no two tables onto one, no table there this run did not create (unless
    ``replace``). Writes nothing; the ``Placement`` to load through."""
    kind = type(target)
    check_kind(kind, naming.into_schema, flags)
    if naming.namespaces() and kind.namespace is None:
        t = next(t for t in p.tables if naming.dest(t).namespace is not None)
        raise errors.InvalidArgument(
            f"{flags.rename}: {kind.title} has no schemas, so {t.name} cannot go into "
            f"{naming.dest(t).namespace}; give NEW as {naming.dest(t).table} (TABLE alone)")
    for schema in sorted(naming.namespaces()):
        problem = kind.name_problem(schema, namespace=True)
        if problem is not None:
            raise errors.InvalidArgument(f"{kind.namespace} name {schema!r} {problem}: choose another")
    for t in p.tables:
        name = naming.dest(t).table
        problem = kind.name_problem(name)
        if problem is not None:
            what = f"the new name of {t.name}" if t.table_id in naming.moved else "the table"
            raise errors.InvalidArgument(f"{what}, {name!r}, {problem}: give it another with {flags.rename}")
    placement = Placement(target, naming, target.current_namespace() if kind.namespace else None)

    def key(t: TablePlan) -> tuple[str, str]:
        where = placement.namespace_of(t)
        return (target.name_key(where) if where is not None else "", target.name_key(naming.dest(t).table))

    _collisions(p, naming, key, flags)
    if not replace:
        taken: list[str] = []
        owners: set[str] = set()
        by_ns: dict[str | None, list[TablePlan]] = {}
        for t in p.tables:
            by_ns.setdefault(placement.namespace_of(t), []).append(t)
        for ns, group in sorted(by_ns.items(), key=lambda kv: kv[0] or ""):
            if ns is not None and not target.has_namespace(ns):
                continue  # made by this restore: nothing in it yet
            scoped = target if ns is None else in_namespace(target, ns)
            try:
                names = [naming.dest(t).table for t in group]
                for n, owner in claims.foreign_owners(scoped, names, run_id).items():
                    taken.append(f"{ns}.{n}" if ns else n)
                    owners |= {owner} if owner is not None else set()
            finally:
                if scoped is not target:
                    scoped.close()
        if taken:
            rerun = "; to finish a stopped restore that made them, " + flags.rerun.format(run=", ".join(sorted(owners))) \
                if owners else ""
            raise errors.AlreadyExists(
                f"target {target} already holds table(s) {', '.join(taken)} that this restore did not create: "
                f"give them other names with {flags.rename} (or {flags.into_schema}), drop them, "
                f"or {flags.replace} to overwrite them{rerun}")
    return placement


def new_run_id(ts: int) -> str:
    """A run of its own for a restore given no run id: it replaces nothing already there."""
    return f"restore-{ts}-{uuid.uuid4().hex[:8]}"


def check_run_id(run_id: str, flag: str = "--run-id") -> str:
    if not isinstance(run_id, str) or not run_id.strip() or len(run_id) > 250 or run_id != run_id.strip():
        raise errors.InvalidArgument(f"{flag} {run_id!r}: give a name of 1 to 250 characters, without spaces "
                                     "at its ends (the run a stopped restore is finished as)")
    return run_id
