"""Domain errors. Transport-free code raises these; ``binlake.rpc`` maps them
to gRPC status codes in one place, and the CLI prints their message."""

from __future__ import annotations


class BinlakeError(Exception):
    """Base of every error binlake reports to a user."""


class InvalidArgument(BinlakeError, ValueError):
    """The request itself is malformed; retrying it unchanged cannot succeed."""


class ConfigError(InvalidArgument):
    """A setting (config file, environment variable, Airflow Variable or Connection) has
    a value binlake cannot use; the one-line message names the setting and where it is set."""


class FailedPrecondition(BinlakeError):
    """The request is well-formed but the system is not in a state to serve it."""


class Conflict(FailedPrecondition):
    """The request contradicts what is stored (a window overlapping an ingested
    one with other bounds): retrying it unchanged cannot succeed."""


class NotFound(BinlakeError, LookupError):
    """The named thing (a node, a consumer, a window) is not stored."""


class AlreadyExists(BinlakeError):
    """The thing was already stored exactly so: a retry that changes nothing."""


class OutOfRange(BinlakeError):
    """A window reaches below the data a Pump still holds (below its GC ts)."""


class ResourceExhausted(BinlakeError):
    """Disk nearly full, message too large."""


class Unavailable(BinlakeError):
    """A peer cannot be reached or is shutting down; retry elsewhere or later."""


class DeadlineExceeded(BinlakeError):
    """The peer did not answer in time."""


class NotEnoughReplicas(Unavailable):
    """Fewer Pumps than ``min_acks`` could take a write (as Kafka's
    NotEnoughReplicas): the write was refused rather than kept on fewer copies."""


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


def first_line(exc: BaseException, with_type: bool = False) -> str:
    """The first line of ``exc``'s message (of the driver's own error when ``exc`` wraps
    one as ``orig``, as SQLAlchemy's do), for a one-line report; the type's name when
    the message is empty. ``with_type`` puts the type's name in front."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    if with_type:
        return f"{type(orig).__name__}: {lines[0] if lines else ''}"
    return lines[0] if lines else type(orig).__name__
