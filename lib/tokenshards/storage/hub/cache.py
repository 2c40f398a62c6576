"""Where huggingface_hub puts a Hub file on this machine, whether it is there whole, and room for it.

Two places: the HF cache (``cache_dir``, default HF_HUB_CACHE: ``snapshots/COMMIT/PATH`` links
to blobs named by etag) or a plain download folder (``download_dir``: ``DIR/PATH``, with
huggingface_hub's record of each download under ``DIR/.cache/huggingface/download``). The
functions read the machine they run on: the client's, or a worker's when run there.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision, repo_folder_name

from ...wording import human
from ...errors import UserError
from ..hubspec import HubDataset
from ..sources import ListedInput
from ..store import vouched_etag
from .listing import HubFile, HubListing


def check_disk(*, need: int, free: int, keep_free: int, where: str, what: str) -> None:
    """Refuse before downloading rather than fill the disk halfway through."""
    if need and need + keep_free > free:
        raise UserError(
            f"not enough disk space in {where}: {what} needs {human(need)}B and {human(keep_free)}B must stay free, "
            f"but only {human(free)}B is free; free some space, download elsewhere (--download-dir DIR or HF_HUB_CACHE), "
            "or pick a smaller --size")


def free_bytes(path: str) -> int:
    """Free space on the filesystem that holds ``path`` (or would, once created)."""
    p = Path(path).expanduser().absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def target(ds: HubDataset) -> str:
    """The folder downloads go to on this machine: ``download_dir``, else the HF cache."""
    return ds.download_dir or ds.hub_cache


def local_path(ds: HubDataset, listing: HubListing, f: HubFile) -> Path:
    """Where huggingface_hub puts (or put) ``f``: the snapshot link in the cache, or under download_dir."""
    if ds.download_dir:
        return Path(ds.download_dir).expanduser().absolute() / f.path
    storage = Path(ds.hub_cache).expanduser().absolute() / repo_folder_name(repo_id=listing.repo, repo_type="dataset")
    return storage / "snapshots" / listing.commit / f.path


def is_present(ds: HubDataset, listing: HubListing, f: HubFile) -> bool:
    """Downloaded whole, with the listed size (a partial download is never at this path). In a
    download folder also vouched for by huggingface_hub's record, with the listed etag (offline
    listings have none): a file it would not fetch again, whose identity is ``downloaded_identity``.
    One not vouched for (edited since, or downloaded without a record) goes to huggingface_hub,
    which checks its hash or fetches it again, and records it."""
    p = local_path(ds, listing, f)
    if not (p.is_file() and p.stat().st_size == f.size):
        return False
    return not (ds.download_dir and f.etag) or vouched_etag(str(p)) == f.etag


def local_sources(ds: HubDataset, listing: HubListing) -> list[ListedInput]:
    """Every listed file where huggingface_hub puts it (downloaded or not yet), in listing order."""
    return [ListedInput(url=str(local_path(ds, listing, f)), name=f.path) for f in listing.files]


def remember_revision(ds: HubDataset, listing: HubListing) -> None:
    """Record revision → commit in the cache's ``refs/`` as huggingface_hub does when it resolves a
    branch itself (we download at the pinned commit, so it doesn't), for HF_HUB_OFFLINE=1 reruns."""
    if ds.download_dir or listing.revision == listing.commit:
        return
    storage = os.path.join(ds.hub_cache, repo_folder_name(repo_id=listing.repo, repo_type="dataset"))
    try:
        _cache_commit_hash_for_specific_revision(storage, listing.revision, listing.commit)
    except OSError:
        pass  # only offline reruns need it; huggingface_hub ignores this failure too


def clear_stale(ds: HubDataset, listing: HubListing, *, older_than: float = 3600.0) -> None:
    """Remove huggingface_hub's temporary ``*.incomplete`` files of this repo left by a killed run.

    huggingface_hub names them per process and never resumes them across processes; one untouched
    for an hour is nobody's download any more (a live one is written to every few seconds)."""
    if ds.download_dir:
        where = Path(ds.download_dir).expanduser() / ".cache" / "huggingface" / "download"
    else:
        where = Path(ds.hub_cache).expanduser() / repo_folder_name(repo_id=listing.repo, repo_type="dataset") / "blobs"
    now = time.time()
    for p in where.rglob("*.incomplete") if where.is_dir() else ():
        try:
            if now - p.stat().st_mtime > older_than:
                p.unlink()
        except OSError:
            pass  # gone already, or not ours to remove
