"""Bench only: the Pumps of ``binlake bench pump --no-flush`` skip the disk flush.

``bench/pump_bench.py`` puts this folder on the Pump processes' PYTHONPATH and
sets ``BINLAKE_BENCH_NO_FLUSH=1`` for them alone; Python imports this module at
start-up and makes ``os.fdatasync`` (the value log's only flush) return at once.
Everything else the Pump does (validation, append, group commit, index,
answers) runs as always, so that row separates the disk's flush from the
Pump's own code in the same run. Nothing in binlake can switch its flushes
off: this file is never on a real Pump's path.
"""

from __future__ import annotations

import os

if os.environ.get("BINLAKE_BENCH_NO_FLUSH") == "1":

    def _no_flush(fd: int) -> None:
        del fd  # the write stays in the page cache: durable only until the machine fails

    os.fdatasync = _no_flush
