"""Reading a snapshot's next batch while the last one is sent, for both sources.

An initial snapshot reads a batch of rows from the upstream, encodes it, and
sends it to the Pumps as one transaction, which returns once the Pumps have
committed it. Done one after the other, the upstream connection sits idle while
the Pumps write, and the Pumps sit idle while the rows are read. ``ahead`` runs
the reading in a thread of its own, at most ``depth`` batches ahead of the
sender: the sender's wait (a gRPC call, which releases the GIL) and the reader's
(a socket read, which releases it too) overlap, and memory stays bounded by
``depth + 2`` batches (one being read, ``depth`` waiting, one being sent).

The batches come out in the order they were read. An error in the reader is
raised in the consumer at the point of the batch it failed to read. A consumer
that stops early (an error of its own, a stop request, a closed generator)
makes the reader's next ``put`` raise ``Stopped``, which ends the thread; the
generator waits for the thread before it returns, so the caller may close the
connection the reader used right after.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from binlake import handoff

T = TypeVar("T")

# How long the reader waits for room in the queue before it looks at the stop flag again.
_POLL_S = 0.1
# How long a stopped consumer waits for the reader thread (a read in flight ends with
# its batch, or when the caller closes the connection after this).
_JOIN_S = 30.0


class Stopped(Exception):
    """Raised by ``put`` once the consumer is gone: the reader must end (not an error)."""


class _End:
    pass


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def ahead(read: Callable[[Callable[[T], None]], None], *, depth: int = 1, name: str = "snapshot-read") -> Iterator[T]:
    """What ``read(put)`` puts, in order, read in a thread at most ``depth`` items ahead."""
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    items: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: T) -> None:
        if not handoff.put_until(items, item, stop, _POLL_S):
            raise Stopped

    def run() -> None:
        end: object = _End()
        try:
            read(put)
        except Stopped:
            return
        except BaseException as exc:  # handed to the consumer, which raises it
            end = _Failed(exc)
        try:
            put(end)  # type: ignore[arg-type]
        except Stopped:
            return

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        while True:
            got = items.get()
            if isinstance(got, _End):
                return
            if isinstance(got, _Failed):
                raise got.exc
            yield got  # type: ignore[misc]
    finally:
        stop.set()
        deadline = time.monotonic() + _JOIN_S
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                items.get_nowait()  # room for a put in flight, which then sees the flag
            except queue.Empty:
                pass
            thread.join(_POLL_S)
