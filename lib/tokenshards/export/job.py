"""The export job: choose validation documents, plan every output byte, write chunks on Dask.

The client reads only ``manifest.json``; workers read docs tables and token ranges. Nothing
about the output depends on the cluster: same OUT and options, identical files.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import numpy as np
from distributed import Client

from ..cluster import interrupt, runner
from ..cluster import machines
from ..cluster.options import RunOptions
from ..errors import UserError
from ..cluster.progress import Progress, human
from ..format.reader import open_manifest
from ..storage.lease import Lease
from ..wording import counted
from ..storage.store import check_bucket, display_url, filesystem, is_local, is_s3, join, write_json
from . import formats, valsplit
from .layout import Chunk, Streams, chunk_file
from .write import PartInfo, Source, Target, abort_target, commit_target, open_target, part_size, partition_candidates, target_kind, write_chunk

DEFAULT_SHARD_TOKENS = 100_000_000
"""llm.c's and build-nanogpt's FineWeb shard size."""
DEFAULT_VAL_TOKENS = 10_485_760
"""modded-nanogpt evaluates on this many validation tokens."""
DEFAULT_CHUNK_BYTES = 64 * 2**20
"""Bytes one task renders and writes: its memory bound, and S3's part size (>= 5 MiB)."""
MERGE_FAN_IN = 8
RECORD_FORMAT = "tokenshards-export/1"


@dataclass(frozen=True, kw_only=True)
class ExportConfig(RunOptions):
    """What decides the exported bytes (above the line) and how the job runs (below it)."""

    out: str
    format: str
    to: str
    shard_tokens: int | None = None
    """llmc and npy only; None means DEFAULT_SHARD_TOKENS."""
    min_shard_tokens: int | None = None
    """llmc and npy only: a split's last shard under this joins the one before it; None means 1%
    of the shard size (``formats.MIN_SHARD_FRACTION``), 0 never joins."""
    val_tokens: int = DEFAULT_VAL_TOKENS
    prefix: str | None = None
    """None: ``fineweb`` for llmc, npy and megatron; nanogpt's names are fixed."""
    overwrite: bool = False
    shuffle: bool = False
    """Train (and validation) documents in a seeded order over the whole corpus (shuffle.py)."""
    seed: int | None = None
    """None: 0. Only with shuffle."""
    mix_with: tuple[str, ...] = ()
    """More finished runs to mix with ``out`` (a mixture is always shuffled)."""
    weights: tuple[float, ...] | None = None
    """One per run, normalised; None: each run's train tokens (every document once)."""
    tokens: int | None = None
    """Train tokens of the mixture; None: the most that takes no run twice."""
    # -- how it runs (and RunOptions): never changes the output bytes --
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def __post_init__(self):
        super().__post_init__()
        if self.format not in formats.FORMATS:
            raise UserError(f"--format {self.format!r} not supported, expected one of {formats.FORMATS}")
        if self.shard_tokens is not None:
            if self.format in ("nanogpt", "megatron"):
                raise UserError(f"--shard-tokens applies to llmc and npy; {self.format} writes one file per split")
            if self.shard_tokens < 1:
                raise UserError(f"--shard-tokens {self.shard_tokens} must be at least 1")
            if self.format == "llmc" and self.shard_tokens > formats.LLMC_MAX_TOKENS:
                raise UserError(f"--shard-tokens {self.shard_tokens:,} is over llm.c's limit of {formats.LLMC_MAX_TOKENS:,} "
                                "(its header stores the count in an int32)")
        if self.min_shard_tokens is not None:
            if self.format in ("nanogpt", "megatron"):
                raise UserError(f"--min-shard-tokens applies to llmc and npy; {self.format} writes one file per split")
            if self.min_shard_tokens < 0:
                raise UserError(f"--min-shard-tokens {self.min_shard_tokens} must be 0 (keep every last shard as it is) or more")
        if self.val_tokens < 0:
            raise UserError(f"--val-tokens {self.val_tokens} must be 0 (no validation set) or more")
        if self.prefix is not None:
            if self.format == "nanogpt":
                raise UserError("--prefix does not apply to nanogpt: nanoGPT's train.py reads the fixed names train.bin and val.bin")
            if not self.prefix or "/" in self.prefix or self.prefix.startswith("."):
                raise UserError(f"--prefix {self.prefix!r}: expected a plain file name prefix such as 'fineweb'")
        if self.chunk_bytes < 1:
            raise UserError(f"chunk_bytes={self.chunk_bytes} must be positive")
        if not self.shuffled and self.seed is not None:
            raise UserError("--seed orders a shuffled export; add --shuffle")
        if self.tokens is not None and self.tokens < 1:
            raise UserError(f"--tokens {self.tokens} must be at least 1")
        if self.weights is not None and len(self.weights) != len(self.runs):
            raise UserError(f"--weights has {len(self.weights)} values for {len(self.runs)} runs; give one weight per run, in the same order")
        for run, w in zip(self.runs, self.weights or ()):
            if not (math.isfinite(w) and w > 0):
                raise UserError(f"weight {w!r} for {run} must be a positive number")
        if len(set(self.runs)) != len(self.runs):
            raise UserError(f"a run is given twice ({', '.join(self.runs)}); to weigh it more, use --weights")

    @property
    def runs(self) -> tuple[str, ...]:
        return (self.out, *self.mix_with)

    @property
    def shuffled(self) -> bool:
        """Mixing (several runs, --weights or --tokens) is always shuffled."""
        return self.shuffle or bool(self.mix_with) or self.weights is not None or self.tokens is not None

    @property
    def name_prefix(self) -> str:
        return self.prefix or formats.DEFAULT_PREFIX

    @property
    def shard_size(self) -> int:
        return self.shard_tokens or DEFAULT_SHARD_TOKENS

    @property
    def min_shard_size(self) -> int:
        if self.min_shard_tokens is not None:
            return self.min_shard_tokens
        return self.shard_size // formats.MIN_SHARD_FRACTION

    def replace(self, **changes) -> "ExportConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class ExportSummary:
    to: str
    files: list[str]
    val_docs: int
    val_tokens: int
    train_docs: int
    train_tokens: int
    seconds: float
    notes: tuple[str, ...] = ()
    """What a reader of these files should know: shard sizes, which trainers read the layout."""

    def lines(self) -> list[str]:
        return [
            f"done: {counted(len(self.files), 'file')}; val {self.val_docs:,} documents, {self.val_tokens:,} tokens; "
            f"train {self.train_docs:,} documents, {self.train_tokens:,} tokens; {self.seconds:.1f} s",
            *(f"      {note}" for note in self.notes),
            f"      output: {self.to}",
        ]


def run_export(config: ExportConfig, *, announce: Callable[[str], None] = print) -> ExportSummary:
    """Run the whole export; raises ``UserError`` for anything the user can fix."""
    if config.to.startswith("hf://"):  # a Hub dataset repo: export into staging, then upload (publish.py)
        from .publish import PublishConfig, run_publish

        return run_publish(PublishConfig(export=config), announce=announce)
    if config.shuffled:
        from .shuffle import run_shuffled_export

        with _dest_lease(config, announce=announce) as lease:
            return run_shuffled_export(config, lease=lease, announce=announce)
    t0 = time.perf_counter()
    _, _, manifest = open_manifest(config.out, config.storage_options)
    with _dest_lease(config, announce=announce) as lease:
        return _export_owned(config, manifest, lease, t0=t0, announce=announce)


def record_settings(config: ExportConfig, manifest, dtype: str) -> dict:
    """What every ``NAME_export.json`` records of the tokens and the options, in this order (its
    run's encoding: a mixture's runs share it)."""
    sharded = config.format in ("llmc", "npy")
    return {
        "encoding": manifest.encoding.to_dict(),
        "eot_position": manifest.eot_position,
        "dtype": dtype,
        "shard_tokens": config.shard_size if sharded else None,
        "min_shard_tokens": config.min_shard_size if sharded else None,
        "val_tokens_requested": config.val_tokens,
    }


def _dest_lease(config: ExportConfig, *, announce: Callable[[str], None]) -> Lease:
    """One live writer per folder, exports and tokenize runs alike: --overwrite never removes a
    live writer's files (``storage.lease``)."""
    dest_fs, dest_root = filesystem(config.to, config.storage_options)
    check_bucket(dest_fs, dest_root, config.to, what="export destination")
    return Lease(dest_fs, dest_root, url=config.to, command="export", announce=announce)


def _export_owned(config: ExportConfig, manifest, lease: Lease, *, t0: float,
                  announce: Callable[[str], None]) -> ExportSummary:
    """The export, while it holds DEST's lease."""
    dtype = formats.output_dtype(config.format, manifest.encoding.dtype)
    entries = manifest.by_index()
    docs = np.array([e.docs for e in entries], dtype=np.int64)
    tokens = np.array([e.tokens for e in entries], dtype=np.int64)
    if config.val_tokens and config.val_tokens >= tokens.sum():
        raise UserError(f"--val-tokens {config.val_tokens:,} is not less than the {int(tokens.sum()):,} tokens in "
                        f"{config.out}; pass a smaller --val-tokens (or 0 for no validation set)")
    ordinal = {i["path"]: n for n, i in enumerate(manifest.inputs)}
    parts = [PartInfo(entry=e, input_ordinal=ordinal.get(e.input, -1)) for e in entries]
    source = Source(out=config.out, storage_options=config.storage_options, dtype=manifest.encoding.dtype)

    dest_fs, dest_root = filesystem(config.to, config.storage_options)
    kind = target_kind(dest_fs)
    _prepare_dest(dest_fs, dest_root, config)

    with runner.connect_to(config, announce=announce, local_paths=[
            machines.reading_run("RUN", config.out, manifest.files(filesystem(config.out, config.storage_options)[1])),
            machines.PathUse(option="--to", url=config.to, writes=True)]) as client:
        threshold = None
        val_docs = np.zeros(len(entries), dtype=np.int64)
        val_tokens = np.zeros(len(entries), dtype=np.int64)
        if config.val_tokens:
            final = _val_candidates(client, parts, source=source, val_tokens=config.val_tokens)
            threshold, val_docs, val_tokens = valsplit.choose(final, n_parts=len(entries))
            if int(val_docs.sum()) == int(docs.sum()):
                raise UserError(f"--val-tokens {config.val_tokens:,} takes every document of {config.out}; pass a smaller value")
            parts = [dataclasses.replace(p, val_docs=int(d), val_tokens=int(t)) for p, d, t in zip(parts, val_docs, val_tokens)]
        streams = Streams.from_counts(docs=docs, tokens=tokens, val_docs=val_docs, val_tokens=val_tokens)
        announce(f"validation: {streams.docs('val'):,} documents, {streams.tokens('val'):,} tokens; "
                 f"train: {streams.docs('train'):,} documents, {streams.tokens('train'):,} tokens")
        files = formats.shard_files(fmt=config.format, prefix=config.name_prefix, streams=streams,
                                    shard_tokens=config.shard_size, dtype=dtype, min_shard_tokens=config.min_shard_size)

        def submit(chunks: list[Chunk], targets: list[Target]):
            return runner.submit(client, write_chunk, chunks, targets,
                                 [{k: parts[k] for k in sorted(c.partitions())} for c in chunks], source=source,
                                 threshold=threshold, dest_storage_options=config.storage_options)

        _write_files(client, files, streams, submit=submit, dest_fs=dest_fs, dest_root=dest_root, kind=kind, config=config,
                     announce=announce)

    record = {
        "format": RECORD_FORMAT,
        "export_format": config.format,
        "source": config.out,
        "source_job": manifest.job,
        **record_settings(config, manifest, dtype),
        "val_selection": "whole documents with the smallest blake2b-64(id), ties by (input, row), "
                         "until val_tokens is reached",
        "splits": {s: {"docs": streams.docs(s), "tokens": streams.tokens(s)} for s in ("val", "train")},
        "files": [{"name": f.name, "split": f.split, "tokens": f.tokens, "bytes": f.nbytes} for f in files],
    }
    lease.check()  # an export that stalled past its lease must not write its record over a successor's files
    write_json(dest_fs, join(dest_root, formats.record_name(config.format, config.name_prefix)), record)
    notes = []
    if config.format in ("llmc", "npy"):
        notes += formats.shard_notes(files, shard_tokens=config.shard_size, min_shard_tokens=config.min_shard_size)
    if config.format == "llmc" and dtype == formats.LLMC_LLAMA3[2]:
        notes.append("note: " + formats.LLAMA3_READERS.format(n_vocab=manifest.encoding.n_vocab))
    return ExportSummary(to=config.to, files=[f.name for f in files], val_docs=streams.docs("val"),
                         val_tokens=streams.tokens("val"), train_docs=streams.docs("train"),
                         train_tokens=streams.tokens("train"), seconds=time.perf_counter() - t0, notes=tuple(notes))


def _prepare_dest(fs, root: str, config: ExportConfig) -> None:
    """Refuse to mix with an earlier export's files (a trainer's glob would read both), unless
    --overwrite, which removes them first; then check DEST is writable."""
    patterns = formats.name_patterns(config.format, config.name_prefix) + [formats.record_name(config.format, config.name_prefix)]
    fs.invalidate_cache(root)  # s3fs caches listings per process; workers may have written since
    found = sorted({p for pattern in patterns for p in fs.glob(join(root, pattern))})
    if found and not config.overwrite:
        names = ", ".join(posixpath.basename(p) for p in found[:3]) + (" ..." if len(found) > 3 else "")
        raise UserError(f"{config.to} already holds an export ({names}); choose another --to or pass --overwrite to replace it")
    try:
        for path in found:
            fs.rm(path)
        _clear_unfinished(fs, root, patterns)
        fs.makedirs(root, exist_ok=True)
        probe = join(root, f".tokenshards-write-probe-{uuid.uuid4().hex}")
        fs.pipe_file(probe, b"ok")
        fs.rm(probe)
    except Exception as e:
        raise UserError(f"cannot write to {config.to!r}: {type(e).__name__}: {e}; choose another --to or fix its permissions") from e


def _clear_unfinished(fs, root: str, patterns: list[str]) -> None:
    """What a killed export of these names left: local ``NAME.<uuid>.tmp`` files, or S3 multipart
    uploads (never visible, but billed until aborted)."""
    def ours(path: str) -> bool:
        return any(fnmatch.fnmatchcase(posixpath.basename(path), p) for p in patterns)

    if is_local(fs):
        for path in fs.glob(join(root, "*.tmp")):
            if ours(path.rsplit(".", 2)[0]):
                fs.rm(path)
        return
    if not is_s3(fs):
        return
    bucket, _, key_prefix = root.partition("/")
    markers: dict = {}
    while True:
        page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key_prefix.rstrip("/") + "/", **markers)
        for upload in page.get("Uploads", []):
            if ours(upload["Key"]):
                fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        if not page.get("IsTruncated"):
            return
        markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}


def _val_candidates(client: Client, parts: list[PartInfo], *, source: Source, val_tokens: int) -> np.ndarray:
    """Per-partition candidates, then merges of MERGE_FAN_IN at a time, all on the cluster."""
    leaves = runner.submit(client, partition_candidates, range(len(parts)), parts, source=source, val_tokens=val_tokens)
    root = runner.reduce_tree(client, leaves, valsplit.merge, fan_in=MERGE_FAN_IN, val_tokens=val_tokens)
    return runner.result_of(client, root, also_cancel=leaves, explain=lambda e: UserError(
        f"choosing validation documents failed: {type(e).__name__}: {e}"))


def _write_files(client: Client, files, streams: Streams, *, submit: Callable, dest_fs, dest_root: str, kind: str,
                 config: ExportConfig, announce) -> None:
    """Open every file, write all chunks in parallel (``submit(chunks, targets)`` starts one task
    per chunk that renders and puts it), then commit every file: none appears before all are
    written, so a killed or failed export leaves nothing that looks finished."""
    targets: dict[str, Target] = {}
    etags: dict[str, dict[int, str]] = {}
    chunks: list[Chunk] = []
    for f in files:
        pieces = chunk_file(f, streams, chunk_bytes=part_size(kind, f.nbytes, config.chunk_bytes))
        chunks.extend(pieces)
        etags[f.name] = {}
    total_bytes = sum(f.nbytes for f in files)
    announce(f"writing {counted(len(files), 'file')}, {human(total_bytes)}B in {counted(len(chunks), 'chunk')} to {config.to}")
    try:
        for f in files:
            targets[f.name] = open_target(dest_fs, join(dest_root, f.name), f.nbytes)
        futures = submit(chunks, [targets[c.file] for c in chunks])
        progress = Progress(len(chunks), mode=config.progress, unit="chunks", amount="B")
        for chunk, (name, number, etag) in runner.each_result(
                client, futures, chunks, progress=progress, amount=lambda chunk, _: chunk.nbytes,
                explain=lambda chunk, e: UserError(f"writing {config.to} failed: {type(e).__name__}: {e}")):
            etags[name][number] = etag
        for f in files:
            interrupt.check()
            commit_target(dest_fs, targets.pop(f.name), etags[f.name])
    except BaseException:
        for target in targets.values():
            abort_target(dest_fs, target)
        raise
    announce(f"wrote {counted(len(files), 'file')} to {display_url(dest_fs, dest_root)}")
