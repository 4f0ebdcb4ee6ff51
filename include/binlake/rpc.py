"""The one place that maps binlake's domain errors to gRPC status codes, makes
gRPC servers and channels (blocking and asyncio), and holds the shared
channel/server options (message size limits, keepalive)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
import grpc.aio

from binlake import errors

log = logging.getLogger(__name__)

_CODES: dict[type[errors.BinlakeError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
}

_ERRORS: dict[grpc.StatusCode, type[errors.BinlakeError]] = {v: k for k, v in _CODES.items()}

F = TypeVar("F", bound=Callable[..., Any])


def status_code(exc: errors.BinlakeError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in _CODES:
            return _CODES[cls]  # type: ignore[index]
    return grpc.StatusCode.UNKNOWN


def from_rpc_error(exc: grpc.RpcError, what: str) -> errors.BinlakeError:
    """Turn a client-side RpcError into the matching domain error, naming ``what`` failed."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    cls = _ERRORS.get(code, errors.Unavailable if code == grpc.StatusCode.UNKNOWN else errors.BinlakeError)
    err = cls(f"{what}: {detail}")
    err.grpc_code = code  # type: ignore[attr-defined]
    return err


def servicer_method(fn: F) -> F:
    """Wrap a unary servicer method: domain errors become their status, anything
    else becomes INTERNAL with the error logged (never a traceback to the peer)."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except errors.BinlakeError as exc:
            context.abort(status_code(exc), str(exc))
        except Exception as exc:
            log.exception("internal error in %s", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


def servicer_stream(fn: F) -> F:
    """As servicer_method, for server-streaming methods."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from fn(self, request, context)
        except errors.BinlakeError as exc:
            context.abort(status_code(exc), str(exc))
        except Exception as exc:
            log.exception("internal error in %s", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


def message_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """Channel/server options: message limits matched to the largest binlog we accept
    (plus room for the envelope), and keepalive so dead peers are noticed."""
    limit = min(max_message_bytes + (1 << 20), (1 << 31) - 1)
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def client_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """Client channels: as message_options, plus fast reconnects so a restarted
    peer is used again within a second (gRPC's default backoff grows to 2 min)."""
    return [
        *message_options(max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def parse_addr(addr: str, what: str = "address") -> tuple[str, int]:
    """Check a HOST:PORT string; raise InvalidArgument naming what is wrong."""
    if not isinstance(addr, str) or ":" not in addr:
        raise errors.InvalidArgument(f"{what} must be HOST:PORT (e.g. 127.0.0.1:8250), got {addr!r}")
    host, _, port_text = addr.rpartition(":")
    host = host.strip("[]")
    if not host:
        raise errors.InvalidArgument(f"{what} {addr!r} has no host; use e.g. 127.0.0.1:{port_text}")
    try:
        port = int(port_text)
    except ValueError:
        raise errors.InvalidArgument(f"{what} {addr!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise errors.InvalidArgument(f"{what} {addr!r}: port must be in 0..65535")
    return host, port


# ---------------------------------------------------------------------------- servers and channels
# Every gRPC server and channel is made here, so transport security is decided
# in one place (today: plaintext on the given address).


def server(executor: Any, options: list[tuple[str, Any]]) -> grpc.Server:
    """A thread-pool gRPC server (not yet bound: see ``add_port``)."""
    return grpc.server(executor, options=options)


def aio_server(options: list[tuple[str, Any]]) -> grpc.aio.Server:
    """An asyncio gRPC server; call from inside the event loop that will run it."""
    return grpc.aio.server(options=options)


def add_port(srv: grpc.Server | grpc.aio.Server, addr: str) -> int:
    """Bind ``srv`` to ``addr``; the port bound (0 when binding failed)."""
    return srv.add_insecure_port(addr)


def channel(addr: str, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A blocking client channel to ``addr``."""
    return grpc.insecure_channel(addr, options=options)


def aio_channel(addr: str, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
    """An asyncio client channel; call from inside the event loop that will use it."""
    return grpc.aio.insecure_channel(addr, options=options)


def aio_servicer_method(fn: F) -> F:
    """As ``servicer_method``, for ``async def`` unary methods of an asyncio server."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await fn(self, request, context)
        except errors.BinlakeError as exc:
            await context.abort(status_code(exc), str(exc))
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log.exception("internal error in %s", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


def aio_servicer_stream(fn: F) -> F:
    """As ``servicer_stream``, for async-generator methods of an asyncio server."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            async for item in fn(self, request, context):
                yield item
        except errors.BinlakeError as exc:
            await context.abort(status_code(exc), str(exc))
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log.exception("internal error in %s", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}: {exc}")

    return wrapper  # type: ignore[return-value]
