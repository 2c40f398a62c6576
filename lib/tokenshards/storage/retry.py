"""The one retry policy of every request tokenshards makes to S3, GCS and Azure: reads, existence
checks, listings, writes, multipart parts and blocks, composes, the lease.

What is retried (``transient``): a connection refused, reset or dropped, no answer within
``timeout``, a body cut short, and the answers that say "try again": 408, 429, 500, 502, 503, 504
(S3's SlowDown, GCS's rateLimitExceeded and backendError, Azure's ServerBusy and OperationTimedOut)
and S3's throttling codes. What is not: every other answer, 401 and 403 above all (a refused
credential fails the same way each time: it is said at once, never waited on), 404, 409, 412.

How long (``RetryPolicy``): ``attempts`` tries in all; before each retry a wait that doubles from
``first_delay`` up to ``max_delay``, jittered down by at most half (so many workers throttled together
do not come back together), or exactly the ``Retry-After`` the store sent (up to ``retry_after_max``).
With the defaults a failure that stays is reported after 7 tries and ~16-32 s of waiting; one line.

Each store's library retries in its own way (botocore's modes, gcsfs's decorator, which also retries
a 401 and logs each try, Azure's SDK, which ignores Retry-After and 429): ``store`` turns those off and
routes every request through ``retried`` instead, so the three stores fail, wait and give up alike.
The policy travels with the storage options (their ``retry`` section: ``--storage-option
retry='{"attempts": 10}'``), so the workers apply the one the client was given.
"""
from __future__ import annotations

import asyncio
import email.utils
import random
import time
from dataclasses import dataclass, fields
from typing import Awaitable, Callable, TypeVar

from ..errors import UserError
from ..wording import scrub_exception

T = TypeVar("T")

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Answers that mean "try again" on every store (Azure's 500 OperationTimedOut and 503 ServerBusy
included); 501 and 505 never change."""

S3_TRANSIENT_CODES = frozenset({
    "RequestTimeout", "RequestTimeoutException", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottledException", "TooManyRequestsException", "SlowDown", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "ProvisionedThroughputExceededException", "InternalError", "ServiceUnavailable"})
"""S3's own words for "try again", some sent with a 400 (botocore's standard retry mode's list)."""

OPTION = "retry"
"""The storage options' section that sets the policy (``RetryPolicy`` fields)."""


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    attempts: int = 7
    """Tries in all, the first included."""
    first_delay: float = 0.5
    """Seconds before the first retry; each next wait doubles."""
    max_delay: float = 16.0
    """No wait (but a Retry-After) is longer than this."""
    retry_after_max: float = 60.0
    """A store's Retry-After is honoured up to this many seconds."""
    timeout: float = 60.0
    """Seconds without an answer (connecting, or between bytes of one) before a try counts as failed."""

    def __post_init__(self):
        if type(self.attempts) is not int or self.attempts < 1:
            raise UserError(f"--storage-option {OPTION}: attempts must be a whole number of at least 1, got {self.attempts!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "attempts" and (type(value) not in (int, float) or not value >= 0):
                raise UserError(f"--storage-option {OPTION}: {f.name} must be a number of seconds, 0 or more, got {value!r}")
        if self.timeout <= 0:
            raise UserError(f"--storage-option {OPTION}: timeout must be more than 0 seconds, got {self.timeout!r}")

    @classmethod
    def of(cls, options: dict | None) -> "RetryPolicy":
        """The policy the storage options' ``retry`` section sets (the defaults where it says nothing)."""
        given = (options or {}).get(OPTION) or {}
        if isinstance(given, RetryPolicy):
            return given
        if not isinstance(given, dict):
            raise UserError(f"--storage-option {OPTION}: expected a JSON object such as "
                            f"{OPTION}='{{\"attempts\": 10}}', got a {type(given).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise UserError(f"--storage-option {OPTION}: unknown key {unknown[0]!r}; expected some of {', '.join(known)}")
        return cls(**given)

    def delay(self, retry: int, retry_after: float | None = None, *, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (from 1): what the store asked for, when it did."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.retry_after_max)
        ceiling = min(self.max_delay, self.first_delay * 2 ** (retry - 1))
        return ceiling * (0.5 + 0.5 * (rng or random).random())


DEFAULT = RetryPolicy()


@dataclass(frozen=True)
class Transient:
    """A failure worth another try; ``retry_after``: the seconds the store asked to wait, if it said."""

    retry_after: float | None = None


def retry_after(headers) -> float | None:
    """Seconds from ``Retry-After`` (seconds or an HTTP date) or Azure's ``x-ms-retry-after-ms`` /
    ``retry-after-ms``; None when absent or unreadable."""
    if not headers:
        return None
    get = headers.get
    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        value = get(name) or get(name.title())
        if value:
            try:
                return float(value) / 1000
            except ValueError:
                pass
    value = get("Retry-After") or get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        when = email.utils.parsedate_to_datetime(value) if _is_date(value) else None
        return None if when is None else max(when.timestamp() - time.time(), 0.0)


def _is_date(value: str) -> bool:
    try:
        return email.utils.parsedate_to_datetime(value) is not None
    except (TypeError, ValueError):
        return False


def status_of(e: BaseException) -> tuple[int | None, object]:
    """(HTTP status, reply headers) of a store's error, whichever library raised it; (None, None)
    for an error that carries no answer (a connection that failed)."""
    for err in (e, e.__cause__):
        if err is None:
            continue
        reply = getattr(err, "response", None)
        if isinstance(reply, dict) and "ResponseMetadata" in reply:  # botocore's ClientError (s3fs keeps it as cause)
            meta = reply["ResponseMetadata"]
            return meta.get("HTTPStatusCode"), meta.get("HTTPHeaders") or {}
        status = getattr(err, "status_code", None)  # azure-core's HttpResponseError
        if isinstance(status, int):
            return status, getattr(reply, "headers", None)
        code = getattr(err, "code", None)  # gcsfs's HttpError
        if type(err).__name__ == "HttpError" and isinstance(code, int):
            return code, getattr(err, "headers", None)
    return None, None


_TRANSIENT_ERRORS = {
    # what the libraries raise when no whole answer came: refused, reset, timed out, cut short
    "ClientConnectionError", "ClientConnectorError", "ClientOSError", "ServerDisconnectedError", "ServerTimeoutError",
    "ClientPayloadError", "ContentLengthError", "TransferEncodingError", "ConnectionTimeoutError", "SocketTimeoutError",
    "HTTPClientError", "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError",
    "ProxyConnectionError", "ResponseStreamingError", "IncompleteReadError", "IncompleteRead",
    "ServiceRequestError", "ServiceResponseError", "ServiceRequestTimeoutError", "ServiceResponseTimeoutError",
    "ChunkedEncodingError", "ReadTimeout", "ConnectTimeout", "ProxyError", "TransportError", "ChecksumError",
}
"""By class name (the classes of every store's library, none of which need be installed): aiohttp's,
botocore's, azure-core's, requests', google-auth's (``TransportError``: the token endpoint did not
answer) and gcsfs's (a checksum that did not match: a body damaged on the way)."""


def transient(e: BaseException) -> Transient | None:
    """Whether a store request that raised ``e`` may succeed if tried again (``Transient``), or not (None)."""
    status, headers = status_of(e)
    if status is not None:
        code = _s3_code(e)
        if status in TRANSIENT_STATUSES or code in S3_TRANSIENT_CODES:
            return Transient(retry_after(headers))
        return None
    if isinstance(e, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return Transient()
    if any(cls.__name__ in _TRANSIENT_ERRORS for cls in type(e).__mro__):
        return Transient()
    return None


def _s3_code(e: BaseException) -> str | None:
    for err in (e, e.__cause__):
        reply = getattr(err, "response", None)
        if isinstance(reply, dict):
            return (reply.get("Error") or {}).get("Code")
    return None


async def retried(policy: RetryPolicy, once: Callable[[], Awaitable[T]], *,
                  judge: Callable[[BaseException], Transient | None] = transient,
                  sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> T:
    """``await once()``, tried again as ``policy`` says while it fails transiently. The error that
    stays leaves with its texts scrubbed of credentials (``wording.scrub_exception``): it may be
    logged by a worker, shown by the dashboard or pickled to the client before anyone words it."""
    retry = 0
    while True:
        try:
            return await once()
        except Exception as e:
            verdict = judge(e)
            retry += 1
            if verdict is None or retry >= policy.attempts:
                raise scrub_exception(e)
            await sleep(policy.delay(retry, verdict.retry_after))
