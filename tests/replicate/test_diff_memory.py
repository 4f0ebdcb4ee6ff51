"""``binlake diff`` keeps its memory to a chunk, whatever the differences: run as a
command with its address space limited a little above what a diff of one chunk's
rows takes, it compares tables of many rows against an empty target (one table
empty there, one missing), writes every fix statement to ``--fix-sql``, and the
fixes applied make the target equal. A diff that held the rows, or their fix
statements, in memory would run out of address space.
"""

from __future__ import annotations

import os
import pathlib
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Callable

from dbfixtures import kept_and_lost

ROWS = 120_000  # per table; a list of the fix statements of one table alone would be ~26 MB
SMALL = 12_000  # more than one chunk (10,000 rows): the baseline holds a full chunk
HEADROOM = 16 << 20

# `binlake` run by an interpreter that writes its peak address space (kB) to argv[1] at exit.
_PEAK_THEN_RUN = (
    "import atexit, runpy, sys\n"
    "path = sys.argv[1]\n"
    "atexit.register(lambda: open(path, 'w').write(\n"
    "    next(x for x in open('/proc/self/status') if x.startswith('VmPeak:')).split()[1]))\n"
    "del sys.argv[1]\n"
    "runpy.run_module('binlake.cli', run_name='__main__', alter_sys=True)\n"
)


def _databases(root: pathlib.Path, n: int) -> tuple[str, str]:
    """A source with tables ``kept`` and ``lost`` of ``n`` narrow rows each, and a target
    holding ``kept`` empty and no ``lost``."""
    root.mkdir()
    source, target = f"sqlite:///{root / 'source.db'}", f"sqlite:///{root / 'target.db'}"
    kept_and_lost(source, target, n, 100, 401)
    return source, target


def _env() -> dict[str, str]:
    env = dict(os.environ)
    here = pathlib.Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(here / "include"), str(here / "plugins"), env.get("PYTHONPATH", "")])
    # One malloc arena: the address space is then what the process holds, not how many
    # threads ever allocated (each would reserve an arena of its own).
    env["MALLOC_ARENA_MAX"] = "1"
    return env


def _diff(args: list[str], preexec: Callable[[], None] | None = None,
          wrapper: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    head = [sys.executable, "-c", _PEAK_THEN_RUN, *wrapper] if wrapper else [sys.executable, "-m", "binlake.cli"]
    return subprocess.run([*head, "diff", *args], env=_env(), capture_output=True, text=True, timeout=120,
                          preexec_fn=preexec)


def test_diff_of_many_rows_runs_in_the_memory_of_one_chunk(tmp_path: pathlib.Path) -> None:
    # The honest baseline: the address space a diff of the same shape takes with a
    # little more than one chunk of rows (the interpreter, SQLAlchemy, one chunk).
    small_src, small_tgt = _databases(tmp_path / "small", SMALL)
    peak_file = tmp_path / "peak"
    first = _diff([small_src, small_tgt, "--fix-sql", str(tmp_path / "small.sql")], wrapper=[str(peak_file)])
    assert first.returncode == 1, first.stderr
    baseline = int(peak_file.read_text()) * 1024
    limit = baseline + HEADROOM

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    source, target = _databases(tmp_path / "big", ROWS)
    fix = tmp_path / "fix.sql"
    run = _diff([source, target, "--fix-sql", str(fix), "--keep-keys", "5"], limited)
    assert run.returncode == 1 and run.stderr == "", (baseline >> 20, run.stderr[-2000:])
    out = run.stdout
    assert f"({ROWS} missing in target, 0 extra, 0 different; {ROWS // 10_000}/{ROWS // 10_000} chunks)" in out, out
    assert "lost" in out and "MISSING" in out and "2 table(s): 2 differ" in out
    assert f"{ROWS - 5} more missing" in out  # only the first --keep-keys keys are kept
    assert f"{2 * ROWS + 1} fix statement(s) written" in out
    # Every statement is on disk, several times the headroom the command had.
    assert fix.stat().st_size > 2 * HEADROOM

    # A chunk of every row does not fit: one line naming what to lower, no traceback.
    whole = _diff([source, target, "--tables", "kept", "--chunk-size", str(ROWS)], limited)
    assert whole.returncode == 2 and whole.stderr == (
        f"binlake diff: error: out of memory in this process holding a chunk of --chunk-size {ROWS} rows: "
        "lower --chunk-size\n"), whole.stderr[-2000:]

    with sqlite3.connect(tmp_path / "big" / "target.db") as db:
        db.executescript("BEGIN;\n" + fix.read_text() + "COMMIT;\n")
    again = _diff([source, target], limited)
    assert again.returncode == 0 and "2 table(s): all OK" in again.stdout, (again.stdout, again.stderr[-2000:])
