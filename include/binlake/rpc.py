"""The one place that maps binlake's domain errors to gRPC status codes, the
shared channel/server options (message size limits, keepalive), and the one
place gRPC servers and channels (blocking and asyncio) are created, with TLS
when ``[security]`` is set."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
import grpc.aio

from binlake import config, errors
from binlake.net import TLSFiles, parse_addr

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
            return _CODES[cls]
    return grpc.StatusCode.UNKNOWN


def from_rpc_error(exc: grpc.RpcError, what: str) -> errors.BinlakeError:
    """Turn a client-side RpcError into the matching domain error, naming ``what`` failed."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    cls = _ERRORS.get(code, errors.Unavailable if code == grpc.StatusCode.UNKNOWN else errors.BinlakeError)
    err = cls(f"{what}: {detail}")
    err.grpc_code = code  # type: ignore[attr-defined]
    return err


# Trailing metadata of a registry follower's refusal (errors.NotLeader): that it
# was refused unexecuted, and the leader's HOST:PORT when known.
NOT_LEADER_METADATA_KEY = "binlake-not-leader"
LEADER_METADATA_KEY = "binlake-leader"


def not_leader_metadata(exc: errors.NotLeader) -> tuple[tuple[str, str], ...]:
    if exc.leader:
        return ((NOT_LEADER_METADATA_KEY, "1"), (LEADER_METADATA_KEY, exc.leader))
    return ((NOT_LEADER_METADATA_KEY, "1"),)


def servicer_method(fn: F) -> F:
    """Wrap a unary servicer method: domain errors become their status, anything
    else becomes INTERNAL with the error logged (never a traceback to the peer)."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except errors.BinlakeError as exc:
            if isinstance(exc, errors.NotLeader):
                context.set_trailing_metadata(not_leader_metadata(exc))
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
        # A server's side of the same keepalive: it accepts a ping every 10 s on an idle
        # connection (gRPC's default is one per 5 min, past which it answers the peers'
        # 20 s pings with GOAWAY "too_many_pings" and the connection is dropped).
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
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


# -- TLS: every gRPC server and channel of binlake is created here ---------------------
#
# ``[security] ca / cert / key`` (config file, BINLAKE_SECURITY_* environment, or the
# top-level ``--ca/--cert/--key`` flags), as TiDB Binlog's [security] section:
# - no cert/key: plaintext (loopback development);
# - cert + key: servers speak TLS; clients present the cert too (mutual TLS);
# - ca: clients verify servers against it, and servers REQUIRE a client
#   certificate signed by it, so only holders of such a certificate connect.
# Only file paths are kept in settings and logs; the key's bytes never leave this module.


_tls: TLSFiles | None = None
_tls_lock = threading.Lock()


def configure_tls(files: TLSFiles | None) -> None:
    """Set this process's TLS files (None: read BINLAKE_SECURITY_* again on next use).
    Checks the files now, so a wrong path is reported before any server starts."""
    global _tls
    if files is not None:
        _read_files(files)
    with _tls_lock:
        _tls = files


def tls() -> TLSFiles:
    """This process's TLS files: configured, else from BINLAKE_SECURITY_* (checked)."""
    global _tls
    with _tls_lock:
        if _tls is None:
            settings = config.load(config.SecuritySettings)
            files = settings.files()
            _read_files(files)
            _tls = files
        return _tls


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise errors.InvalidArgument(
            f"[security] {what} {path!r} cannot be read ({exc.strerror}); give a readable PEM file"
        ) from None
    if b"-----BEGIN" not in data:
        raise errors.InvalidArgument(f"[security] {what} {path!r} is not a PEM file")
    return data


def _read_files(files: TLSFiles) -> tuple[bytes | None, bytes | None, bytes | None]:
    if bool(files.cert) != bool(files.key):
        raise errors.InvalidArgument("[security] cert and key go together: give both (or neither)")
    return _read(files.ca, "ca"), _read(files.cert, "cert"), _read(files.key, "key")


def create_server(max_workers: int, name: str, options: list[tuple[str, Any]] | None = None) -> grpc.Server:
    """A gRPC server with a thread pool (ports are added with ``add_port``); requests
    that are not the method's message are refused with INVALID_ARGUMENT.

    SO_REUSEPORT is off: gRPC enables it by default, so a second server started
    on a taken port would bind beside the first and take half its clients (two
    Pumps, or two registries, started at once pass ``add_port``'s check of the
    port together; only the bind itself can refuse one)."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name),
        options=[("grpc.so_reuseport", 0), *(options or [])],
        interceptors=[_DecodeRequests()],
    )


def _server_credentials(files: TLSFiles) -> grpc.ServerCredentials:
    ca, cert, key = _read_files(files)
    if cert is None or key is None:
        raise errors.InvalidArgument("[security] a server needs cert and key (ca alone only verifies servers)")
    return grpc.ssl_server_credentials(((key, cert),), root_certificates=ca, require_client_auth=ca is not None)


def _channel_credentials(files: TLSFiles) -> grpc.ChannelCredentials:
    ca, cert, key = _read_files(files)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class _DecodeRequests(grpc.ServerInterceptor):  # type: ignore[misc]
    """Decode requests inside the handler, so bytes that are no message get a clear
    INVALID_ARGUMENT (gRPC's own decoding answers INTERNAL "Exception deserializing")."""

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        method = details.method

        def parse(raw: bytes) -> Any:
            try:
                return decode(raw)
            except Exception:
                raise errors.InvalidArgument(
                    f"{method}: the request is not a valid message of this method (a client built from "
                    "another .proto?)") from None

        def first(raw: bytes, context: grpc.ServicerContext) -> Any:
            try:
                return parse(raw)
            except errors.InvalidArgument as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

        out = handler.response_serializer
        if handler.unary_unary is not None:
            fn = handler.unary_unary
            return grpc.unary_unary_rpc_method_handler(lambda raw, ctx: fn(first(raw, ctx), ctx),
                                                       response_serializer=out)
        if handler.unary_stream is not None:
            fn_s = handler.unary_stream
            return grpc.unary_stream_rpc_method_handler(lambda raw, ctx: fn_s(first(raw, ctx), ctx),
                                                        response_serializer=out)
        if handler.stream_unary is not None:
            fn_su = handler.stream_unary
            return grpc.stream_unary_rpc_method_handler(lambda it, ctx: fn_su(map(parse, it), ctx),
                                                        response_serializer=out)
        fn_ss = handler.stream_stream
        return grpc.stream_stream_rpc_method_handler(lambda it, ctx: fn_ss(map(parse, it), ctx),
                                                     response_serializer=out)


def add_port(server: grpc.Server, addr: str) -> int:
    """Listen on ``addr`` with this process's TLS (or plaintext); the bound port, 0 if refused."""
    files = tls()
    if _in_use(addr):
        # Checked first: gRPC's core would also print its own error line to stderr.
        return 0
    if not files.enabled:
        try:
            return int(server.add_insecure_port(addr))
        except RuntimeError:
            return 0
    try:
        return int(server.add_secure_port(addr, _server_credentials(files)))
    except RuntimeError:
        return 0


def _in_use(addr: str) -> bool:
    """Whether something already listens on ``addr`` (a fixed port on a numeric or local host)."""
    host, port = parse_addr(addr)
    if port == 0:
        return False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as s:
        # As gRPC binds: connections in TIME_WAIT do not count, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def channel(addr: str, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A blocking channel to ``addr`` with this process's TLS (or plaintext)."""
    files = tls()
    if not files.enabled:
        return grpc.insecure_channel(addr, options=options)
    return grpc.secure_channel(addr, _channel_credentials(files), options=options)


def aio_channel(addr: str, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
    """An asyncio channel to ``addr`` with this process's TLS (or plaintext); call from
    inside the event loop that will use it."""
    files = tls()
    if not files.enabled:
        return grpc.aio.insecure_channel(addr, options=options)
    return grpc.aio.secure_channel(addr, _channel_credentials(files), options=options)
