"""``--fetch workers``: Hub files opened on a worker as ``hfcache://datasets/REPO@COMMIT/PATH``,
each downloaded into that worker's own machine (its HF cache, or ``download_dir`` as a path of
that machine) the first time a task opens it. ``HubFetchPlugin`` registers the filesystem on
every worker with the client's endpoint and listing.

A run's manifest keeps those references (and its ``--download-dir``), so ``verify --deep`` (on
the workers) and ``inspect`` (in its own process) open them too, maybe on machines that never
held the files: their plugin (``fetch=False``) reads this machine's copy where there is one, else
only the byte ranges a read asks for, from the Hub at the run's commit (huggingface_hub's
``HfFileSystem``), never downloading a whole file to check a few documents."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass

import fsspec
from distributed import WorkerPlugin
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem
from huggingface_hub import HfFileSystem

from ...errors import UserError
from ..hubspec import PROTOCOL, HubDataset, folder_size
from ..store import file_identity
from .cache import is_present, local_path
from .fetch import fetch_file
from .listing import HubFile, HubListing


def cache_uri(repo: str, commit: str, path: str) -> str:
    return f"{PROTOCOL}://datasets/{repo}@{commit}/{path}"


def reference_identity(f: HubFile) -> tuple[tuple[str, object], ...]:
    """``store.file_identity`` of ``f``'s ``hfcache://`` reference on any worker, known from the
    listing before any worker fetched it: its size and etag (see ``HubCacheFileSystem.info``)."""
    return (("size", f.size), ("etag", f.etag))


def parse_cache_uri(uri: str) -> tuple[str, str, str]:
    """``hfcache://datasets/OWNER/NAME@COMMIT/PATH`` → (repo, commit, path)."""
    rest = uri.split("://", 1)[-1]
    m = re.fullmatch(r"datasets/([^/@]+/[^/@]+)@([0-9a-f]{40})/(.+)", rest)
    if not m:
        raise UserError(f"{uri!r} is not a {PROTOCOL}://datasets/OWNER/NAME@COMMIT/PATH reference")
    return m.group(1), m.group(2), m.group(3)


@dataclass(frozen=True)
class Registered:
    """What a worker knows of one (repo, commit): how to fetch, the listed files, and whether a
    file missing here is downloaded (a run) or read by range from the Hub (a verify)."""

    ds: HubDataset
    files: dict[str, HubFile]
    fetch: bool = True


class HubCacheFileSystem(AbstractFileSystem):
    """``hfcache://datasets/REPO@COMMIT/PATH`` opened from this machine's HF cache, downloading the
    file first when missing (huggingface_hub's per-blob lock makes concurrent workers of one
    machine wait for one download instead of starting their own), or, registered without
    ``fetch``, reading a missing file's ranges from the Hub."""

    protocol = PROTOCOL
    datasets: dict[tuple[str, str], Registered] = {}
    """(repo, commit) → what this worker knows of it; filled by ``HubFetchPlugin.setup``."""

    def __init__(self, *args, **storage_options):
        super().__init__()  # storage options belong to other protocols (s3://): nothing to take here

    def _entry(self, path: str) -> tuple[Registered, HubListing, HubFile]:
        repo, commit, file = parse_cache_uri(path)
        entry = self.datasets.get((repo, commit))
        if entry is None:
            raise UserError(f"{path}: this worker was not set up for {repo}@{commit[:12]} (HubFetchPlugin missing)")
        f = entry.files.get(file)
        if f is None:
            raise FileNotFoundError(f"{path}: not in the listing of {repo}@{commit[:12]}")
        listing = HubListing(repo=repo, revision=commit, commit=commit, folder=entry.ds.folder, files=(f,))
        return entry, listing, f

    def _local(self, entry: Registered, listing: HubListing, f: HubFile) -> str | None:
        """This machine's copy, downloaded first if the entry fetches; None: read it from the Hub."""
        if entry.fetch:
            return fetch_file(entry.ds, listing.repo, listing.commit, f)
        return str(local_path(entry.ds, listing, f)) if is_present(entry.ds, listing, f) else None

    @classmethod
    def _strip_protocol(cls, path):
        return path.split("://", 1)[-1] if isinstance(path, str) else path

    def info(self, path, **kwargs):
        """Size, and the etag its copy here is known by (a cache blob's name, or the etag a download
        folder's record vouches for): ``store.file_identity`` of it is ``reference_identity``. A
        file read from the Hub at a pinned commit cannot change: its identity is the listed one."""
        entry, listing, f = self._entry(path)
        local = self._local(entry, listing, f)
        if local is None:
            return {"name": path, "type": "file", **dict(reference_identity(f))}
        local = dict(file_identity(LocalFileSystem(), local))
        found = {"name": path, "size": local["size"], "type": "file"}
        if "blob" in local:
            found["etag"] = local["blob"]
        return found

    def _open(self, path, mode="rb", **kwargs):
        if mode != "rb":
            raise PermissionError(f"{PROTOCOL}:// is read-only")
        entry, listing, f = self._entry(path)
        local = self._local(entry, listing, f)
        if local is not None:
            return open(local, "rb")
        hub = HfFileSystem(endpoint=entry.ds.hub_endpoint)
        # No read-ahead: Arrow asks for exactly the footer and column chunks it needs, each one range.
        return hub.open(f"datasets/{listing.repo}@{listing.commit}/{f.path}", "rb", size=f.size, cache_type="none")


class HubFetchPlugin(WorkerPlugin):
    """Registers ``hfcache://`` on each worker with the client's endpoint and listing, so every
    machine fetches from the Hub the client listed, at the same commit."""

    def __init__(self, ds: HubDataset, listing: HubListing, *, fetch: bool = True):
        self.ds = dataclasses.replace(ds, endpoint=ds.hub_endpoint)
        self.key = (listing.repo, listing.commit)
        self.files = {f.path: f for f in listing.files}
        self.fetch = fetch
        digest = hashlib.sha256(repr((self.ds, self.key, sorted(self.files), fetch)).encode()).hexdigest()[:16]
        self.name = f"tokenshards-hub-{digest}"

    idempotent = True
    """Same name, same listing: a second run on the same scheduler keeps the running copy."""

    def setup(self, worker):
        mine = Registered(self.ds, self.files, self.fetch)
        known = HubCacheFileSystem.datasets.get(self.key)
        # A fetching run's entry stays (it knows where the run's copies are, and serves a verify on
        # the same cluster too); a later reader's replaces an earlier reader's (another folder, maybe).
        if self.fetch or known is None or not known.fetch:
            HubCacheFileSystem.datasets[self.key] = mine
        fsspec.register_implementation(PROTOCOL, HubCacheFileSystem, clobber=True)

    def teardown(self, worker):
        """Unregistered (or the worker closes): forget this listing unless another plugin replaced it."""
        if HubCacheFileSystem.datasets.get(self.key) == Registered(self.ds, self.files, self.fetch):
            del HubCacheFileSystem.datasets[self.key]


def reading_plugins(identities: dict[str, dict], *, endpoint: str | None = None,
                    download_dir: str | None = None) -> list[HubFetchPlugin]:
    """For readers after a run (``verify --deep``, ``inspect``): a plugin that reads (never
    fetches) per (repo, commit) among a run's recorded inputs, {url: identity}; the files come
    from the identities the run recorded (size, etag: ``reference_identity``); ``endpoint`` None:
    this process's HF_ENDPOINT. A machine's copy is looked for in ``download_dir`` (the run's
    ``--download-dir``), else in its HF cache."""
    by_dataset: dict[tuple[str, str], list[HubFile]] = {}
    for url, identity in identities.items():
        if not url.startswith(f"{PROTOCOL}://"):
            continue
        repo, commit, path = parse_cache_uri(url)
        by_dataset.setdefault((repo, commit), []).append(
            HubFile(path=path, size=int(identity.get("size", 0)), etag=str(identity.get("etag", ""))))
    plugins = []
    for (repo, commit), files in sorted(by_dataset.items()):
        folder = files[0].path.rsplit("/", 1)[0]
        ds = HubDataset(repo=repo, size=folder_size(folder), endpoint=endpoint, download_dir=download_dir)
        listing = HubListing(repo=repo, revision=commit, commit=commit, folder=folder, files=tuple(files))
        plugins.append(HubFetchPlugin(ds, listing, fetch=False))
    return plugins
