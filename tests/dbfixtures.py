"""Upstream database fixtures: throwaway PostgreSQL and MariaDB servers, and a
fresh upstream database per test on SQLite, PostgreSQL and MariaDB.

A test module imports the fixtures it uses (pytest registers fixtures found in
a test module's namespace), the same way suites import ``pumpkit``:

    from dbfixtures import mariadb_server, postgres_server, upstream_url  # noqa: F401

The servers are started once per test run, when a test first asks for one:
tests/conftest.py imports ``shared_postgres_server`` and ``shared_mariadb_server``,
so pytest keeps one instance of each for every directory, and the
``postgres_server`` / ``mariadb_server`` a module imports only hand that one on
(a session fixture imported into several modules would otherwise be a separate
fixture, and a separate server, per module). Tests share a server, never a
database: each makes its own (``create_database`` with a fresh name).

Without the server binaries (a developer machine without ``apt-get install
postgresql mariadb-server``) the PostgreSQL/MariaDB cases skip with the reason;
CI installs them (``.ci/run``).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from binlake.stack.localdb import LocalMariaDB, LocalPostgres

UPSTREAMS = ("sqlite", "postgresql", "mariadb")


@pytest.fixture(scope="session")
def shared_postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    if not LocalPostgres.available():
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql); CI always has them")
    made = None
    if os.geteuid() == 0:
        # As root the server runs as the `postgres` user, who cannot enter
        # pytest's 0700 base temp dir: use a traversable dir of our own.
        made = pathlib.Path(tempfile.mkdtemp(prefix="binlake-test-pg-"))
        made.chmod(0o755)
        root = made
    else:
        root = tmp_path_factory.mktemp("postgres")
    server = LocalPostgres(root).start()
    try:
        yield server
    finally:
        server.stop()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_mariadb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    if not LocalMariaDB.available():
        pytest.skip("MariaDB server binaries not installed (apt-get install mariadb-server); CI always has them")
    server = LocalMariaDB(tmp_path_factory.mktemp("mariadb")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server(shared_postgres_server: LocalPostgres) -> LocalPostgres:
    """The test run's PostgreSQL server (``shared_postgres_server``)."""
    return shared_postgres_server


@pytest.fixture(scope="session")
def mariadb_server(shared_mariadb_server: LocalMariaDB) -> LocalMariaDB:
    """The test run's MariaDB server (``shared_mariadb_server``)."""
    return shared_mariadb_server


@pytest.fixture(params=UPSTREAMS)
def upstream_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    """A SQLAlchemy URL of an empty upstream database, new for each test."""
    kind = request.param
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'upstream.db'}"
    # Looked up lazily, so a SQLite-only run never starts (or skips on) a server.
    server = request.getfixturevalue("postgres_server" if kind == "postgresql" else "mariadb_server")
    return server.create_database(f"up_{uuid.uuid4().hex[:16]}")


# Every database binlake has a target for (binlake.sql.targets), as the target tests name them.
TARGETS = ("sqlite", "postgresql", "mariadb", "duckdb")


def new_target_url(kind: str, request: pytest.FixtureRequest, tmp_path: pathlib.Path, prefix: str = "t") -> str:
    """A SQLAlchemy URL of a new, empty target database of ``kind`` (one of ``TARGETS``):
    a file in ``tmp_path``, or a database of the test run's server."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / (name + '.db')}"
    if kind == "duckdb":
        return f"duckdb:///{tmp_path / (name + '.duckdb')}"
    if kind not in TARGETS:
        raise ValueError(f"unknown target kind {kind!r}")
    server = request.getfixturevalue("postgres_server" if kind == "postgresql" else "mariadb_server")
    return str(server.create_database(name))


def kept_and_lost(source_url: str, target_url: str, n: int, pad: int, first_id: int) -> None:
    """A diff's two databases: ``n`` narrow rows (a note of about ``pad`` characters) in
    tables ``kept`` and ``lost`` of the source; the target holds ``kept`` empty and no
    ``lost`` (table ids ``first_id`` and ``first_id + 1``)."""
    from binlake.sql import schema as sc
    from binlake.sql.url import open_target

    narrow = [sc.ColumnDef("id", "int", False), sc.ColumnDef("note", "string")]
    kept = sc.new_table(first_id, "app", "kept", narrow, ["id"], None, 1)
    lost = sc.new_table(first_id + 1, "app", "lost", narrow, ["id"], None, 1)
    with open_target(source_url) as src:
        for info in (kept, lost):
            src.create_table(info)
            src.bulk_load(info, ({"id": i, "note": f"row {i:07d} " + "x" * pad} for i in range(n)))
    with open_target(target_url) as tgt:
        tgt.create_table(kept)
