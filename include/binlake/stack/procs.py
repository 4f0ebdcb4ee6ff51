"""Stopping the throwaway servers the test fixtures start (PostgreSQL, MariaDB,
SeaweedFS): each runs in a session of its own, so a kill reaches its helpers too."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s whole process group (a crash: nothing is flushed) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def stop_group(proc: subprocess.Popen[bytes], graceful: signal.Signals, timeout_s: float) -> None:
    """Send ``graceful`` to ``proc``; SIGKILL its group if it has not exited within ``timeout_s``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(graceful)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
