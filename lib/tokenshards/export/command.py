"""The export job: choose validation documents, plan every output byte, write chunks on Dask.

The client reads only ``manifest.json``; workers read docs tables and token ranges. Nothing
about the output depends on the cluster: same OUT and options, identical files. This module
is the entry (``run_export``) and the driver for documents in manifest order; shuffled and
mixed exports are ``shuffle.py``'s; both stand on ``common.py`` and the formats registry.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Callable

import numpy as np

from ..cluster import runner
from ..errors import UserError
from ..format.reader import open_manifest
from ..storage.hubspec import is_hub_url
from ..storage.lease import Lease
from ..format import v1
from ..format.export_record import ORDERED
from ..storage.location import Location
from ..storage.store import file_identity
from . import valsplit
from .common import (ExportSummary, check_destination, check_sources, checked, dest_lease, export_record, finish, paths_used, prepare_dest, split_counts,
                     val_candidates, write_files, written_files)
from .config import DEFAULT_CHUNK_BYTES, DEFAULT_SHARD_TOKENS, DEFAULT_VAL_TOKENS, ExportConfig
from .layout import Chunk, Streams
from .write import PartInfo, Source, Target, target_kind, write_chunk

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_SHARD_TOKENS", "DEFAULT_VAL_TOKENS", "ExportConfig", "ExportSummary",
           "run_export"]


def run_export(config: ExportConfig, *, announce: Callable[[str], None] = print) -> ExportSummary:
    """Run the whole export; raises ``UserError`` for anything the user can fix."""
    if is_hub_url(config.to):  # the command line hands these to publish.run_publish, which calls back here
        raise ValueError(f"run_export writes files; a Hub destination ({config.to}) goes through export.publish.run_publish")
    dest = Location.at(config.to, config.storage_options)
    check_destination(dest, config)
    with _made_here(dest), _runs_kept(config, dest):
        if config.rows:  # packed sequences, or hf's parquet rows: written row group by row group
            from .packed import run_packed_export  # heavy: ~0.2 s (shuffle and the Hub cache it reads through) a plain export never uses

            with dest_lease(dest, announce=announce) as lease:
                return run_packed_export(config, lease=lease, announce=announce)
        if config.shuffled:
            from .shuffle import run_shuffled_export  # heavy: ~0.2 s that a plain export (or its errors) never uses

            with dest_lease(dest, announce=announce) as lease:
                return run_shuffled_export(config, lease=lease, announce=announce)
        t0 = time.perf_counter()
        run = open_manifest(config.out, config.storage_options)
        with dest_lease(dest, announce=announce) as lease:
            return _export_owned(config, run, lease, t0=t0, announce=announce)


@contextlib.contextmanager
def _runs_kept(config: ExportConfig, dest: Location):
    """An export that fails because a run it reads was replaced meanwhile (``tokenize --overwrite``
    of it: its part files vanish under the workers) says so, rather than that the run is damaged:
    each run's manifest.json, as it was when the export began, is looked at again. One that
    finished meanwhile is refused the same way, its record removed: it may hold both runs' tokens."""
    before = [(run, _manifest_identity(run)) for run in (Location.at(url, config.storage_options) for url in config.runs)]

    def replaced() -> UserError | None:
        for run, was in before:
            now = _manifest_identity(run)
            if was is not None and now != was:
                return UserError(f"{run.url} was replaced while it was read (its {v1.MANIFEST} "
                                 f"{'is gone' if now is None else 'changed'} since this export began: another "
                                 "command, such as tokenize --overwrite, is writing there); export it again once "
                                 "that run has finished")
        return None

    try:
        yield
    except Exception as e:
        error = replaced()
        if error is not None:
            raise error from e
        raise
    error = replaced()
    if error is not None:  # read through: some files may be the old run's, some the new one's
        with contextlib.suppress(OSError):  # no record: nothing looks like a finished export
            dest.fs.rm(dest.join(config.fmt.record_name(config.name_prefix)))
        raise error


def _manifest_identity(run: Location):
    """Which manifest.json a run holds now (store.file_identity; an inode too, locally), or None."""
    path = run.join(v1.MANIFEST)
    try:
        identity = file_identity(run.fs, path)
        return (*identity, ("inode", os.stat(path).st_ino)) if run.is_local else identity
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _made_here(dest: Location):
    """A local DEST this export made is removed again when it fails while DEST is still empty
    (a full disk, a refused run): nothing is left that looks like an export was begun."""
    made = dest.is_local and not os.path.lexists(dest.root)
    try:
        yield
    except BaseException:
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(dest.root)  # only if empty
        raise


def _export_owned(config: ExportConfig, run: v1.FinishedRun, lease: Lease, *, t0: float,
                  announce: Callable[[str], None]) -> ExportSummary:
    """The export, while it holds the lease of DEST (``lease.location``)."""
    manifest = run.manifest
    dtype = config.fmt.dtype(manifest.encoding.dtype)
    plan = config.plan(manifest, dtype=dtype)
    entries = manifest.by_index()
    docs = np.array([e.docs for e in entries], dtype=np.int64)
    tokens = np.array([e.tokens for e in entries], dtype=np.int64)
    if config.val_tokens and config.val_tokens >= tokens.sum():
        raise UserError(f"--val-tokens {config.val_tokens:,} is not less than the {int(tokens.sum()):,} tokens in "
                        f"{config.out}; pass a smaller --val-tokens (or 0 for no validation set)")
    ordinal = {i.path: n for n, i in enumerate(manifest.input_records)}
    parts = [PartInfo(entry=e, input_ordinal=ordinal.get(e.input, -1)) for e in entries]
    source = Source(out=run.location, dtype=manifest.encoding.dtype, n_vocab=manifest.encoding.n_vocab,
                    job=manifest.done_job())

    dest = lease.location
    kind = target_kind(dest.fs)
    if not config.overwrite:
        prepare_dest(dest, config)  # an earlier export there is refused at once

    with runner.connect_to(config, announce=announce, local_paths=paths_used(config, [(run.location, manifest)])) as client:
        threshold = None
        val_docs = np.zeros(len(entries), dtype=np.int64)
        val_tokens = np.zeros(len(entries), dtype=np.int64)
        if not config.val_tokens:  # every partition checked before a byte is written (with validation: below)
            check_sources(client, source, parts)
        else:
            final = val_candidates(client, parts, source=source, val_tokens=config.val_tokens, check=True)
            threshold, val_docs, val_tokens = valsplit.choose(final, n_parts=len(entries))
            if int(val_docs.sum()) == int(docs.sum()):
                raise UserError(f"--val-tokens {config.val_tokens:,} takes every document of {config.out}; pass a smaller value")
            parts = [dataclasses.replace(p, val_docs=int(d), val_tokens=int(t)) for p, d, t in zip(parts, val_docs, val_tokens)]
        announce(checked([parts]))
        if config.overwrite:
            prepare_dest(dest, config)  # the export it replaces goes once the run read as it must
        streams = Streams.from_counts(docs=docs, tokens=tokens, val_docs=val_docs, val_tokens=val_tokens)
        announce(f"validation: {streams.docs('val'):,} documents, {streams.tokens('val'):,} tokens; "
                 f"train: {streams.docs('train'):,} documents, {streams.tokens('train'):,} tokens")
        files = config.fmt.files(streams, plan)

        def submit(chunks: list[Chunk], targets: list[Target]):
            return runner.submit(client, write_chunk, chunks, targets,
                                 [{k: parts[k] for k in sorted(c.partitions())} for c in chunks], source=source,
                                 threshold=threshold, dest_storage_options=config.storage_options)

        write_files(client, files, streams, submit=submit, dest=dest, kind=kind, config=config, announce=announce)

    record = export_record(config, manifest, kind=ORDERED, dtype=dtype, source=config.out, source_job=manifest.job,
                           val_selection="whole documents with the smallest blake2b-64(id), ties by (input, row), "
                                         "until val_tokens is reached",
                           splits=split_counts(streams), files=written_files(files))
    return finish(config, record=record, files=files, streams=streams, plan=plan, lease=lease, notes=[], t0=t0)
