"""The undo's steps as functions, for the CLI and the ``binlake_undo`` DAG's tasks.

``check`` refuses every user mistake it can see without Spark (the selection,
the options, an unreachable target, an unwritable --sql file); ``run`` plans
in Spark (``fold.plan``: the lake's coverage, the tables, --where) and then
compares and reverts (``revert.run``). Nothing is written before every check
of both passed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from binlake import errors
from binlake.sql import targets
from binlake.sql import url as sql_url
from binlake.undo import fold, revert
from binlake.undo.selection import Selection

Progress = Callable[[str], None]


def check(sel: Selection, target_url: str, opts: revert.Options) -> None:
    """Refusals that need neither Spark nor the lake (one line each)."""
    if not isinstance(sel, Selection):
        raise TypeError(f"sel must be a Selection, got {type(sel).__name__}")
    if not isinstance(target_url, str) or "://" not in target_url:
        raise errors.InvalidArgument(f"--target must be a database URL such as postgresql://USER@HOST/DB or "
                                     f"sqlite:///FILE, got {target_url!r}")
    if opts.sql_file is not None:
        if not opts.sql_file.strip():
            raise errors.InvalidArgument("--sql is empty: give the file to write the statements to")
        parent = os.path.dirname(os.path.abspath(opts.sql_file))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise errors.InvalidArgument(f"--sql {opts.sql_file}: cannot write there (no writable directory {parent})")
        if os.path.isdir(opts.sql_file):
            raise errors.InvalidArgument(f"--sql {opts.sql_file} is a directory: give a file name")


def open_target(target_url: str) -> targets.Target:
    return sql_url.open_target(target_url)


def run(spark: Any, lake: str, sel: Selection, target_url: str, opts: revert.Options,
        progress: Progress | None = None) -> tuple[fold.UndoPlan, revert.UndoResult]:
    """Plan, then compare and revert (or only count, or write the statements)."""
    check(sel, target_url, opts)
    target = open_target(target_url)  # unreachable: refused before Spark reads anything
    try:
        done = revert.already(target, sel)
        if done is not None:  # a rerun: nothing to fold (revert.run checks again in its transaction)
            return fold.UndoPlan(sel, [], 0, 0, 0), done
        p = fold.plan(spark, lake, sel, progress)
        result = revert.run(p, target, opts, progress)
        if not p.tables and result.mode == "undone":
            result.mode = "nothing to do"
        return p, result
    finally:
        target.close()
