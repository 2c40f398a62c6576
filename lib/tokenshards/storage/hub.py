"""Hugging Face Hub inputs: ``--dataset REPO --size 10B`` → the parquet files of ``sample/10BT``.

Every request goes through huggingface_hub (``HfApi``, ``hf_hub_download``), so HF_ENDPOINT,
HF_TOKEN, HF_HOME/HF_HUB_CACHE and HF_HUB_OFFLINE mean what they mean to it, and its cache
layout, per-blob file locks and private temporary ``.incomplete`` files are what keep a
partial download from ever being read. On top of it this module adds what a batch job needs:
one pinned commit for the whole run, a size check of every file against the listing (etags are
huggingface_hub's own: it keys blobs by them), a disk-space check before anything is fetched,
and retries of the transient errors it hands back to its caller (a 5xx on a download's GET, on
repo info).

Two ways to fetch (``fetch``):

- ``client`` (default): this process downloads every file once into the HF cache or
  ``download_dir`` (a shared filesystem on a cluster), and workers read local paths (as each
  file is whole, when tokenizing overlaps the download: ``Fetcher``).
- ``workers``: inputs stay Hub references (``hfcache://datasets/REPO@COMMIT/PATH``); each worker
  downloads the files its tasks read into its own machine's cache (once per machine: the
  per-blob lock), through the fsspec filesystem that ``HubFetchPlugin`` registers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import queue
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import fsspec
import httpx2
from distributed import WorkerPlugin
from fsspec import AbstractFileSystem
from huggingface_hub import HfApi, RepoFile, RepoFolder, constants, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision, repo_folder_name

from ..errors import UserError
from .hubspec import FETCH_MODES, SAMPLE_DIR, HubDataset, folder_size, size_folder  # noqa: F401 (this module's API too)
from ..cluster.progress import human
from .sources import Source
from .store import vouched_etag

PROTOCOL = "hfcache"
_TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True, kw_only=True)
class HubFile:
    path: str
    """Path in the repo, e.g. ``sample/10BT/000_00000.parquet``: also the document-id prefix."""
    size: int
    etag: str
    """As listed (the LFS sha256, else the git blob id; "" offline): for the record, since
    huggingface_hub itself keys downloads by the etag its HEAD request gets."""


@dataclass(frozen=True, kw_only=True)
class HubListing:
    repo: str
    revision: str
    commit: str
    folder: str
    files: tuple[HubFile, ...]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def describe(self) -> str:
        return f"{self.repo}@{self.revision} (commit {self.commit[:12]}) {self.folder}"

    def record(self) -> dict:
        """For a manifest's extra keys: which dataset, at which commit, the inputs came from."""
        return {"repo": self.repo, "revision": self.revision, "commit": self.commit, "folder": self.folder,
                "files": len(self.files), "bytes": self.bytes}


# -- pure helpers --

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


def cache_uri(repo: str, commit: str, path: str) -> str:
    return f"{PROTOCOL}://datasets/{repo}@{commit}/{path}"


def parse_cache_uri(uri: str) -> tuple[str, str, str]:
    """``hfcache://datasets/OWNER/NAME@COMMIT/PATH`` → (repo, commit, path)."""
    rest = uri.split("://", 1)[-1]
    m = re.fullmatch(r"datasets/([^/@]+/[^/@]+)@([0-9a-f]{40})/(.+)", rest)
    if not m:
        raise UserError(f"{uri!r} is not a {PROTOCOL}://datasets/OWNER/NAME@COMMIT/PATH reference")
    return m.group(1), m.group(2), m.group(3)


# -- listing --

def list_files(ds: HubDataset) -> HubListing:
    """The parquet files of the size folder at one commit, with sizes and etags (no download).

    With HF_HUB_OFFLINE=1, the files already downloaded for that revision instead."""
    if constants.is_offline_mode():
        return _offline_listing(ds)
    api = HfApi(endpoint=ds.endpoint)
    where = f"dataset {ds.repo!r} on {ds.hub_endpoint}"
    try:
        info = _retrying(lambda: api.dataset_info(ds.repo, revision=ds.revision), ds=ds)
        commit = info.sha
        files = _list_folder(api, ds, commit)
    except GatedRepoError as e:
        raise UserError(f"{where} is gated: accept its terms on the Hub and set HF_TOKEN (or `hf auth login`)") from e
    except RepositoryNotFoundError as e:
        raise UserError(f"{where} not found (or private: set HF_TOKEN); check --dataset") from e
    except RevisionNotFoundError as e:
        raise UserError(f"{where} has no revision {ds.revision!r}; check --revision (a branch, tag or commit)") from e
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as e:
        raise UserError(f"cannot list {where} ({_first_line(e)}); check your connection and "
                        "HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the files already downloaded") from e
    return HubListing(repo=ds.repo, revision=ds.revision, commit=commit, folder=ds.folder, files=files)


def _list_folder(api: HfApi, ds: HubDataset, commit: str) -> tuple[HubFile, ...]:
    """The size folder's parquet files; a missing folder is a one-line error listing the sizes that exist.

    One request per 1,000 files for the folder itself; only when that finds nothing, the names
    under ``sample/``, and as a last resort (a server that lists no sub-folder) the whole tree."""
    def tree(path: str | None, recursive: bool) -> list:
        try:
            return _retrying(lambda: list(api.list_repo_tree(ds.repo, path, recursive=recursive, repo_type="dataset",
                                                             revision=commit)), ds=ds)
        except EntryNotFoundError:
            return []

    files = _parquet_under(tree(ds.folder, True), ds.folder)
    if files:
        return files
    samples = sorted({e.path for e in tree(SAMPLE_DIR, False) if isinstance(e, RepoFolder)})
    if samples and ds.folder not in samples:
        raise UserError(_missing_size(ds, samples))
    everything = tree(None, True)
    files = _parquet_under(everything, ds.folder)
    if files:
        return files
    samples = sorted({"/".join(e.path.split("/")[:2]) for e in everything
                      if e.path.startswith(SAMPLE_DIR + "/") and e.path.count("/") >= 2})
    raise UserError(_missing_size(ds, samples))


def _parquet_under(entries: list, folder: str) -> tuple[HubFile, ...]:
    found = (_hub_file(e) for e in entries
             if isinstance(e, RepoFile) and e.path.startswith(folder + "/") and e.path.endswith(".parquet"))
    return tuple(sorted(found, key=lambda f: f.path))


def _hub_file(entry) -> HubFile:
    lfs = getattr(entry, "lfs", None)
    return HubFile(path=entry.path, size=int(lfs.size if lfs else entry.size),
                   etag=lfs.sha256 if lfs else entry.blob_id)


def _missing_size(ds: HubDataset, folders: list[str]) -> str:
    """One line naming the missing folder and the sizes that exist."""
    sizes = ", ".join(folder_size(f) for f in sorted(folders, key=lambda f: (len(f), f))) or f"none (no {SAMPLE_DIR}/ folder)"
    return (f"dataset {ds.repo!r} at revision {ds.revision!r} has no size {ds.size} (folder {ds.folder}); "
            f"sizes that exist: {sizes}")


def _offline_listing(ds: HubDataset) -> HubListing:
    """HF_HUB_OFFLINE=1: what an earlier download left for this revision (sizes from disk, no etags)."""
    if ds.download_dir:
        base = Path(ds.download_dir)
        commit = ds.revision if _COMMIT.fullmatch(ds.revision) else "0" * 40
    else:
        storage = Path(ds.hub_cache) / repo_folder_name(repo_id=ds.repo, repo_type="dataset")
        ref = storage / "refs" / ds.revision
        commit = ds.revision if _COMMIT.fullmatch(ds.revision) else (ref.read_text().strip() if ref.is_file() else "")
        base = storage / "snapshots" / commit
    found = sorted(p for p in (base / ds.folder).glob("**/*.parquet") if p.is_file()) if commit else []
    if not found:
        raise UserError(f"HF_HUB_OFFLINE is set and no file of {ds.repo}@{ds.revision} {ds.folder} was downloaded to "
                        f"{base if commit else ds.hub_cache}; download it first (unset HF_HUB_OFFLINE)")
    files = tuple(HubFile(path=p.relative_to(base).as_posix(), size=p.stat().st_size, etag="") for p in found)
    return HubListing(repo=ds.repo, revision=ds.revision, commit=commit, folder=ds.folder, files=files)


# -- downloading (client mode) --

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


def download(ds: HubDataset, listing: HubListing, *, announce: Callable[[str], None] = print) -> list[Source]:
    """Fetch what is missing (after saying how much, and checking the disk); return local sources."""
    prepare_download(ds, listing, announce=announce)
    if not constants.is_offline_mode():
        _fetch_all(ds, listing, listing.files, announce=announce)  # present ones too: a HEAD checks their etag
        remember_revision(ds, listing)
    return local_sources(ds, listing)


def local_sources(ds: HubDataset, listing: HubListing) -> list[Source]:
    """Every listed file where huggingface_hub puts it (downloaded or not yet), in listing order."""
    return [Source(url=str(local_path(ds, listing, f)), name=f.path) for f in listing.files]


def prepare_download(ds: HubDataset, listing: HubListing, *, announce: Callable[[str], None]) -> list[HubFile]:
    """What a download must fetch, after saying how much and checking the disk (offline: refuse
    when anything is missing). Fetches nothing."""
    _clear_stale(ds, listing)
    todo = [f for f in listing.files if not is_present(ds, listing, f)]
    target = ds.download_dir or ds.hub_cache
    need = sum(f.size for f in todo)
    free = free_bytes(target)
    have = len(listing.files) - len(todo)
    announce(f"{listing.describe()}: {len(listing.files)} files, {human(listing.bytes)}B"
             + (f"; {have} already downloaded" if have else "")
             + f"; fetching {len(todo)} files ({human(need)}B) into {target}, {human(free)}B free")
    check_disk(need=need, free=free, keep_free=ds.keep_free, where=target,
               what=f"fetching {len(todo)} files of {listing.describe()}")
    if constants.is_offline_mode() and todo:
        raise UserError(f"HF_HUB_OFFLINE is set but {len(todo)} files of {listing.describe()} are incomplete; "
                        "unset HF_HUB_OFFLINE to fetch them")
    return todo


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


def _fetch_all(ds: HubDataset, listing: HubListing, files, *, announce: Callable[[str], None],
               every: float = 15.0) -> None:
    """Every file through ``fetch_file``, ``max_workers`` at a time, with a progress line per file
    and one every ``every`` seconds (a FineWeb file is ~2 GB: minutes without a word otherwise)."""
    for _ in arrivals(Fetcher(ds, listing, files, workers=ds.max_workers).start(), announce=announce, every=every):
        pass


def arrivals(fetcher: "Fetcher", *, announce: Callable[[str], None], every: float = 15.0) -> Iterator[tuple[HubFile, str]]:
    """(file, local path) as each download ends, with a line per file and one every ``every``
    seconds. After an ordinary error the downloads under way are let finish, so a rerun finds them
    whole; leaving early stops the fetcher from starting more."""
    ready = ready_bytes = 0
    try:
        while ready < len(fetcher.files):
            try:
                f, path, error = fetcher.next(timeout=every)
            except queue.Empty:
                if fetcher.stopped():
                    return  # stopped by the job, which no longer waits for these files
                announce(fetcher.status(ready))
                continue
            if error is not None:
                fetcher.stop(wait=True)
                raise error
            ready, ready_bytes = ready + 1, ready_bytes + f.size
            announce(f"ready {ready}/{len(fetcher.files)} ({human(ready_bytes)}B of {human(fetcher.total)}B): {f.path}")
            yield f, path
    finally:
        fetcher.stop()


class Fetcher:
    """``files`` through ``fetch_file`` on background threads, ``workers`` at a time, started in
    the order given; each outcome lands on a queue as (file, local path, error), read with ``next``.

    Daemon threads, so that Ctrl-C stops at once instead of waiting for 2 GB downloads to end;
    what they leave is only huggingface_hub's temporary ``.incomplete`` files (see ``_clear_stale``).
    ``stop`` starts no further file; ``stop(wait=True)`` also lets the ones under way finish."""

    def __init__(self, ds: HubDataset, listing: HubListing, files, *, workers: int):
        self.files = list(files)
        self.total = sum(f.size for f in self.files)
        self._counter = _ByteCounter()
        self._work: queue.Queue = queue.Queue()
        for f in self.files:
            self._work.put(f)
        self._results: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._t0 = time.monotonic()

        def worker() -> None:
            while not self._stop.is_set():
                try:
                    f = self._work.get_nowait()
                except queue.Empty:
                    return
                try:
                    self._results.put((f, fetch_file(ds, listing.repo, listing.commit, f, tqdm_class=self._counter.bar),
                                       None))
                except BaseException as e:  # handed to the reading thread, raised there
                    self._results.put((f, None, e))

        self._threads = [threading.Thread(target=worker, name=f"tokenshards-hub-{i}", daemon=True)
                         for i in range(min(workers, len(self.files)))]

    def start(self) -> "Fetcher":
        self._t0 = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def next(self, timeout: float | None = None) -> tuple[HubFile, str | None, BaseException | None]:
        """The next file done (or failed); ``queue.Empty`` after ``timeout`` seconds without one."""
        return self._results.get(timeout=timeout)

    def stop(self, *, wait: bool = False) -> None:
        self._stop.set()
        if wait:
            for t in self._threads:
                if t.is_alive():
                    t.join()

    def stopped(self) -> bool:
        """Stopped, and no download under way any more."""
        return self._stop.is_set() and not any(t.is_alive() for t in self._threads)

    def status(self, ready: int) -> str:
        rate = self._counter.n / max(time.monotonic() - self._t0, 1e-9)
        return f"downloading: {human(self._counter.n)}B received, {human(rate)}B/s, {ready}/{len(self.files)} files ready"


def _clear_stale(ds: HubDataset, listing: HubListing, *, older_than: float = 3600.0) -> None:
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


class _ByteCounter:
    """Bytes that huggingface_hub reports to its progress-bar class, summed over threads."""

    def __init__(self):
        self.n = 0
        lock = threading.Lock()
        counter = self

        class _Bar(_NoBar):
            def update(self, n=1):
                with lock:
                    counter.n += n or 0

        self.bar = _Bar


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
                                   tqdm_class=tqdm_class or _NoBar)
        except (RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError) as e:
            raise UserError(f"cannot download {where}: {_first_line(e)}; the repo changed since it was listed? rerun") from e
        except Exception as e:
            if not (_is_transient(e) or _is_short_read(e)):
                raise UserError(f"cannot download {where} into {ds.download_dir or ds.hub_cache} ({_first_line(e)})") from e
            if attempt < ds.retries:
                attempt = _sleep(ds, attempt)
                continue
            raise UserError(f"cannot download {where} after {attempt + 1} attempts ({_first_line(e)}); "
                            "rerun to resume (files already downloaded are kept)") from e
        problem = _disagreement(path, f)
        if problem is None:
            return path
        if force:
            raise UserError(f"{where}: {problem} even after a fresh download; the Hub's listing and file disagree")
        force = True


# -- footers before the download (client mode, overlapped with tokenizing) --

OVERLAP_DOWNLOADS = 1
"""Files downloaded at a time while tokenizing overlaps: through one link, k downloads at once
make the first whole file wait k times longer and leave k files to tokenize after the last byte
arrives; huggingface_hub's Xet path already fetches one file over many connections."""
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
    import pyarrow.parquet as pq
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(listing.repo, f.path, repo_type="dataset", revision=listing.commit, endpoint=ds.hub_endpoint)
    where = f"{f.path} of {listing.repo}@{listing.commit[:12]} from {ds.hub_endpoint}"
    try:
        tail = _get_range(ds, url, max(0, f.size - FOOTER_TAIL), f.size)
        if len(tail) >= 8 and tail[-4:] == b"PAR1":
            need = min(f.size, int.from_bytes(tail[-8:-4], "little") + 8)
            if need > len(tail):
                tail = _get_range(ds, url, f.size - need, f.size - len(tail)) + tail
    except (RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError) as e:
        raise UserError(f"cannot read the footer of {where}: {_first_line(e)}; the repo changed since it was listed? rerun") from e
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as e:
        raise UserError(f"cannot read the footer of {where} ({_first_line(e)}); check your connection and rerun") from e
    return pq.ParquetFile(_Tail(tail, f.size)).metadata


def _get_range(ds: HubDataset, url: str, start: int, stop: int) -> bytes:
    """Bytes [start, stop) of ``url``, with huggingface_hub's headers (HF_TOKEN) and its retries."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

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


def _disagreement(path: str, f: HubFile) -> str | None:
    """The size check huggingface_hub skips for a file it already has. Etags need no check here:
    at a pinned commit a file's etag cannot change, and huggingface_hub keys cache blobs (and
    ``local_dir`` metadata) by the etag the Hub sent, so a new etag is always a new download."""
    size = os.path.getsize(path)
    if size != f.size:
        return f"local copy holds {size} bytes, the Hub lists {f.size}"
    return None


def _is_transient(e: BaseException | None) -> bool:
    """429, 5xx or a network error, raised as such or as the cause huggingface_hub wrapped
    ("cannot find the requested files in the local cache", "Force download failed")."""
    for err in (e, getattr(e, "__cause__", None)):
        if isinstance(err, HfHubHTTPError) and not isinstance(err, EntryNotFoundError) and err.response is not None:
            if err.response.status_code in _TRANSIENT_STATUS:
                return True
        elif isinstance(err, httpx2.TransportError):
            return True
    return False


def _is_short_read(e: BaseException) -> bool:
    """huggingface_hub's "Consistency check failed" after a download that ended early."""
    return isinstance(e, OSError) and "Consistency check failed" in str(e)


def _sleep(ds: HubDataset, attempt: int) -> int:
    time.sleep(min(60.0, ds.backoff * 2**attempt))
    return attempt + 1


def _retrying(call, *, ds: HubDataset):
    """``call()``, retried on 429/5xx/network errors: repo info is a plain GET in huggingface_hub."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as e:
            # A refused connection is rarely a blip: a wrong HF_ENDPOINT should fail in seconds.
            limit = min(ds.retries, 2) if isinstance(e, httpx2.ConnectError) else ds.retries
            if not _is_transient(e) or attempt >= limit:
                raise
            attempt = _sleep(ds, attempt)


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:200]}"


class _NoBar:
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


# -- workers mode --

class HubCacheFileSystem(AbstractFileSystem):
    """``hfcache://datasets/REPO@COMMIT/PATH`` opened from this machine's HF cache, downloading the
    file first when missing (huggingface_hub's per-blob lock makes concurrent workers of one
    machine wait for one download instead of starting their own)."""

    protocol = PROTOCOL
    datasets: dict[tuple[str, str], tuple[HubDataset, dict[str, HubFile]]] = {}
    """(repo, commit) → how to fetch and the listed files; filled by ``HubFetchPlugin.setup``."""

    def __init__(self, *args, **storage_options):
        super().__init__()  # storage options belong to other protocols (s3://): nothing to take here

    def _local(self, path: str) -> str:
        repo, commit, file = parse_cache_uri(path)
        entry = self.datasets.get((repo, commit))
        if entry is None:
            raise UserError(f"{path}: this worker was not set up for {repo}@{commit[:12]} (HubFetchPlugin missing)")
        ds, files = entry
        f = files.get(file)
        if f is None:
            raise FileNotFoundError(f"{path}: not in the listing of {repo}@{commit[:12]}")
        return fetch_file(ds, repo, commit, f)

    @classmethod
    def _strip_protocol(cls, path):
        return path.split("://", 1)[-1] if isinstance(path, str) else path

    def info(self, path, **kwargs):
        return {"name": path, "size": os.path.getsize(self._local(path)), "type": "file"}

    def _open(self, path, mode="rb", **kwargs):
        if mode != "rb":
            raise PermissionError(f"{PROTOCOL}:// is read-only")
        return open(self._local(path), "rb")


class HubFetchPlugin(WorkerPlugin):
    """Registers ``hfcache://`` on each worker with the client's endpoint and listing, so every
    machine fetches from the Hub the client listed, at the same commit."""

    def __init__(self, ds: HubDataset, listing: HubListing):
        self.ds = dataclasses.replace(ds, endpoint=ds.hub_endpoint)
        self.key = (listing.repo, listing.commit)
        self.files = {f.path: f for f in listing.files}
        digest = hashlib.sha256(repr((self.ds, self.key, sorted(self.files))).encode()).hexdigest()[:16]
        self.name = f"tokenshards-hub-{digest}"

    idempotent = True
    """Same name, same listing: a second run on the same scheduler keeps the running copy."""

    def setup(self, worker):
        HubCacheFileSystem.datasets[self.key] = (self.ds, self.files)
        fsspec.register_implementation(PROTOCOL, HubCacheFileSystem, clobber=True)

    def teardown(self, worker):
        """Unregistered (or the worker closes): forget this listing unless another plugin replaced it."""
        if HubCacheFileSystem.datasets.get(self.key) == (self.ds, self.files):
            del HubCacheFileSystem.datasets[self.key]


def _worker_free(path: str | None) -> tuple[str, str, int]:
    import socket

    where = path or constants.HF_HUB_CACHE
    return socket.gethostname(), where, free_bytes(where)


def prepare_workers(client, ds: HubDataset, listing: HubListing, *, announce: Callable[[str], None] = print) -> list[Source]:
    """Workers mode: check each machine's disk, register the plugin, return Hub references."""
    target = ds.download_dir or ds.cache_dir
    by_host = {host: (where, free) for host, where, free in client.run(_worker_free, target).values()}
    if not by_host:
        raise UserError("no Dask worker is connected; start `dask worker SCHEDULER` first")
    share = max(max((f.size for f in listing.files), default=0), listing.bytes // len(by_host))
    machines = f"each of {len(by_host)} machines" if len(by_host) > 1 else "the one worker machine"
    announce(f"{listing.describe()}: {len(listing.files)} files, {human(listing.bytes)}B; {machines} fetches the files "
             f"of its own partitions into its cache (about {human(share)}B each)")
    for host, (where, free) in sorted(by_host.items()):
        check_disk(need=share, free=free, keep_free=ds.keep_free, where=f"{host}:{where}",
                   what=f"this machine's share of {listing.describe()}")
    client.register_plugin(HubFetchPlugin(ds, listing))
    return [Source(url=cache_uri(listing.repo, listing.commit, f.path), name=f.path) for f in listing.files]
