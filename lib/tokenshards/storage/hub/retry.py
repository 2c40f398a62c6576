"""Which Hub errors are worth another try, and how long to wait before it.

huggingface_hub retries 429s itself (since 1.2) and hands back a 5xx on a download's GET or on
repo info to its caller; a batch job fetching hundreds of GB retries those too, with backoff.
"""
from __future__ import annotations

import time

import httpx2
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

from ..hubspec import HubDataset

TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)


def is_transient(e: BaseException | None) -> bool:
    """429, 5xx or a network error, raised as such or as the cause huggingface_hub wrapped
    ("cannot find the requested files in the local cache", "Force download failed")."""
    for err in (e, getattr(e, "__cause__", None)):
        if isinstance(err, HfHubHTTPError) and not isinstance(err, EntryNotFoundError) and err.response is not None:
            if err.response.status_code in TRANSIENT_STATUS:
                return True
        elif isinstance(err, httpx2.TransportError):
            return True
    return False


def is_short_read(e: BaseException) -> bool:
    """huggingface_hub's "Consistency check failed" after a download that ended early."""
    return isinstance(e, OSError) and "Consistency check failed" in str(e)


def wait_before_retry(ds: HubDataset, attempt: int) -> int:
    """Sleep ``ds.backoff`` seconds doubled per attempt (at most 60 s); the next attempt's number."""
    time.sleep(min(60.0, ds.backoff * 2**attempt))
    return attempt + 1


def retrying(call, *, ds: HubDataset):
    """``call()``, retried on 429/5xx/network errors: repo info is a plain GET in huggingface_hub."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as e:
            # A refused connection is rarely a blip: a wrong HF_ENDPOINT should fail in seconds.
            limit = min(ds.retries, 2) if isinstance(e, httpx2.ConnectError) else ds.retries
            if not is_transient(e) or attempt >= limit:
                raise
            attempt = wait_before_retry(ds, attempt)


def first_line(e: BaseException) -> str:
    """An error as one short line for a message: its type and the start of its text."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:200]}"
