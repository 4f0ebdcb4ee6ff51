"""Errors out of Spark: the binlake error a failed Spark job carries, rebuilt as its class,
the one line a command reports for any failed Spark job (``command_error``), and the
one line for a job or command that ran out of memory (``out_of_memory``), naming the
``[memory]`` setting to change and its value in force."""

from __future__ import annotations

import re
from collections.abc import Sequence

from binlake import config, errors
from binlake.lake.decoding.schema_history import UnknownTableError
from binlake.lake.decoding.txn import CorruptBinlogError

_ERROR_LINE = re.compile(r"^binlake(?:\.\w+)*\.(\w+): (.+)$", re.MULTILINE)
# The decoding errors outside binlake.errors a worker may raise, by class name.
_DECODE_ERRORS: dict[str, type[errors.BinlakeError]] = {
    "CorruptBinlogError": CorruptBinlogError, "UnknownTableError": UnknownTableError}


def _text(exc: BaseException) -> str:
    """The exception's message; py4j's Java errors ask the JVM for theirs, which fails
    when that JVM is gone: then the message they were raised with."""
    try:
        return str(exc)
    except Exception as gone:  # the JVM that would render it is gone: say so (py4j's words)
        said = " ".join(str(a).strip() for a in exc.args if isinstance(a, str)) or type(exc).__name__
        return f"{said} ({gone})"


def binlake_error(exc: BaseException) -> errors.BinlakeError | None:
    """The binlake error a failed Spark job carries (raised in a planner or executor
    Python worker), rebuilt as its class with its message; None when there is none."""
    matches = _ERROR_LINE.findall(_text(exc))
    if not matches:
        return None
    name, message = matches[-1]
    cls = getattr(errors, name, None) or _DECODE_ERRORS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, errors.BinlakeError)):
        return None
    try:
        return cls(message.strip())
    except TypeError:  # an error class whose constructor takes more (UnknownTableError)
        return errors.FailedPrecondition(message.strip())


# What the AWS SDK / s3a say when the store does not answer (down, unreachable, timing out).
_S3_DOWN = ("Unable to execute HTTP request", "Connection refused", "UnknownHostException", "connect timed out",
            "SocketTimeoutException", "NoHttpResponseException", "Connection reset")
_S3_OP = re.compile(r"(\w+ on s3a://[^\s:]+)")
_CAUSE = re.compile(r"^Caused by: ([\w.$]+): (.*)$", re.MULTILINE)


def s3_unreachable(exc: BaseException, what: str) -> errors.Unavailable | None:
    """One line for a Spark job that lost the lake's S3 store mid-way (the store went
    down or out of reach), naming the operation and the root cause instead of py4j's
    "An error occurred while calling o94.load"; None for any other failure."""
    text = _text(exc)
    if "s3a://" not in text or not any(marker in text for marker in _S3_DOWN):
        return None
    op = _S3_OP.search(text)
    causes = _CAUSE.findall(text)
    root = f"{causes[-1][0].rsplit('.', 1)[-1]}: {causes[-1][1].strip()}" if causes else "no answer"
    return errors.Unavailable(
        f"{what}: the lake's S3 store stopped answering ({op.group(1) + ': ' if op else ''}{root[:200]}); "
        "check that the endpoint is up, then rerun")


# A JVM's OutOfMemoryError as py4j (": java.lang.OutOfMemoryError: Java heap space") and
# Spark Connect ("(java.lang.OutOfMemoryError) Java heap space") print it; group 1 is the kind.
_JVM_OOM = re.compile(r"java\.lang\.OutOfMemoryError\)?:?[ \t]*([A-Za-z][\w -]*)?")
# A task's failure names where it ran: "(TID 7) (10.0.0.5 executor 3): ..."; in local
# mode the executor is the driver ("executor driver").
_TASK_EXECUTOR = re.compile(r"\bexecutor (\d+)\b")
# Spark's exit code of an executor its OutOfMemoryError killed (SparkExitCode.OOM).
_EXECUTOR_OOM_EXIT = re.compile(r"ExecutorLostFailure.*?exited with code 52", re.DOTALL)
# What py4j says when the driver JVM behind it is gone (it died, most often of its heap).
_JVM_GONE = ("Answer from Java side is empty", "Error while sending or receiving",
             "Error while obtaining a new communication channel", "Connection refused")
# What may hold rows in this process, by default (the commands that stream through it).
PROCESS_SETTINGS = ("batch_rows", "direct_rows", "read_budget")


def _setting(name: str, bounds: config.MemorySettings) -> str:
    env = config.env_names(config.MemorySettings, name)[0]
    return f"[memory] {name} = {getattr(bounds, name)} ({env})"


def out_of_memory(exc: BaseException, what: str,
                  process_settings: Sequence[str] = PROCESS_SETTINGS) -> errors.ResourceExhausted | None:
    """One line for ``what`` (a prefix; none when empty) having run out of memory, naming
    where (the Spark driver, an executor, this process), the heap or setting in force and
    what to change; None when ``exc`` is no such failure. ``process_settings``: the ``[memory]`` settings that bound
    the rows this process holds in the failed command (a Python MemoryError)."""
    try:
        bounds = config.memory()
    except errors.BinlakeError:  # a bad [memory] value is reported on its own; name the defaults here
        bounds = config.MemorySettings.model_construct()
    head = f"{what}: " if what else ""
    if isinstance(exc, MemoryError):
        lower = " or ".join(_setting(name, bounds) for name in process_settings)
        return errors.ResourceExhausted(
            f"{head}out of memory in this process (Python MemoryError): lower {lower}, "
            "or give the process more memory")
    text = _text(exc)
    module = type(exc).__module__
    oom = _JVM_OOM.search(text)
    if oom is not None or _EXECUTOR_OOM_EXIT.search(text):
        kind = f", {oom.group(1).strip()}" if oom is not None and oom.group(1) else ""
        executor = _TASK_EXECUTOR.search(text)
        if executor is not None or oom is None:
            return errors.ResourceExhausted(
                f"{head}out of memory in a Spark executor (heap {bounds.executor}{kind}): raise "
                f"{_setting('executor', bounds)} (at most [spark] worker_memory) or lower "
                f"{_setting('partition_rows', bounds)}")
        return errors.ResourceExhausted(
            f"{head}out of memory in the Spark driver (heap {bounds.driver}{kind}): raise "
            f"{_setting('driver', bounds)} or lower {_setting('partition_rows', bounds)}")
    if module.startswith("py4j") and any(marker in text for marker in _JVM_GONE):
        return errors.ResourceExhausted(
            f"{head}the Spark driver JVM stopped answering (it most often dies of its heap, "
            f"{bounds.driver}): raise {_setting('driver', bounds)} or lower {_setting('partition_rows', bounds)}")
    return None


def command_error(exc: Exception, what: str) -> errors.BinlakeError:
    """The one-line error a command (``binlake ingest``, ``lake``, ``apply``, ``restore``,
    ...) reports for the Spark job doing ``what`` that failed with ``exc``: the binlake
    error the job carries, a lost S3 store, running out of memory, else the first line
    of Spark's message."""
    err = binlake_error(exc) or s3_unreachable(exc, what) or out_of_memory(exc, what)
    if err is not None:
        return err
    first = next((line.strip() for line in _text(exc).splitlines() if line.strip()), type(exc).__name__)
    return errors.FailedPrecondition(f"{what}: {first[:500]}")
