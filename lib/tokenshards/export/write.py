"""Worker side of export: render a chunk's bytes from the part files, write them in place.

A file is written by many tasks at once, each owning a byte range, and appears only when the
client commits it after every range is in:
- locally: ranges are ``pwrite``-n into ``NAME.<uuid>.tmp`` (created at full size by the client),
  then fsync and ``os.replace``;
- on an object store (S3, GCS, Azure): one parted upload per file (``store.begin_parts``), one
  part per chunk, completed by the client, dropped on failure: no partial object is ever visible
  (S3's multipart upload, GCS part objects composed at the end, Azure blocks committed as a list).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from ..format import run as run_files
from ..format.reader import PartitionFiles
from ..format.v1 import PartitionEntry
from ..storage.location import Location
from ..storage.store import (PARTED_MIN_PART, PartedUpload, abort_parts, begin_parts, commit_parts, is_local,
                             parted_part_size, parted_store, put_part, temporary_beside)
from .layout import Chunk
from .valsplit import Threshold, candidates, id_hashes, is_val
from .view import DocView

S3_MIN_PART = PARTED_MIN_PART["s3"]


@dataclass(frozen=True, kw_only=True)
class Source:
    """The tokenized OUT as tasks see it: small, the same for every task (its location travels
    as its URL and options, a local one as its absolute path)."""

    out: Location
    dtype: str
    n_vocab: int | None = None
    """Every id of the run is below it (``check_source``); None: not checked."""
    job: str | None = None
    """The job every done record of the run carries (``check_source``: the manifest's ``done_job``)."""


@dataclass(frozen=True, kw_only=True)
class PartInfo:
    """What a task needs of one partition: its manifest entry and the client's expectations."""

    entry: PartitionEntry
    input_ordinal: int
    val_docs: int = 0
    val_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Target:
    """One output file being written: where the bytes go until it is committed."""

    kind: str  # "local", or the object store's kind ("s3", "gcs", "azure")
    path: str
    nbytes: int
    tmp: str = ""
    upload: PartedUpload | None = None


def source_files(source: Source, parts: dict[int, PartInfo]) -> PartitionFiles:
    """The part files of ``parts`` (by their position in manifest order), and of no other partition."""
    return PartitionFiles(source.out, dtype=source.dtype, partitions={k: p.entry for k, p in parts.items()})


# -- what is copied: checked first ----------------------------------------------------------------
def check_source(part: PartInfo, source: Source) -> int:
    """Worker task, before an export writes: one partition's files read whole and checked against
    the manifest (``format.run.check_partition``: sha256, exact ``.npy`` headers, ids inside the
    vocabulary, a consistent docs table, its done record). Returns the bytes read."""
    return run_files.check_partition(source.out, part.entry, dtype=source.dtype,
                                     n_vocab=source.n_vocab if source.n_vocab is not None else 2**32,
                                     job=source.job, done=True)


# -- validation candidates ----------------------------------------------------------------------
def partition_candidates(k: int, part: PartInfo, *, source: Source, val_tokens: int, check: bool = False) -> np.ndarray:
    """A partition's validation candidates; with ``check``, once its files passed ``check_source``
    (the export's first read of the run: one pass over every partition, not two)."""
    if check:
        check_source(part, source)
    files = source_files(source, {k: part})
    docs = files.docs(k, columns=("id", "row", "length"))
    return candidates(hashes=id_hashes(docs.ids.to_pylist()), input_ordinal=part.input_ordinal, rows=docs.rows,
                      lengths=docs.lengths, part=k, val_tokens=val_tokens)


# -- rendering ----------------------------------------------------------------------------------
def partition_view(files: PartitionFiles, k: int, part: PartInfo, threshold: Threshold | None) -> dict[str, DocView]:
    """One partition's documents divided into val and train, each a ``DocView`` in row order."""
    columns = ("id", "row", "start", "length") if threshold else ("start", "length")
    docs = files.docs(k, columns=columns)
    if threshold:
        val = is_val(hashes=id_hashes(docs.ids.to_pylist()), input_ordinal=part.input_ordinal, rows=docs.rows,
                     threshold=threshold)
    else:
        val = np.zeros(len(docs.lengths), dtype=bool)
    got = (int(val.sum()), int(docs.lengths[val].sum()))
    if got != (part.val_docs, part.val_tokens):
        raise UserError(f"{part.entry.docs_file}: {got[0]} validation documents ({got[1]} tokens) now, "
                        f"{part.val_docs} ({part.val_tokens}) when the export was planned; did OUT change? rerun export")
    views = {}
    for name, mask in (("val", val), ("train", ~val)):
        n = int(mask.sum())
        views[name] = DocView([files], np.zeros(n, np.int64), np.full(n, k, np.int64), docs.starts[mask],
                              docs.lengths[mask])
    return views


def render_chunk(chunk: Chunk, *, source: Source, parts: dict[int, PartInfo], threshold: Threshold | None) -> bytes:
    files = source_files(source, parts)
    views: dict[int, dict[str, DocView]] = {}

    def view(k: int, split: str) -> DocView:
        if k not in views:
            views[k] = partition_view(files, k, parts[k], threshold)
        return views[k][split]

    return render(chunk, view)


def render(chunk: Chunk, view) -> bytes:
    """A chunk's bytes; ``view(k, split)`` is the ``DocView`` of the k-th piece of that split's
    stream (a partition here, a bucket of a shuffled export)."""
    out = []
    for head, take, ops in chunk.segments:
        pieces = []
        for op in ops:
            kind = op[0]
            if kind == "literal":
                pieces.append(op[1])
            elif kind == "tokens":
                _, k, split, lo, hi, dtype = op
                tokens = view(k, split).tokens(split, lo, hi)
                pieces.append(tokens.astype(dtype, copy=False).tobytes())
            elif kind == "mask":
                _, k, split, lo, hi = op
                pieces.append(view(k, split).mask(split, lo, hi).astype(np.uint8, copy=False).tobytes())
            elif kind == "lengths":
                _, k, split, lo, hi = op
                pieces.append(view(k, split).lengths(split, lo, hi).tobytes())
            elif kind == "offsets":
                _, k, split, lo, hi, base, scale, end, dtype = op
                pieces.append(view(k, split).offsets(split, lo, hi, base, scale, end, dtype).tobytes())
            elif kind == "sized":
                _, k, split, lo, hi, dtype = op
                pieces.append(view(k, split).sized(split, lo, hi, dtype))
            elif kind == "encode":  # what this segment's ops rendered: starts then ends of `n` documents
                _, encode, n, params = op
                offsets = np.frombuffer(b"".join(pieces), dtype="<i8")
                pieces = [encode(offsets[:n], offsets[n:], *params)]
            elif kind == "arange":
                pieces.append(np.arange(op[1], op[2], dtype="<i8").tobytes())
            else:
                raise ValueError(f"unknown chunk operation {kind!r}")
        data = b"".join(pieces)
        out.append(data[head:head + take] if (head or take != len(data)) else data)
    data = b"".join(out)
    if len(data) != chunk.nbytes:
        raise RuntimeError(f"{chunk.file} chunk {chunk.number}: rendered {len(data)} bytes, planned {chunk.nbytes}")
    return data


# -- targets ------------------------------------------------------------------------------------
def target_kind(fs) -> str:
    if is_local(fs):
        return "local"
    kind = parted_store(fs)
    if kind is None:
        raise UserError(f"export writes to a local folder, s3://, gs:// or az:// (got a {type(fs).__name__}); "
                        "export locally and copy")
    return kind


def part_size(kind: str, nbytes: int, chunk_bytes: int) -> int:
    """Chunk size for one file: an object store's parts obey its rules (S3: at least 5 MiB, at most
    10,000 of them)."""
    return chunk_bytes if kind == "local" else parted_part_size(kind, nbytes, chunk_bytes)


def open_target(fs, path: str, nbytes: int) -> Target:
    """Client side: a full-size temporary file, or a new parted upload."""
    kind = target_kind(fs)
    if kind == "local":
        tmp = temporary_beside(path)
        with open(tmp, "wb") as f:
            f.truncate(nbytes)
        return Target(kind=kind, path=path, nbytes=nbytes, tmp=tmp)
    return Target(kind=kind, path=path, nbytes=nbytes, upload=begin_parts(fs, path))


def write_chunk(chunk: Chunk, target: Target, parts: dict[int, PartInfo], *, source: Source,
                threshold: Threshold | None, dest_storage_options: dict) -> tuple[str, int, str]:
    """Worker task: render one chunk and put it in place; returns (file, part number, tag)."""
    return put_chunk(render_chunk(chunk, source=source, parts=parts, threshold=threshold), chunk, target,
                     dest_storage_options=dest_storage_options)


def put_chunk(data: bytes, chunk: Chunk, target: Target, *, dest_storage_options: dict) -> tuple[str, int, str]:
    """Put a rendered chunk in its place in ``target``; returns (file, part number, what the
    commit needs of the part: S3's ETag, Azure's block id, ...)."""
    if target.kind == "local":
        try:
            fd = os.open(target.tmp, os.O_WRONLY)
        except FileNotFoundError as e:
            raise UserError(f"{target.tmp}: not found on worker host {socket.gethostname()}; with workers on other "
                            "machines, --to must be a folder they all share, or an object store (s3://, gs://, az://)") from e
        try:
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], chunk.offset + written)
        finally:
            os.close(fd)
        return chunk.file, chunk.number, ""
    return chunk.file, chunk.number, put_part(target.upload, chunk.number, data, dest_storage_options)


def commit_target(fs, target: Target, etags: dict[int, str]) -> None:
    """Client side, after every chunk of the file is in: make it visible under its name."""
    if target.kind == "local":
        fd = os.open(target.tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(target.tmp, target.path)
        return
    commit_parts(fs, target.upload, etags)


def abort_target(fs, target: Target) -> None:
    """Client side, on failure: leave nothing behind (best effort; the cause is raised anyway)."""
    try:
        if target.kind == "local":
            if os.path.exists(target.tmp):
                os.remove(target.tmp)
        else:
            abort_parts(fs, target.upload)
    except Exception:  # noqa: BLE001 - cleanup must not hide the error that caused it
        pass
