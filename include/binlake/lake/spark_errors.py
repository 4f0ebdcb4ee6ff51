"""Errors out of Spark: the binlake error a failed Spark job carries, rebuilt as its class."""

from __future__ import annotations

import re

from binlake import errors
from binlake.lake.schema_history import UnknownTableError
from binlake.lake.txn import CorruptBinlogError

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
