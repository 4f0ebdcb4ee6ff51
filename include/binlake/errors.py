"""Domain errors. Transport-free code raises these; ``binlake.rpc`` maps them
to gRPC status codes in one place, and the CLI prints their message."""

from __future__ import annotations


class BinlakeError(Exception):
    """Base of every error binlake reports to a user."""

    code_name = "UNKNOWN"


class InvalidArgument(BinlakeError, ValueError):
    """The request itself is malformed; retrying it unchanged cannot succeed."""

    code_name = "INVALID_ARGUMENT"


class FailedPrecondition(BinlakeError):
    """The request is well-formed but the system is not in a state to serve it."""

    code_name = "FAILED_PRECONDITION"


class Conflict(FailedPrecondition):
    """The request contradicts what is stored (a window overlapping an ingested
    one with other bounds): retrying it unchanged cannot succeed."""


class NotFound(BinlakeError, LookupError):
    code_name = "NOT_FOUND"


class AlreadyExists(BinlakeError):
    """The thing was already stored exactly so: a retry that changes nothing."""

    code_name = "ALREADY_EXISTS"


class OutOfRange(BinlakeError):
    """A window reaches below the data a Pump still holds (below its GC ts)."""

    code_name = "OUT_OF_RANGE"


class ResourceExhausted(BinlakeError):
    """Disk nearly full, message too large."""

    code_name = "RESOURCE_EXHAUSTED"


class Unavailable(BinlakeError):
    """A peer cannot be reached or is shutting down; retry elsewhere or later."""

    code_name = "UNAVAILABLE"


class DeadlineExceeded(BinlakeError):
    code_name = "DEADLINE_EXCEEDED"


class NotLeader(Unavailable):
    """A registry follower (or a deposed leader) refused a call; ``leader`` is the
    HOST:PORT of the current leader when known, else empty."""

    def __init__(self, message: str, leader: str = "") -> None:
        super().__init__(message)
        self.leader = leader


# Errors no retry can fix: the request itself is wrong, contradicts the lake,
# or needs binlogs that are gone. Schedulers fail such a task at once instead
# of retrying it (``is_final``); batch entry points exit with EXIT_FINAL.
FINAL: tuple[type[BinlakeError], ...] = (InvalidArgument, OutOfRange, Conflict)
# Exit statuses of batch entry points (jobs/*.py) for errors they report:
# EXIT_RETRYABLE for a refusal that may pass later (a Pump down, a safe ts not
# there yet), EXIT_FINAL for one of FINAL.
EXIT_RETRYABLE = 2
EXIT_FINAL = 3


def is_final(exc: BaseException) -> bool:
    """Whether retrying the request that raised ``exc`` unchanged cannot succeed."""
    return isinstance(exc, FINAL)
