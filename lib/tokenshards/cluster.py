"""Where the work runs: a LocalCluster of process workers, or an existing scheduler."""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Callable, Iterator

import dask
from distributed import Client, LocalCluster

from .errors import UserError

CLUSTER_DEFAULTS = {
    # A worker that dies (OOM kill, lost machine) is not a task error: Dask reschedules its
    # tasks up to this many times before it gives up on them.
    "distributed.scheduler.allowed-failures": 5,
}


@contextlib.contextmanager
def connect(*, workers: int | None = None, scheduler: str | None = None, dashboard_address: str = ":8787",
            announce: Callable[[str], None] = print) -> Iterator[Client]:
    """A client on an existing scheduler, or on a fresh LocalCluster (one thread per process
    worker: tiktoken holds the GIL on ``encode_ordinary``, so threads would not help)."""
    with dask.config.set(CLUSTER_DEFAULTS):
        if scheduler:
            try:
                client = Client(scheduler, timeout="15s")
            except (OSError, TimeoutError) as e:
                raise UserError(f"cannot reach the Dask scheduler at {scheduler}: {e}; is `dask scheduler` running there?") from e
            with client:
                announce(f"scheduler {scheduler}, {len(client.scheduler_info(n_workers=-1)['workers'])} workers; dashboard: {client.dashboard_link}")
                yield client
            return
        n = workers or os.cpu_count() or 1
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=dashboard_address,
                          silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
            announce(f"local cluster: {n} process workers; dashboard: {client.dashboard_link}")
            yield client
