"""Local workers that are ready the moment they start.

Dask spawns each LocalCluster worker as a fresh interpreter, which imports Dask, pandas, pyarrow
and the tokenizers (~0.6 s of CPU per worker, part of it on its first task) while this process is
still busy importing the same. Instead, as soon as this process has imported ``distributed``, a
forkserver starts: a separate, single-threaded process (so forking it is safe, unlike forking
this one, which runs threads) that imports all of that on another core while the client goes on,
then forks each worker with everything already imported. Measured on 2 cores: ~1 s off a ~7.5 s
run of 200 MB of text.
"""
from __future__ import annotations

import multiprocessing
import os

from .interrupt import children_ignore_ctrl_c

PRELOAD = ("distributed", "dask.dataframe", "tokenshards.tokenize.task", "tokenshards.encoding.backends", "gigatoken",
           "awkward", "splintr", "riptoken")
"""What a worker's tasks import; the forkserver skips a module that is not installed. (gigatoken hands
its results back as awkward arrays but imports awkward only then: ~0.35 s in a worker's first task.)"""


def start_forkserver() -> bool:
    """Start the forkserver and have Dask's nannies fork workers from it. Does nothing (False)
    where forkserver does not exist (Windows) or the Dask config already names a start method
    other than the default spawn (the user chose)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    import dask
    import distributed  # noqa: F401  (its config defaults, read below)
    from multiprocessing import forkserver

    if dask.config.get("distributed.worker.multiprocessing-method") != "spawn":
        return False
    # What distributed sets for the workers it spawns (MALLOC_TRIM_THRESHOLD_, OMP_NUM_THREADS...):
    # the forkserver must have it before its allocator and numpy read it.
    os.environ.update({k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()})
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    with children_ignore_ctrl_c():  # the workers forked from the server inherit its disposition
        forkserver.ensure_running()
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    return True
