"""``tokenshards inspect OUT``: the partitions read on the cluster (``oncluster``), or here.

A small run (``LOCAL_PARTITIONS``, ``LOCAL_DOCUMENTS``) is read in this process unless the
command names a cluster (``--workers``, ``--scheduler``, ``--cluster``): starting a local cluster
would cost more than the reading. The same function reads it, so the report is the same.
"""
from __future__ import annotations

from typing import Callable

from ..format import v1
from .config import InspectConfig
from .stats import RunStats, inspect_here

__all__ = ["InspectConfig", "run_inspect"]

LOCAL_PARTITIONS = 64
LOCAL_DOCUMENTS = 250_000
"""At most this many partitions and documents, with no cluster named, are read in this process:
about a second here (~3 ms a partition, ~2.5-5 s a million documents, docs/scaling.md), less than
a local cluster takes to start (~2-3 s). Bounded, so the client's work stays flat past it."""


def run_inspect(config: InspectConfig, *, announce: Callable[[str], None] = print) -> RunStats:
    """Read OUT's manifest here, then its partitions on the cluster (or here, for a small run with
    no cluster named). Anything wrong is a one-line ``UserError``."""
    run, manifest = v1.open_finished(config.out, config.storage_options)
    parts = manifest.partitions
    if not config.names_a_cluster() and len(parts) <= LOCAL_PARTITIONS and manifest.totals.docs <= LOCAL_DOCUMENTS:
        return inspect_here(run, manifest, language_column=config.language_column)
    # Dask, only when a cluster reads it: a small run's inspect never imports distributed (~0.4 s).
    from .oncluster import inspect_on_cluster

    return inspect_on_cluster(config, run, manifest, announce=announce)
