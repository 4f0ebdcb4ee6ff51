"""The lake's write lock: one holder at a time, a local lake's lock inside it."""

from __future__ import annotations

import pathlib
import threading
import time

import pytest

from binlake.lake.store import writelock


def test_lock_path_local_and_uri(tmp_path: pathlib.Path) -> None:
    assert writelock.lock_path(str(tmp_path / "lake")) == str(tmp_path / "lake" / writelock.LOCK_NAME)
    assert writelock.lock_path(f"file://{tmp_path}/lake") == str(tmp_path / "lake" / writelock.LOCK_NAME)
    uri = writelock.lock_path("s3a://bucket/lake")
    assert uri != writelock.lock_path("s3a://bucket/other") and uri == writelock.lock_path("s3a://bucket/lake/")
    with pytest.raises(ValueError, match="lake must be"):
        writelock.lock_path("  ")


def test_one_holder_at_a_time(tmp_path: pathlib.Path) -> None:
    lake = str(tmp_path / "lake")
    inside: list[int] = []
    most = [0]
    waits: list[float] = []

    def writer() -> None:
        with writelock.lake_writes(lake) as turn:
            waits.append(turn.waited)
            inside.append(1)
            most[0] = max(most[0], len(inside))
            time.sleep(0.05)
            inside.pop()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and len(waits) == 4
    assert max(waits) >= 0.1  # the last one waited for at least two others
    assert (tmp_path / "lake" / writelock.LOCK_NAME).exists()


def test_a_thread_inside_takes_it_again_without_waiting(tmp_path: pathlib.Path) -> None:
    lake = str(tmp_path / "lake")
    with writelock.lake_writes(lake) as outer, writelock.lake_writes(lake) as inner:
        assert inner is outer
        inner.check()  # a local lake's turn cannot be lost
    # And it is free again for another thread afterwards.
    done = threading.Event()

    def other() -> None:
        with writelock.lake_writes(lake):
            done.set()

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    assert done.is_set()
