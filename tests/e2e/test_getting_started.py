"""The first page a newcomer follows, run as written: the README's five-minute tour and the
*Restore a table at a datetime* page (docs/getting-started/restore-at-datetime.md).

Both hold the same block of commands, marked ``<!-- tested: tour ... -->``. This test
reads the page's block, checks the README's is the same, and runs it in a temporary
directory on the demo's embedded defaults: ``binlake up --no-airflow`` as a child process
(on free ports, so test runs on one machine do not meet; the other commands find its
registry through ``BINLAKE_REGISTRY``, as they would find the default one), then every
other command line as bash expands it, each ``binlake`` command through ``binlake.cli.main``
in this process, so the ingest and the restore share the test session's Spark. The table
restored at the datetime is then compared with the upstream row by row.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import sqlite3
import subprocess
import time
from typing import Any

import pytest
from pumpkit import free_port
from upkit import PUMP_ARGS, binlake_up

from binlake import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started" / "restore-at-datetime.md"
README = ROOT / "README.md"
MARK = re.compile(r"<!-- tested: tour\b[^>]*-->\s*\n```bash\n(.*?)\n```", re.DOTALL)


def tour_block(path: pathlib.Path) -> list[str]:
    """The command lines of the block marked ``tested: tour`` in ``path``."""
    found = MARK.findall(path.read_text())
    assert len(found) == 1, f"{path}: expected one block marked <!-- tested: tour -->, found {len(found)}"
    return [line for line in found[0].splitlines() if line.strip()]


def test_the_readme_tour_is_the_getting_started_page() -> None:
    page = tour_block(PAGE)
    assert tour_block(README) == page
    binlake_commands = [seg for line in page for seg in line.split(" && ") if seg.lstrip().startswith("binlake ")]
    # The newcomer's path, counted: at most five commands after `make demo`.
    assert len(binlake_commands) <= 5, binlake_commands


def _expand(segment: str, env: dict[str, str]) -> list[str]:
    """``segment``'s words as bash expands them (quotes, $(...), $VAR), without running it."""
    done = subprocess.run(["bash", "-c", f"printf '%s\\0' {segment}"], env=env, check=True,
                          capture_output=True, text=True)
    return done.stdout.split("\0")[:-1]


@pytest.mark.slow
def test_the_getting_started_commands_restore_the_table_at_the_datetime(
        tmp_path: pathlib.Path, spark: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = tour_block(PAGE)
    first = shlex.split(lines[0].removesuffix("&"))
    assert lines[0].endswith("&") and first[:2] == ["binlake", "up"], lines[0]
    registry = f"127.0.0.1:{free_port()}"
    monkeypatch.chdir(tmp_path)
    for name in ("BINLAKE_LAKE_DIR", "BINLAKE_SPARK_MASTER", "BINLAKE_SPARK_REMOTE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BINLAKE_REGISTRY", registry)
    env = {"PATH": "/usr/bin:/bin", "TZ": "UTC"}
    with binlake_up([*first[2:], "--registry-addr", registry, "--pump-port-base", "0", PUMP_ARGS],
                    tmp_path) as up:
        # As the page says: wait until it prints "Press Ctrl-C".
        up.wait_for("Press Ctrl-C", timeout=120)
        for line in lines[1:]:
            for segment in line.split(" && "):
                assign = re.fullmatch(r"([A-Za-z_]\w*)=(.*)", segment.strip())
                words = shlex.split(segment)
                if assign:
                    env[assign.group(1)] = _expand(assign.group(2), env)[0]
                elif words[0] == "sleep":
                    time.sleep(float(words[1]))
                else:
                    assert words[0] == "binlake", segment
                    argv = _expand(segment.strip().removeprefix("binlake "), env)
                    rc = cli.main(argv)
                    out = capsys.readouterr().out
                    assert rc == 0, f"{segment}\n{out}"
                    if argv[0] == "restore":
                        assert "verify   clean" in out, out
        assert up.ctrl_c() == 0
    with sqlite3.connect(tmp_path / "data" / "shop.db") as upstream, \
            sqlite3.connect(tmp_path / "data" / "restored.db") as restored:
        want = upstream.execute("SELECT id, owner, balance FROM accounts ORDER BY id").fetchall()
        got = restored.execute("SELECT id, owner, balance FROM accounts ORDER BY id").fetchall()
    assert len(want) == 100
    # Decimal text either side: compare the values, row by row.
    assert [(i, o, float(b)) for i, o, b in got] == [(i, o, float(b)) for i, o, b in want]
