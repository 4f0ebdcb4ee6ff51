"""MkDocs hook: adds the generated reference pages (scripts/docs_reference.py) to every build.

The pages are made from the code at build time and never written into docs/, so the
CLI, configuration, DAG and table references cannot fall behind what ships.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any

from mkdocs.structure.files import File, Files

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    """scripts/docs_reference.py, loaded by path (scripts/ is not a package)."""
    if str(_ROOT / "include") not in sys.path:
        # A build from a clone without `make setup`'s editable install still finds binlake.
        sys.path.insert(0, str(_ROOT / "include"))
    spec = importlib.util.spec_from_file_location("binlake_docs_reference", _ROOT / "scripts" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_files(files: Files, config: Any) -> Files:
    """Add each generated page (replacing a file of the same name, were one committed)."""
    for src_uri, make in _generator().PAGES.items():
        existing = files.get_file_from_path(src_uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, src_uri, content=make()))
    return files
