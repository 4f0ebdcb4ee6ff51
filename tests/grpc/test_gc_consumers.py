"""Pump GC held by registered consumers: a stopped ingest keeps everything, a
caught-up one releases what it read, a removed one releases all, and only a
hard limit passes a checkpoint - loudly (error log, metric, ctl warning)."""

from __future__ import annotations

import logging

import pytest
from pumpkit import PumpFactory, commit, prewrite, pull, refusal, wait_until, write_one

from binlake import cli
from binlake.pump.node import PumpNode
from binlake.registry.client import RegistryClient
from binlake.registry.server import RegistryServer


def txn(node: PumpNode, reg: RegistryClient) -> tuple[int, int]:
    """One committed transaction on ``node``; waits until the safe ts passes it."""
    start = reg.get_ts()
    write_one(node.addr, prewrite(start))
    commit_ts = reg.get_ts()
    write_one(node.addr, commit(start, commit_ts))
    wait_until(lambda: node.storage.safe_ts > commit_ts, 10, what="safe ts past the transaction")
    return start, commit_ts


def test_consumer_holds_gc_until_it_catches_up_or_is_removed(
    pump_factory: PumpFactory, reg: RegistryClient, registry: RegistryServer, capsys: pytest.CaptureFixture[str],
) -> None:
    node = pump_factory.start("p1", gc_retention_days=0)
    held_at = reg.get_ts()
    reg.update_consumer("lake", held_at, "test lake")
    s1, c1 = txn(node, reg)
    s2, c2 = txn(node, reg)

    # Retention 0 and the ingest stopped: nothing the consumer has not read goes.
    decision = node._gc()
    assert decision.held_by is not None and decision.held_by.consumer_id == "lake"
    assert node.storage.gc_ts == held_at
    assert [b.start_ts for b in pull(node.addr, held_at, node.storage.safe_ts)] == [s1, s2]

    # `ctl pumps` and `ctl consumers` show what holds GC.
    assert cli.main(["ctl", "pumps", "--registry", registry.addr]) == 0
    assert "GC held by lake @" in capsys.readouterr().out
    assert cli.main(["ctl", "consumers", "--registry", registry.addr]) == 0
    out, err = capsys.readouterr()
    assert "lake" in out and str(held_at) in out and "test lake" in out and "WARNING" not in err

    # The ingest catches up to past the first transaction: GC follows it, no further.
    reg.update_consumer("lake", c1 + 1)
    node._gc()
    assert node.storage.gc_ts == c1 + 1
    code, msg = refusal(lambda: pull(node.addr, s1, c1 + 1))
    assert "GC ts" in msg
    assert [b.start_ts for b in pull(node.addr, c1 + 1, node.storage.safe_ts)] == [s2]

    # An operator removes the consumer: retention alone decides again.
    assert cli.main(["ctl", "remove-consumer", "lake", "--registry", registry.addr]) == 0
    assert "consumer lake removed" in capsys.readouterr().out
    assert reg.list_consumers() == []
    node._gc()
    assert node.storage.gc_ts > c2
    assert cli.main(["ctl", "remove-consumer", "lake", "--registry", registry.addr]) == 2
    assert "consumer lake is not registered" in capsys.readouterr().err


def test_hard_limit_passes_a_checkpoint_loudly(
    pump_factory: PumpFactory, reg: RegistryClient, registry: RegistryServer,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    node = pump_factory.start("p1", gc_retention_days=0, gc_hard_limit_bytes=1)
    reg.update_consumer("stuck", 1)
    _, c1 = txn(node, reg)
    with caplog.at_level(logging.ERROR, logger="binlake.pump.node"):
        decision = node._gc()
    assert decision.forced_by is not None and "gc_hard_limit_bytes=1" in decision.forced_by
    assert node.storage.gc_ts > c1
    errors_logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("consumer stuck loses [" in m and "gc_hard_limit_bytes" in m for m in errors_logged), errors_logged
    assert node.metrics.registry.get_sample_value("binlake_pump_gc_forced_total", {"consumer": "stuck"}) == 1.0

    # Once the Pump reported its new GC ts, ctl names the windows the consumer lost.
    gc_ts = node.storage.gc_ts
    wait_until(lambda: reg.get_node("p1").gc_ts == gc_ts, 10, what="heartbeat with the new GC ts")
    assert cli.main(["ctl", "consumers", "--registry", registry.addr]) == 0
    err = capsys.readouterr().err
    assert "WARNING: pump p1 removed [1 (" in err and "consumer stuck has not read" in err
