"""The ``bench pump --no-flush`` shim: it skips the value log's flush only in a
process that has both its folder on the path and the bench's variable set, so
no other process of a bench run (or of anything else) loses its flushes."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

SHIM = pathlib.Path(__file__).resolve().parents[2] / "bench" / "noflush"

# Prints whether os.fdatasync still flushes: the real one is a builtin of the os module.
PROBE = "import os; print(type(os.fdatasync).__name__)"


def _probe(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BINLAKE_BENCH_NO_FLUSH")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_shim_skips_flushes_only_where_the_bench_asks() -> None:
    assert _probe({"PYTHONPATH": str(SHIM), "BINLAKE_BENCH_NO_FLUSH": "1"}) == "function"
    # Its folder on the path alone, or the variable alone, changes nothing.
    assert _probe({"PYTHONPATH": str(SHIM)}) == "builtin_function_or_method"
    assert _probe({"BINLAKE_BENCH_NO_FLUSH": "1"}) == "builtin_function_or_method"


def test_a_skipped_flush_still_writes(tmp_path: pathlib.Path) -> None:
    # The Pump's append goes on as always: only the flush returns at once.
    target = tmp_path / "log"
    code = (
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT); os.write(fd, b'abc'); "
        "os.fdatasync(fd); os.close(fd)"
    )
    env = {**os.environ, "PYTHONPATH": str(SHIM), "BINLAKE_BENCH_NO_FLUSH": "1"}
    subprocess.run([sys.executable, "-c", code, str(target)], env=env, check=True)
    assert target.read_bytes() == b"abc"
