"""A Hub file's parquet footer read on the client with ranged GETs, before (or without) any
download of it, and the identity the file will have once downloaded: with both, a run plans a
file exactly as it would plan a local copy."""
from __future__ import annotations

import io

import httpx2
import pyarrow.parquet as pq
from huggingface_hub import constants, hf_hub_url
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from ...errors import UserError
from ..hubspec import HubDataset
from .listing import HubFile, HubListing
from .retry import first_line

FOOTER_TAIL = 64 * 2**10
"""Bytes of a file's end asked for first: what Arrow reads first to find a footer (its default
footer read size); a larger footer costs one more request."""


def downloaded_identity(f: HubFile) -> tuple[tuple[str, object], ...]:
    """``store.file_identity`` of ``f`` once downloaded, known from the listing: the HF cache names
    a blob by the etag the Hub sends (the listed LFS sha256, else the git blob id), and a download
    folder's record holds that etag (``store.vouched_etag``)."""
    return (("size", f.size), ("blob", f.etag))


def read_footer(ds: HubDataset, listing: HubListing, f: HubFile):
    """``f``'s parquet metadata (``pq.FileMetaData``) read with ranged GETs of its resolve URL at
    the pinned commit: one request (two for a footer over ``FOOTER_TAIL``), not the whole file."""
    url = hf_hub_url(listing.repo, f.path, repo_type="dataset", revision=listing.commit, endpoint=ds.hub_endpoint)
    where = f"{f.path} of {listing.repo}@{listing.commit[:12]} from {ds.hub_endpoint}"
    try:
        tail = _get_range(ds, url, max(0, f.size - FOOTER_TAIL), f.size)
        if len(tail) >= 8 and tail[-4:] == b"PAR1":
            need = min(f.size, int.from_bytes(tail[-8:-4], "little") + 8)
            if need > len(tail):
                tail = _get_range(ds, url, f.size - need, f.size - len(tail)) + tail
    except (RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError) as e:
        raise UserError(f"cannot read the footer of {where}: {first_line(e)}; the repo changed since it was listed? rerun") from e
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as e:
        raise UserError(f"cannot read the footer of {where} ({first_line(e)}); check your connection and rerun") from e
    return pq.ParquetFile(_Tail(tail, f.size)).metadata


def _get_range(ds: HubDataset, url: str, start: int, stop: int) -> bytes:
    """Bytes [start, stop) of ``url``, with huggingface_hub's headers (HF_TOKEN) and its retries."""
    r = http_backoff("GET", url, headers={"Range": f"bytes={start}-{stop - 1}", **build_hf_headers()},
                     max_retries=ds.retries, base_wait_time=ds.backoff, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)
    hf_raise_for_status(r)
    body = r.content if r.status_code == 206 else r.content[start:stop]  # a server may ignore Range
    if len(body) != stop - start:
        raise OSError(f"asked for bytes {start}-{stop - 1}, got {len(body)} bytes")
    return body


class _Tail(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only the last ``len(tail)`` are known: what
    pyarrow reads to parse a footer. A read before them is an error, never made-up bytes."""

    def __init__(self, tail: bytes, size: int):
        self._tail, self._size, self._start, self._pos = tail, size, size - len(tail), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._size}[whence] + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        if self._pos < self._start:
            raise OSError(f"byte {self._pos} is before the {len(self._tail)} bytes read of the file's end")
        data = self._tail[self._pos - self._start:self._pos - self._start + len(buffer)]
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)
