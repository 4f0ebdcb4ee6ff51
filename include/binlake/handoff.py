"""Handing items from a producer thread to a bounded queue whose consumer may go away.

A reader thread ahead of its consumer (a snapshot's reads, the ingest's planning
scan of each Pump, the delta-rs append's decoding threads) blocks on a full
queue; when the consumer stops early it sets an event, and the producer must
notice it while it waits, or it would hang on a queue nobody reads.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

# How long a producer waits for room in the queue before it looks at the stop event again.
POLL_S = 0.1


def put_until(q: queue.Queue[Any], item: Any, stop: threading.Event, poll_s: float = POLL_S) -> bool:
    """Put ``item`` in ``q``, waiting for room: True once it is in, False (not put)
    as soon as ``stop`` is set."""
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False
