"""Shuffled and mixed exports: a seeded order over every document of one or more runs.

How it runs, all on the cluster (the client holds per-bucket and per-partition counts only):
1. validation documents per run, exactly as for an unshuffled export (``valsplit``);
2. for a run that contributes a partial epoch, the cut in its own seeded order: a token-weighted
   histogram of selection keys (4,096 bins, summed in a tree), then the candidates of the one
   bin the cut falls in, merged as validation candidates are;
3. a small frame, one row per document copy (sort key, source, epoch, input, row, partition,
   start, length: 46 bytes), built per group of (run, partition, epoch) and moved into
   key-range buckets (directly when it is small, else with Dask's shuffle), each bucket then
   sorted by the full key (``order.SORT_COLUMNS``); a bucket holds about one chunk of tokens
   and stays in worker memory;
4. every output chunk is a token range of buckets: its writer takes those buckets' rows and reads
   the documents' tokens from the part files, grouped by file, nearby ranges joined, in bounded
   batches (concurrent range requests on S3), and puts the bytes in place as an unshuffled
   export does.
"""
from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from distributed import Client

from ..cluster import runner
from ..errors import UserError
from ..format.export_record import SHUFFLED, ExportSource, Order
from ..format.reader import PartitionFiles, has_masks, open_manifest
from ..format.v1 import Manifest, PartitionEntry
from ..storage.hub.cache import free_bytes
from ..storage.location import Location
from ..wording import counted
from . import mix, order, valsplit
from .common import (export_record, finish, paths_used, prepare_dest, split_counts, split_validation, write_files,
                     written_files)
from .layout import PIECE_OPS, Chunk, Streams
from .valsplit import Threshold, id_hashes, is_val
from .view import DocView, coalesce  # noqa: F401 - coalesce: the shuffle's reads join nearby ranges (view.gather)
from .write import PartInfo, Source, Target, put_chunk, render, source_files, target_kind

SELECT_BITS = 12
"""The cut of a partial epoch is found in two passes: which of 2**12 key bins, then where in it."""
DIRECT_TASKS = 4096
"""Frames cut into at most this many (group, bucket) pieces skip Dask's shuffle (and importing
dask.dataframe on the client, ~0.4 s). With 64 MiB chunks and ~1,000-token documents that is
up to ~10 B tokens on a few threads, ~2 B on 64 (at least one group per thread)."""
FRAME_ROWS = 1_000_000
"""Rows (document copies, 46 bytes each) one task of the frame builds at most."""
MAX_PLANNED_PASSES = 65_536
"""(partition, pass) pieces the client plans at most: a mixture that repeats a small run very
often (``--tokens 1T`` of a 640k-token run) is refused instead of growing the client."""
FREE_DISK_KEPT = 2**30
"""A local export refuses to start unless its output leaves this much of the disk free."""
MAX_BUCKETS = 16_384
"""Keeps Dask's shuffle to at most this many output partitions (about 550 BT at 64 MiB chunks)."""
ROW = np.dtype([("key", "<i8"), ("src", "<i2"), ("epoch", "<i4"), ("input", "<i4"), ("row", "<i8"), ("part", "<i4"),
                ("start", "<i8"), ("length", "<i8")])
"""One document copy in the order's frame: 46 bytes."""
BUCKET = np.dtype([("src", "<i2"), ("part", "<i4"), ("start", "<i8"), ("length", "<i8")])
"""What a writer needs of each document of its buckets, in output order."""


@dataclass(frozen=True, kw_only=True)
class FrameTask:
    """One (run, partition, epoch) of the frame. ``cutoff``: only documents whose selection key
    is at most this (a partial epoch); ``with_val``: also the partition's validation documents."""

    src: int
    k: int
    part: PartInfo
    source: Source
    val_threshold: Threshold | None
    seed: int
    epoch: int
    with_val: bool
    cutoff: Threshold | None = None


@dataclass(frozen=True)
class Catalog:
    """Every run's part files (scattered once; each writer task reads what its buckets name)."""

    sources: tuple[Source, ...]
    entries: tuple[tuple[PartitionEntry, ...], ...]

    def files(self) -> list[PartitionFiles]:
        return [PartitionFiles(source.out, dtype=source.dtype, partitions=list(entries))
                for source, entries in zip(self.sources, self.entries)]


# -- worker side: documents and keys --------------------------------------------------------------
def _train_docs(src: int, k: int, part: PartInfo, source: Source, val_threshold: Threshold | None):
    """(docs, id hashes, val mask) of one partition, checked against what the client planned."""
    files = source_files(source, {k: part})
    docs = files.docs(k, columns=("id", "row", "start", "length"))
    hashes = id_hashes(docs.ids.to_pylist())
    val = is_val(hashes=hashes, input_ordinal=part.input_ordinal, rows=docs.rows, threshold=val_threshold)
    got = (int(val.sum()), int(docs.lengths[val].sum()))
    if got != (part.val_docs, part.val_tokens):
        raise UserError(f"{part.entry.docs_file}: {got[0]} validation documents ({got[1]} tokens) now, "
                        f"{part.val_docs} ({part.val_tokens}) when the export was planned; did {source.out.url} change? rerun export")
    return docs, hashes, val


def select_histogram(src: int, k: int, part: PartInfo, *, source: Source, val_threshold: Threshold | None,
                     seed: int) -> np.ndarray:
    """(2, 2**SELECT_BITS) int64: train documents and tokens per selection-key bin."""
    docs, hashes, val = _train_docs(src, k, part, source, val_threshold)
    q = order.keyed(hashes[~val], order.salt(seed=seed, purpose="select", source=src))
    bins = (q >> np.uint64(64 - SELECT_BITS)).astype(np.int64)
    lengths = docs.lengths[~val]
    return np.stack([np.bincount(bins, minlength=1 << SELECT_BITS),
                     np.bincount(bins, weights=lengths, minlength=1 << SELECT_BITS).astype(np.int64)])


def select_candidates(src: int, k: int, part: PartInfo, *, source: Source, val_threshold: Threshold | None,
                      seed: int, bin: int, need: int) -> np.ndarray:
    """This partition's train documents in selection bin ``bin`` that could be in the cut."""
    docs, hashes, val = _train_docs(src, k, part, source, val_threshold)
    q = order.keyed(hashes, order.salt(seed=seed, purpose="select", source=src))
    mask = ~val & ((q >> np.uint64(64 - SELECT_BITS)).astype(np.int64) == bin)
    return valsplit.candidates(hashes=q[mask], input_ordinal=part.input_ordinal, rows=docs.rows[mask],
                               lengths=docs.lengths[mask], part=k, val_tokens=need)


def doc_rows(task: FrameTask) -> np.ndarray:
    """The frame rows of one (run, partition, epoch), a ``ROW`` array."""
    docs, hashes, val = _train_docs(task.src, task.k, task.part, task.source, task.val_threshold)
    train = ~val
    if task.cutoff is not None:
        q = order.keyed(hashes, order.salt(seed=task.seed, purpose="select", source=task.src))
        train &= is_val(hashes=q, input_ordinal=task.part.input_ordinal, rows=docs.rows, threshold=task.cutoff)
    pieces = []
    if task.with_val and val.any():
        keys = order.keyed(hashes[val], order.salt(seed=task.seed, purpose="val", source=task.src))
        pieces.append((val, order.sort_keys(keys, "val"), 0))
    keys = order.keyed(hashes[train], order.salt(seed=task.seed, purpose="train", source=task.src, epoch=task.epoch))
    pieces.append((train, order.sort_keys(keys, "train"), task.epoch))
    out = []
    for mask, keys, epoch in pieces:
        rows = np.empty(int(mask.sum()), ROW)
        rows["key"], rows["src"], rows["epoch"], rows["input"] = keys, task.src, epoch, task.part.input_ordinal
        rows["row"], rows["part"], rows["start"], rows["length"] = docs.rows[mask], task.k, docs.starts[mask], docs.lengths[mask]
        out.append(rows)
    return np.concatenate(out) if len(out) > 1 else out[0]


def group_rows(tasks: tuple[FrameTask, ...]) -> np.ndarray:
    return np.concatenate([doc_rows(t) for t in tasks])


def final_order(rows: np.ndarray) -> np.ndarray:
    """A bucket's rows in their final order, by the full key (``order.SORT_COLUMNS``), so equal
    position keys never depend on which task's rows arrived first; only what writers need."""
    by = np.lexsort(tuple(rows[c] for c in reversed(order.SORT_COLUMNS)))
    out = np.empty(len(rows), BUCKET)
    for c in BUCKET.names:
        out[c] = rows[c][by]
    return out


def split_rows(tasks: tuple[FrameTask, ...], *, divisions: list[int]) -> tuple[np.ndarray, ...]:
    """A group's rows cut at the bucket boundaries (the direct path)."""
    rows = group_rows(tasks)
    bucket = np.searchsorted(np.asarray(divisions[1:-1], dtype=np.int64), rows["key"], side="right")
    by = np.argsort(bucket, kind="stable")
    rows, bucket = rows[by], bucket[by]
    cuts = np.searchsorted(bucket, np.arange(len(divisions)))
    return tuple(rows[a:b] for a, b in zip(cuts[:-1], cuts[1:]))


def bucket_of(*pieces: np.ndarray) -> np.ndarray:
    return final_order(np.concatenate(pieces))


def bucket_counts(rows) -> tuple[int, int]:
    return len(rows), int(np.asarray(rows["length"]).sum())


# -- worker side: writing ---------------------------------------------------------------------------
def write_shuffled_chunk(chunk: Chunk, target: Target, buckets: dict, *, catalog: Catalog,
                         dest_storage_options: dict) -> tuple[str, int, str]:
    """Worker task: render one chunk from its buckets' rows, put it in place."""
    files = catalog.files()
    views: dict = {}

    def view(k: int, split: str) -> DocView:
        if (split, k) not in views:
            # A BUCKET array (direct path) or the same columns as a DataFrame (Dask's shuffle).
            frame = buckets[(split, k)]
            views[(split, k)] = DocView(files, *(np.asarray(frame[c]) for c in BUCKET.names))
        return views[(split, k)]

    return put_chunk(render(chunk, view), chunk, target, dest_storage_options=dest_storage_options)


def chunk_buckets(chunk: Chunk) -> set[tuple[str, int]]:
    return {(op[2], op[1]) for _, _, ops in chunk.segments for op in ops if op[0] in PIECE_OPS}


# -- client side -------------------------------------------------------------------------------------
def _explain(what: str) -> Callable[[Exception], UserError]:
    return lambda e: UserError(f"{what} failed: {type(e).__name__}: {e}")


def _sum(*arrays: np.ndarray) -> np.ndarray:
    return np.sum(arrays, axis=0)


def topup_cutoff(client: Client, parts: list[PartInfo], *, src: int, source: Source, val_threshold: Threshold | None,
                 seed: int, need: int) -> tuple[Threshold, int, int]:
    """(cut, documents, tokens) of the shortest prefix of run ``src``'s selection order holding
    at least ``need`` train tokens."""
    kw = dict(source=source, val_threshold=val_threshold, seed=seed)
    what = f"choosing the documents of {source.out.url}"
    leaves = runner.submit(client, select_histogram, [src] * len(parts), range(len(parts)), parts, **kw)
    hist = runner.result_of(client, runner.reduce_tree(client, leaves, _sum), also_cancel=leaves, explain=_explain(what))
    cum = np.cumsum(hist[1])
    b = int(np.searchsorted(cum, need, side="left"))
    docs_before = int(hist[0][:b].sum())
    tokens_before = int(cum[b - 1]) if b else 0
    rest = need - tokens_before
    leaves = runner.submit(client, select_candidates, [src] * len(parts), range(len(parts)), parts, bin=b, need=rest, **kw)
    final = runner.result_of(client, runner.reduce_tree(client, leaves, valsplit.merge, val_tokens=rest),
                             also_cancel=leaves, explain=_explain(what))
    last = final[-1]
    cut = Threshold(hash=int(last["hash"]), input=int(last["input"]), row=int(last["row"]))
    return cut, docs_before + len(final), tokens_before + int(final["length"].sum())


def group_tasks(tasks: list[FrameTask], *, threads: int) -> list[tuple[FrameTask, ...]]:
    """Consecutive frame tasks, about ``FRAME_ROWS`` rows or a share of the threads each: Dask's
    shuffle costs tens of milliseconds per input partition, a partition's rows ~4 ms."""
    total = sum(t.part.entry.docs for t in tasks)
    per_group = min(FRAME_ROWS, max(1, math.ceil(total / max(1, threads))))
    groups, current, rows = [], [], 0
    for t in tasks:
        current.append(t)
        rows += t.part.entry.docs
        if rows >= per_group:
            groups.append(tuple(current))
            current, rows = [], 0
    if current:
        groups.append(tuple(current))
    return groups


def _frame_of(tasks: tuple[FrameTask, ...]):
    import pandas as pd

    return pd.DataFrame(group_rows(tasks))


def _bucket_of_frame(frame):
    import pandas as pd

    return pd.DataFrame(final_order(frame.reset_index().to_records(index=False)))


def sort_frame(client: Client, tasks: list[FrameTask], divisions: list[int]) -> list:
    """Futures of the buckets, in order. A small frame (``DIRECT_TASKS``) goes straight from
    its groups to the buckets (one task per group and bucket picks that group's piece); a large
    one through Dask's shuffle, which spills to disk and does not need a task per pair.
    Either way each bucket is then sorted by the full key: the bytes are the same."""
    groups = group_tasks(tasks, threads=sum(client.nthreads().values()))
    n = len(divisions) - 1
    if len(groups) * n <= DIRECT_TASKS:
        split = runner.submit(client, split_rows, groups, divisions=divisions)
        pieces = [[client.submit(operator.getitem, g, b, pure=False) for g in split] for b in range(n)]
        return [client.submit(bucket_of, *pieces[b], pure=False) for b in range(n)]
    import dask.dataframe as dd
    import pandas as pd

    meta = pd.DataFrame(np.empty(0, ROW))
    frame = dd.from_map(_frame_of, groups, meta=meta, enforce_metadata=False, label="tokenshards-order")
    ranged = frame.set_index("key", divisions=divisions)
    return client.compute(ranged.map_partitions(_bucket_of_frame, meta=pd.DataFrame(np.empty(0, BUCKET))).to_delayed())


@dataclass(frozen=True, kw_only=True)
class Run:
    """One input run of a shuffled export, as the client plans it."""

    index: int
    path: str
    manifest: Manifest
    source: Source
    parts: list[PartInfo]

    @property
    def tokens(self) -> int:
        return sum(p.entry.tokens for p in self.parts)


def open_runs(config) -> list[Run]:
    """Every run of the export; they must agree on what a token is and where eot goes."""
    runs = []
    for i, path in enumerate(config.runs):
        location, manifest = open_manifest(path, config.storage_options)
        entries = manifest.by_index()
        ordinal = {x.path: n for n, x in enumerate(manifest.input_records)}
        parts = [PartInfo(entry=e, input_ordinal=ordinal.get(e.input, -1)) for e in entries]
        source = Source(out=location, dtype=manifest.encoding.dtype, n_vocab=manifest.encoding.n_vocab,
                        job=manifest.done_job())
        runs.append(Run(index=i, path=path, manifest=manifest, source=source, parts=parts))
    first = runs[0]
    for run in runs[1:]:
        for key, ours, theirs in (("encoding", first.manifest.encoding.to_dict(), run.manifest.encoding.to_dict()),
                                  ("eot_position", first.manifest.eot_position, run.manifest.eot_position)):
            if ours != theirs:
                raise UserError(f"{first.path} and {run.path} differ in {key} ({ours} vs {theirs}); "
                                "mix only runs tokenized with the same encoding and --eot")
        if has_masks(first.manifest) != has_masks(run.manifest):
            chat, text = (first, run) if has_masks(first.manifest) else (run, first)
            raise UserError(f"{chat.path} is a chat run (an assistant mask per token) and {text.path} is not; "
                            "mix chat runs with chat runs, or export each alone")
    return runs


def check_request(runs, shares, names: list[str], *, total: int, val_tokens: int, dtype: str, per_bucket: int,
                  dest: Location) -> None:
    """Refuse, in one line and before any ordering, a mixture the client or the disk cannot hold."""
    pieces = sum(len(r.parts) * (s.epochs + (1 if s.remainder else 0)) for r, s in zip(runs, shares))
    if pieces > MAX_PLANNED_PASSES:
        worst = max(range(len(shares)), key=lambda i: shares[i].target / shares[i].available)
        share = shares[worst]
        raise UserError(f"--tokens {total:,} asks {share.target / share.available:,.0f} passes over {names[worst]} "
                        f"({share.available:,} train tokens): {pieces:,} pieces to order, over the {MAX_PLANNED_PASSES:,} "
                        "an export plans; ask fewer tokens, or tokenize more text")
    if total > MAX_BUCKETS * per_bucket:
        raise UserError(f"--tokens {total:,} is more than one export holds ({MAX_BUCKETS * per_bucket:,} tokens in "
                        f"{MAX_BUCKETS:,} chunks); export fewer tokens at a time")
    if dest.is_local:
        need = (total + val_tokens) * np.dtype(dtype).itemsize
        free = free_bytes(dest.root)
        if need + FREE_DISK_KEPT > free:
            raise UserError(f"not enough disk space for --to {dest.url}: the export needs ~{need / 1e9:,.1f} GB and 1 GB must "
                            f"stay free, but only {free / 1e9:,.1f} GB is free; free some space, export elsewhere, or "
                            "ask fewer --tokens")


def run_shuffled_export(config, *, lease, announce: Callable[[str], None] = print):
    """``export --shuffle`` and mixtures of several runs, while holding the ``lease`` of DEST (its
    ``location``); see the module docstring."""
    t0 = time.perf_counter()
    runs = open_runs(config)
    names = [r.path for r in runs]
    dtype = config.fmt.dtype(runs[0].manifest.encoding.dtype)
    plan = config.plan(runs[0].manifest, dtype=dtype)
    sizes = [r.tokens for r in runs]
    given = config.weights
    val_weights = mix.weights_of(given, sizes, names)
    val_split = mix.split_val(config.val_tokens, val_weights)
    for run, want, size in zip(runs, val_split, sizes):
        if want and want >= size:
            raise UserError(f"--val-tokens {config.val_tokens:,} asks {want:,} validation tokens of {run.path}, which holds "
                            f"{size:,}; pass a smaller --val-tokens (or 0 for no validation set)")

    dest = lease.location
    kind = target_kind(dest.fs)
    dest.check_bucket(what="export destination")
    if not config.overwrite:
        prepare_dest(dest, config)  # an earlier export there is refused at once
    seed = config.seed or 0

    with runner.connect_to(config, announce=announce,
                           local_paths=paths_used(config, [(r.source.out, r.manifest) for r in runs])) as client:
        thresholds = split_validation(client, runs, val_split, announce=announce)  # every run checked first
        if config.overwrite:
            prepare_dest(dest, config)  # the export it replaces goes once the runs read as they must
        val = [(sum(p.val_docs for p in r.parts), sum(p.val_tokens for p in r.parts)) for r in runs]
        available = [size - vt for size, (_, vt) in zip(sizes, val)]
        docs = [sum(p.entry.docs - p.val_docs for p in r.parts) for r in runs]
        weights = mix.weights_of(given, available, names)
        total = config.tokens if config.tokens is not None else mix.default_total(available, weights)
        shares = mix.shares(available=available, weights=weights, total=total, runs=names)
        check_request(runs, shares, names, total=total, val_tokens=sum(vt for _, vt in val), dtype=dtype,
                      per_bucket=max(1, config.chunk_bytes // np.dtype(dtype).itemsize), dest=dest)
        for name, share in zip(names, shares):
            passes = share.target / share.available
            if passes > 1:
                announce(f"{name}: {passes:.3g} passes over its {share.available:,} train tokens "
                         f"({share.epochs} whole, each document that many times{', then a top-up' if share.remainder else ''})")

        tasks: list[FrameTask] = []
        taken = []
        for run, share, threshold, d in zip(runs, shares, thresholds, docs):
            cutoff, top_docs, top_tokens = None, 0, 0
            if share.remainder:
                cutoff, top_docs, top_tokens = topup_cutoff(client, run.parts, src=run.index, source=run.source,
                                                            val_threshold=threshold, seed=seed, need=share.remainder)
            taken.append((share.epochs * d + top_docs, share.epochs * share.available + top_tokens))
            epochs = [(e, None) for e in range(share.epochs)] + ([(share.epochs, cutoff)] if cutoff else [])
            for k, part in enumerate(run.parts):
                for e, cut in epochs:
                    tasks.append(FrameTask(src=run.index, k=k, part=part, source=run.source, val_threshold=threshold,
                                           seed=seed, epoch=e, with_val=e == 0, cutoff=cut))

        per_bucket = max(1, config.chunk_bytes // np.dtype(dtype).itemsize)
        val_tokens = sum(vt for _, vt in val)
        train_tokens = sum(t for _, t in taken)
        n_val = min(MAX_BUCKETS, math.ceil(val_tokens / per_bucket)) if val_tokens else 0
        n_train = min(MAX_BUCKETS, max(1, math.ceil(train_tokens / per_bucket)))
        announce(f"ordering {counted(sum(d for d, _ in taken) + sum(d for d, _ in val), 'document')} of "
                 f"{counted(len(runs), 'run')} (seed {seed}) into {counted(n_val + n_train, 'bucket')}")
        buckets = sort_frame(client, tasks, order.divisions(val_buckets=n_val, train_buckets=n_train))
        try:
            labels = [f"bucket {b} of the order" for b in range(len(buckets))]
            counts = runner.gather(client, runner.submit(client, bucket_counts, buckets), labels,
                                   explain=lambda name, e: UserError(f"ordering documents ({name}) failed: {type(e).__name__}: {e}"))
            counts = np.array(counts, dtype=np.int64).reshape(-1, 2)

            def bounds(x):
                return np.concatenate([[0], np.cumsum(x, dtype=np.int64)]).astype(np.int64)

            streams = Streams(doc_bounds={"val": bounds(counts[:n_val, 0]), "train": bounds(counts[n_val:, 0])},
                              token_bounds={"val": bounds(counts[:n_val, 1]), "train": bounds(counts[n_val:, 1])})
            planned = {"val": (sum(d for d, _ in val), val_tokens), "train": (sum(d for d, _ in taken), train_tokens)}
            for split, (d, t) in planned.items():
                if (streams.docs(split), streams.tokens(split)) != (d, t):
                    raise RuntimeError(f"ordered {streams.docs(split)} {split} documents ({streams.tokens(split)} tokens), "
                                       f"planned {d} ({t}); did a run change during the export? rerun it")
            announce(f"validation: {streams.docs('val'):,} documents, {streams.tokens('val'):,} tokens; "
                     f"train: {streams.docs('train'):,} documents, {streams.tokens('train'):,} tokens")
            files = config.fmt.files(streams, plan)
            catalog = client.scatter(Catalog(sources=tuple(r.source for r in runs),
                                             entries=tuple(tuple(p.entry for p in r.parts) for r in runs)), hash=False)
            by_name = {("val", b): buckets[b] for b in range(n_val)}
            by_name.update({("train", b): buckets[n_val + b] for b in range(n_train)})

            def submit(chunks: list[Chunk], targets: list[Target]):
                needed = [{name: by_name[name] for name in sorted(chunk_buckets(c))} for c in chunks]
                return runner.submit(client, write_shuffled_chunk, chunks, targets, needed, catalog=catalog,
                                     dest_storage_options=config.storage_options)

            write_files(client, files, streams, submit=submit, dest=dest, kind=kind, config=config, announce=announce)
        finally:
            # Released, not cancelled: cancelling finished futures that finished tasks consumed trips
            # an assertion in distributed's scheduler (see cluster/runner.result_of).
            for future in buckets:
                future.release()

    record = export_record(
        config, runs[0].manifest, kind=SHUFFLED, dtype=dtype, source=runs[0].path if len(runs) == 1 else None,
        val_selection="per run, whole documents with the smallest blake2b-64(id), ties by (input, row), until its "
                      "share of val_tokens (by weight) is reached",
        order=Order(seed=seed, key="murmur3 fmix64(blake2b-64(id) xor salt(seed, split, run, epoch)), "
                                   "ties by (run, epoch, input, row)"),
        tokens_requested=config.tokens, train_tokens_target=total,
        sources=tuple(ExportSource(path=r.path, source_job=r.manifest.job, weight=float(s.weight), tokens=t, documents=d,
                                   epochs=round(t / s.available, 6), full_epochs=s.epochs, val_tokens=vt, val_documents=vd)
                      for r, s, (d, t), (vd, vt) in zip(runs, shares, taken, val)),
        splits=split_counts(streams), files=written_files(files))
    notes = [f"{s.path}: weight {s.weight:.4g}, {s.tokens:,} train tokens ({counted(s.documents, 'document')}, "
             f"{s.epochs:.3g} epochs)" for s in record.sources] if len(runs) > 1 else []
    return finish(config, record=record, files=files, streams=streams, plan=plan, lease=lease, notes=notes, t0=t0)
