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

import contextlib
import gc
import multiprocessing
import os
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterator, Mapping

from .interrupt import children_ignore_ctrl_c

FIRST, LAST = "tokenshards.cluster.forkserver_begin", "tokenshards.cluster.forkserver_preload"
"""The server's first preload stops the garbage collector for the rest (``pause_gc``); its last one
asks once what every worker's handshake asks, freezes the heap and starts the collector again."""


@dataclass(frozen=True)
class ForkserverPreload:
    """What the caller wants its local workers to start with: the modules their tasks import
    (imported once in the server; one that is not installed is skipped) and the environment the
    server starts with. CPython's forkserver takes module names only and inherits its environment
    when it starts: those are the two ways into it, and a module that builds something there (the
    encoders, ``encoding/prebuild.py``) reads what to build from that environment."""

    modules: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)

    def then(self, other: ForkserverPreload) -> ForkserverPreload:
        return ForkserverPreload(modules=(*self.modules, *(m for m in other.modules if m not in self.modules)),
                                 environment={**self.environment, **other.environment})

    def imports(self) -> list[str]:
        """The server's whole preload, in order. Not dask.dataframe: the client builds the graph
        with it, but a partition's task names only ``dask._task_spec`` and our modules
        (``test_a_partition_task_names_only_modules_the_workers_start_with``), and importing it
        took ~0.2 s of the server's CPU while both cores were busy starting (a 5 MB run: 1.57
        against 1.66 s, medians of 10, interleaved)."""
        return [FIRST, "distributed", *self.modules, LAST]


def start_forkserver(preload: ForkserverPreload = ForkserverPreload()) -> bool:
    """Start the forkserver with ``preload`` and have Dask's nannies fork workers from it. Does
    nothing (False) where forkserver does not exist (Windows) or the Dask config already names a
    start method other than the default spawn (the user chose)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    import dask  # heavy: the forkserver imports this module first, before it stops the garbage collector
    from multiprocessing import forkserver

    _register_distributed_defaults()

    if dask.config.get("distributed.worker.multiprocessing-method") != "spawn":
        return False
    # What distributed sets for the workers it spawns (OMP_NUM_THREADS...), allocator settings
    # included: the forkserver must have them before its allocator and numpy read them.
    os.environ.update(worker_environment(dask.config.get("distributed.nanny.pre-spawn-environ"), inherited=os.environ))
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload.imports())
    monitors = coarser_monitors()
    # The caller's environment is the server's alone: set for its start, then taken back.
    with children_ignore_ctrl_c(), _environment({**preload.environment, **dask_environment(monitors)}):
        forkserver.ensure_running()  # workers inherit the server's disposition and its Dask config
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver", **monitors})  # the scheduler's
    return True


COARSER_MONITORS = {
    # Each worker's statistical profiler (the dashboard's Profile page): a callback on the worker's
    # event loop that samples the task thread's stack. Every 10 ms, it and the loop's other
    # periodic work took ~16% of a worker's CPU on 1 GB (the event loop thread: 3.8 of 23 s).
    "distributed.worker.profile.interval": ("10ms", "100ms"),
    # The event loop health check (warns when a loop is blocked for more than 3 s) in every
    # worker and the scheduler.
    "distributed.admin.tick.interval": ("20ms", "100ms"),
}
"""Dask's monitors of a local cluster that wake each process's event loop often, at a tenth of the
rate: {key: (Dask's default, ours)}. Both cores are busy tokenizing, so every wake-up is taken
from a task. Measured on 200 MB, 2 workers, four interleaved pairs, medians of CPU seconds: the
workers' event loops 1.30 -> 0.80, the client (the scheduler's loop) 2.67 -> 2.31, the whole
tree 10.07 -> 8.98. The Profile page still fills (ten samples a second per worker thread) and a
loop blocked past ``distributed.admin.tick.limit`` is still reported."""


def coarser_monitors(config: Mapping | None = None) -> dict[str, str]:
    """``COARSER_MONITORS``' rates for the keys still at Dask's default (a value you set in your
    Dask config is left as it is)."""
    import dask

    get = (lambda key: config.get(key)) if config is not None else (lambda key: dask.config.get(key, None))
    return {key: ours for key, (default, ours) in COARSER_MONITORS.items() if get(key) == default}


def dask_environment(settings: Mapping[str, str]) -> dict[str, str]:
    """Dask config keys as the environment variables Dask reads when it is imported (``DASK_`` +
    the key with ``__`` between levels)."""
    return {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value) for key, value in settings.items()}


@contextlib.contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


DASK_TRIM_THRESHOLD = 65536
"""Dask's default MALLOC_TRIM_THRESHOLD_ for the workers it spawns."""
REUSE_BYTES = str(32 * 2**20)
"""Arrays up to this size come from (and go back to) the heap; at most this much free heap is kept.
The size is set by gigatoken's output, a Rust ``Vec`` of uint32 that doubles as it grows: a default
partition (8 MiB of English text) is ~3 M tokens, a 16 MiB ``Vec``, which at a 16 MiB threshold was
mapped fresh and faulted in every partition (~3,000 page faults each). 32 MiB keeps it on the heap;
64 MiB measured no better (page faults and CPU alike, a plain process) and keeps more free memory.
1 GB of English, 2 workers, five interleaved pairs: phase 4.29 -> 4.01 s, whole 5.1 -> 4.8 s
(medians), page faults -88% in a plain process, ~25 MB more peak RSS per worker; all languages,
three pairs: phase 6.57 -> 6.40 s."""


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's ``mallopt`` parameters (malloc.h)."""


def reuse_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """In a worker Dask started with its default MALLOC_TRIM_THRESHOLD_ (a ``dask worker`` by hand,
    SLURM's and Kubernetes' workers: all but our LocalCluster's, see ``worker_environment``), set
    glibc's thresholds to ``REUSE_BYTES`` now, as that environment would have at start. glibc reads
    them once, before any of our code runs, but ``mallopt`` changes them in a running process
    (``connect.ReuseFreedMemory`` runs this on such a cluster's workers). On 1 GB
    of English through a hand-started ``dask scheduler`` + ``dask worker --nworkers 2``, four
    interleaved pairs: tokenizing phase 5.03 -> 4.56 s (medians). True when it set them; a value you
    set, or a C library without ``mallopt`` (macOS, musl's refuses), is left as it is."""
    if environ.get("MALLOC_TRIM_THRESHOLD_") != str(DASK_TRIM_THRESHOLD) or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    reuse = int(REUSE_BYTES)
    return bool(mallopt(M_TRIM_THRESHOLD, reuse)) and bool(mallopt(M_MMAP_THRESHOLD, reuse))


ARROW_MIMALLOC = {"MIMALLOC_PURGE_DELAY": "1000"}
"""Arrow reads through mimalloc (its default pool on Linux), which by default hands freed pages back
to the kernel 10 ms after they are freed. A worker decodes a piece, then tokenizes it for longer than
that, so each read met fresh pages: faulted in and zeroed (2 MB huge pages here) while they were
filled. Kept for a second, the next read reuses them (with ``corpus.read.RELEASE_AFTER_BYTES``). Measured
on 1 GB of held-out text, 2 workers, interleaved, medians of 3: worker CPU 16.1 -> 15.3 s, phase
8.5 -> 7.9 s, page faults 1.23 M -> ~0.3 M, ~90 MB more peak RSS in the tree. (The earlier setting
here, purge at once and commit lazily, made Arrow's decode ~2x slower: 275 vs 595 MB/s alone.)"""


def worker_environment(pre_spawn_environ: dict, *, inherited: Mapping[str, str] = MappingProxyType({})) -> dict[str, str]:
    """Dask's ``pre-spawn-environ`` for the forkserver, with two changes. Dask's default
    MALLOC_TRIM_THRESHOLD_=65536 (hand freed memory back at once: long-lived workers whose
    unmanaged memory creeps) also pins glibc's mmap threshold at 128 KiB, so every array of a
    partition is mmapped, faulted in zeroed and unmapped again, task after task: 13-18% of a
    gigatoken worker's CPU, measured here. Our workers allocate the same sizes in every task, so
    glibc may keep up to ``REUSE_BYTES`` free for reuse (measured: ~20 MB more per worker at peak
    at 16 MiB, ~25 MB more again at 32 MiB). A value set in your Dask config is left as it is. And Arrow's allocator gets ``ARROW_MIMALLOC``, each
    unless ``inherited`` (this process's environment) or the Dask config already sets it."""
    environment = {k: str(v) for k, v in pre_spawn_environ.items()}
    if environment.get("MALLOC_TRIM_THRESHOLD_") == str(DASK_TRIM_THRESHOLD):
        environment.update(MALLOC_TRIM_THRESHOLD_=REUSE_BYTES, MALLOC_MMAP_THRESHOLD_=REUSE_BYTES)
    for name, value in ARROW_MIMALLOC.items():
        environment.setdefault(name, inherited.get(name, value))
    return environment


def pause_gc() -> bool:
    """Stop the cyclic garbage collector for a stretch of start-up; True if it was running (then
    ``resume_gc`` ends the pause). Importing Dask, pandas, pyarrow and bokeh makes ~275,000 objects
    that live as long as the process, and the collector walked the growing heap again and again
    meanwhile, finding next to nothing (1,355 objects). Measured here, medians of 5: importing the
    tokenize job and the dashboard 0.85 -> 0.67 s (0.76 s when the objects made are collected once
    afterwards instead of frozen), the forkserver's imports 0.66 -> 0.54 s. A whole tokenize run
    of 200 MB, 12 interleaved pairs: 2.80 -> 2.60 s, its time outside the tokenizing phase
    1.42 -> 1.24 s (medians). Paused where a local cluster starts: by the command line around its
    job's imports and the forkserver's start (``cli._prestart_local_workers``), by ``connect``
    around the LocalCluster's (bokeh's dashboard), by the forkserver through its preload."""
    if not gc.isenabled():
        return False
    gc.disable()
    return True


def resume_gc() -> None:
    """End a pause: what it made is frozen (never walked by a later collection: modules, classes,
    the cluster's objects, all kept to the end anyway), then the collector runs again."""
    gc.freeze()
    gc.enable()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """``pause_gc`` for the block (the command's imports, starting a LocalCluster), ``resume_gc`` after it."""
    paused = pause_gc()
    try:
        yield
    finally:
        if paused:
            resume_gc()


def _register_distributed_defaults() -> None:
    """What importing ``distributed`` does first (its ``config`` module): register the defaults in
    its own ``distributed.yaml`` with Dask's config. Read here without importing it, so that the
    forkserver starts ~0.25 s sooner; distributed registers the same file again when it loads."""
    import importlib.util

    import dask.config  # heavy: as in start_forkserver, the only caller
    import yaml

    folder = importlib.util.find_spec("distributed").submodule_search_locations[0]
    with open(os.path.join(folder, "distributed.yaml"), encoding="utf-8") as f:
        dask.config.update_defaults(yaml.safe_load(f))
