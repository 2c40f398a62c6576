"""A Hub sample this process downloads (``--fetch client``): every file crosses the network once,
into the HF cache or ``--download-dir``, and the workers read local paths there. Right on one
machine, and on a cluster whose workers see that folder (a shared filesystem): ``set_up`` checks
that they do before anything is downloaded.

Two ways: download everything first (``overlap=False``, train-bpe), or in the background while
the job tokenizes (``overlap=True``, tokenize): footers of files not here yet are read from the
Hub by ranged GETs, with the identity each file will have once here (``downloaded_identity``),
so the plan and every output byte are a download-first run's; each file's partitions start
when ``arrivals`` says it is whole.
"""
from __future__ import annotations

import socket
from typing import Iterator

from distributed import Client
from huggingface_hub import constants

from ...cluster.machines import PathUse, blind_machines, listed
from ...errors import UserError
from ...storage.hub.cache import local_path, local_sources, remember_revision, target
from ...storage.hub.fetcher import OVERLAP_DOWNLOADS, Fetcher, arrivals, download, prepare_download
from ...storage.hub.footer import downloaded_identity
from ...storage.hub.listing import HubFile, HubListing
from ...storage.hubspec import HubDataset
from ...storage.sources import ListedInput
from ...storage.store import describe_identity_change, file_identity, filesystem
from ..plan import BadInput, InputFile
from .base import Announce, FooterRequest, Inputs
from .plain import read_footers
from .ranged import ranged_footers


class ClientFetched(Inputs):
    """``why``: the end of the line that says this process downloads (``--fetch client``, ...).
    ``checked``: the workers are known to see this machine's download folder (a local cluster,
    or a check already made), so ``set_up`` need not ask them."""

    def __init__(self, ds: HubDataset, listing: HubListing, *, overlap: bool, why: str, checked: bool = False):
        self.ds, self.listing, self.overlap, self.why, self.checked = ds, listing, overlap, why, checked
        self._started = False
        self._todo: list[HubFile] = []
        self._fetcher: Fetcher | None = None

    def start(self, *, announce: Announce) -> None:
        """Say where the files go, check the disk, and download (in the background with ``overlap``).
        Before the cluster starts on a local cluster (the download overlaps its start), else from ``set_up``."""
        if self._started:
            return
        self._started = True
        announce(f"hub: this machine downloads into {target(self.ds)} ({self.why})")
        if not self.overlap:
            download(self.ds, self.listing, announce=announce)
            return
        self._todo = prepare_download(self.ds, self.listing, announce=announce)  # the same disk check
        if self._todo:
            workers = min(self.ds.max_workers, OVERLAP_DOWNLOADS)
            self._fetcher = Fetcher(self.ds, self.listing, self._todo, workers=workers).start()
        elif not constants.is_offline_mode():
            remember_revision(self.ds, self.listing)  # as ``download`` does, for HF_HUB_OFFLINE=1 reruns

    def set_up(self, client: Client, *, announce: Announce) -> None:
        if not self.checked:
            check_workers_see(client, self.ds)
            self.checked = True
        self.start(announce=announce)

    def sources(self) -> list[ListedInput]:
        return local_sources(self.ds, self.listing)

    def footers(self, client: Client, request: FooterRequest) -> list[InputFile | BadInput]:
        """Files here: on the workers, as plain files. Files still downloading: from the Hub."""
        missing = self._missing()
        sources = self.sources()
        found = {r.url: r for r in read_footers(client, [s for s in sources if s.url not in missing], request)}
        found.update({r.url: r for r in ranged_footers(self.ds, self.listing, missing, request,
                                                       identity=downloaded_identity)})
        return [found[s.url] for s in sources]  # the order a download-first run has

    def arriving(self) -> frozenset[str]:
        return frozenset(self._missing())

    def arrivals(self, *, announce: Announce) -> Iterator[str]:
        """Each downloading file's url once it is whole and is the file planned (its identity);
        a failed download raises here, as ``download`` would."""
        if self._fetcher is None:
            return
        whole = 0
        for f, _ in arrivals(self._fetcher, announce=announce):
            whole += 1
            url = str(local_path(self.ds, self.listing, f))
            fs, path = filesystem(url, None)
            now, want = file_identity(fs, path), downloaded_identity(f)
            if now != want:
                raise UserError(f"{url}: downloaded, but not the file the Hub listed "
                                f"({describe_identity_change(want, now)}){_unvouched(now)}; rerun")
            yield url
        if whole == len(self._todo):
            remember_revision(self.ds, self.listing)

    def record(self) -> dict:
        return {"hub": self.listing.record()}

    def close(self) -> None:
        if self._fetcher is not None:
            self._fetcher.stop()

    def _missing(self) -> dict[str, HubFile]:
        """Local url → Hub file, for the files still downloading."""
        return {str(local_path(self.ds, self.listing, f)): f for f in self._todo}


def download_target(ds: HubDataset) -> PathUse:
    """This machine's download folder, as the same-view check takes it: workers read the files there."""
    return PathUse(option="--download-dir" if ds.download_dir else "HF cache", url=target(ds), writes=True)


def check_workers_see(client: Client, ds: HubDataset) -> None:
    """``--fetch client`` on a cluster: stop, in one line and before downloading anything, when
    worker machines do not see this machine's download folder (their tasks would find no file)."""
    use = download_target(ds)
    blind = blind_machines(client, [use]).get(use)
    if blind:
        raise UserError(not_seen(ds, blind))


def not_seen(ds: HubDataset, machines: list[str]) -> str:
    hosts = listed(machines)
    use = download_target(ds)
    elsewhere = "a --download-dir that every machine mounts" if ds.download_dir else \
        "--download-dir DIR on a filesystem every machine mounts (NFS, a cluster's /scratch)"
    return (f"--fetch client downloads into this machine's ({socket.gethostname()}) {use.option} {use.url}, which the "
            f"workers on {hosts} do not see: their tasks would find no file there; use --fetch workers (each machine "
            f"fetches the files of its own partitions), or {elsewhere}")


def _unvouched(identity) -> str:
    """Why a file just downloaded into a folder can lack its etag: huggingface_hub's record of
    the download is older than the file by more than the 1 s it allows (``store.vouched_etag``)."""
    if "mtime_ns" not in dict(identity):
        return ""
    return ("; huggingface_hub's record of the download does not vouch for it (the file is newer than the record: "
            "written again since, or a filesystem clock ahead of this machine's)")
