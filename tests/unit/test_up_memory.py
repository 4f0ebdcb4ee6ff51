"""``binlake up`` sizes the Spark Connect server it starts from ``[memory]``: the
server's JVM (the driver of every DAG job it serves) gets ``[memory] driver`` as its
heap and asks ``[memory] executor`` for its executors."""

from __future__ import annotations

import io
import pathlib
import signal
import time

import pytest

from binlake import net
from binlake.lake.sparkenv import connect_server
from binlake.stack.supervisor import Stack, StackConfig


def _cmdline(pid: int) -> list[str]:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def test_the_connect_server_command_takes_the_memory_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_MEMORY_DRIVER", "640m")
    monkeypatch.setenv("BINLAKE_MEMORY_EXECUTOR", "700m")
    args = connect_server.server_command(15999)
    assert args[args.index("--driver-memory") + 1] == "640m"
    assert "spark.executor.memory=700m" in args
    # A conf given to the server (python -m ... --conf) still wins over the settings.
    args = connect_server.server_command(15999, extra_conf={"spark.driver.memory": "3g",
                                                            "spark.executor.memory": "2g"})
    assert args[args.index("--driver-memory") + 1] == "3g" and "spark.executor.memory=2g" in args
    assert not any(a.startswith("spark.driver.memory=") for a in args)


def test_binlake_up_starts_the_connect_server_with_the_driver_heap(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_MEMORY_DRIVER", "640m")
    monkeypatch.setenv("BINLAKE_MEMORY_EXECUTOR", "700m")
    stack = Stack(StackConfig(data_dir=tmp_path, pumps=0, spark_connect_port=net.free_port()), out=io.StringIO())
    stack._start_spark_connect()
    child = stack.connect_starting
    assert child is not None and child.proc is not None
    try:
        # spark-submit's launcher execs the server's JVM in the same process: its heap
        # is what the command line gave it.
        deadline = time.monotonic() + 60
        while not any(a.startswith("-Xmx") for a in _cmdline(child.proc.pid)):
            assert child.alive and time.monotonic() < deadline, (child.args, _cmdline(child.proc.pid))
            time.sleep(0.2)
        jvm = _cmdline(child.proc.pid)
        assert "-Xmx640m" in jvm, jvm
        assert "spark.executor.memory=700m" in jvm and connect_server.SERVER_CLASS in jvm
    finally:
        child.signal(signal.SIGKILL)
        child.wait(10)
