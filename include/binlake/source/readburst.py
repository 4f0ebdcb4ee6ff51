"""Reading the upstream's log in bursts, for both sources' reader threads.

A source following a busy upstream live gets its transactions one at a time:
each arrives on its own, and a reader that waits for the next one in the
kernel (``select`` for PostgreSQL, a blocking socket read for MySQL) wakes
once per transaction. Measured (bench/RESULTS.md, Sources), that wake-up (the
system call, taking the GIL back from the sender and the gRPC threads, the
driver's input handling) was most of the PostgreSQL reader's ~117 us per
transaction at a few hundred transactions/s, while reading transactions
already waiting costs ~6 us each.

So while a trickle arrives, a reader that has just run out of data after
reading less than ``BURST_BYTES`` sleeps ``read_burst_s()`` and then reads
everything that came meanwhile in one go. A read that finds nothing goes back
to waiting in the kernel, so an idle source still sleeps there; a reader that
had read more than ``BURST_BYTES`` since it last ran out (a busy upstream, a
backlog after a restart, bulk transactions) never sleeps, so this caps
nothing: it only applies while the upstream sends less than ``BURST_BYTES``
per sleep (3.2 MB/s at the defaults), where the reader is far from its limit. The price: a transaction is read up to that much
later (5 ms by default), small against the group pipeline's pace (25 ms and
more), which the upstream never waits for either.

``BINLAKE_READ_BURST_MS`` (0..100, read when a source starts) sets it; 0 turns
it off (a wake-up per arrival, as before), which the benchmark uses to
compare both in one run.
"""

from __future__ import annotations

READ_BURST_ENV = "BINLAKE_READ_BURST_MS"
READ_BURST_S = 0.005
# Less than this read since the reader last ran out: a trickle, worth a sleep. A few
# dozen small transactions; a bulk transaction's events alone are larger.
BURST_BYTES = 16 << 10


def read_burst_s() -> float:
    """The burst sleep in seconds: ``BINLAKE_READ_BURST_MS`` if set, else ``READ_BURST_S``."""
    from binlake import config

    return config.load(config.SourceSettings).read_burst_ms / 1000
