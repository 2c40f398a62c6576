"""One Hub file downloaded whole, on whichever machine calls it (the client, or a worker).

Every request goes through ``hf_hub_download``: its cache layout, per-blob file locks and private
temporary ``.incomplete`` files are what keep a partial download from ever being read, and what
make worker processes of one machine wait for one download instead of starting their own.
"""
from __future__ import annotations

import os

from huggingface_hub import hf_hub_download
from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from ...errors import UserError
from ..hubspec import HubDataset
from .listing import HubFile
from .retry import first_line, is_short_read, is_transient, wait_before_retry


def fetch_file(ds: HubDataset, repo: str, commit: str, f: HubFile, *, tqdm_class: type | None = None) -> str:
    """``f`` downloaded whole at ``commit``; its local path. A local copy whose size differs from the
    listing is fetched again; transient errors (429, 5xx, dropped connections) are retried."""
    force = False
    attempt = 0
    where = f"{f.path} of {repo}@{commit[:12]} from {ds.hub_endpoint}"
    while True:
        try:
            path = hf_hub_download(repo, f.path, repo_type="dataset", revision=commit, endpoint=ds.endpoint,
                                   cache_dir=ds.cache_dir, local_dir=ds.download_dir, force_download=force,
                                   tqdm_class=tqdm_class or NoBar)
        except (RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError) as e:
            raise UserError(f"cannot download {where}: {first_line(e)}; the repo changed since it was listed? rerun") from e
        except Exception as e:
            if not (is_transient(e) or is_short_read(e)):
                raise UserError(f"cannot download {where} into {ds.download_dir or ds.hub_cache} ({first_line(e)})") from e
            if attempt < ds.retries:
                attempt = wait_before_retry(ds, attempt)
                continue
            raise UserError(f"cannot download {where} after {attempt + 1} attempts ({first_line(e)}); "
                            "rerun to resume (files already downloaded are kept)") from e
        problem = _disagreement(path, f)
        if problem is None:
            return path
        if force:
            raise UserError(f"{where}: {problem} even after a fresh download; the Hub's listing and file disagree")
        force = True


def _disagreement(path: str, f: HubFile) -> str | None:
    """The size check huggingface_hub skips for a file it already has. Etags need no check here:
    at a pinned commit a file's etag cannot change, and huggingface_hub keys cache blobs (and
    ``local_dir`` metadata) by the etag the Hub sent, so a new etag is always a new download."""
    size = os.path.getsize(path)
    if size != f.size:
        return f"local copy holds {size} bytes, the Hub lists {f.size}"
    return None


class NoBar:
    """huggingface_hub's per-file bars would interleave from 8 threads; we print our own lines."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass

    def close(self):
        pass
