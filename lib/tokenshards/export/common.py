"""What both export drivers stand on (``command.py``: documents in manifest order; ``shuffle.py``:
seeded and mixed): DEST's lease and its earlier files, the validation candidates, writing every
file in parallel chunks and committing them together, the record and the summary. Neither driver
imports the other's module for these; ``command.run_export`` only hands shuffled exports to ``shuffle``
(and row exports to ``packed``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import numpy as np
from distributed import Client

from .. import crashpoints
from ..cluster import interrupt, machines, runner
from ..cluster.progress import Progress
from ..errors import UserError
from ..format.run import BadRunFile, read_record
from ..format.run import check_destination as check_run_destination
from ..format.export_record import ExportFile, ExportRecord, ExportRecordError, SplitCounts
from ..storage.lease import Lease
from ..storage.location import WRITE_PROBE_PREFIX, Location
from ..storage.store import is_s3, remove_stale_parts, write_advice
from ..wording import counted, human
from . import formats, valsplit
from .config import ExportConfig
from .formats import Plan
from .layout import Chunk, MaskRun, OutFile, Streams, chunk_file
from .write import (PartInfo, Source, Target, abort_target, check_source, commit_target, open_target, part_size,
                    partition_candidates)

MERGE_FAN_IN = 8


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


def export_record(config: ExportConfig, manifest, *, kind: str, dtype: str, splits: dict[str, SplitCounts],
                  files: list[ExportFile], **fields) -> ExportRecord:
    """The record an export writes last (``format.export_record``): what every one says of the
    tokens (its run's encoding: a mixture's runs share it) and the options, then what the export
    that wrote it adds (``fields``: its source, how it chose and ordered documents, ...)."""
    sharded = config.fmt.sharded
    return ExportRecord(kind=kind, export_format=config.format, encoding=manifest.encoding,
                        eot_position=manifest.eot_position, dtype=dtype,
                        shard_tokens=config.shard_size if sharded else None,
                        min_shard_tokens=config.min_shard_size if sharded else None,
                        val_tokens_requested=config.val_tokens, splits=splits, files=tuple(files), **fields)


def written_files(files: list[OutFile]) -> list[ExportFile]:
    """The record's ``files`` of an export written in byte ranges."""
    return [ExportFile(name=f.name, split=f.split, tokens=f.tokens, bytes=f.nbytes) for f in files]


def split_counts(streams: Streams) -> dict[str, SplitCounts]:
    return {s: SplitCounts(docs=streams.docs(s), tokens=streams.tokens(s)) for s in ("val", "train")}


def check_destination(dest: Location, config: ExportConfig) -> None:
    """One line, before anything is read or written: DEST must be a folder (or missing), not under a
    file, and not a run (the one being exported or another) nor inside one (its files would join the
    run's, and verify would fail): ``format.run.check_destination``."""
    local = dest.is_local
    if local and os.path.exists(dest.root) and not os.path.isdir(dest.root):
        raise UserError(f"--to {config.to}: is an existing file, not a folder; choose a folder (it is made if missing)")
    inside = os.path.realpath(dest.root) if local else dest.root.rstrip("/")
    for run in config.runs:
        location = Location.at(run, config.storage_options)
        if location.is_local != local:
            continue
        source = os.path.realpath(location.root) if local else location.root.rstrip("/")
        if inside == source or inside.startswith(source + "/"):
            raise UserError(f"--to {config.to}: is {'the run' if inside == source else 'inside the run'} {run} being "
                            "exported; its files would mix with the run's: choose a folder outside it")
    check_run_destination(dest, "--to")  # nor under a file, nor in any other run


def dest_lease(dest: Location, *, announce: Callable[[str], None]) -> Lease:
    """One live writer per folder, exports and tokenize runs alike: --overwrite never removes a
    live writer's files (``storage.lease``). The lease's ``location`` is DEST from then on."""
    dest.check_bucket(what="export destination")
    return Lease(dest, command="export", announce=announce)


def prepare_dest(dest: Location, config: ExportConfig) -> None:
    """Refuse to mix with an earlier export's files (a trainer's glob would read both), unless
    --overwrite, which removes them first; then check DEST is writable."""
    fs = dest.fs
    patterns = config.fmt.patterns(config.name_prefix) + [config.fmt.record_name(config.name_prefix)]
    fs.invalidate_cache(dest.root)  # s3fs caches listings per process; workers may have written since
    if config.overwrite:  # the record this export replaces may be another format's: its files go too
        patterns += earlier_format_patterns(dest, config)
    found = sorted({p for pattern in patterns for p in dest.glob(pattern)})
    unfinished = unfinished_files(dest, config)
    killed = unfinished is not None and {in_dest(dest, p) for p in found} <= unfinished - {record_of(config)}
    if found and not (config.overwrite or killed):
        names = ", ".join(posixpath.basename(p) for p in found[:3]) + (" ..." if len(found) > 3 else "")
        raise UserError(f"{config.to} already holds an export ({names}); choose another --to or pass --overwrite to replace it")
    probe = dest.join(f"{WRITE_PROBE_PREFIX}{uuid.uuid4().hex}")
    try:
        for path in found:
            fs.rm(path)
        if unfinished is not None or config.overwrite:  # after the files it vouches for
            with contextlib.suppress(FileNotFoundError):
                fs.rm(dest.join(unfinished_name(config)))
        _clear_unfinished(dest, patterns)
        dest.remove_stale_probes()
        remove_stale_parts(fs, dest.root)  # GCS: a killed export's part objects, whatever names they were for
        fs.makedirs(dest.root, exist_ok=True)
        fs.pipe_file(probe, b"ok")
    except Exception as e:
        raise UserError(f"cannot write to {config.to!r}: {type(e).__name__}: {e}; {write_advice(e, '--to')}") from e
    finally:  # also when the write failed: a full disk keeps the file it created, empty
        with contextlib.suppress(Exception):
            if fs.exists(probe):
                fs.rm(probe)


def record_of(config: ExportConfig) -> str:
    """The export record's name in DEST."""
    return config.fmt.record_name(config.name_prefix)


def unfinished_name(config: ExportConfig) -> str:
    """The note an export leaves in DEST while it commits its files (``begin_commits``)."""
    return f".{record_of(config)}.unfinished"


def begin_commits(dest: Location, config: ExportConfig, names: list[str]) -> None:
    """Before the first of an export's files appears under its name: a note in DEST listing them
    all, removed once the record is written (``end_commits``). Files cannot all appear at once;
    an export stopped between two commits leaves some without a record, and its rerun, finding
    them listed here, knows they are that export's own, unfinished: it replaces them without
    --overwrite, where files it cannot vouch for (another tool's, a finished export's) are refused."""
    dest.write_json(unfinished_name(config), {"files": sorted(in_dest(dest, name) for name in names)})


def end_commits(dest: Location, config: ExportConfig) -> None:
    """The export's record is written: the note ``begin_commits`` left goes."""
    with contextlib.suppress(FileNotFoundError):
        dest.fs.rm(dest.join(unfinished_name(config)))


def unfinished_files(dest: Location, config: ExportConfig) -> set[str] | None:
    """The files an unfinished export of this record's name listed (``begin_commits``), or None
    where it left no note (or one that is not such a note: it vouches for nothing)."""
    try:  # read as the record it stands for (format.run: a regular file inside DEST, bounded)
        note = read_record(dest, unfinished_name(config), kind="export record")
    except (OSError, BadRunFile):
        return None
    files = note.get("files") if isinstance(note, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files)


def in_dest(dest: Location, path: str) -> str:
    """A path under DEST (as ``fs`` names it) relative to it, as the record names files; a
    relative one as it is."""
    root = dest.root.rstrip("/") + "/"
    return path[len(root):] if path.startswith(root) else path


def earlier_format_patterns(dest: Location, config: ExportConfig) -> list[str]:
    """The file globs of the export whose record this one replaces, when it was of another format
    (an llmc export overwritten by an npy one must not leave its ``.bin`` shards beside the new
    ones). Globs of a known format, under DEST: the record's own file list is never trusted."""
    try:  # a regular file inside DEST, of a record's size, parsed bounded (format.run); else no record
        earlier = ExportRecord.from_dict(read_record(dest, config.fmt.record_name(config.name_prefix),
                                                     kind="export record")).export_format
    except (OSError, BadRunFile, ExportRecordError):
        return []
    if earlier == config.format or earlier not in formats.REGISTRY:
        return []
    return formats.get(earlier).patterns(config.name_prefix)


def _clear_unfinished(dest: Location, patterns: list[str]) -> None:
    """What a killed export of these names left: local ``NAME.<uuid>.tmp`` files, or S3 multipart
    uploads (never visible, but billed until aborted)."""
    fs, root = dest.fs, dest.root

    def ours(path: str) -> bool:
        name = posixpath.relpath(path, root.rstrip("/")) if path.startswith(root.rstrip("/") + "/") else path
        return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(posixpath.basename(path), p) for p in patterns)

    if dest.is_local:
        for folder in sorted({posixpath.dirname(p) for p in patterns}):  # a format's files may be in train/, val/
            for path in dest.glob(folder, "*.tmp"):  # folder "" is DEST itself
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
            if ours(f"{bucket}/{upload['Key']}"):
                fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        if not page.get("IsTruncated"):
            return
        markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}


def val_candidates(client: Client, parts: list[PartInfo], *, source: Source, val_tokens: int,
                   check: bool = False) -> np.ndarray:
    """Per-partition candidates, then merges of MERGE_FAN_IN at a time, all on the cluster; with
    ``check``, each leaf first checks its partition's files (``write.check_source``)."""
    leaves = runner.submit(client, partition_candidates, range(len(parts)), parts, source=source, val_tokens=val_tokens,
                           check=check)
    root = runner.reduce_tree(client, leaves, valsplit.merge, fan_in=MERGE_FAN_IN, val_tokens=val_tokens)
    return runner.result_of(client, root, also_cancel=leaves, explain=lambda e: UserError(
        f"choosing validation documents failed: {type(e).__name__}: {e}"))


def paths_used(config: ExportConfig, runs: list[tuple[Location, object]]) -> list[machines.PathUse]:
    """What the workers must reach: each run read (``(location, manifest)``), DEST written. A local
    path the workers' machines do not share is refused before any work (``runner.connect_to``)."""
    reads = [machines.reading_run("RUN", run.url, manifest.files(run.root)) for run, manifest in runs]
    return [*reads, machines.PathUse(option="--to", url=config.to, writes=True)]


def check_sources(client: Client, source: Source, parts: list[PartInfo]) -> None:
    """Every partition of a run an export reads, checked on the cluster before a byte is written
    (``write.check_source``): a tokens file whose bytes are not those its manifest records (or
    whose header, ids, docs table or done record is wrong) stops the export in one line naming it.
    Hashing costs ~1.8 s of CPU per GiB here, against ~4.8 s per GiB for the copy it guards
    (docs/format-v1.md). An export that chooses validation documents checks each partition in the
    same task (``val_candidates(check=True)``) instead."""
    futures = runner.submit(client, check_source, parts, source=source)
    runner.gather(client, futures, parts, explain=runner.failure(lambda part: f"checking {source.out.shown(part.entry.tokens_file)}"))


def checked(runs: list[list[PartInfo]]) -> str:
    """What an export checked of the runs it read, in words."""
    parts = [p for run in runs for p in run]
    read = sum((p.entry.tokens_bytes or 0) + (p.entry.docs_bytes or 0) + (p.entry.mask_bytes or 0) for p in parts)
    return (f"checked {counted(len(parts), 'partition')} ({human(read)}B) before writing: every tokens file's sha256, "
            ".npy header and ids, every docs table and done record")


def split_validation(client: Client, runs: list, val_split: list[int], *,
                     announce: Callable[[str], None] | None = None) -> list[valsplit.Threshold | None]:
    """Each run's validation documents, chosen on the cluster (``val_candidates``), each partition
    of every run checked first (``check_sources``): ``runs[n]`` is replaced by the run with its parts'
    ``val_docs``/``val_tokens`` set; returns each run's threshold (None where ``val_split[n]`` asks
    for no validation set). Shuffled and packed exports share it."""
    thresholds: list[valsplit.Threshold | None] = []
    for n, (run, want) in enumerate(zip(runs, val_split)):
        threshold = None
        if want:
            final = val_candidates(client, run.parts, source=run.source, val_tokens=want, check=True)
            threshold, vd, vt = valsplit.choose(final, n_parts=len(run.parts))
            parts = [dataclasses.replace(p, val_docs=int(d), val_tokens=int(t)) for p, d, t in zip(run.parts, vd, vt)]
            runs[n] = dataclasses.replace(run, parts=parts)
        else:
            check_sources(client, run.source, run.parts)
        thresholds.append(threshold)
    if announce is not None:
        announce(checked([run.parts for run in runs]))
    return thresholds


def write_files(client: Client, files, streams: Streams, *, submit: Callable, dest: Location, kind: str,
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
            if "/" in f.name and dest.is_local:  # a format's files may be in folders (train/, val/)
                dest.fs.makedirs(dest.join(posixpath.dirname(f.name)), exist_ok=True)
            targets[f.name] = open_target(dest.fs, dest.join(f.name), f.nbytes)
        futures = submit(chunks, [targets[c.file] for c in chunks])
        progress = Progress(len(chunks), mode=config.progress, unit="chunks", amount="B")
        for chunk, (name, number, etag) in runner.each_result(
                client, futures, chunks, progress=progress, amount=lambda chunk, _: chunk.nbytes,
                explain=lambda chunk, e: UserError(f"writing {config.to} failed: {type(e).__name__}: {e}")):
            etags[name][number] = etag
        begin_commits(dest, config, [f.name for f in files])
        for f in files:
            interrupt.check()
            commit_target(dest.fs, targets.pop(f.name), etags[f.name])
            crashpoints.reached(crashpoints.EXPORT_FILE, f.name)
    except BaseException:
        for target in targets.values():
            abort_target(dest.fs, target)
        raise
    announce(f"wrote {counted(len(files), 'file')} to {dest.shown()}")


def finish(config: ExportConfig, *, record: ExportRecord, files: list[OutFile], streams: Streams, plan: Plan, lease: Lease,
           notes: list[str], t0: float) -> ExportSummary:
    """Write the record (the last file of an export) in DEST, the folder ``lease`` guards, and say
    what was written."""
    lease.check()  # an export that stalled past its lease must not write its record over a successor's files
    lease.location.write_json(record_of(config), record.to_dict())
    end_commits(lease.location, config)
    crashpoints.reached(crashpoints.EXPORT_RECORD)
    notes = [*notes, *config.fmt.notes(files, plan)]
    if plan.mask and not any(isinstance(r, MaskRun) for f in files for r in f.regions):
        notes.append(f"this chat run's assistant mask has no place in {config.format}: its trainer takes the loss on "
                     "every token; --format hf (labels), datatrove (.ds.loss) and npy (mask/) carry it (docs/chat.md)")
    return ExportSummary(to=config.to, files=[f.name for f in files], val_docs=streams.docs("val"),
                         val_tokens=streams.tokens("val"), train_docs=streams.docs("train"),
                         train_tokens=streams.tokens("train"), seconds=time.perf_counter() - t0, notes=tuple(notes))
