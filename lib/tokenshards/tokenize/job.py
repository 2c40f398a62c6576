"""The tokenize job: plan on the cluster, tokenize on the cluster, commit the manifest last."""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Callable

import dask
import dask.dataframe as dd
from distributed import Client, as_completed, performance_report

from ..cluster import interrupt
from ..format import v1 as manifest
from ..cluster.connect import connect
from .config import TokenizeConfig
from ..encoding.backends import backend_version, choose_backend
from ..encoding.encoders import EncoderPlugin, load_encoding, plugin_name
from ..errors import UserError
from .task import FRAME_META, RECORD_META, PartitionJob, read_piece, tokenize_and_write
from .plan import BadInput, plan_pieces, read_footers
from ..cluster.progress import Progress, human
from ..storage.sources import resolve_inputs
from ..storage.store import abort_stale_uploads, ensure_writable, filesystem, join, storage_options


@dataclass(frozen=True, kw_only=True)
class Summary:
    out: str
    partitions: int
    skipped_partitions: int
    docs: int
    tokens: int
    skipped_null: int
    skipped_empty: int
    seconds: float
    tokenize_seconds: float
    """First task start to last task end, as the workers saw it."""

    def lines(self) -> list[str]:
        rate = self.tokens / self.seconds if self.seconds else 0.0
        return [
            f"done: {self.docs:,} documents, {self.tokens:,} tokens, skipped {self.skipped_null:,} null "
            f"and {self.skipped_empty:,} empty rows",
            f"      {self.partitions} partitions ({self.skipped_partitions} already committed), {self.seconds:.1f} s, "
            f"{human(rate)} tokens/s overall, tokenizing phase {self.tokenize_seconds:.1f} s",
            f"      output: {self.out}",
        ]


def run_tokenize(config: TokenizeConfig, *, announce: Callable[[str], None] = print) -> Summary:
    """Run the whole job; returns its summary. Raises ``UserError`` for anything the user can fix."""
    t0 = time.perf_counter()
    # Options (credentials too) travel in the task graph; their repr hides values from logs.
    config = config.replace(storage_options=storage_options(config.storage_options))
    sources = resolve_inputs(config.inputs, config.storage_options) if config.inputs else []
    out_fs, out_root = filesystem(config.out, config.storage_options)
    ensure_writable(out_fs, out_root, config.out)  # a missing bucket or dead endpoint fails here, in one line
    if config.overwrite and out_fs.exists(out_root):
        announce(f"--overwrite: removing the earlier run in {config.out}")
        manifest.remove_run(out_fs, out_root)
    report = _performance_report(config.report)
    # Checked before a cluster starts; its notes wait so that the dashboard link comes first.
    encoding_notes: list[str] = []
    loaded = load_encoding(config.encoding, announce=encoding_notes.append)
    spec = loaded.spec
    backend, backend_note = choose_backend(config.backend, loaded.encoding, loaded.params)
    encoding_notes.append(f"tokenizer: {backend_note}")
    if config.hub:
        from ..storage import hub  # huggingface_hub: imported only by runs that read the Hub
    listing = hub.list_files(config.hub) if config.hub else None
    if listing is not None and config.hub.fetch == "client":
        sources += hub.download(config.hub, listing, announce=announce)

    with connect(workers=config.workers, scheduler=config.scheduler, dashboard_address=config.dashboard_address,
                 announce=announce, cluster_config=config.cluster_config) as client, report:
        for note in encoding_notes:
            announce(note)
        if listing is not None and config.hub.fetch == "workers":
            sources += hub.prepare_workers(client, config.hub, listing, announce=announce)
        files, bad = read_footers(client, sources, text_column=config.text_column, id_column=config.id_column,
                                  storage_options=config.storage_options, on_bad_file=config.on_bad_file)
        if not files:
            raise UserError("every input was skipped as unreadable; nothing to tokenize")
        for b in bad:
            announce(f"skipping unreadable input: {b.reason}")
        partition_bytes = config.resolved_partition_bytes(sum(sum(f.row_group_text_bytes) for f in files))
        pieces = plan_pieces(files, target_bytes=partition_bytes)
        identity = manifest.job_identity(
            encoding=spec.as_dict(), encoding_fingerprint=loaded.fingerprint, eot_position=config.eot_position,
            text_column=config.text_column, id_column=config.id_column, partition_bytes=partition_bytes,
            inputs=[{"path": f.url, "rows": f.rows, "bytes": f.bytes} for f in files],
        )
        job = manifest.identity_hash(identity)
        manifest.claim_output(out_fs, out_root, identity, url=config.out)
        _clear_leftovers(out_fs, out_root)
        committed = manifest.committed_entries(out_fs, out_root, job=job, pieces=pieces)
        pending = [p for p in pieces if p.index not in committed]
        announce(f"{len(sources)} input files, {sum(f.rows for f in files):,} rows, "
                 f"{human(sum(p.text_bytes for p in pieces))}B of text in {len(pieces)} partitions"
                 + (f"; {len(committed)} already committed, skipping them" if committed else ""))

        client.register_plugin(EncoderPlugin(loaded, backend=backend))
        part_job = PartitionJob(out=config.out, storage_options=config.storage_options,
                                encoder_plugin=plugin_name(loaded, backend=backend),
                                dtype=spec.dtype, eot_position=config.eot_position, job=job,
                                backend=backend_version(backend))
        entries = dict(committed)
        started, finished = _run_pieces(client, pending, part_job, config, entries, bad, already_done=len(committed),
                                        announce=announce)

    interrupt.check()  # a Ctrl-C swallowed inside Dask still stops us before the commit point
    # A worker killed mid-write during this run left one too; every partition is committed now.
    _clear_leftovers(out_fs, out_root)
    result = manifest.build_manifest(identity=identity, files=files, skipped=bad, entries=list(entries.values()),
                                     extra={"planned_partitions": len(pieces),
                                            **({"hub": listing.record()} if listing is not None else {})})
    manifest.write_manifest(out_fs, out_root, result)
    if config.report:
        announce(f"performance report: {config.report}")
    totals = result["totals"]
    return Summary(out=config.out, partitions=len(pieces), skipped_partitions=len(committed), docs=totals["docs"],
                   tokens=totals["tokens"], skipped_null=totals["skipped_null"], skipped_empty=totals["skipped_empty"],
                   seconds=time.perf_counter() - t0, tokenize_seconds=max(finished - started, 0.0))


def _clear_leftovers(fs, root: str) -> None:
    """What killed writers leave: local ``*.tmp`` files, unfinished S3 multipart uploads. Only
    when no writer of this job is active (before its tasks start, after they all finished)."""
    manifest.remove_stale_temporaries(fs, root)
    abort_stale_uploads(fs, join(root, "parts"))


def _performance_report(path: str | None):
    """Dask's performance report (task stream, worker profiles) saved as HTML when the job ends."""
    if not path:
        return contextlib.nullcontext()
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--report {path}: folder {folder} does not exist; create it or choose another file")
    return performance_report(filename=path)


def _run_pieces(client: Client, pending, part_job: PartitionJob, config: TokenizeConfig, entries: dict[int, dict],
                unreadable: list[BadInput], *, already_done: int, announce: Callable[[str], None]) -> tuple[float, float]:
    """Tokenize every pending piece; fill ``entries`` (and ``unreadable`` under --on-bad-file skip);
    return (first start, last end) times of the tasks."""
    if not pending:
        return 0.0, 0.0
    # Largest first (Dask runs them roughly in submission order): the small last partitions of
    # each file then fill the final wave, so cores idle less at the end. Output does not change.
    pending = sorted(pending, key=lambda p: (-p.text_bytes, p.index))
    # Our frames already hold Arrow strings; dask's convert-string pass would copy every text.
    with dask.config.set({"dataframe.convert-string": False}):
        frames = dd.from_map(read_piece, pending, text_column=config.text_column, storage_options=config.storage_options,
                             on_bad_file=config.on_bad_file, meta=FRAME_META, enforce_metadata=False)
        records = frames.map_partitions(tokenize_and_write, job=part_job, meta=RECORD_META, enforce_metadata=False)
        futures = client.compute(records.to_delayed(), retries=config.retries)
    piece_of = {f.key: p for f, p in zip(futures, pending)}
    first, last = float("inf"), 0.0
    progress = Progress(already_done + len(pending), mode=config.progress, already_done=already_done)
    try:
        for future in as_completed(futures):
            piece = piece_of[future.key]
            try:
                row = future.result().iloc[0]
            except UserError:
                raise
            except Exception as e:
                raise UserError(f"partition {piece.index} ({piece.input}, row groups {piece.row_groups[0]}.."
                                f"{piece.row_groups[1] - 1}) failed: {type(e).__name__}: {e}") from e
            if row["unreadable"] is not None:
                progress.say(announce, f"skipping unreadable partition {piece.index}: {row['unreadable']}")
                unreadable.append(BadInput(url=piece.input, reason=row["unreadable"], partition=piece.index,
                                           row_groups=piece.row_groups))
                progress.update(0)
                continue
            entries[piece.index] = row["entry"]
            interrupt.check()
            first, last = min(first, row["started"]), max(last, row["finished"])
            progress.update(row["entry"]["tokens"])
            future.release()
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        progress.close()
    return first, last
