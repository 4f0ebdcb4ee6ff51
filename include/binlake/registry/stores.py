"""The registry's store named by a data directory or a URL: ``open_store``.

Above both implementations, so neither imports the other: the SQLite store
(``binlake.registry.store``) and the etcd store a registry group shares
(``binlake.registry.etcd_store``, built on the interface in ``store``).
"""

from __future__ import annotations

import pathlib

from binlake import errors
from binlake.registry.etcd import parse_etcd_url
from binlake.registry.etcd_store import EtcdStore
from binlake.registry.store import DB_FILE_NAME, RegistryStore, SQLiteStore

_SQLITE_PREFIX = "sqlite:///"
_ETCD_PREFIXES = ("etcd://", "etcd+http://", "etcd+https://")


def open_store(spec: str | pathlib.Path, *, cluster_id: int = 0) -> RegistryStore:
    """Open the store named by ``spec``.

    - a directory (created if missing): the SQLite file ``registry.db`` inside it;
    - ``sqlite:///path/to/file.db``: that SQLite file (as in SQLAlchemy URLs, the
      path after ``sqlite:///`` is relative unless it starts with ``/``);
    - ``etcd://h1:2379,h2:2379,h3:2379[/prefix]``: the etcd store, shared by a
      registry group (``cluster_id``, when given, must match the stored one).
    """
    if isinstance(spec, pathlib.Path):
        return _open_directory(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise errors.InvalidArgument(
            f"registry store must be a directory or sqlite:///path/to/file.db, got {spec!r}"
        )
    text = spec.strip()
    lowered = text.lower()
    if lowered.startswith(_ETCD_PREFIXES):
        return EtcdStore(parse_etcd_url(text), expect_cluster_id=cluster_id)
    if lowered.startswith("sqlite:"):
        if not lowered.startswith(_SQLITE_PREFIX):
            raise errors.InvalidArgument(
                f"registry store {text!r}: a SQLite URL is sqlite:///path/to/file.db "
                "(sqlite:////abs/path.db for an absolute path)"
            )
        file_part = text[len(_SQLITE_PREFIX) :]
        if not file_part or file_part.endswith("/") or file_part.startswith(":memory:"):
            raise errors.InvalidArgument(
                f"registry store {text!r} names no file; the registry needs a durable file "
                "such as sqlite:///data/registry/registry.db"
            )
        path = pathlib.Path(file_part)
        if path.is_dir():
            raise errors.InvalidArgument(f"registry store {text!r}: {path} is a directory, not a file")
        path.parent.mkdir(parents=True, exist_ok=True)
        return SQLiteStore(path)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise errors.InvalidArgument(
            f"registry store {text!r}: unknown scheme {scheme!r}; "
            "use a data directory, a sqlite:///path/to/registry.db URL or etcd://HOST:2379,..."
        )
    return _open_directory(pathlib.Path(text))


def _open_directory(directory: pathlib.Path) -> RegistryStore:
    if directory.exists() and not directory.is_dir():
        raise errors.InvalidArgument(
            f"registry data directory {directory} is a file; give a directory "
            f"(the store is {DB_FILE_NAME} inside it) or a sqlite:///{directory} URL"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot create registry data directory {directory}: {exc}") from None
    return SQLiteStore(directory / DB_FILE_NAME)
