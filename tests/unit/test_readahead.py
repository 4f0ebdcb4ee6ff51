"""``source.readahead.ahead``: a snapshot's reads one batch ahead of its sends, in
order, bounded, with the reader's errors raised where they belong and a consumer
that stops early ending the reader before it returns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from binlake.source import readahead


def test_items_come_in_order_and_the_reader_stays_at_most_depth_ahead() -> None:
    produced: list[int] = []

    def read(put: Callable[[int], None]) -> None:
        for i in range(50):
            produced.append(i)
            put(i)

    got = []
    for item in readahead.ahead(read, depth=2):
        time.sleep(0.002)  # a slow sender: the reader waits for room
        # held: the item being sent, ``depth`` queued, one in the reader's hands
        assert len(produced) - len(got) <= 2 + 2
        got.append(item)
    assert got == list(range(50))


def test_an_error_of_the_reader_is_raised_after_the_items_before_it() -> None:
    def read(put: Callable[[int], None]) -> None:
        put(1)
        put(2)
        raise ConnectionError("lost the upstream")

    got = []
    with pytest.raises(ConnectionError, match="lost the upstream"):
        for item in readahead.ahead(read):
            got.append(item)
    assert got == [1, 2]


def test_a_consumer_that_stops_ends_the_reader_before_it_returns() -> None:
    threads: list[threading.Thread] = []
    puts = [0]

    def read(put: Callable[[int], None]) -> None:
        threads.append(threading.current_thread())
        for i in range(10_000):
            put(i)
            puts[0] += 1

    gen = readahead.ahead(read, depth=1)
    assert next(gen) == 0
    assert next(gen) == 1
    gen.close()  # the consumer's own error or a stop request does this
    assert threads and not threads[0].is_alive(), "the reader still runs after the consumer is gone"
    assert puts[0] < 10, "the reader went on reading for nobody"


def test_depth_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="depth must be a positive integer"):
            next(readahead.ahead(lambda put: None, depth=bad))  # type: ignore[arg-type]
