"""The ingest's planning scan (``index_window``) against real Pumps: each Pump's
window read by a thread of its own and merged, a transaction two Pumps hold
emitted by the lower id only, and a Pump's refusal raised by the scan."""

from __future__ import annotations

import pytest
from pumpkit import PumpFactory, commit, prewrite, pull, wait_safe, write_one

from binlake import errors
from binlake.lake.pumps import window_index
from binlake.lake.pumps.window_index import index_streams, index_window
from binlake.registry.client import RegistryClient


def test_index_window_merges_the_pumps_and_drops_duplicate_copies(
    pump_factory: PumpFactory, reg: RegistryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    pumps = {name: pump_factory.start(name).addr for name in ("p1", "p2", "p3")}
    names = sorted(pumps)
    first = reg.get_ts()
    held: dict[int, list[str]] = {}
    for i in range(40):
        start = reg.get_ts()
        # Every 7th transaction is on two Pumps (a prewrite retried elsewhere), same commit_ts.
        held[start] = [names[i % 3]] + ([names[(i + 2) % 3]] if i % 7 == 0 else [])
        for name in held[start]:
            write_one(pumps[name], prewrite(start))
        commit_ts = reg.get_ts()
        for name in held[start]:
            write_one(pumps[name], commit(start, commit_ts))
    end = reg.get_ts()
    for addr in pumps.values():
        wait_safe(addr, end)
    # Chunks of 4 transactions, 2 ahead: the merge waits on the reading threads.
    monkeypatch.setattr(window_index, "CHUNK", 4)
    monkeypatch.setattr(window_index, "READ_AHEAD", 2)
    index = index_window(pumps, first, end, partitions=6, min_rows_per_partition=1)

    owner = {start: min(names_) for start, names_ in held.items()}
    assert (index.total_txns, index.total_rows, index.duplicates) == (40, 40, 6)
    assert index.txns == {name: sum(o == name for o in owner.values()) for name in names}
    assert index.skip == {name: sorted(s for s, names_ in held.items() if len(names_) == 2 and max(names_) == name)
                          for name in ("p2", "p3")}
    assert all(index.splits.get(name) for name in names)  # cut into parts of about 40 / 6 rows
    assert index.tables == {7: (min(index.tables[7]), max(index.tables[7]))}
    # The same as the scan of the same transactions read one Pump after the other.
    served = {name: pull(addr, first, end) for name, addr in pumps.items()}
    again = index_streams(first, end, served, partitions=6, min_rows_per_partition=1)
    assert (again.txns, again.rows, again.skip, again.splits, again.table_counts) == (
        index.txns, index.rows, index.skip, index.splits, index.table_counts)
    assert index.table_counts == [(min(index.tables[7]), 7, 40, 0, 0)]

    # A Pump that cannot serve the window fails the scan with its refusal.
    with pytest.raises(errors.BinlakeError, match="p1"):
        index_window(pumps, first, reg.get_ts() + 10**12)
