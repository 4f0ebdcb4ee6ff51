"""Out of memory, in a Spark JVM or in this process, reaches the user as one line that
says where it ran out and which ``[memory]`` setting to change, with its value in force."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from py4j.protocol import Py4JJavaError, Py4JNetworkError
from pyspark.errors.exceptions.connect import SparkConnectGrpcException

from binlake import errors
from binlake.lake.sparkenv.spark_errors import command_error, out_of_memory

_TRACE = "\n\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)\n\tat org.apache.spark.sql.Dataset.collect"


class _RenderedJavaError(Py4JJavaError):
    """A Py4JJavaError as py4j formats it, with ``text`` standing for what the JVM renders
    (the Java exception's toString and stack trace)."""

    def __init__(self, call: str, text: str) -> None:
        super().__init__(f"An error occurred while calling {call}.\n", SimpleNamespace(_target_id="o7"))
        self.rendered = text

    def __str__(self) -> str:
        return f"{self.errmsg}: {self.rendered}"


class _GoneGateway:
    """py4j's client of a JVM that died: every command fails as py4j's does."""

    def send_command(self, command: str) -> str:
        raise Py4JNetworkError("Answer from Java side is empty")


def _gone_java_error() -> Py4JJavaError:
    """A real Py4JJavaError whose JVM is gone (its message cannot be rendered any more)."""
    return Py4JJavaError("An error occurred while calling o88.collectToPython.\n",
                         SimpleNamespace(_target_id="o88", _gateway_client=_GoneGateway()))


def _one_line(err: errors.BinlakeError | None) -> str:
    assert isinstance(err, errors.ResourceExhausted), err
    text = str(err)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.fixture(autouse=True)
def _memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_MEMORY_DRIVER", "512m")
    monkeypatch.setenv("BINLAKE_MEMORY_EXECUTOR", "768m")
    monkeypatch.setenv("BINLAKE_MEMORY_PARTITION_ROWS", "50000")


def test_driver_heap_in_a_py4j_error() -> None:
    exc = _RenderedJavaError("o45.collectToPython", "java.lang.OutOfMemoryError: Java heap space" + _TRACE)
    assert _one_line(command_error(exc, "restore")) == (
        "restore: out of memory in the Spark driver (heap 512m, Java heap space): raise [memory] driver = 512m "
        "(BINLAKE_MEMORY_DRIVER) or lower [memory] partition_rows = 50000 (BINLAKE_MEMORY_PARTITION_ROWS)")


def test_a_local_task_runs_in_the_driver_a_cluster_task_in_an_executor() -> None:
    abort = ("org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 "
             "times, most recent failure: Lost task 0.0 in stage 3.0 (TID 5) (10.0.0.7 executor {}): "
             "java.lang.OutOfMemoryError: GC overhead limit exceeded" + _TRACE)
    local = _one_line(command_error(_RenderedJavaError("o91.save", abort.format("driver")), "ingest"))
    assert local.startswith("ingest: out of memory in the Spark driver (heap 512m, GC overhead limit exceeded)")
    cluster = _one_line(command_error(_RenderedJavaError("o91.save", abort.format("2")), "ingest"))
    assert cluster == (
        "ingest: out of memory in a Spark executor (heap 768m, GC overhead limit exceeded): raise [memory] "
        "executor = 768m (BINLAKE_MEMORY_EXECUTOR) (at most [spark] worker_memory) or lower [memory] "
        "partition_rows = 50000 (BINLAKE_MEMORY_PARTITION_ROWS)")
    killed = ("Job aborted due to stage failure: Task 1 in stage 2.0 failed 4 times, most recent failure: Lost "
              "task 1.3 in stage 2.0 (TID 9) (10.0.0.8 executor 3): ExecutorLostFailure (executor 3 exited "
              "caused by one of the running tasks) Reason: Command exited with code 52")
    assert "out of memory in a Spark executor (heap 768m)" in _one_line(
        command_error(_RenderedJavaError("o12.save", killed), "apply"))


def test_spark_connect_and_a_lost_jvm() -> None:
    remote = SparkConnectGrpcException("(java.lang.OutOfMemoryError) Java heap space")
    assert "out of memory in the Spark driver (heap 512m, Java heap space)" in _one_line(
        command_error(remote, "snapshot"))
    gone = _one_line(command_error(_gone_java_error(), "restore"))
    assert gone.startswith("restore: the Spark driver JVM stopped answering (it most often dies of its heap, 512m)")
    lost = _one_line(command_error(Py4JNetworkError("Answer from Java side is empty"), "apply"))
    assert "raise [memory] driver = 512m (BINLAKE_MEMORY_DRIVER)" in lost


def test_python_memory_error() -> None:
    try:
        bytearray(1 << 62)  # a real MemoryError: no machine has that much to give
    except MemoryError as exc:
        err = command_error(exc, "restore")
    assert _one_line(err) == (
        "restore: out of memory in this process (Python MemoryError): lower [memory] batch_rows = 10000 "
        "(BINLAKE_MEMORY_BATCH_ROWS) or [memory] direct_rows = 50000 (BINLAKE_MEMORY_DIRECT_ROWS) or [memory] "
        "read_budget = 200000 (BINLAKE_MEMORY_READ_BUDGET), or give the process more memory")


def test_other_failures_are_not_out_of_memory() -> None:
    assert out_of_memory(ValueError("bad"), "x") is None
    assert out_of_memory(_RenderedJavaError("o1.load", "org.apache.spark.sql.AnalysisException: no such "
                                                       "table" + _TRACE), "x") is None
    err = command_error(_RenderedJavaError("o1.load", "java.io.FileNotFoundException: gone" + _TRACE), "lake")
    assert isinstance(err, errors.FailedPrecondition) and "OutOfMemory" not in str(err)


def test_the_cli_says_it_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A command that runs out of memory anywhere prints the one line and exits non-zero."""
    import argparse

    from binlake import cli
    from binlake.cli import args as cli_args

    def exhausted(_args: object) -> int:
        bytearray(1 << 62)
        return 0

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.choices["ingest"].set_defaults(handler=exhausted)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["ingest", "--lake", "x", "--start-ts", "1", "--end-ts", "2"]) == cli_args.EXIT_USER
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("binlake ingest: error: out of memory in this process"), err
