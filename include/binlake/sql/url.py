"""Database URLs binlake accepts, and connecting to one.

Every role that writes to or reads a SQL database by URL (the apply's targets,
restore, ``binlake diff``, the command-line checks of ``binlake.cli.argcheck``) parses
it here, so a URL is accepted or refused the same way everywhere. Which URLs a database
takes, and how its engine is set up, its ``Target`` module says (``binlake.sql.targets``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from binlake import errors
from binlake.sql import targets


def normalize_url(url: str) -> sa.engine.URL:
    """``url`` parsed, with bare ``postgresql://`` / ``mysql://`` given binlake's drivers;
    ``errors.InvalidArgument`` for anything else."""
    return _parse(url)[1]


def _parse(url: str) -> tuple[type[targets.Target], sa.engine.URL]:
    if not isinstance(url, str) or not url.strip():
        raise errors.InvalidArgument(f"target must be a database URL such as sqlite:///replica.db, got {url!r}")
    try:
        parsed = sa.engine.make_url(url.strip())
    except sa.exc.ArgumentError:
        raise errors.InvalidArgument(
            f"target {url!r} is not a database URL: use {targets.url_forms()}") from None
    name = parsed.drivername
    kind = targets.for_scheme(name)
    if kind is None:
        schemes = ", ".join(s for k in targets.kinds() for s in k.schemes)
        raise errors.InvalidArgument(
            f"target {parsed.render_as_string(hide_password=True)!r}: unsupported database {name!r} "
            f"(use one of {schemes})")
    if name in kind.schemes and name not in kind.drivers:
        parsed = parsed.set(drivername=kind.schemes[name])
    return kind, kind.prepare_url(parsed)


def _create(url: str, *, writer: bool) -> sa.engine.Engine:
    """An engine for ``url``, not yet connected: a writer's with its database's options
    and listeners (a file database's directory created), else a reader's, which takes
    none of a writer's settings or locks."""
    kind, parsed = _parse(url)
    options: dict[str, Any] = kind.engine_options(parsed) if writer else {}
    try:
        engine = sa.create_engine(parsed, **options)
    except ImportError as exc:
        raise errors.FailedPrecondition(f"database {parsed.render_as_string(hide_password=True)}: its driver "
                                        f"is not installed ({exc}); run `make setup`") from None
    kind.prepare_engine(engine, writer=writer)
    return engine


def reader_engine(url: str) -> sa.engine.Engine:
    """An engine that only reads the database at ``url`` (diff, checksums), not yet connected."""
    return _create(url, writer=False)


def check_reachable(engine: sa.engine.Engine, what: str) -> None:
    """One round trip to ``engine``'s database; ``errors.Unavailable`` naming it as ``what``
    (the engine disposed) when it does not answer."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.DBAPIError as exc:
        engine.dispose()
        shown = engine.url.render_as_string(hide_password=True)
        raise errors.Unavailable(f"cannot reach {what} {shown}: {errors.first_line(exc)}") from None


def open_engine(url: str) -> sa.engine.Engine:
    """An engine for the database at ``url`` (a target, or one to check), answering now (one
    round trip); a file database's directory is created. ``errors.Unavailable`` if it does not."""
    engine = _create(url, writer=True)
    check_reachable(engine, "target")
    return engine


def open_target(url: str) -> targets.Target:
    """Connect to the target at ``url`` (checked with one round trip)."""
    engine = open_engine(url)
    return targets.kind(engine.dialect.name)(engine)
