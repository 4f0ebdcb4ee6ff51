"""The committed *_pb2 modules are what `make proto` would generate now."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generated_protobuf_modules_are_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_check_detects_a_stale_module(tmp_path: pathlib.Path) -> None:
    # Tamper with a copy of the tree: the checker must notice.
    import shutil

    work = tmp_path / "repo"
    shutil.copytree(ROOT / "include" / "binlake" / "proto", work / "include" / "binlake" / "proto")
    shutil.copytree(ROOT / "scripts", work / "scripts")
    stale = work / "include" / "binlake" / "proto" / "binlog_pb2.py"
    stale.write_text(stale.read_text() + "\n# edited by hand\n")
    proc = subprocess.run(
        [sys.executable, str(work / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "binlog_pb2.py" in proc.stderr and "make proto" in proc.stderr
