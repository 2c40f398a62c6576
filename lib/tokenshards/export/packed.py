"""Row exports: packed sequences (``--seq-len N``: ``formats.PACKED`` and ``formats.PACKED_IN_TRAINER_FILES``) and ``--format hf``.

How it runs (the client holds counts per partition and one shard's row list at a time):
1. validation documents per run, as every export chooses them (``valsplit``);
2. one task per (run, partition) packs that partition's validation and train documents
   (``pack.py``; plain ``concat`` also reads the next partitions' lengths for its last window,
   so only the stream's tail is left over) and keeps the packing in worker memory; the client
   gathers the counts;
3. the rows of each split are the runs' sequences (a mixture's epochs and top-up), in the
   stream's order or permuted by the seed (``pack.sequence_order``: what is shuffled is whole
   sequences); each output shard is a range of rows: small tasks pick its sequences out of the
   partitions' packings, one task writes the shard row group by row group (parquet) or row
   batch by row batch (npy), reading the tokens from the part files as the other exports do;
   ``megatron`` and ``olmo`` write one file per split (their readers take it whole), so one task
   writes each split, in the same batches;
4. local files are written as ``NAME.<uuid>.tmp`` and renamed by the client once all are in;
   other stores get uncommitted uploads (``autocommit=False``) committed by their task; the
   export record, written last, is the commit point either way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import crashpoints
from ..cluster import runner
from ..cluster.progress import Progress
from ..errors import UserError
from ..format.export_record import ROWS, ExportFile, ExportSource, Order, PackedRows, SplitCounts
from ..storage.location import Location
from ..storage.store import temporary_beside
from ..wording import counted
from . import mix, order
from .common import (ExportSummary, begin_commits, end_commits, export_record, in_dest, prepare_dest, paths_used,
                     split_validation)
from .formats import base as format_base
from .formats import PACKED_IN_TRAINER_FILES, hf, megatron, olmo
from .formats.megatron import packed_index
from .formats.npy import header
from .formats.olmo import packed_documents, packed_names
from .pack import Copies, PackSpec, Packing, pack, position_ids, ranges, segments, sequence_order
from .shuffle import Catalog, open_runs
from ..format.reader import MaskFiles, has_masks
from .view import gather
from .write import PartInfo, Source, partition_view, source_files

SPLITS = ("val", "train")
ROW_GROUP_TOKENS = 1 << 20
"""Tokens a writer holds at a time (one parquet row group, one npy batch): ~4 MB of int32 ids."""


# -- worker side ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pieces:
    """A split's packing in one partition, its pieces located in the part files: piece i is tokens
    [start[i], start[i] + length[i]) of partition part[i]; sequence j is pieces [bounds[j], bounds[j+1])."""

    part: np.ndarray
    start: np.ndarray
    length: np.ndarray
    bounds: np.ndarray
    docs: int
    """Documents of the split in this partition (whether packed whole, cut or dropped)."""
    doc_tokens: int
    dropped: int

    @property
    def sequences(self) -> int:
        return len(self.bounds) - 1


@dataclass(frozen=True)
class PackedPart:
    src: int
    k: int
    splits: dict


@dataclass(frozen=True)
class Block:
    """Sequences of one partition going to one shard, with their row in it."""

    src: int
    part: np.ndarray
    start: np.ndarray
    length: np.ndarray
    bounds: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True, kw_only=True)
class ShardTask:
    """One output shard: what it is called, what it holds, how rows look."""

    fmt: str
    name: str
    """hf: the parquet file; npy: the shard's stem (``npy_names``)."""
    prefix: str
    index: int
    split: str
    rows: int
    seq_len: int | None
    columns: tuple[str, ...]
    pad_id: int
    dtype: str
    dest: Location
    mask: bool = False
    """A chat run's: ``labels`` are -100 outside the assistant's tokens (hf), and npy gets a mask file."""
    label_mask: bool = False
    """olmo and npy: write the loss mask (False on padding, and outside a chat run's assistant mask)."""


def pack_part(src: int, k: int, part: PartInfo, following: dict, *, source: Source, threshold, spec: PackSpec,
              windows: dict) -> PackedPart:
    """Worker task: one partition's validation and train documents packed (see the module docstring)."""
    parts = {k: part, **{k2: p2 for split in SPLITS for k2, p2 in following.get(split, ())}}
    files = source_files(source, parts)
    views = {kk: partition_view(files, kk, parts[kk], threshold) for kk in parts}
    out = {}
    for split in SPLITS:
        chain = [(k, views[k][split])] + [(k2, views[k2][split]) for k2, _ in following.get(split, ())]
        own = views[k][split]
        lengths = np.concatenate([v.length for _, v in chain]).astype(np.int64)
        starts = np.concatenate([v.start for _, v in chain]).astype(np.int64)
        part_of = np.concatenate([np.full(len(v.length), kk, np.int64) for kk, v in chain])
        first, own_tokens = windows.get(split, (0, None))
        p: Packing = pack(lengths, spec, first=first, own=own_tokens)
        out[split] = Pieces(part=part_of[p.doc], start=starts[p.doc] + p.offset, length=p.length, bounds=p.bounds,
                            docs=len(own.length), doc_tokens=int(own.length.sum()), dropped=p.dropped)
    return PackedPart(src=src, k=k, splits=out)


def part_counts(packed: PackedPart) -> np.ndarray:
    """(2, 5) int64, val then train: sequences, tokens in them, documents, document tokens, dropped."""
    return np.array([[p.sequences, int(p.length.sum()), p.docs, p.doc_tokens, p.dropped]
                     for p in (packed.splits[s] for s in SPLITS)], dtype=np.int64)


def select(packed: PackedPart, split: str, seqs: np.ndarray, rows: np.ndarray) -> Block:
    """Worker task: sequences ``seqs`` of a partition's packing, bound for rows ``rows`` of a shard."""
    p = packed.splits[split]
    counts = p.bounds[seqs + 1] - p.bounds[seqs]

    idx = ranges(p.bounds[seqs], counts)
    return Block(src=packed.src, part=p.part[idx], start=p.start[idx], length=p.length[idx],
                 bounds=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), rows=np.asarray(rows, np.int64))


def _in_order(blocks: tuple[Block, ...], n_rows: int):
    """(src, part, start, length, bounds) of a shard's pieces in row order."""

    src = np.concatenate([np.full(len(b.length), b.src, np.int64) for b in blocks])
    part, start, length = (np.concatenate([getattr(b, c) for b in blocks]) for c in ("part", "start", "length"))
    base = np.cumsum([0] + [len(b.length) for b in blocks])[:-1]
    first = np.concatenate([b.bounds[:-1] + o for b, o in zip(blocks, base)])
    count = np.concatenate([np.diff(b.bounds) for b in blocks])
    rows = np.concatenate([b.rows for b in blocks])
    if len(rows) != n_rows or not np.array_equal(np.sort(rows), np.arange(n_rows)):
        raise RuntimeError(f"a shard's sequences do not cover its {n_rows} rows exactly once")
    by = np.argsort(rows)
    idx = ranges(first[by], count[by])
    bounds = np.concatenate([[0], np.cumsum(count[by])]).astype(np.int64)
    return src[idx], part[idx], start[idx], length[idx], bounds


@contextlib.contextmanager
def _output(dest: Location, name: str, written: list):
    """DEST's file ``name`` being written: locally ``NAME.<uuid>.tmp`` (renamed by the client),
    elsewhere an upload committed only when the block ends without error."""
    path = dest.join(name)
    if dest.is_local:
        tmp = temporary_beside(path)
        try:
            with open(tmp, "wb") as f:
                yield f
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        written.append((path, tmp))
        return
    f = dest.fs.open(path, "wb", autocommit=False)
    try:
        yield f
    except BaseException:
        with contextlib.suppress(Exception):
            f.discard()
        raise
    f.commit()
    written.append((path, ""))


def write_shard(task: ShardTask, *blocks: Block, catalog: Catalog) -> tuple[list, int, int]:
    """Worker task: one shard, in batches of ~``ROW_GROUP_TOKENS``; returns (files written as
    (path, temporary), rows, tokens in them)."""
    files = catalog.files()
    src, part, start, length, bounds = _in_order(blocks, task.rows)
    filled = np.add.reduceat(np.r_[length, 0], bounds[:-1])[:task.rows] if task.rows else np.zeros(0, np.int64)
    filled = np.where(np.diff(bounds) > 0, filled, 0).astype(np.int64)
    if task.seq_len:
        per = max(1, ROW_GROUP_TOKENS // task.seq_len)
        cuts = list(range(0, task.rows, per)) + [task.rows]
    else:  # documents: batches of about ROW_GROUP_TOKENS, at least one row each
        reach = np.cumsum(filled)
        cuts, r = [0], 0
        while r < task.rows:
            r = max(r + 1, int(np.searchsorted(reach, (reach[r - 1] if r else 0) + ROW_GROUP_TOKENS, side="right")))
            cuts.append(min(r, task.rows))

    masks = [MaskFiles(f) for f in files] if task.mask else None

    def batches():
        for r0, r1 in zip(cuts[:-1], cuts[1:]):
            p0, p1 = int(bounds[r0]), int(bounds[r1])
            tokens = gather(files, src[p0:p1], part[p0:p1], start[p0:p1], start[p0:p1] + length[p0:p1])
            if masks is not None:  # the assistant mask rides with the tokens (``_rows_of``)
                tokens = Masked(tokens, gather(masks, src[p0:p1], part[p0:p1], start[p0:p1], start[p0:p1] + length[p0:p1]))
            yield r0, r1, p0, p1, tokens

    written: list = []
    write = {"hf": _write_parquet, "megatron": _write_megatron, "olmo": _write_olmo}.get(task.fmt, _write_npy)
    write(task.dest, task, batches(), length, bounds, filled, written)
    return written, task.rows, int(filled.sum())


class Masked(np.ndarray):
    """A batch's tokens with their assistant mask (``.mask``, uint8) attached: a chat run's."""

    def __new__(cls, tokens: np.ndarray, mask: np.ndarray):
        out = np.asarray(tokens).view(cls)
        out.mask = np.asarray(mask)
        return out

    def __array_finalize__(self, obj):
        self.mask = getattr(obj, "mask", None)


def _labels(ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """``labels`` of a batch's flat ids: the ids where the loss is taken, -100 elsewhere."""
    return ids if mask is None else np.where(mask.astype(bool), ids, hf.LABEL_IGNORE)


def _rows_of(task: ShardTask, r0: int, r1: int, p0: int, length: np.ndarray, bounds: np.ndarray, filled: np.ndarray,
             tokens: np.ndarray) -> dict[str, np.ndarray]:
    """The batch's columns as 2-D arrays (packed) or flat with offsets (documents)."""
    n, seq_len = r1 - r0, task.seq_len
    fill = filled[r0:r1]
    ids = np.full((n, seq_len), task.pad_id, dtype=np.int64)

    at = ranges(np.arange(n, dtype=np.int64) * seq_len, fill)
    ids.reshape(-1)[at] = tokens
    cols = {"input_ids": ids}
    b = bounds[r0:r1 + 1] - p0
    piece_len = length[p0:p0 + int(b[-1])]
    if "position_ids" in task.columns:
        cols["position_ids"] = position_ids(piece_len, b, seq_len)
    if getattr(tokens, "mask", None) is not None:
        train = np.zeros((n, seq_len), dtype=np.uint8)
        train.reshape(-1)[at] = tokens.mask
        cols["mask"] = train
    if "attention_mask" in task.columns or "labels" in task.columns:
        real = _real(n, seq_len, fill)
        if "attention_mask" in task.columns:
            cols["attention_mask"] = real.astype(np.int8)
        if "labels" in task.columns:
            labels = np.where(real if "mask" not in cols else real & (cols["mask"] == 1), ids, hf.LABEL_IGNORE)
            # no loss on a document's first token: it would be predicted from another document (TRL's
            # padding-free collator and DataCollatorWithFlattening take none there either)
            piece_at = np.concatenate([[0], np.cumsum(piece_len)[:-1]]).astype(np.int64)
            row_of = np.repeat(np.arange(n), np.diff(b))
            row_start = np.concatenate([[0], np.cumsum(fill)[:-1]])
            labels.reshape(-1)[row_of * seq_len + piece_at - row_start[row_of]] = hf.LABEL_IGNORE
            cols["labels"] = labels
    return cols


def _real(n: int, seq_len: int, fill: np.ndarray) -> np.ndarray:
    """(n, seq_len) bool: True on a row's tokens, False on its padding."""
    real = np.zeros((n, seq_len), dtype=bool)
    real.reshape(-1)[ranges(np.arange(n, dtype=np.int64) * seq_len, fill)] = True
    return real


def _write_parquet(dest: Location, task: ShardTask, batches, length, bounds, filled, written: list) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    packed = task.seq_len is not None
    schema = hf.schema(task.columns, packed=packed)

    def lists(values: np.ndarray, offsets: np.ndarray, kind) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, kind))

    with _output(dest, shard_names(task)["rows"], written) as f:
        with pq.ParquetWriter(f, schema, compression="zstd") as writer:
            for r0, r1, p0, p1, tokens in batches:
                if packed:
                    cols = _rows_of(task, r0, r1, p0, length, bounds, filled, tokens)
                    n = r1 - r0
                    offsets = np.arange(n + 1, dtype=np.int64) * task.seq_len
                    arrays = {name: lists(a.reshape(-1), offsets, schema.field(name).type.value_type)
                              for name, a in cols.items() if name in schema.names}
                    seg_len, seg_bounds = segments(length[p0:p1], bounds[r0:r1 + 1] - p0, task.seq_len)
                    arrays["seq_lengths"] = lists(seg_len, seg_bounds, pa.int32())
                else:
                    offsets = np.concatenate([[0], np.cumsum(filled[r0:r1])])
                    ids = np.asarray(tokens).astype(np.int64)
                    arrays = {"input_ids": lists(ids, offsets, pa.int32())}
                    if "labels" in schema.names:  # a chat run's documents: the loss on the assistant's tokens alone
                        arrays["labels"] = lists(_labels(ids, getattr(tokens, "mask", None)), offsets, pa.int32())
                writer.write_table(pa.table([arrays[name] for name in schema.names], schema=schema),
                                   row_group_size=max(1, r1 - r0))


def npy_names(prefix: str, split: str, index: int, columns: tuple[str, ...]) -> dict[str, str]:
    """A packed npy shard's files: the (rows, N) ids, each row's segment lengths (``pack.segments``:
    its documents, then its padding; flat, with an index of where each row's start), position ids
    when asked, and the loss mask where some token is not trained (best-fit's padding, a chat run's)."""
    base = f"{prefix}_{split}_{index:06d}"
    names = {"input_ids": f"{base}.npy", "seq_lengths": f"{base}.seq_lengths.npy", "seq_index": f"{base}.seq_index.npy"}
    if "position_ids" in columns:
        names["position_ids"] = f"{base}.position_ids.npy"
    if "mask" in columns:
        names["mask"] = f"{base}.mask.npy"
    return names


def shard_names(task: ShardTask) -> dict[str, str]:
    """The files (names inside DEST, by what each holds) a shard's writer makes: the one list the
    writers and the client's unfinished-export note (``begin_commits``) both read."""
    if task.fmt == "hf":
        return {"rows": task.name}
    if task.fmt == "megatron":
        return {"bin": f"{task.name}.bin", "idx": f"{task.name}.idx"}
    if task.fmt == "olmo":
        return packed_names(task.prefix, task.split, label_mask=task.label_mask)
    return npy_names(task.prefix, task.split, task.index,
                     task.columns + (("mask",) if task.mask or task.label_mask else ()))


def _write_npy(dest: Location, task: ShardTask, batches, length, bounds, filled, written: list) -> None:
    names = shard_names(task)
    n, seq_len = task.rows, task.seq_len
    with contextlib.ExitStack() as stack:
        out = {key: stack.enter_context(_output(dest, name, written)) for key, name in names.items()}
        out["input_ids"].write(_npy_header(task.dtype, (n, seq_len)))
        if "position_ids" in out:
            out["position_ids"].write(_npy_header("<i4", (n, seq_len)))
        if "mask" in out:
            out["mask"].write(_npy_header("|u1", (n, seq_len)))
        for r0, r1, p0, p1, tokens in batches:
            cols = _rows_of(task, r0, r1, p0, length, bounds, filled, tokens)
            out["input_ids"].write(cols["input_ids"].astype(task.dtype).tobytes())
            if "position_ids" in out:
                out["position_ids"].write(cols["position_ids"].astype("<i4").tobytes())
            if "mask" in out:  # a chat run's assistant mask (0 on padding), else 1 on the tokens
                loss = cols["mask"] if "mask" in cols else _real(r1 - r0, task.seq_len, filled[r0:r1])
                out["mask"].write(loss.astype("|u1").tobytes())
        seg_len, seg_bounds = segments(length, bounds, task.seq_len)
        out["seq_lengths"].write(header(dtype="<i4", count=len(seg_len)) + seg_len.astype("<i4").tobytes())
        out["seq_index"].write(header(dtype="<i8", count=len(seg_bounds)) + seg_bounds.astype("<i8").tobytes())


def _write_megatron(dest: Location, task: ShardTask, batches, length, bounds, filled, written: list) -> None:
    """``NAME.bin``: the rows back to back; ``NAME.idx``: one document of N tokens per row."""
    names = shard_names(task)
    with _output(dest, names["bin"], written) as out:
        for r0, r1, p0, p1, tokens in batches:
            out.write(_rows_of(task, r0, r1, p0, length, bounds, filled, tokens)["input_ids"].astype(task.dtype).tobytes())
    with _output(dest, names["idx"], written) as out:
        for chunk in packed_index(dtype=task.dtype, rows=task.rows, seq_len=task.seq_len):
            out.write(chunk)


def _write_olmo(dest: Location, task: ShardTask, batches, length, bounds, filled, written: list) -> None:
    """``SPLIT/PREFIX.npy``: the rows back to back, headerless; ``.csv.gz``: every piece's start,end in
    it; ``SPLIT/label_mask/PREFIX.npy`` when asked: True where the loss is taken."""
    names = shard_names(task)
    n_tokens = task.rows * task.seq_len
    with contextlib.ExitStack() as stack:
        out = {key: stack.enter_context(_output(dest, name, written)) for key, name in names.items()}
        for r0, r1, p0, p1, tokens in batches:
            cols = _rows_of(task, r0, r1, p0, length, bounds, filled, tokens)
            out["input_ids"].write(cols["input_ids"].astype(task.dtype).tobytes())
            b = bounds[r0:r1 + 1] - p0
            piece_len = length[p0:p1].astype(np.int64)
            cum = np.concatenate([[0], np.cumsum(piece_len)]).astype(np.int64)
            counts = np.diff(b)
            rows = np.repeat(np.arange(r0, r1, dtype=np.int64), counts)
            starts = rows * task.seq_len + cum[:-1] - np.repeat(cum[b[:-1]], counts)
            out["documents"].write(packed_documents(starts, starts + piece_len, tokens=n_tokens))
            if "label_mask" in out:
                real = _real(r1 - r0, task.seq_len, filled[r0:r1])
                if "mask" in cols:
                    real &= cols["mask"] == 1
                out["label_mask"].write(real.tobytes())


def _npy_header(dtype: str, shape: tuple) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": shape})
    return buf.getvalue()


# -- client side ------------------------------------------------------------------------------------
def _explain(what: str) -> Callable:
    return lambda item, e: UserError(f"{what} failed: {type(e).__name__}: {e}")


def _bounds(x) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(x, dtype=np.int64))]).astype(np.int64)


def concat_windows(tokens: np.ndarray, seq_len: int) -> tuple[list, list]:
    """For plain concat: per partition, (where its first window starts, its own tokens), and the
    partitions after it whose documents its last window reaches into."""
    b = _bounds(tokens)
    windows, following = [], []
    for k in range(len(tokens)):
        first = int(-b[k] % seq_len)
        windows.append((first, int(tokens[k])))
        last_start = b[k] + first + ((int(tokens[k]) - first - 1) // seq_len) * seq_len if tokens[k] > first else None
        reach = []
        if last_start is not None:
            end = last_start + seq_len
            k2 = k + 1
            while k2 < len(tokens) and b[k2] < end:
                reach.append(k2)
                k2 += 1
        following.append(reach)
    return windows, following


def run_packed_export(config, *, lease, announce: Callable[[str], None] = print) -> ExportSummary:
    """A packed export, or an hf one, while holding DEST's ``lease``; see the module docstring."""
    t0 = time.perf_counter()
    runs = open_runs(config)
    names = [r.path for r in runs]
    manifest = runs[0].manifest
    spec = PackSpec(seq_len=config.seq_len, mode=config.pack_mode, bos_align=config.bos_align)
    enc = manifest.encoding
    dtype = config.fmt.dtype(enc.dtype) if config.format != "hf" else enc.dtype
    columns = config.extra_columns if config.format not in PACKED_IN_TRAINER_FILES else ()
    mask = has_masks(manifest)
    if (mask or (spec.packed and spec.mode == "best-fit")) and config.format == "hf" and "labels" not in columns:
        columns = (*columns, "labels")  # a chat run trains on the assistant alone; best-fit's padding is never a target
    pad_id = _trainer_pad(manifest) if config.format in PACKED_IN_TRAINER_FILES else _pad(manifest)
    sizes = [r.tokens for r in runs]
    val_split = mix.split_val(config.val_tokens, mix.weights_of(config.weights, sizes, names))
    for run, want, size in zip(runs, val_split, sizes):
        if want and want >= size:
            raise UserError(f"--val-tokens {config.val_tokens:,} asks {want:,} validation tokens of {run.path}, which holds "
                            f"{size:,}; pass a smaller --val-tokens (or 0 for no validation set)")
    dest = lease.location
    dest.check_bucket(what="export destination")
    prepare_dest(dest, config)
    _check_card(dest, config)
    seed = config.seed or 0

    with runner.connect_to(config, announce=announce,
                           local_paths=paths_used(config, [(r.source.out, r.manifest) for r in runs])) as client:
        thresholds = split_validation(client, runs, val_split)

        announce(f"packing {counted(sum(len(r.parts) for r in runs), 'partition')} of {counted(len(runs), 'run')}"
                 + (f" into sequences of {config.seq_len:,} tokens ({spec.mode}{', BOS-aligned' if spec.bos_align else ''})"
                    if spec.packed else " into document rows"))
        packed: list[list] = []
        for run, threshold in zip(runs, thresholds):
            windows = [{} for _ in run.parts]
            following = [{} for _ in run.parts]
            if spec.packed and spec.mode == "concat" and not spec.bos_align:
                for split in SPLITS:
                    toks = np.array([p.val_tokens if split == "val" else p.entry.tokens - p.val_tokens for p in run.parts])
                    w, f = concat_windows(toks, config.seq_len)
                    for k in range(len(run.parts)):
                        windows[k][split] = w[k]
                        following[k][split] = [(k2, run.parts[k2]) for k2 in f[k]]
            packed.append([client.submit(pack_part, run.index, k, p, following[k], source=run.source,
                                         threshold=threshold, spec=spec, windows=windows[k], pure=False)
                           for k, p in enumerate(run.parts)])
        try:
            return _write(client, config, runs, packed, spec=spec, columns=columns, pad_id=pad_id, dtype=dtype, seed=seed,
                          lease=lease, t0=t0, announce=announce)
        finally:
            for futures in packed:
                runner.drop(futures)


def _write(client, config, runs, packed, *, spec: PackSpec, columns, pad_id: int, dtype: str, seed: int, lease, t0: float,
           announce) -> ExportSummary:
    dest = lease.location
    names = [r.path for r in runs]
    mask = has_masks(runs[0].manifest)
    all_futures = [f for fs in packed for f in fs]
    labels = [f"packing partition {k} of {r.path}" for r in runs for k in range(len(r.parts))]
    counts = runner.gather(client, [client.submit(part_counts, f, pure=False) for f in all_futures], labels,
                           explain=_explain("packing"))
    per_run, at = [], 0
    for r in runs:
        per_run.append(np.array(counts[at:at + len(r.parts)], dtype=np.int64).reshape(len(r.parts), 2, 5))
        at += len(r.parts)
    seq_bounds = {split: [_bounds(c[:, i, 0]) for c in per_run] for i, split in enumerate(SPLITS)}
    sequences = {split: [int(b[-1]) for b in seq_bounds[split]] for split in SPLITS}
    if not sum(sequences["train"]):
        raise UserError(f"no train {'sequence of ' + format(config.seq_len, ',') + ' tokens' if spec.packed else 'rows'} "
                        f"in {', '.join(names)}: pass a smaller --seq-len or --val-tokens")

    # Which copies of each run's sequences each split holds (a mixture weighs runs by sequences).
    copies = {"val": [Copies(sequences=s) for s in sequences["val"]]}
    if len(runs) > 1 or config.weights is not None or config.tokens is not None:
        available = sequences["train"]
        weights = mix.weights_of(config.weights, available, names)
        total = -(-config.tokens // config.seq_len) if config.tokens is not None else mix.default_total(available, weights)
        shares = mix.shares(available=available, weights=weights, total=total, runs=names)
        copies["train"] = [Copies(sequences=s.available, epochs=s.epochs, extra=s.remainder,
                                  salt=int(order.salt(seed=seed, purpose="packed-select", source=r)))
                           for r, s in enumerate(shares)]
    else:
        copies["train"] = [Copies(sequences=s) for s in sequences["train"]]
    salts = {split: (order.salt(seed=seed, purpose=f"packed-{split}") if config.shuffled else None) for split in SPLITS}

    rows_total = {split: sum(c.total for c in copies[split]) for split in SPLITS}
    shards: list[tuple[ShardTask, int, int]] = []
    for split in SPLITS:
        n = rows_total[split]
        if not n:
            continue
        if config.format in PACKED_IN_TRAINER_FILES:
            per = least = n
        elif spec.packed:
            per = max(1, config.shard_size // config.seq_len)
            least = config.min_shard_size // config.seq_len
        else:
            docs = sum(int(c[:, SPLITS.index(split), 0].sum()) for c in per_run)
            toks = sum(int(c[:, SPLITS.index(split), 1].sum()) for c in per_run)
            per = max(1, round(config.shard_size * docs / max(toks, 1)))
            least = round(config.min_shard_size * docs / max(toks, 1))
        lo = 0
        for i, size in enumerate(format_base.shard_sizes(n, shard_tokens=per, min_shard_tokens=least)):
            name = (hf.shard_name(config.name_prefix, split, i) if config.format == "hf"
                    else _trainer_stem(config.format, config.name_prefix, split) if config.format in PACKED_IN_TRAINER_FILES
                    else f"{config.name_prefix}_{split}_{i:06d}")
            shards.append((ShardTask(fmt=config.format, name=name, prefix=config.name_prefix, index=i, split=split, rows=size, seq_len=spec.seq_len,
                                     columns=columns, pad_id=pad_id, dtype=dtype, dest=dest, mask=mask,
                                     label_mask=_label_mask(config, spec, runs[0].manifest)), lo, lo + size))
            lo += size

    # Before the first shard can appear: on an object store each is committed by its worker as it
    # ends, so the note listing them all (``begin_commits``) must be there first, for a rerun after a
    # kill to know them as this export's own (locally the client renames them after, in order).
    listed = {dest.join(name) for task, _, _ in shards for name in shard_names(task).values()}
    begin_commits(dest, config, sorted(listed))
    catalog = client.scatter(Catalog(sources=tuple(r.source for r in runs),
                                     entries=tuple(tuple(p.entry for p in r.parts) for r in runs)), hash=False)
    futures, tasks = [], []
    for task, lo, hi in shards:
        run, seq = sequence_order(lo, hi, copies[task.split], salt=salts[task.split])
        rows = np.arange(hi - lo, dtype=np.int64)
        blocks = []
        for r in np.unique(run).tolist():
            mine = run == r
            sb = seq_bounds[task.split][r]
            k = np.searchsorted(sb, seq[mine], side="right") - 1
            by = np.argsort(k, kind="stable")
            ks, local, where = k[by], (seq[mine] - sb[k])[by], rows[mine][by]
            cuts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1], True]).tolist()
            for a, b in zip(cuts[:-1], cuts[1:]):
                blocks.append(client.submit(select, packed[r][int(ks[a])], task.split, local[a:b], where[a:b], pure=False))
        futures.append(client.submit(write_shard, task, *blocks, catalog=catalog, pure=False))
        tasks.append(task)
    announce(f"writing {counted(len(tasks), 'shard')} to {config.to}")
    written, got, carried = [], {s: [0, 0] for s in SPLITS}, {}
    progress = Progress(len(tasks), mode=config.progress, unit="shards", amount=None)
    for task, (files, rows, tokens) in runner.each_result(client, futures, tasks, progress=progress,
                                                          explain=_explain(f"writing {config.to}")):
        written.extend(files)
        main = {"hf": task.name, "megatron": f"{task.name}.bin"}.get(task.fmt, f"{task.name}.npy")
        carried[dest.join(main)] = tokens  # side files: none
        got[task.split][0] += rows
        got[task.split][1] += tokens
    unlisted = {path for path, _ in written} - listed
    if unlisted:  # a writer and shard_names disagree: the note would not vouch for these
        raise RuntimeError(f"shards wrote files the unfinished-export note does not list: {sorted(unlisted)[:3]}")
    for path, tmp in sorted(written):
        if tmp:
            os.replace(tmp, path)
        crashpoints.reached(crashpoints.EXPORT_FILE, in_dest(dest, path))
    rel = sorted((posixpath.relpath(p, dest.root) if dest.is_local else p[len(dest.root.rstrip("/")) + 1:],
                  carried.get(p, 0)) for p, _ in written)
    return _finish(config, runs, per_run, got, rel, spec=spec, columns=columns, dtype=dtype, seed=seed,
                   lease=lease, t0=t0, copies=copies)


def _trainer_stem(fmt: str, prefix: str, split: str) -> str:
    """A split's file name without its suffix, as the unpacked export of the format names it."""
    if fmt == "megatron":
        return f"{prefix}_text_document" if split == "train" else f"{prefix}_val_text_document"
    return f"{split}/{prefix}"


def _split_of(name: str, prefix: str) -> str:
    if name.startswith(hf.SPLIT_DIRS["val"] + "/") or name.startswith("val/") or name.startswith(f"{prefix}_val_"):
        return "val"
    return "train"


def _finish(config, runs, per_run, got, files: list[tuple[str, int]], *, spec: PackSpec, columns, dtype, seed, lease, t0,
            copies) -> ExportSummary:
    """The record (and hf's card) in DEST (``lease.location``), then the summary."""
    dest = lease.location
    splits = {}
    notes = []
    for i, split in enumerate(SPLITS):
        c = sum(x[:, i, :].sum(axis=0) for x in per_run)
        rows, tokens = got[split]
        counts = SplitCounts(docs=int(c[2]), tokens=tokens, rows=rows, source_tokens=int(c[3]))
        if spec.packed:
            counts = dataclasses.replace(counts, padding=rows * spec.seq_len - tokens, dropped=int(c[3]) - int(c[1]))
            if rows:
                notes.append(f"{split}: {rows:,} sequences of {spec.seq_len:,} tokens; padding {counts.padding:,} tokens "
                             f"({counts.padding / (rows * spec.seq_len):.2%}); left over {counts.dropped:,} of "
                             f"{int(c[3]):,} tokens" + (" (the stream's tail)" if spec.mode == "concat" and not spec.bos_align
                                                        else ""))
        splits[split] = counts
    notes += _trainer_notes(config, runs[0].manifest, spec=spec, dtype=dtype, padded=any(s.padding for s in splits.values()))
    record = export_record(
        config, runs[0].manifest, kind=ROWS, dtype=dtype, source=runs[0].path if len(runs) == 1 else None,
        source_job=runs[0].manifest.job,
        val_selection="per run, whole documents with the smallest blake2b-64(id), ties by (input, row), until its "
                      "share of val_tokens is reached",
        packing=(PackedRows(seq_len=spec.seq_len, mode=spec.mode, bos_align=spec.bos_align,
                            window_docs=spec.window if spec.mode == "best-fit" else None,
                            unit="each partition of each run is packed on its own" + (
                                "; concat's windows run on across partitions" if spec.mode == "concat" and not spec.bos_align
                                else ""))
                 if spec.packed else None),
        columns=(("input_ids", *(["label_mask"] if _label_mask(config, spec, runs[0].manifest) else []))
                 if config.format in PACKED_IN_TRAINER_FILES else
                 ("input_ids", *(["seq_lengths"] if spec.packed else []), *columns,
                  *(["mask"] if config.format == "npy" and _label_mask(config, spec, runs[0].manifest) else []))),
        order=Order(seed=seed, key="seeded Feistel permutation of whole rows (pack.permute)") if config.shuffled else None,
        sources=tuple(ExportSource(path=r.path, source_job=r.manifest.job, sequences=c.sequences, epochs=c.epochs,
                                   extra=c.extra) for r, c in zip(runs, copies["train"])),
        splits=splits,
        files=[ExportFile(name=name, split=_split_of(name, config.name_prefix), tokens=tokens,
                          bytes=int(dest.fs.size(dest.join(name)))) for name, tokens in files])
    lease.check()
    if config.format == "hf":
        dest.write_atomic("README.md", hf.local_card(record).encode())
        crashpoints.reached(crashpoints.EXPORT_CARD)
    dest.write_json(config.fmt.record_name(config.name_prefix), record.to_dict())
    end_commits(dest, config)
    crashpoints.reached(crashpoints.EXPORT_RECORD)
    return ExportSummary(to=config.to, files=[name for name, _ in files], val_docs=splits["val"].docs,
                         val_tokens=splits["val"].tokens, train_docs=splits["train"].docs,
                         train_tokens=splits["train"].tokens, seconds=time.perf_counter() - t0, notes=tuple(notes))


def _pad(manifest) -> int:
    """Best-fit's padding: the run's eot id (0 when it has none)."""
    enc = manifest.encoding
    return enc.eot if enc.eot is not None and enc.eot >= 0 else 0


def _trainer_pad(manifest) -> int:
    """megatron's and olmo's padding: the token that ends each document where there is one (the
    eod or eos the trainer ends documents at: Megatron's --eod-mask-loss then keeps padding out of
    the loss), else the run's eot id, as ``_pad``: a run with tokens on both sides has its start
    token as eot."""
    _, suffix = manifest.encoding.boundaries(manifest.eot_position)
    return suffix[-1] if suffix else _pad(manifest)


def _label_mask(config, spec: PackSpec, manifest) -> bool:
    """An olmo or a packed npy export writes a loss mask where some token must stay out of the loss:
    best-fit's padding (npy's ``seq_lengths`` count it as a segment, so they no longer say where it
    is), a chat run's prompts."""
    return config.format in ("olmo", "npy") and spec.packed and (spec.mode == "best-fit" or has_masks(manifest))


def _trainer_notes(config, manifest, *, spec: PackSpec, dtype: str, padded: bool) -> list[str]:
    """How the trainer reads a megatron or olmo export's rows and finds their documents."""
    if config.format not in PACKED_IN_TRAINER_FILES:
        return []
    prefix, suffix = manifest.encoding.boundaries(manifest.eot_position)
    if config.format == "megatron":
        return megatron.packed_notes(seq_len=spec.seq_len, prefix=prefix, suffix=suffix, padded=padded,
                                     pad=_trainer_pad(manifest), mask=has_masks(manifest))
    return olmo.packed_notes(seq_len=spec.seq_len, dtype=dtype, prefix=prefix, suffix=suffix,
                             label_mask=_label_mask(config, spec, manifest))


def _check_card(dest: Location, config) -> None:
    """An hf export writes DEST/README.md: one that is not an earlier export's is kept unless --overwrite."""
    if config.format != "hf":
        return
    path = dest.join("README.md")
    with contextlib.suppress(OSError, ValueError):
        if dest.fs.exists(path) and hf.CARD_MARKER.encode() not in dest.fs.cat_file(path) and not config.overwrite:
            raise UserError(f"{config.to} holds a README.md of its own; an hf export writes its dataset card there: "
                            "choose another --to or pass --overwrite to replace it")
