"""The databases binlake writes to, one module each, behind one interface.

``base.Target`` is the interface (see its docstring for what a database
module provides); ``sqlite``, ``postgresql``, ``mysql`` and ``duckdb`` are the
databases. ``kind(name)`` finds a database's class by SQLAlchemy dialect name,
``for_scheme`` by a URL's scheme; ``binlake.sql.url`` opens a target from a URL
with them. A new database is one module with a ``Target`` subclass, and one
line in ``_BUILT_IN`` below.
"""

from __future__ import annotations

from binlake import errors
from binlake.sql.targets.base import INTERNAL_PREFIX, SCHEMA_TABLE, Target
from binlake.sql.targets.duckdb import DuckDB
from binlake.sql.targets.mysql import MySQL
from binlake.sql.targets.postgresql import PostgreSQL
from binlake.sql.targets.sqlite import SQLite

_BUILT_IN: tuple[type[Target], ...] = (SQLite, PostgreSQL, MySQL, DuckDB)
_KINDS: dict[str, type[Target]] = {}


def register(cls: type[Target]) -> type[Target]:
    """Make ``cls`` the database of its dialect name and URL schemes (usable as a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Target)) or not cls.name or not cls.schemes:
        raise TypeError(f"a target must be a Target subclass with a name and URL schemes, got {cls!r}")
    _KINDS[cls.name] = cls
    return cls


for _cls in _BUILT_IN:
    register(_cls)


def kinds() -> list[type[Target]]:
    """Every registered database, in registration order."""
    return list(_KINDS.values())


def kind(name: str) -> type[Target]:
    """The database whose SQLAlchemy dialect name is ``name`` (``errors.InvalidArgument`` if none)."""
    cls = _KINDS.get(name)
    if cls is None:
        raise errors.InvalidArgument(f"binlake has no target for {name} databases (it has: {', '.join(_KINDS)})")
    return cls


def for_scheme(scheme: str) -> type[Target] | None:
    """The database a URL scheme or SQLAlchemy driver name (``postgresql``, ``mysql+pymysql``) names."""
    for cls in _KINDS.values():
        if scheme in cls.schemes or scheme in cls.drivers:
            return cls
    return None


def url_forms() -> str:
    """The URL forms every database takes, for messages."""
    return ", ".join(cls.example_url for cls in _KINDS.values())


__all__ = ["INTERNAL_PREFIX", "SCHEMA_TABLE", "DuckDB", "MySQL", "PostgreSQL", "SQLite", "Target", "for_scheme",
           "kind", "kinds", "register", "url_forms"]
