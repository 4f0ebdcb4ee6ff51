"""Loading a benchmark of the checkout's bench/ folder for ``binlake bench ...``."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from typing import Any

from binlake import config, errors


def bench_module(name: str) -> Any:
    """``bench/<name>_bench.py`` loaded from the bench folder (``binlake.config.PathSettings``:
    $BINLAKE_BENCH_DIR, else the checkout's bench/), without touching sys.path."""

    path = config.paths().bench() / f"{name}_bench.py"
    if not path.is_file():
        raise errors.FailedPrecondition(
            f"no benchmark {path}: the benchmarks live in a binlake checkout's bench/ folder; "
            "run from a checkout or set BINLAKE_BENCH_DIR")
    # The benchmarks share bench/benchkit.py and import it by its plain name.
    kit = path.parent / "benchkit.py"
    if kit.is_file() and "benchkit" not in sys.modules:
        _load_file("benchkit", kit)
    return _load_file(f"{name}_bench", path)


def _load_file(name: str, path: pathlib.Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses in the module look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
