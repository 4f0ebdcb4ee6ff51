"""``net.free_port``: the ports the tests, the benchmarks and ``binlake up`` pick for
the processes they start lie below the kernel's ephemeral range (which outgoing
connections take), are not repeated within a process, skip a port in use, and
a forked child does not follow its parent's sequence."""

from __future__ import annotations

import os
import socket

import pytest

from binlake import net


def test_picks_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    high = net._ephemeral_low()
    assert high - net.PICK_LOW >= 1000, "this machine's ephemeral range leaves no room below it"
    picks = [net.free_port() for _ in range(300)]
    assert all(net.PICK_LOW <= p < high for p in picks), picks
    assert len(set(picks)) == len(picks)
    for port in picks[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", net.free_port()))
        squatter.listen()
        taken = squatter.getsockname()[1]
        monkeypatch.setattr(net, "_pick_next", taken)
        picked = net.free_port()
    assert picked != taken
    assert picked == taken + 1 or not net._bindable("127.0.0.1", taken + 1)


def test_the_range_wraps_at_its_top(monkeypatch: pytest.MonkeyPatch) -> None:
    high = net._ephemeral_low()
    if not net._bindable("127.0.0.1", high - 1):
        pytest.skip(f"port {high - 1} is in use here")
    monkeypatch.setattr(net, "_pick_next", high - 1)
    assert net.free_port() == high - 1
    after = net.free_port()  # the range's bottom, or the first free port above it
    assert net.PICK_LOW <= after < net.PICK_LOW + 100


def test_no_room_below_the_range_falls_back_to_the_kernels_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    ephemeral = net._ephemeral_low()
    monkeypatch.setattr(net, "_ephemeral_low", lambda: net.PICK_LOW + 10)
    port = net.free_port()
    assert port >= ephemeral  # bound to port 0: the kernel's ephemeral range
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_an_unreadable_range_is_taken_as_linuxs_default(tmp_path: os.PathLike[str]) -> None:
    assert net._ephemeral_low(os.path.join(tmp_path, "missing")) == 32768
    bad = os.path.join(tmp_path, "bad")
    with open(bad, "w") as f:
        f.write("not numbers\n")
    assert net._ephemeral_low(bad) == 32768


def test_a_forked_child_starts_its_own_sequence() -> None:
    net.free_port()  # the parent has a next port now
    assert net._pick_next is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it forgot the parent's next port
        try:
            os.write(write, b"1" if net._pick_next is None else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        answer = os.read(read, 1)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert answer == b"1"
