"""``--fetch workers``: Hub files opened on a worker as ``hfcache://datasets/REPO@COMMIT/PATH``,
each downloaded into that worker's own machine (its HF cache, or ``download_dir`` as a path of
that machine) the first time a task opens it. ``HubFetchPlugin`` registers the filesystem on
every worker with the client's endpoint and listing."""
from __future__ import annotations

import dataclasses
import hashlib
import re

import fsspec
from distributed import WorkerPlugin
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from ...errors import UserError
from ..hubspec import HubDataset
from ..store import file_identity
from .fetch import fetch_file
from .listing import HubFile, HubListing

PROTOCOL = "hfcache"


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
        """Size, and the etag its copy here is known by (a cache blob's name, or the etag a download
        folder's record vouches for): ``store.file_identity`` of it is ``reference_identity``."""
        local = dict(file_identity(LocalFileSystem(), self._local(path)))
        found = {"name": path, "size": local["size"], "type": "file"}
        if "blob" in local:
            found["etag"] = local["blob"]
        return found

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
