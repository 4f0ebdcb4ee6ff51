"""One small S3 object read and written with preconditions: the lake's writer lease.

The lease (``lake.lease``) needs S3's conditional writes: ``PUT`` with
``If-None-Match: *`` (create only if absent) and with ``If-Match: ETAG``
(replace only the version read). Neither engine already in binlake offers them:
PyArrow's S3 file system has no precondition headers, and delta-rs's Python API
does not expose its object store's. Rather than a new dependency (boto3/botocore,
tens of megabytes) for two request kinds, this module signs them itself with AWS
Signature Version 4 (the standard library's ``hmac``/``hashlib``) and sends them
with ``http.client``, using the settings ``lake.s3settings`` resolved (endpoint,
region, keys, addressing style).

Only static keys (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, optionally a
session token) are supported here; the AWS SDK's other credential sources
(instance roles, profiles) are not read, and an S3 lake without keys is refused
with a line saying so.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import http.client
import re
import urllib.parse

from binlake import errors
from binlake.config import S3Settings

# Seconds to connect and to wait for an answer: a lease request is small, and a
# holder must learn of a dead endpoint well within its lease's TTL.
CONNECT_TIMEOUT_S = 5.0
_UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~"


class S3RequestError(errors.BinlakeError):
    """An S3 answer that is neither success nor a failed precondition."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclasses.dataclass(frozen=True)
class Answer:
    """What a request got: the HTTP status, the object's ETag (quoted, as sent), its body."""

    status: int
    etag: str | None
    body: bytes


class ObjectClient:
    """GET and conditional PUT of ``key`` in ``bucket``, signed with ``settings``' keys."""

    def __init__(self, settings: S3Settings, bucket: str, key: str, timeout_s: float = 10.0) -> None:
        if not bucket or not key or key.startswith("/"):
            raise ValueError(f"bucket and a relative key are needed, got {bucket!r} / {key!r}")
        if not (settings.access_key_id and settings.secret_access_key):
            raise errors.InvalidArgument(
                "the lake's writer lease on S3 needs static keys: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or [lake.s3] access_key_id / secret_access_key)")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.settings = settings
        self.bucket = bucket
        self.key = key
        self.timeout_s = timeout_s
        endpoint = settings.endpoint_url or f"https://s3.{settings.region}.amazonaws.com"
        url = urllib.parse.urlsplit(endpoint)
        self._https = url.scheme == "https"
        self._netloc = url.netloc
        base = url.path.rstrip("/")
        quoted_key = _quote(key)
        if settings.path_style:
            self._host, self._path = self._netloc, f"{base}/{_quote(bucket)}/{quoted_key}"
        else:
            self._host, self._path = f"{bucket}.{self._netloc}", f"{base}/{quoted_key}"

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def get(self) -> Answer:
        """The object (status 200) or its absence (404 with code NoSuchKey)."""
        return self._request("GET", b"", {}, ok=(200, 404))

    def put(self, body: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> Answer:
        """Write ``body``: only if absent (``if_none_match``) or only over the version
        ``if_match`` names. 200 when written; 412/409 when the precondition failed
        (another writer got there first) or, for ``if_match``, the object is gone."""
        if if_none_match == (if_match is not None):
            raise ValueError("give exactly one of if_none_match=True or if_match=ETAG")
        headers = {"if-none-match": "*"} if if_none_match else {"if-match": str(if_match)}
        return self._request("PUT", body, headers, ok=(200, 404, 409, 412))

    def _request(self, method: str, body: bytes, extra: dict[str, str], ok: tuple[int, ...]) -> Answer:
        headers = self._signed(method, body, extra)
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._netloc if self.settings.path_style else self._host, timeout=self.timeout_s)
        try:
            try:
                conn.request(method, self._path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                raise errors.Unavailable(
                    f"cannot reach the S3 endpoint {self.settings.endpoint_url or 'AWS S3'} for {self.where} "
                    f"({type(exc).__name__}: {exc}); check AWS_ENDPOINT_URL and that the server is up") from None
            etag = resp.getheader("ETag")
        finally:
            conn.close()
        code = _error_code(data) if resp.status >= 300 else ""
        if resp.status == 404 and code == "NoSuchBucket":
            raise errors.InvalidArgument(f"{self.where}: bucket {self.bucket!r} does not exist: create it first")
        if resp.status in ok:
            return Answer(resp.status, etag, data)
        if resp.status == 403 or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
            raise errors.InvalidArgument(
                f"{self.where}: {self.settings.endpoint_url or 'AWS S3'} refused the credentials ({code or resp.status}); "
                "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or [lake.s3]")
        if resp.status == 501 or code == "NotImplemented":
            raise errors.FailedPrecondition(
                f"{self.where}: the S3 server does not support conditional writes ({code or resp.status}), "
                "which the lake's writer lease needs")
        raise S3RequestError(f"{method} {self.where} answered {resp.status} {code}".rstrip(), resp.status, code)

    def _signed(self, method: str, body: bytes, extra: dict[str, str]) -> dict[str, str]:
        """The request's headers with an AWS Signature Version 4 ``Authorization``."""
        s = self.settings
        now = dt.datetime.now(dt.UTC)
        stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload = hashlib.sha256(body).hexdigest()
        headers = {"host": self._host, "x-amz-content-sha256": payload, "x-amz-date": stamp, **extra}
        if s.session_token:
            headers["x-amz-security-token"] = s.session_token
        names = sorted(headers)
        canonical = "\n".join([method, self._path, "", *(f"{n}:{headers[n].strip()}" for n in names), "",
                               ";".join(names), payload])
        scope = f"{day}/{s.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + str(s.secret_access_key)).encode()
        for part in (day, s.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={s.access_key_id}/{scope}, "
                                    f"SignedHeaders={';'.join(names)}, Signature={signature}")
        if body:
            headers["content-length"] = str(len(body))
        return headers


def _quote(path: str) -> str:
    """A key as SigV4's canonical URI for S3 wants it: each byte but the unreserved and '/' escaped once."""
    return urllib.parse.quote(path, safe="/" + _UNRESERVED)


def _error_code(body: bytes) -> str:
    match = re.search(rb"<Code>([^<]{1,64})</Code>", body)
    return match.group(1).decode(errors="replace") if match else ""
