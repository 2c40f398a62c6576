"""Which implementation a run's inputs get, ``--fetch auto`` included.

``auto`` (the default) picks what fits the cluster and says in one line what it picked and why:
on a local cluster this process downloads (no question to ask the cluster, and the download
overlaps its start); on any other cluster, once connected, this process downloads when every
worker machine sees its download folder (NFS, workers on this machine), else the workers fetch.
"""
from __future__ import annotations

from typing import Iterator

from distributed import Client

from ...cluster.machines import blind_machines, listed
from ...cluster.runner import Lane
from ...storage.hubspec import HubDataset
from ...storage.sources import ListedInput
from ..plan import BadInput, InputFile
from .base import Announce, FooterRequest, Inputs, Several
from .plain import PlainInputs

LOCAL_CLUSTER = "a local cluster: its workers share this machine's disk"


def open_inputs(sources: list[ListedInput], *, hub: HubDataset | None, local_cluster: bool, overlap: bool,
                announce: Announce) -> Inputs:
    """The run's inputs, before any cluster runs: ``sources`` (``--input``) and the Hub sample.
    ``local_cluster``: the run starts a LocalCluster (no ``--scheduler``, no other kind of
    ``--cluster``). ``overlap``: tokenize while downloading (else download first)."""
    parts: list[Inputs] = [PlainInputs(sources)] if sources or hub is None else []
    if hub is not None:
        parts.append(open_hub(hub, local_cluster=local_cluster, overlap=overlap, announce=announce))
    return parts[0] if len(parts) == 1 else Several(parts)


def open_hub(ds: HubDataset, *, local_cluster: bool, overlap: bool, announce: Announce) -> Inputs:
    """List the sample (a typo in --dataset/--size fails here, before any cluster), and pick who
    fetches it; on a local cluster this process starts downloading at once."""
    # huggingface_hub and the Hub inputs: imported only by runs that read the Hub (~0.1 s of a
    # run's start otherwise, on a core the workers' start needs).
    from ...storage.hub.listing import list_files
    from .hub_client import ClientFetched
    from .hub_workers import WorkersFetched

    listing = list_files(ds)
    if ds.fetch == "workers":
        return WorkersFetched(ds, listing, why="--fetch workers")
    if ds.fetch == "client" or local_cluster:
        why = "--fetch client" if ds.fetch == "client" else LOCAL_CLUSTER
        hub = ClientFetched(ds, listing, overlap=overlap, why=why, checked=local_cluster)
        if local_cluster:
            hub.start(announce=announce)  # the download overlaps the cluster's start
        return hub
    return AutoHub(ds, listing, overlap=overlap)


class AutoHub(Inputs):
    """``--fetch auto`` on a cluster that is not local: decided in ``set_up``, then that one."""

    def __init__(self, ds: HubDataset, listing, *, overlap: bool):
        self.ds, self.listing, self.overlap = ds, listing, overlap
        self.chosen: Inputs | None = None

    def set_up(self, client: Client, *, announce: Announce) -> None:
        # Kept out of start-up as in ``open_hub`` (which has imported them by now).
        from .hub_client import ClientFetched, download_target
        from .hub_workers import WorkersFetched

        if not client.scheduler_info(n_workers=-1)["workers"]:  # blind_machines waits for the first one
            announce("hub: waiting for a worker to join, to know whether the workers see this machine's disk")
        use = download_target(self.ds)
        blind = blind_machines(client, [use]).get(use)
        if blind:
            hosts = listed(blind)
            verb = "does" if len(blind) == 1 else "do"
            self.chosen = WorkersFetched(self.ds, self.listing,
                                         why=f"{hosts} {verb} not see this machine's {use.option} {use.url}")
        else:
            self.chosen = ClientFetched(self.ds, self.listing, overlap=self.overlap, why="the workers on every machine see it",
                                        checked=True)
        self.chosen.set_up(client, announce=announce)

    def _decided(self) -> Inputs:
        if self.chosen is None:
            raise RuntimeError("--fetch auto: set_up decides who fetches; call it first")
        return self.chosen

    def sources(self) -> list[ListedInput]:
        return self._decided().sources()

    def footers(self, client: Client, request: FooterRequest) -> list[InputFile | BadInput]:
        return self._decided().footers(client, request)

    def arriving(self) -> frozenset[str]:
        return self._decided().arriving()

    def arrivals(self, *, announce: Announce) -> Iterator[str]:
        return self._decided().arrivals(announce=announce)

    def lane_of(self, url: str) -> Lane | None:
        return self._decided().lane_of(url)

    def record(self) -> dict:
        return {"hub": self.listing.record()}

    def close(self) -> None:
        if self.chosen is not None:
            self.chosen.close()
