"""Errors out of Spark: the binlake error a failed Spark job carries, rebuilt as its class,
and the one line a command reports for any failed Spark job (``command_error``)."""

from __future__ import annotations

import re

from binlake import errors
from binlake.lake.decoding.schema_history import UnknownTableError
from binlake.lake.decoding.txn import CorruptBinlogError

_ERROR_LINE = re.compile(r"^binlake(?:\.\w+)*\.(\w+): (.+)$", re.MULTILINE)
# The decoding errors outside binlake.errors a worker may raise, by class name.
_DECODE_ERRORS: dict[str, type[errors.BinlakeError]] = {
    "CorruptBinlogError": CorruptBinlogError, "UnknownTableError": UnknownTableError}


def binlake_error(exc: BaseException) -> errors.BinlakeError | None:
    """The binlake error a failed Spark job carries (raised in a planner or executor
    Python worker), rebuilt as its class with its message; None when there is none."""
    matches = _ERROR_LINE.findall(str(exc))
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
    text = str(exc)
    if "s3a://" not in text or not any(marker in text for marker in _S3_DOWN):
        return None
    op = _S3_OP.search(text)
    causes = _CAUSE.findall(text)
    root = f"{causes[-1][0].rsplit('.', 1)[-1]}: {causes[-1][1].strip()}" if causes else "no answer"
    return errors.Unavailable(
        f"{what}: the lake's S3 store stopped answering ({op.group(1) + ': ' if op else ''}{root[:200]}); "
        "check that the endpoint is up, then rerun")


def command_error(exc: Exception, what: str) -> errors.BinlakeError:
    """The one-line error a command (``binlake ingest``, ``lake``, ``apply``, ``restore``,
    ...) reports for the Spark job doing ``what`` that failed with ``exc``: the binlake
    error the job carries, a lost S3 store, else the first line of Spark's message."""
    err = binlake_error(exc) or s3_unreachable(exc, what)
    if err is not None:
        return err
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return errors.FailedPrecondition(f"{what}: {first[:500]}")
