"""A Hub sample the workers fetch themselves (``--fetch workers``): for clusters whose machines
share no disk. Inputs stay Hub references (``hfcache://datasets/REPO@COMMIT/PATH``); a worker
downloads a file into its own machine's HF cache (or ``--download-dir``, a path of that machine)
the first time one of its tasks opens it.

So that each file crosses the network about once per run, not once per machine that happens to
run one of its partitions:

- planning reads footers on the client by ranged GETs (never a whole file), and knows each
  file's identity from the listing (``reference_identity``), so resume and verify keep working;
- ``set_up`` asks every worker where its files go, groups workers into machines (one download
  folder each: ``placement``), gives each file to one machine (balancing bytes per thread, a
  file already there staying there), checks each machine's disk for the bytes it will fetch,
  and registers the ``hfcache://`` plugin;
- the job runs a file's partitions in its machine's ``Lane``: on that machine's workers, with
  loose restrictions (a lost machine's files still finish elsewhere), at most its threads at a
  time, so that no task waits in a queue where an idle machine's worker would steal it.
"""
from __future__ import annotations

import os
import socket

from distributed import Client
from huggingface_hub import constants

from ...cluster import machines as cluster_machines
from ...cluster.runner import Lane
from ...namespaces import file_view
from ...storage.hub.cache import check_disk, free_bytes, is_present, target
from ...storage.hub.listing import HubFile, HubListing
from ...storage.hub.workerfs import HubFetchPlugin, cache_uri, reference_identity
from ...storage.hubspec import HubDataset
from ...storage.sources import ListedInput
from ..plan import BadInput, InputFile
from ...wording import counted, human
from .base import Announce, FooterRequest, Inputs
from .placement import DownloadSite, Place, assign_files, download_sites
from .plain import read_footers
from .ranged import ranged_footers

SHOWN_MACHINES = 6
"""Machines named one by one in the share line; the rest are counted."""


class WorkersFetched(Inputs):
    """``why``: the end of the line that says the workers fetch (``--fetch workers``, ...)."""

    def __init__(self, ds: HubDataset, listing: HubListing, *, why: str):
        self.ds = ds
        self.listing = listing
        self.why = why
        self._lanes: dict[str, Lane] = {}

    def sources(self) -> list[ListedInput]:
        return [ListedInput(url=self._uri(f), name=f.path) for f in self.listing.files]

    def set_up(self, client: Client, *, announce: Announce) -> None:
        announce(f"hub: workers fetch the files themselves ({self.why}); each file goes to one machine")
        if not client.scheduler_info(n_workers=-1)["workers"]:
            announce("hub: waiting for a worker to join, to know where the files go")
            cluster_machines.wait_for_a_worker(client)
        plugin = HubFetchPlugin(self.ds, self.listing)
        places = {address: Place(**found) for address, found in client.run(where_files_go, plugin.ds, self.listing).items()}
        machines = download_sites(places, client.nthreads())
        owner = assign_files([(f.path, f.size) for f in self.listing.files], machines)
        shares = {m.name: [f for f in self.listing.files if owner[f.path] == m.name] for m in machines}
        announce(self._shares_line(machines, shares))
        for m in machines:
            need = sum(f.size for f in shares[m.name] if f.path not in m.present)
            check_disk(need=need, free=m.free, keep_free=self.ds.keep_free, where=f"{m.host}:{m.target}",
                       what=f"{m.name}'s {counted(len(shares[m.name]), 'file')} of {self.listing.describe()}")
        client.register_plugin(plugin)
        lanes = {m.name: Lane(name=m.name, workers=m.where, slots=m.slots) for m in machines}
        self._lanes = {self._uri(f): lanes[owner[f.path]] for f in self.listing.files}

    def footers(self, client: Client, request: FooterRequest) -> list[InputFile | BadInput]:
        """From the Hub by ranged GETs; offline (no Hub to ask) on the workers, from their copies."""
        if constants.is_offline_mode():
            return read_footers(client, self.sources(), request)
        return ranged_footers(self.ds, self.listing, {self._uri(f): f for f in self.listing.files}, request,
                              identity=reference_identity)

    def lane_of(self, url: str) -> Lane | None:
        return self._lanes.get(url)

    def record(self) -> dict:
        """The listing's record, and the workers' ``--download-dir`` (a path on each machine), so
        that readers after the run (``verify --deep``, ``inspect``) find their copies there
        instead of reading the Hub."""
        where = {"download_dir": self.ds.download_dir} if self.ds.download_dir else {}
        return {"hub": {**self.listing.record(), **where}}

    def _uri(self, f: HubFile) -> str:
        return cache_uri(self.listing.repo, self.listing.commit, f.path)

    def _shares_line(self, machines: list[DownloadSite], shares: dict[str, list[HubFile]]) -> str:
        def share(m: DownloadSite) -> str:
            files = shares[m.name]
            fetch = sum(f.size for f in files if f.path not in m.present)
            return (f"{m.name} {counted(len(files), 'file')} ({human(sum(f.size for f in files))}B, "
                    f"{human(fetch)}B to fetch into {m.target}, {human(m.free)}B free)")

        shown = "; ".join(share(m) for m in machines[:SHOWN_MACHINES])
        more = f"; and {len(machines) - SHOWN_MACHINES} more machines" if len(machines) > SHOWN_MACHINES else ""
        return (f"{self.listing.describe()}: {len(self.listing.files)} files, {human(self.listing.bytes)}B over "
                f"{counted(len(machines), 'machine')}: {shown}{more}")


def where_files_go(ds: HubDataset, listing: HubListing) -> dict:
    """On a worker: its machine, its download folder and the room there, and which listed files
    are there whole already (the fields of ``placement.Place``)."""
    folder = target(ds)
    return {"host": socket.gethostname(), "view": file_view(),
            "target": os.path.realpath(os.path.expanduser(folder)), "free": free_bytes(folder),
            "present": frozenset(f.path for f in listing.files if is_present(ds, listing, f))}
