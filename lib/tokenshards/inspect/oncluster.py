"""``inspect`` on the cluster: the partitions read by tasks, the summaries combined there.

The client reads the manifest, cuts its partitions into batches in the manifest's order and
submits one task per batch (``stats.summarize_partitions``); the tasks' summaries (a fixed-size
histogram, totals, a Counter per language) are combined ``FAN_IN`` at a time on the workers, in
the same order, and only the root comes back. So the client's work and memory do not grow with
the documents, nor with the partitions beyond the manifest it reads and one small task per batch,
and the numbers are those of reading the partitions one by one.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from distributed import Client

from ..cluster import machines, runner
from ..cluster.progress import Progress
from ..errors import UserError
from ..format import v1
from ..format.v1 import Manifest
from ..storage.hubreaders import reading_plugins_for_run
from ..storage.location import Location
from ..wording import counted
from .config import InspectConfig
from .stats import PartRef, RunStats, Summary, combine_summaries, summarize_partitions

TASKS_PER_THREAD = 4
"""Batches per worker thread (a cluster still starting counts as 4 threads): enough for the faster
workers to take more, few enough that the scheduler's cost per task stays small."""
MIN_BATCH, MAX_BATCH = 4, 64
"""Partitions per task: a docs file is read in a few ms, a task costs the scheduler ~2-3 ms; a
batch at most streams ``stats.WINDOW`` partitions at once whatever its size."""
TASK_THREADS = 4
"""Threads a task reads its batch with: for a store's latency (s3://, the Hub), not for CPU."""
FAN_IN = 8


def inspect_on_cluster(config: InspectConfig, run: Location, manifest: Manifest, *,
                       announce: Callable[[str], None] = print) -> RunStats:
    """OUT's partitions (its manifest read by ``command.run_inspect``) read on the cluster the
    options name, or on a local one."""
    refs = [PartRef.of(e) for e in manifest.partitions]
    local_inputs = sorted({r.input for r in refs if machines.is_local_path(r.input)})
    out_files = [run.join(v1.MANIFEST), *(run.join(r.docs_file) for r in refs)]
    with runner.connect_to(config, announce=announce,
                           local_paths=[machines.reading_run("OUT", config.out, out_files)]) as client:
        unseen = _unseen_inputs(client, local_inputs)
        for hub in reading_plugins_for_run(manifest.input_identities(), manifest.extra):  # a --fetch workers run's inputs
            client.register_plugin(hub)
        announce(f"inspecting {counted(len(refs), 'partition')} of {config.out}")
        summary = summarize_on_cluster(client, refs, out=run.task_url,
                                       storage_options=config.storage_options, language_column=config.language_column,
                                       unseen_local_inputs=unseen,
                                       progress=Progress(len(refs), mode=config.progress, amount=None))
    return RunStats.of(summary, out=config.out, manifest=manifest, language_column=config.language_column)


def _unseen_inputs(client: Client, inputs: Sequence[str]) -> str | None:
    """Why the workers cannot read the run's local inputs for their language column (their
    machines see other files there than this one), or None. Not an error: the totals and lengths
    come from OUT; only the per-language counts need the inputs."""
    if not inputs:
        return None
    blind = machines.blind_machines(client, machines.reading_inputs(list(inputs), list(inputs)))
    for use, names in blind.items():
        return (f"the workers on {machines.listed(names)} do not see the input files this machine sees at {use.url}; "
                "put the inputs on s3:// or a filesystem every machine mounts")
    return None


def batch_size(partitions: int, threads: int) -> int:
    """Partitions per task: about ``TASKS_PER_THREAD`` tasks per thread, within the bounds."""
    want = math.ceil(partitions / (TASKS_PER_THREAD * max(threads, 4)))
    return max(MIN_BATCH, min(MAX_BATCH, want))


def summarize_on_cluster(client: Client, refs: list[PartRef], *, out: str, storage_options: dict,
                         language_column: str, unseen_local_inputs: str | None = None,
                         progress: Progress | None = None) -> Summary:
    """One task per batch of ``refs`` (in order), their summaries combined in a tree on the workers."""
    size = batch_size(len(refs), sum(client.nthreads().values()))
    batches = [refs[i:i + size] for i in range(0, len(refs), size)]
    leaves = runner.submit(client, summarize_partitions, batches, out=out, storage_options=storage_options,
                           language_column=language_column, threads=TASK_THREADS,
                           unseen_local_inputs=unseen_local_inputs)
    root = None
    try:
        root = runner.reduce_tree(client, leaves, combine_summaries, fan_in=FAN_IN)
        # Each batch's summary stays on the workers for its tree node; here only its progress counts.
        for batch, _ in runner.each_result(client, leaves, batches, explain=runner.failure(_describe_batch),
                                           fetch=False):
            if progress is not None:
                progress.update(items=len(batch))
        return runner.result_of(client, root, explain=lambda e: UserError(
            f"combining the partitions' summaries failed: {type(e).__name__}: {e}"))
    except BaseException:
        runner.drop([*leaves, *([root] if root is not None else [])])
        raise
    finally:
        if progress is not None:
            progress.close()


def _describe_batch(batch: list[PartRef]) -> str:
    return f"reading partitions {batch[0].index}..{batch[-1].index}"
