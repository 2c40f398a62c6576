"""Which machine fetches and tokenizes each Hub file (``--fetch workers``): pure functions over
what each worker reported, so the rules are tested without a cluster.

A ``DownloadSite`` is a set of workers that share one download folder: the same machine (file
view: kernel boot and mount namespace, ``namespaces.file_view``) and the same folder in it. Workers of
one machine wait for each other's downloads (huggingface_hub's per-blob lock), so a file fetched
by one of them is there for all; a file whose partitions ran on two machines would cross the
network twice.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping

from distributed.comm import get_address_host


@dataclass(frozen=True, kw_only=True)
class Place:
    """What one worker reports about where Hub files go on its machine."""

    host: str
    view: str
    target: str
    """The download folder there, resolved (its HF cache, or --download-dir)."""
    free: int
    present: frozenset[str]
    """Repo paths of the listed files already there whole."""


@dataclass(frozen=True, kw_only=True)
class DownloadSite:
    name: str
    """For messages: its host name, and the folder when one host has several."""
    host: str
    target: str
    workers: tuple[str, ...]
    where: tuple[str, ...] = ()
    """What Dask restricts its tasks to: the hosts (IP addresses) of its workers when no other
    machine has a worker there (a worker its nanny restarts, at a new port, still counts), else
    its workers' addresses."""
    slots: int
    """Its workers' threads: tasks it runs at once."""
    free: int
    present: frozenset[str]


def download_sites(places: Mapping[str, Place], nthreads: Mapping[str, int]) -> list[DownloadSite]:
    """Workers (address → place) grouped into machines, sorted by name."""
    groups: dict[tuple[str, str], list[str]] = {}
    for address in sorted(places):
        p = places[address]
        groups.setdefault((p.view, p.target), []).append(address)
    machines = []
    for (_, folder), addresses in groups.items():
        first = places[addresses[0]]
        machines.append(DownloadSite(
            name=first.host, host=first.host, target=folder, workers=tuple(addresses),
            slots=max(1, sum(nthreads.get(a, 1) for a in addresses)), free=min(places[a].free for a in addresses),
            present=frozenset.intersection(*(places[a].present for a in addresses))))
    return sorted(_restricted(_named(machines)), key=lambda m: m.name)


def _restricted(machines: list[DownloadSite]) -> list[DownloadSite]:
    hosts = {m.name: {get_address_host(a) for a in m.workers} for m in machines}
    shared = {h for m in machines for h in hosts[m.name]
              if sum(h in hosts[other.name] for other in machines) > 1}

    def by_host(m: DownloadSite) -> bool:  # an IPv6 host would read as an address to Dask: addresses then
        return not (hosts[m.name] & shared) and not any(":" in h for h in hosts[m.name])

    return [dataclasses.replace(m, where=tuple(sorted(hosts[m.name])) if by_host(m) else m.workers) for m in machines]


def _named(machines: list[DownloadSite]) -> list[DownloadSite]:
    """Unique names: the host name; with its folder when one host has several; with its first
    worker's address when even that repeats (containers that share a host name and a path)."""
    def count(key) -> dict:
        seen: dict = {}
        for m in machines:
            seen[key(m)] = seen.get(key(m), 0) + 1
        return seen

    hosts, folders = count(lambda m: m.host), count(lambda m: (m.host, m.target))

    def name(m: DownloadSite) -> str:
        if hosts[m.host] == 1:
            return m.host
        if folders[(m.host, m.target)] == 1:
            return f"{m.host}:{m.target}"
        return f"{m.host} ({m.workers[0]})"

    return [dataclasses.replace(m, name=name(m)) for m in machines]


def assign_files(files: Iterable[tuple[str, int]], machines: list[DownloadSite]) -> dict[str, str]:
    """Each file (repo path, bytes) → the name of the one machine that fetches and tokenizes it.

    Largest file first, to the machine that would finish its share soonest (bytes per thread);
    a machine that holds the file already counts it at half its size, the download it saves.
    Deterministic: ties go to the first machine by name."""
    if not machines:
        raise ValueError("assign_files needs at least one machine")
    load = {m.name: 0 for m in machines}
    chosen: dict[str, str] = {}
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        def finish(m: DownloadSite) -> tuple[float, str]:
            weight = size / 2 if path in m.present else size
            return (load[m.name] + weight) / m.slots, m.name

        best = min(machines, key=finish)
        load[best.name] += size
        chosen[path] = best.name
    return chosen
