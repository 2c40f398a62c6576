"""Which Hub errors are worth another try, and how long to wait before it.

huggingface_hub retries 429s itself (since 1.2) and hands back a 5xx on a download's GET or on
repo info to its caller; a batch job fetching hundreds of GB retries those too, with backoff.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

import httpx2
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

from ...wording import brief
from ..hubspec import HubDataset

TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
T = TypeVar("T")


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
    return _backoff(ds.backoff, attempt)


def _backoff(seconds: float, attempt: int) -> int:
    time.sleep(min(60.0, seconds * 2**attempt))
    return attempt + 1


def retrying(call, *, ds: HubDataset):
    """``call()``, retried on 429/5xx/network errors: repo info is a plain GET in huggingface_hub.
    A refused connection is rarely a blip: a wrong HF_ENDPOINT should fail in seconds."""
    return retry_call(call, retries=ds.retries, backoff=ds.backoff, refused_retries=min(ds.retries, 2))


def retry_call(call: Callable[[], T], *, retries: int, backoff: float,
               transient: Callable[[BaseException], bool] = is_transient, refused_retries: int | None = None) -> T:
    """``call()``, retried ``retries`` times (``refused_retries`` for a refused connection) while
    ``transient`` says the error may pass, ``backoff`` seconds doubled per attempt (at most 60 s)."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as e:
            refused = refused_retries is not None and isinstance(e, httpx2.ConnectError)
            if not transient(e) or attempt >= (refused_retries if refused else retries):
                raise
            attempt = _backoff(backoff, attempt)


def first_line(e: BaseException) -> str:
    """An error as one short line for a message: its type and the start of its text."""
    return f"{type(e).__name__}: {brief(e)}"
