"""Every RPC of every gRPC service (registry, Pump, the writer's TxnStatus), found
from the .proto descriptors so methods added later are covered, answers
malformed messages - missing fields, huge fields, out-of-range numbers and
unknown enum values, bytes that are another message - with a clear status
(not UNKNOWN or INTERNAL) and a message, and the server keeps serving."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as _d
from google.protobuf import message_factory
from pumpkit import PumpFactory, start_registry

from binlake.proto import pump_pb2, registry_pb2, upstream_pb2
from binlake.writer import txn_status

HUGE = 4 << 20  # bytes: far above any id or query, well below the message limits
CLEAR = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
         grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ALREADY_EXISTS,
         grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _fill(msg: Any, how: str, depth: int = 0) -> Any:
    """Set every scalar field of ``msg`` (and of nested messages) the malformed way ``how``."""
    for field in msg.DESCRIPTOR.fields:
        label_repeated = field.is_repeated if hasattr(field, "is_repeated") else (
            field.label == _d.FieldDescriptor.LABEL_REPEATED)
        if field.type == _d.FieldDescriptor.TYPE_MESSAGE:
            if depth < 2 and not label_repeated:
                _fill(getattr(msg, field.name), how, depth + 1)
            continue
        value: Any
        if field.type == _d.FieldDescriptor.TYPE_STRING:
            value = "x" * HUGE if how == "huge" else " \x00"
        elif field.type == _d.FieldDescriptor.TYPE_BYTES:
            value = b"\xff" * HUGE if how == "huge" else b"\x00"
        elif field.type == _d.FieldDescriptor.TYPE_ENUM:
            value = 99
        elif field.type == _d.FieldDescriptor.TYPE_BOOL:
            continue  # any bool is well-formed (and wait=true would only wait)
        elif field.type in (_d.FieldDescriptor.TYPE_DOUBLE, _d.FieldDescriptor.TYPE_FLOAT):
            value = float("nan")
        elif field.type in (_d.FieldDescriptor.TYPE_UINT32, _d.FieldDescriptor.TYPE_FIXED32):
            value = (1 << 32) - 1
        elif field.type in (_d.FieldDescriptor.TYPE_UINT64, _d.FieldDescriptor.TYPE_FIXED64):
            value = (1 << 64) - 1
        else:
            value = -1
        if label_repeated:
            getattr(msg, field.name).append(value)
        else:
            setattr(msg, field.name, value)
    return msg


def malformed(method: _d.MethodDescriptor, other: _d.Descriptor) -> list[tuple[str, bytes]]:
    cls = message_factory.GetMessageClass(method.input_type)
    wrong = _fill(message_factory.GetMessageClass(other)(), "out-of-range")
    return [
        ("missing fields", cls().SerializeToString()),
        ("huge fields", _fill(cls(), "huge").SerializeToString()),
        ("out-of-range numbers, unknown enums, odd strings", _fill(cls(), "out-of-range").SerializeToString()),
        (f"a {other.name} instead", wrong.SerializeToString()),
        ("bytes that are no message", b"\xff\xff\xff\xff"),
    ]


@pytest.fixture
def services(tmp_path: pathlib.Path) -> Iterator[dict[str, tuple[str, Any, Callable[[grpc.Channel], None]]]]:
    """Service full name -> (address, file descriptor, a call that must still succeed)."""
    registry = start_registry(tmp_path / "registry")
    pumps = PumpFactory(registry.addr, tmp_path / "pumps")
    node = pumps.start("p1")
    status = txn_status.TxnStatusServer(txn_status.MemoryStatusProvider()).start()

    def registry_alive(ch: grpc.Channel) -> None:
        ch.unary_unary("/binlake.registry.Registry/GetClusterInfo")(b"", timeout=5)

    def pump_alive(ch: grpc.Channel) -> None:
        ch.unary_unary("/binlake.pump.Pump/Status")(b"", timeout=5)

    def writer_alive(ch: grpc.Channel) -> None:
        req = upstream_pb2.GetTxnStatusReq(start_ts=1).SerializeToString()
        ch.unary_unary(f"/{upstream_pb2.DESCRIPTOR.services_by_name['TxnStatus'].full_name}/GetTxnStatus")(
            req, timeout=5)

    yield {
        "Registry": (registry.addr, registry_pb2.DESCRIPTOR, registry_alive),
        "Pump": (node.addr, pump_pb2.DESCRIPTOR, pump_alive),
        "TxnStatus": (status.addr, upstream_pb2.DESCRIPTOR, writer_alive),
    }
    status.stop(0.2)
    pumps.stop_all()
    registry.stop(0.5)


def _call(ch: grpc.Channel, method: _d.MethodDescriptor, payload: bytes) -> tuple[grpc.StatusCode, str]:
    path = f"/{method.containing_service.full_name}/{method.name}"
    try:
        if method.client_streaming:
            for _ in ch.stream_stream(path)(iter([payload]), timeout=5):
                pass
        elif method.server_streaming:
            for _ in ch.unary_stream(path)(payload, timeout=5):
                pass
        else:
            ch.unary_unary(path)(payload, timeout=5)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_every_rpc_answers_malformed_messages_clearly_and_keeps_serving(
    services: dict[str, tuple[str, Any, Callable[[grpc.Channel], None]]],
) -> None:
    problems: list[str] = []
    calls = 0
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    for name, (addr, file_descriptor, alive) in services.items():
        service = file_descriptor.services_by_name[name]
        other = registry_pb2.NodeInfo.DESCRIPTOR
        with grpc.insecure_channel(addr, options=options) as ch:
            for method in service.methods:
                for what, payload in malformed(method, other):
                    code, details = _call(ch, method, payload)
                    calls += 1
                    if code != grpc.StatusCode.OK and (code not in CLEAR or not details):
                        problems.append(f"{name}.{method.name} with {what}: {code.name} {details[:200]!r}")
                    alive(ch)  # raises if the server stopped serving
    assert calls >= 4 * 14, calls
    assert not problems, "\n".join(problems)
