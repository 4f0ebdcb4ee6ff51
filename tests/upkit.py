"""Helpers for tests that run the always-on stack (``binlake up``) as a child process.

The stack is started the way a user starts it, on free ports, and its stdout
is collected so a test can wait for the lines it prints (the banner, "stopped").
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

BINLAKE = [sys.executable, "-m", "binlake.cli"]
# Pumps that never stop writing for lack of disk, and whose fake binlogs move
# their safe ts twice a second even when nothing is written.
PUMP_ARGS = "--pump-args=--stop-write-at-free-bytes 0 --fake-binlog-interval-s 0.5"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any Airflow or binlake setting, plus ``extra``.

    A clean slate: no Airflow or binlake settings of the test session
    (tests/dags pins some for its own Airflow) may leak into the stack or into
    a command that is meant to see only what the stack's ``env.sh`` sets.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "BINLAKE_"))}
    env.update(extra or {})
    return env


class Up:
    """A `binlake up` child whose stdout is collected line by line."""

    def __init__(self, args: list[str], cwd: pathlib.Path, env: Mapping[str, str] | None = None) -> None:
        self.lines: list[str] = []
        if "--spark-connect-port" not in args:
            # A test opts in to the always-on Spark: its JVM costs CPU, and the fixed
            # port would clash between test runs.
            args = [*args, "--spark-connect-port", "0"]
        self.proc = subprocess.Popen([*BINLAKE, "up", *args], cwd=cwd, stdout=subprocess.PIPE, env=clean_env(env),
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the reader drain
                raise AssertionError(f"binlake up exited ({self.proc.returncode}):\n{self.output}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {timeout:g}s:\n{self.output}")
            time.sleep(0.1)

    def ctrl_c(self, timeout: float = 90.0) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        # Only if a test failed half-way (or did not stop the stack itself): the whole
        # group of this child. `binlake up` stops its own children in order on SIGTERM.
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def binlake_up(args: list[str], cwd: pathlib.Path, env: Mapping[str, str] | None = None) -> Iterator[Up]:
    """`binlake up *args` in ``cwd``; ``env`` adds settings (e.g. the DAG's
    ``BINLAKE_INGEST_*``) to the otherwise clean environment of the stack."""
    up = Up(args, cwd, env)
    try:
        yield up
    finally:
        up.kill()


def port_open(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


def read_json(url: str, timeout: float, tries: int = 4) -> Any:
    """GET ``url`` (a stack's REST API) and parse its JSON answer. A try that timed
    out or found no server is retried (an HTTP error is not): on two cores the API
    server, beside the scheduler, the triggerer, the Pumps and a Spark application,
    has been slower than 10 s to answer. Its answers, not its latency, are what
    the tests check."""
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return json.loads(resp.read())
        except (TimeoutError, urllib.error.URLError) as failed:
            if isinstance(failed, urllib.error.HTTPError) or attempt == tries - 1:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")
