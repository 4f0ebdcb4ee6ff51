"""The Pump's gRPC surface against a real registry and Pump on loopback ports:
writes (unary and batched), every refusal with its status code and message,
reads and their refusals, Status, metrics, and `binlake ctl` errors."""

from __future__ import annotations

import json
import pathlib
import threading
import time
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from pumpkit import (
    PumpFactory,
    commit,
    free_port,
    now_ts,
    prewrite,
    pull,
    pump_stub,
    refusal,
    row_start_ts,
    run_cli,
    start_registry,
    status,
    try_status,
    wait_safe,
    wait_until,
    write_one,
)

from binlake import errors, tso
from binlake.proto import binlog_pb2, pump_pb2
from binlake.pump.node import PumpNode
from binlake.pump.service import PumpService
from binlake.pump.storage import Storage
from binlake.registry.client import RegistryClient
from binlake.registry.server import RegistryServer

MAX_BINLOG = 4096


@pytest.fixture
def pump(pump_factory: PumpFactory) -> PumpNode:
    return pump_factory.start(
        "p1", max_binlog_bytes=MAX_BINLOG, fake_binlog_interval_s=0.5, metrics_addr="127.0.0.1:0"
    )


def expect(fn: Callable[[], object], code: grpc.StatusCode, *words: str) -> str:
    """``fn`` fails with status ``code`` (a raw RpcError, or the domain error the
    reader turns it into) and a message naming every word in ``words``."""
    got, message = refusal(fn)
    assert got == code, message
    for word in words:
        assert word in message, (word, message)
    return message


def txn(addr: str, reg: RegistryClient) -> tuple[int, int]:
    start = reg.get_ts()
    write_one(addr, prewrite(start))
    commit_ts = reg.get_ts()
    write_one(addr, commit(start, commit_ts))
    return start, commit_ts


# ---------------------------------------------------------------------------- writes


def test_unary_write_and_pull(pump: PumpNode, reg: RegistryClient) -> None:
    start, commit_ts = txn(pump.addr, reg)
    got = pull(pump.addr, start, commit_ts + 1, wait=True, wait_timeout_s=10)
    assert [(b.start_ts, b.commit_ts) for b in got] == [(start, commit_ts)]
    assert got[0].tp == binlog_pb2.COMMIT and row_start_ts(got[0]) == start
    # The same commit again is a harmless retry; a prewrite again too.
    expect(lambda: write_one(pump.addr, commit(start, commit_ts)), grpc.StatusCode.ALREADY_EXISTS, str(start))
    expect(lambda: write_one(pump.addr, prewrite(start)), grpc.StatusCode.ALREADY_EXISTS, str(start))


def test_batched_write(pump: PumpNode, reg: RegistryClient) -> None:
    starts = [reg.get_ts() for _ in range(5)]
    groups_before = pump.storage.stats.groups
    with pump_stub(pump.addr) as stub:
        resp = stub.WriteBinlogs(
            pump_pb2.WriteBinlogsReq(payloads=[prewrite(s).SerializeToString() for s in starts]), timeout=10
        )
        assert [r.code for r in resp.results] == [0] * 5
        commit_ts = reg.get_ts()
        payloads = [commit(s, commit_ts + i).SerializeToString() for i, s in enumerate(starts)]
        payloads.insert(2, b"\xff" * 16)  # one malformed entry among good ones
        payloads.append(payloads[0])  # and a retry of the first commit
        payloads.append(commit(starts[1], commit_ts + 99).SerializeToString())  # a conflicting commit
        resp = stub.WriteBinlogs(pump_pb2.WriteBinlogsReq(payloads=payloads), timeout=10)
    assert [r.code for r in resp.results] == [
        0, 0, grpc.StatusCode.INVALID_ARGUMENT.value[0], 0, 0, 0,
        grpc.StatusCode.ALREADY_EXISTS.value[0], grpc.StatusCode.FAILED_PRECONDITION.value[0],
    ]
    assert "payload #2" in resp.results[2].message and "not a serialized" in resp.results[2].message
    assert "already committed" in resp.results[7].message
    # Each batch was stored under one group commit (fake binlogs may add their own groups).
    assert pump.storage.stats.groups - groups_before <= 2 + 4
    got = pull(pump.addr, starts[0], commit_ts + 5, wait=True, wait_timeout_s=10)
    assert [(b.start_ts, b.commit_ts) for b in got] == [(s, commit_ts + i) for i, s in enumerate(starts)]


def test_empty_payload_is_a_probe(pump: PumpNode) -> None:
    before = pump.storage.stats.binlogs
    with pump_stub(pump.addr) as stub:
        assert stub.WriteBinlog(pump_pb2.WriteBinlogReq(), timeout=5) == pump_pb2.WriteBinlogResp()
        stub.WriteBinlog(pump_pb2.WriteBinlogReq(cluster_id=pump.service.cluster_id), timeout=5)
    assert pump.storage.stats.binlogs in (before, before + 1)  # at most a fake binlog meanwhile
    assert pump.storage.pending_count == 0


BAD_INPUTS: dict[str, tuple[Callable[[int], bytes], grpc.StatusCode, tuple[str, ...]]] = {
    "malformed payload": (
        lambda ts: bytes([0xFF, 0x13, 0x77, 0x00, 0xFE] * 13), grpc.StatusCode.INVALID_ARGUMENT,
        ("not a serialized binlake Binlog",),
    ),
    "prewrite without prewrite_key": (
        lambda ts: prewrite(ts, writer=b"").SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT,
        ("prewrite_key", "start_ts"),
    ),
    "malformed prewrite_value": (
        lambda ts: binlog_pb2.Binlog(
            tp=binlog_pb2.PREWRITE, start_ts=ts, prewrite_key=b"w1", prewrite_value=b"\xff" * 12
        ).SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT, ("prewrite_value", "not a PrewriteValue"),
    ),
    "prewrite with commit_ts": (
        lambda ts: binlog_pb2.Binlog(
            tp=binlog_pb2.PREWRITE, start_ts=ts, commit_ts=ts + 1, prewrite_key=b"w1"
        ).SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT, ("carries no commit_ts",),
    ),
    "commit without prewrite": (
        lambda ts: commit(ts, ts + 1).SerializeToString(), grpc.StatusCode.FAILED_PRECONDITION,
        ("no prewrite on this pump", "the pump that took the prewrite"),
    ),
    "commit_ts equal to start_ts": (
        lambda ts: commit(ts, ts).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT,
        ("must be greater than start_ts",),
    ),
    "commit_ts below start_ts": (
        lambda ts: commit(ts, ts - 5).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT,
        ("must be greater than start_ts",),
    ),
    "start_ts zero": (
        lambda ts: prewrite(0).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT,
        ("start_ts must be a positive TSO",),
    ),
    "unknown binlog type": (
        lambda ts: binlog_pb2.Binlog(tp=7, start_ts=ts).SerializeToString(),  # type: ignore[arg-type]
        grpc.StatusCode.INVALID_ARGUMENT, ("unknown binlog type 7",),
    ),
    "rollback without prewrite": (
        lambda ts: binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=ts).SerializeToString(),
        grpc.StatusCode.FAILED_PRECONDITION, ("rollback", "no prewrite"),
    ),
    "binlog above max_binlog_bytes": (
        lambda ts: prewrite(ts, pad=MAX_BINLOG).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT,
        ("max_binlog_bytes=4096", "split the transaction"),
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_status(pump: PumpNode, reg: RegistryClient, case: str) -> None:
    build, code, words = BAD_INPUTS[case]
    payload = build(reg.get_ts())
    stored = pump.storage.stats.binlogs
    expect(lambda: write_one(pump.addr, payload), code, *words)
    # The batched form reports the same refusal in the entry's result.
    with pump_stub(pump.addr) as stub:
        resp = stub.WriteBinlogs(pump_pb2.WriteBinlogsReq(payloads=[payload]), timeout=5)
    assert resp.results[0].code == code.value[0]
    assert all(w in resp.results[0].message for w in words)
    assert pump.storage.pending_count == 0
    # Nothing but (at most a few) fake binlogs was stored meanwhile.
    assert pump.storage.stats.binlogs - stored <= 3


def test_malformed_payload_really_is_malformed() -> None:
    from google.protobuf.message import DecodeError

    with pytest.raises(DecodeError):
        binlog_pb2.Binlog.FromString(BAD_INPUTS["malformed payload"][0](1))


def test_duplicate_commit_conflicting(pump: PumpNode, reg: RegistryClient) -> None:
    start, commit_ts = txn(pump.addr, reg)
    expect(
        lambda: write_one(pump.addr, commit(start, commit_ts + 1)), grpc.StatusCode.FAILED_PRECONDITION,
        "duplicate commit", f"already committed with commit_ts {commit_ts}", str(commit_ts + 1),
    )
    # Rolling back a committed transaction is refused as well.
    expect(
        lambda: write_one(pump.addr, binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=start)),
        grpc.StatusCode.FAILED_PRECONDITION, "already committed",
    )


def test_cluster_id_mismatch(pump: PumpNode, reg: RegistryClient) -> None:
    cluster_id, _ = reg.cluster_info()
    assert pump.service.cluster_id == cluster_id
    start = reg.get_ts()
    expect(
        lambda: write_one(pump.addr, prewrite(start), cluster_id=cluster_id ^ 1),
        grpc.StatusCode.FAILED_PRECONDITION, "cluster id", "different registries",
    )
    expect(  # the probe checks it too
        lambda: write_one(pump.addr, b"", cluster_id=cluster_id ^ 1), grpc.StatusCode.FAILED_PRECONDITION,
        "cluster id",
    )
    with pump_stub(pump.addr) as stub:  # the batched form refuses the whole call
        expect(
            lambda: stub.WriteBinlogs(
                pump_pb2.WriteBinlogsReq(cluster_id=cluster_id ^ 1, payloads=[prewrite(start).SerializeToString()]),
                timeout=5,
            ),
            grpc.StatusCode.FAILED_PRECONDITION, "cluster id",
        )
    # The right cluster id (and 0 = unchecked) are accepted.
    write_one(pump.addr, prewrite(start), cluster_id=cluster_id)
    assert pump.storage.is_pending(start)


# ---------------------------------------------------------------------------- reads


def test_pull_empty_window_invalid(pump: PumpNode) -> None:
    expect(lambda: pull(pump.addr, 100, 100), grpc.StatusCode.INVALID_ARGUMENT, "is empty", "[100, 100)")
    expect(lambda: pull(pump.addr, 200, 100), grpc.StatusCode.INVALID_ARGUMENT, "start_ts must be less")


def _pull_raw(addr: str, **fields: object) -> list[pump_pb2.PullBinlogsResp]:
    with pump_stub(addr) as stub:
        return list(stub.PullBinlogs(pump_pb2.PullBinlogsReq(**fields), timeout=20))


def test_pull_window_above_safe_ts(pump: PumpNode, reg: RegistryClient) -> None:
    start, commit_ts = txn(pump.addr, reg)
    far = now_ts(60_000)
    msg = expect(
        lambda: _pull_raw(pump.addr, start_ts=start, end_ts=far), grpc.StatusCode.FAILED_PRECONDITION,
        "safe ts", "retry later or pull with wait",
    )
    assert str(far) in msg
    # With wait, the pull blocks until fake binlogs move the safe ts past the end.
    end = now_ts(1_000)
    t0 = time.monotonic()
    resps = _pull_raw(pump.addr, start_ts=start, end_ts=end, wait=True, wait_timeout_ms=10_000)
    assert time.monotonic() - t0 >= 0.3
    assert [(b.start_ts, b.commit_ts) for r in resps for b in r.binlogs] == [(start, commit_ts)]
    assert all(r.node_id == "p1" for r in resps)
    assert pump.storage.safe_ts >= end
    # A wait that cannot be satisfied in time ends with DEADLINE_EXCEEDED, naming the safe ts.
    expect(
        lambda: _pull_raw(pump.addr, start_ts=start, end_ts=far, wait=True, wait_timeout_ms=300),
        grpc.StatusCode.DEADLINE_EXCEEDED, "did not reach the window end",
    )


def test_pull_batches(pump: PumpNode, reg: RegistryClient) -> None:
    txns = [txn(pump.addr, reg) for _ in range(7)]
    end = txns[-1][1] + 1
    wait_safe(pump.addr, end)
    resps = _pull_raw(pump.addr, start_ts=txns[0][0], end_ts=end, batch_max_txns=3)
    assert [len(r.binlogs) for r in resps] == [3, 3, 1]
    assert [(b.start_ts, b.commit_ts) for r in resps for b in r.binlogs] == txns
    expect(lambda: _pull_raw(pump.addr, start_ts=1, end_ts=2, batch_max_txns=-1),
           grpc.StatusCode.INVALID_ARGUMENT, "batch limits")


def test_a_transaction_larger_than_a_read_batch_comes_in_bounded_messages(
        pump_factory: PumpFactory, reg: RegistryClient) -> None:
    from binlake.client.reader import pull_pump

    node = pump_factory.start("big", read_batch_bytes=16 << 10, fake_binlog_interval_s=0.3)
    small = txn(node.addr, reg)
    start = reg.get_ts()
    write_one(node.addr, prewrite(start, pad=200_000))
    commit_ts = reg.get_ts()
    write_one(node.addr, commit(start, commit_ts))
    after = txn(node.addr, reg)
    wait_safe(node.addr, after[1] + 1)
    window = {"start_ts": small[0], "end_ts": after[1] + 1}
    # Every message of a reader that joins parts stays near the batch limit...
    resps = _pull_raw(node.addr, accept_parts=True, **window)
    assert max(r.ByteSize() for r in resps) < (16 << 10) + 256
    assert sum(r.HasField("part") for r in resps) == 13  # 200 KB in 16 KiB parts
    # ...and the reader gets the transaction whole, in its place.
    got = list(pull_pump(node.addr, **window))
    assert [(b.start_ts, b.commit_ts) for b in got] == [small, (start, commit_ts), after]
    assert got[1].tp == binlog_pb2.COMMIT and not got[1].prewrite_key and row_start_ts(got[1]) == start
    # The same bytes as an older reader gets in one message.
    (whole,) = [b for r in _pull_raw(node.addr, **window) for b in r.binlogs if b.start_ts == start]
    assert got[1].SerializeToString() == whole.SerializeToString()
    # Keys alone: no mutations on the wire.
    keys = list(pull_pump(node.addr, keys_only=True, **window))
    assert [(b.start_ts, b.commit_ts, b.prewrite_value) for b in keys][1] == (start, commit_ts, b"")


def test_pull_window_below_gc_ts(pump: PumpNode, reg: RegistryClient) -> None:
    old_start, old_commit = txn(pump.addr, reg)
    new_start, new_commit = txn(pump.addr, reg)
    wait_safe(pump.addr, new_commit + 1)
    gc_ts = new_start
    assert pump.storage.gc(gc_ts)["gc_ts"] == gc_ts
    msg = expect(
        lambda: pull(pump.addr, old_start, new_commit + 1), grpc.StatusCode.OUT_OF_RANGE,
        "below pump p1's GC ts", "retention",
    )
    assert tso.format_ts(gc_ts) in msg
    # At or above the GC ts the window is served (and the old txn is gone).
    got = pull(pump.addr, gc_ts, new_commit + 1)
    assert [(b.start_ts, b.commit_ts) for b in got] == [(new_start, new_commit)]
    assert status(pump.addr).gc_ts == gc_ts


def test_disk_nearly_full_refuses_writes_but_serves_reads(pump_factory: PumpFactory, reg: RegistryClient) -> None:
    node = pump_factory.start("full", stop_write_at_free_bytes=1 << 60, fake_binlog_interval_s=0.3)
    start = reg.get_ts()
    msg = expect(
        lambda: write_one(node.addr, prewrite(start)), grpc.StatusCode.RESOURCE_EXHAUSTED,
        "bytes free", "stop_write_at_free_bytes=1152921504606846976", "reads are still served",
    )
    assert "full" in msg
    expect(lambda: write_one(node.addr, b""), grpc.StatusCode.RESOURCE_EXHAUSTED, "stop_write_at_free_bytes")
    st = status(node.addr)
    assert st.accepting_writes is False and st.disk_free_bytes > 0
    # Reads keep working (its own fake binlogs still move the safe ts).
    end = now_ts(500)
    assert pull(node.addr, start, end, wait=True, wait_timeout_s=10) == []


def test_service_refuses_writes_before_registration(tmp_path) -> None:
    storage = Storage(tmp_path / "unregistered")
    try:
        svc = PumpService(storage, node_id="early", max_binlog_bytes=1 << 20, stop_write_at_free_bytes=0)
        assert svc.registered is False and not svc.accepting_writes()
        (err,) = svc.write([prewrite(100).SerializeToString()])
        assert isinstance(err, errors.Unavailable)
        assert "not registered yet" in str(err) and "early" in str(err)
        with pytest.raises(errors.Unavailable, match="not registered"):
            svc.probe()
        assert storage.pending_count == 0 and storage.stats.binlogs == 0
        svc.registered = True
        assert svc.write([prewrite(100).SerializeToString()]) == [None]
        assert svc.accepting_writes()
        # Shutting down: prewrites and commits are refused as Unavailable (retry elsewhere/later).
        svc.closing = True
        (err,) = svc.write([prewrite(101).SerializeToString()])
        assert isinstance(err, errors.Unavailable) and "shutting down" in str(err)
        (err,) = svc.write([commit(100, 200).SerializeToString()])
        assert isinstance(err, errors.Unavailable) and "retry the commit" in str(err)
    finally:
        storage.close()


def test_unstarted_node_refuses_writes(pump_factory: PumpFactory) -> None:
    node = pump_factory.create("unstarted")
    assert node.service.registered is False
    assert node.service.accepting_writes() is False


def test_status_fields(pump: PumpNode, reg: RegistryClient) -> None:
    start, commit_ts = txn(pump.addr, reg)
    pending = reg.get_ts()
    write_one(pump.addr, prewrite(pending))
    st = status(pump.addr)
    assert st.node_id == "p1"
    assert st.state == "online"
    assert st.max_commit_ts == commit_ts
    assert st.safe_ts == min(pending, pump.storage.sorter.bound) and st.safe_ts <= pending
    assert st.gc_ts == 0
    assert st.pending_txns == 1
    assert st.storage_bytes > 0 and st.disk_free_bytes > 0
    assert st.accepting_writes is True
    write_one(pump.addr, commit(pending, reg.get_ts()))
    assert status(pump.addr).pending_txns == 0


def test_metrics_endpoint(pump: PumpNode, reg: RegistryClient) -> None:
    assert pump.metrics_addr
    txn(pump.addr, reg)
    expect(lambda: write_one(pump.addr, commit(reg.get_ts(), reg.get_ts())), grpc.StatusCode.FAILED_PRECONDITION)
    with urllib.request.urlopen(f"http://{pump.metrics_addr}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("binlake_pump_")]
    names = {ln.split("{")[0].split(" ")[0] for ln in lines}
    for name in (
        "binlake_pump_binlogs_stored_total", "binlake_pump_fsyncs_total", "binlake_pump_group_commits_total",
        "binlake_pump_safe_ts", "binlake_pump_max_commit_ts", "binlake_pump_gc_ts", "binlake_pump_pending_txns",
        "binlake_pump_storage_bytes", "binlake_pump_disk_free_bytes", "binlake_pump_write_latency_seconds_count",
        "binlake_pump_write_requests_total",
    ):
        assert name in names, name
    values = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines}
    assert values["binlake_pump_binlogs_stored_total"] >= 2
    assert values['binlake_pump_write_requests_total{code="OK",method="WriteBinlog"}'] >= 2
    assert values['binlake_pump_write_requests_total{code="FAILED_PRECONDITION",method="WriteBinlog"}'] == 1
    assert values["binlake_pump_max_commit_ts"] > 0
    # The registry learns the metrics address from heartbeats.
    assert reg.get_node("p1").metrics_addr == pump.metrics_addr


# ---------------------------------------------------------------------------- ctl


def test_ctl_pause_unknown_pump_exits_2(registry: RegistryServer, pump: PumpNode) -> None:
    res = run_cli("ctl", "pause-pump", "nope", "--registry", registry.addr)
    assert res.returncode == 2, res
    assert "nope" in res.stderr and "not registered" in res.stderr
    assert "Traceback" not in res.stderr


def test_ctl_pause_writer_refused(registry: RegistryServer, upstream) -> None:
    res = run_cli("ctl", "offline-pump", "w1", "--registry", registry.addr)
    assert res.returncode == 2
    assert "is a writer, not a pump" in res.stderr


def test_ctl_pumps_json_and_dump(registry: RegistryServer, pump: PumpNode, reg: RegistryClient) -> None:
    start, commit_ts = txn(pump.addr, reg)
    wait_safe(pump.addr, commit_ts + 1)
    res = run_cli("ctl", "pumps", "--json", "--registry", registry.addr)
    assert res.returncode == 0, res.stderr
    (row,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert row["node_id"] == "p1" and row["addr"] == pump.addr and row["state"] == "online"
    res = run_cli("ctl", "dump", "--registry", registry.addr, "--start-ts", str(start),
                  "--end-ts", str(commit_ts + 1))
    assert res.returncode == 0, res.stderr
    (txn_json,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert (txn_json["start_ts"], txn_json["commit_ts"]) == (start, commit_ts)
    assert txn_json["mutations"][0]["inserts"] == 1
    assert "1 transactions" in res.stderr
    # A window above the safe ts is a clear one-line refusal with exit 2.
    res = run_cli("ctl", "dump", "--registry", registry.addr, "--start-ts", str(start),
                  "--end-ts", str(now_ts(3_600_000)))
    assert res.returncode == 2 and "safe ts" in res.stderr and "Traceback" not in res.stderr


def test_pump_takes_writes_only_once_registered(tmp_path: pathlib.Path) -> None:
    """A pump whose registry is not up yet serves Status but refuses prewrites
    (UNAVAILABLE, retry shortly); once the registry appears it registers and accepts them."""
    reg_addr = f"127.0.0.1:{free_port()}"
    factory = PumpFactory(reg_addr, tmp_path / "pumps")
    node = factory.create("early")
    started: list[object] = []
    thread = threading.Thread(target=lambda: started.append(node.start(register_timeout_s=30)))
    thread.start()
    registry: RegistryServer | None = None
    try:
        st = wait_until(lambda: try_status(node.addr), timeout=10, what="the pump to listen")
        assert st.accepting_writes is False and st.node_id == "early"
        code, message = refusal(lambda: write_one(node.addr, prewrite(now_ts())))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "not registered yet" in message and "retry shortly" in message
        registry = start_registry(tmp_path / "registry", addr=reg_addr)
        thread.join(timeout=20)
        assert started == [node]
        with RegistryClient(reg_addr) as reg:
            rec = reg.get_node("early")
            assert rec.state.value == "online" and rec.online_ts > 0
            start = reg.get_ts()
            assert start > rec.online_ts  # anything it takes commits after it came online
            write_one(node.addr, prewrite(start))
            write_one(node.addr, commit(start, reg.get_ts()))
        assert status(node.addr).accepting_writes
    finally:
        thread.join(timeout=30)
        factory.stop_all()
        if registry is not None:
            registry.stop(grace=0.5)
