"""The tokenize job: plan on the cluster, tokenize on the cluster, commit the manifest last."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Callable

import dask
import dask.dataframe as dd
from distributed import Client, performance_report

from ..cluster import interrupt, machines, runner
from ..format import v1 as manifest
from ..format.v1 import PartitionEntry
from .config import TokenizeConfig
from . import grow
from ..encoding import prebuilt
from ..encoding.backends import backend_version, check_request, choose
from ..encoding.encoders import EncoderPlugin, load_encoding
from ..errors import UserError
from . import corpus
from ..inputs import Inputs
from .task import FRAME_META, PIECE_META, RESULT_META, TaskResult, TaskSettings, piece_frame, read_piece, write_frame
from .plan import BadInput, Piece, submission_order
from . import resume
from ..cluster.progress import Progress, human
from ..wording import counted
from ..storage.lease import Lease
from ..storage.store import abort_stale_uploads, ensure_writable, file_identity_like, filesystem, is_local, join


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
            f"      {counted(self.partitions, 'partition')} ({self.skipped_partitions} already committed), {self.seconds:.1f} s, "
            f"{human(rate)} tokens/s overall, tokenizing phase {self.tokenize_seconds:.1f} s",
            f"      output: {self.out}",
        ]


def run_tokenize(config: TokenizeConfig, *, announce: Callable[[str], None] = print) -> Summary:
    """Run the whole job; returns its summary. Raises ``UserError`` for anything the user can fix."""
    t0 = time.perf_counter()
    sources = corpus.find_inputs(config.inputs, storage_options=config.storage_options, announce=announce)
    out_fs, out_root = filesystem(config.out, config.storage_options)
    ensure_writable(out_fs, out_root, config.out)  # a missing bucket or dead endpoint fails here, in one line
    # One live writer per OUT: taken before anything in OUT is removed or written, held to the end.
    with Lease(out_fs, out_root, url=config.out, command="tokenize", announce=announce) as lease:
        return _run_owned(config, sources, lease, out_fs, out_root, t0=t0, announce=announce)


def _run_owned(config: TokenizeConfig, sources: list, lease: Lease, out_fs, out_root: str, *, t0: float,
               announce: Callable[[str], None]) -> Summary:
    """The run, while it holds OUT's lease."""
    if config.overwrite and out_fs.exists(out_root):
        announce(f"--overwrite: removing the earlier run in {config.out}")
        resume.remove_run(out_fs, out_root, url=config.out)
    growth = grow.start(out_fs, out_root, url=config.out, add=config.add, sources=sources, announce=announce,
                        partition_bytes=config.partition_bytes, storage_options=config.storage_options)
    if growth is not None:  # a growth (tokenize --add): plan only the inputs it adds, cut as the run was
        if not growth.sources:
            announce(growth.nothing_to_add(config.out, add=config.add))
            return _unchanged_summary(config, growth.kept, t0=t0)
        sources, config = list(growth.sources), config.replace(partition_bytes=growth.partition_bytes)
    report = _performance_report(config.report)
    # Checked before a cluster starts; its notes wait so that the dashboard link comes first.
    encoding_notes: list[str] = []
    loaded = load_encoding(config.encoding, announce=encoding_notes.append)
    check_request(config.backend)  # the backend itself is verified once the cluster is starting
    # On a local cluster a Hub download starts here, in the background: it goes on while the
    # cluster starts and tokenizes (on another cluster, once the workers said what they see).
    inputs = corpus.open_inputs(sources, hub=config.hub, options=config, announce=announce, overlap=True)
    try:
        return _run_inputs(config, inputs, loaded, encoding_notes, report, lease, out_fs, out_root,
                           local_paths=_local_paths(config, sources), t0=t0, announce=announce, growth=growth)
    finally:
        inputs.close()


def _run_inputs(config: TokenizeConfig, inputs: Inputs, loaded, encoding_notes: list[str], report,
                lease: Lease, out_fs, out_root: str, *, local_paths: list[machines.PathUse], t0: float,
                announce: Callable[[str], None], growth: grow.Growth | None = None) -> Summary:
    """The run once its inputs are open (some may still be downloading). ``local_paths``: what
    the workers must see as this machine does, checked first thing on the cluster."""
    spec = loaded.spec
    # Before any work: workers on other machines must see the same --input files and --out folder.
    with runner.connect_to(config, announce=announce, local_paths=local_paths) as client, report:
        # Local workers' forkserver verified the backend while this process started the cluster.
        choice = prebuilt.ask(loaded.fingerprint, config.backend) or choose(config.backend, loaded.encoding, loaded.params)
        backend = choice.name
        for note in encoding_notes + [f"tokenizer: {choice.note}"]:
            announce(note)
        plan = corpus.plan(client, inputs, text_column=config.text_column, id_column=config.id_column,
                           storage_options=config.storage_options, partition_bytes=config.partition_bytes,
                           on_bad_file=config.on_bad_file, announce=announce,
                           first_index=growth.first_index if growth else 0)
        files, pieces, unreadable = plan.files, plan.pieces, list(plan.unreadable)
        identity = resume.job_identity(
            encoding=spec.as_dict(), encoding_fingerprint=loaded.fingerprint, eot_position=config.eot_position,
            text_column=config.text_column, id_column=config.id_column, partition_bytes=plan.partition_bytes,
            inputs=[{"path": f.url, "rows": f.rows, "bytes": f.bytes, "identity": dict(f.identity)} for f in files],
        )
        if growth is not None:
            identity = growth.identity(identity)
            growth.claim(out_fs, out_root, identity, url=config.out)
        else:
            resume.claim_output(out_fs, out_root, identity, url=config.out,
                                identity_like=lambda path, recorded: _identity_like(path, recorded, config, files))
        job = resume.identity_hash(identity)
        done_job = growth.parts_job if growth is not None else job  # what done records carry
        _clear_leftovers(out_fs, out_root)
        redo: list[str] = []
        committed = resume.committed_entries(out_fs, out_root, job=done_job, pieces=pieces, redo=redo, url=config.out,
                                             kept=growth.kept_entries() if growth is not None else None)
        for note in redo:
            announce(note)
        pending = [p for p in pieces if p.index not in committed]
        announce(f"{counted(len(plan.sources), 'input file')}, {sum(f.rows for f in files):,} rows, "
                 f"{human(plan.text_bytes)}B of text in {counted(len(pieces), 'partition')}"
                 + (f"; {len(committed)} already committed, skipping them" if committed else ""))

        plugin = EncoderPlugin(loaded, backend=backend)
        client.register_plugin(plugin)
        settings = TaskSettings(out=config.out, storage_options=config.storage_options, encoder=plugin.ref,
                                dtype=spec.dtype, eot_position=config.eot_position, job=done_job,
                                text_column=config.text_column, on_bad_file=config.on_bad_file,
                                backend=backend_version(backend))
        entries = dict(committed)
        started, finished = _tokenize_pending(client, pending, settings, config, entries, unreadable,
                                              already_done=len(committed), announce=announce,
                                              inputs=inputs, arriving=plan.arriving)

    interrupt.check()  # a Ctrl-C swallowed inside Dask still stops us before the commit point
    # A worker killed mid-write during this run left one too; every partition is committed now.
    _clear_leftovers(out_fs, out_root)
    lease.check()  # a run that stalled past its lease must not commit over its successor's files
    _check_parts_here(out_fs, out_root, entries.values(), url=config.out)
    _announce_invalid_rows(entries.values(), announce=announce)
    rows_of = {p.index: p.rows for p in pieces}  # so that verify can check each input's rows are covered
    unreadable = [dataclasses.replace(b, rows=rows_of[b.partition]) if b.partition is not None else b for b in unreadable]
    result = manifest.build_manifest(identity=identity, job=job, files=files, skipped=unreadable, entries=list(entries.values()),
                                     extra={"planned_partitions": len(pieces),
                                            **plan.record})
    if growth is not None:
        result = growth.manifest(result, planned=growth.first_index + len(pieces))
    manifest.write_manifest(out_fs, out_root, result)
    if config.report:
        announce(f"performance report: {config.report}")
    totals = result.totals
    kept = len(growth.kept.partitions) if growth is not None else 0  # a growth's summary counts the whole run
    return Summary(out=config.out, partitions=kept + len(pieces), skipped_partitions=kept + len(committed), docs=totals["docs"],
                   tokens=totals["tokens"], skipped_null=totals["skipped_null"], skipped_empty=totals["skipped_empty"],
                   seconds=time.perf_counter() - t0, tokenize_seconds=max(finished - started, 0.0))


def _unchanged_summary(config: TokenizeConfig, kept: manifest.Manifest, *, t0: float) -> Summary:
    """The summary of a command that found nothing to do in OUT's finished run."""
    totals, n = kept.totals, len(kept.partitions)
    return Summary(out=config.out, partitions=n, skipped_partitions=n, docs=totals["docs"], tokens=totals["tokens"],
                   skipped_null=totals["skipped_null"], skipped_empty=totals["skipped_empty"],
                   seconds=time.perf_counter() - t0, tokenize_seconds=0.0)


def _local_paths(config: TokenizeConfig, sources: list) -> list[machines.PathUse]:
    """--input files and the --out folder, as the same-view check takes them (it skips URLs)."""
    return [machines.PathUse(option="--out", url=config.out, writes=True),
            *machines.reading_inputs(config.inputs, [s.url for s in sources])]


def _identity_like(url: str, recorded: dict, config: TokenizeConfig, files: list) -> dict:
    """An input's file identity now, in the terms an earlier run recorded it in (``claim_output``).
    An input only workers open (``hfcache://``, ``--fetch workers``) has no file here: its identity
    is what the plan knew, as far as the record goes (versions before this one recorded its size)."""
    from ..storage.hub.workerfs import PROTOCOL

    if url.startswith(f"{PROTOCOL}://"):
        planned = next((dict(f.identity) for f in files if f.url == url), {})
        return {k: v for k, v in planned.items() if k in recorded}
    return dict(file_identity_like(*filesystem(url, config.storage_options), recorded))


def _check_parts_here(fs, root: str, entries, *, url: str) -> None:
    """The manifest lists only files this machine sees: a worker that joined after the start-up
    check, on a machine that does not share a local OUT, wrote its parts to its own disk."""
    if not is_local(fs):
        return
    missing = sorted(e.tokens_file for e in entries if not os.path.exists(join(root, e.tokens_file)))
    if missing:
        raise UserError(f"--out {url}: this machine's folder lacks {counted(len(missing), 'part file')} the workers wrote "
                        f"(first: {missing[0]}): some worker's machine does not share it; no manifest was written; "
                        "use s3://BUCKET/PREFIX or a folder on a filesystem every machine mounts, and rerun")


def _announce_invalid_rows(entries, *, announce: Callable[[str], None]) -> None:
    """One line per partition that skipped rows of invalid UTF-8 (``--on-bad-file skip``)."""
    for e in sorted(entries, key=lambda e: e.index):
        if e.skipped_invalid:
            rows = ", ".join(map(str, e.invalid_rows[:5])) + (", …" if e.skipped_invalid > 5 else "")
            announce(f"skipped {counted(e.skipped_invalid, 'row')} of {e.input} (partition {e.index}) whose "
                     f"text is not valid UTF-8: rows {rows}; recorded as skipped_invalid in the manifest")


def _clear_leftovers(fs, root: str) -> None:
    """What killed writers leave: local ``*.tmp`` files, unfinished S3 multipart uploads. Only
    when no writer of this job is active (before its tasks start, after they all finished)."""
    resume.remove_stale_temporaries(fs, root)
    abort_stale_uploads(fs, join(root, "parts"))


def _performance_report(path: str | None):
    """Dask's performance report (task stream, worker profiles) saved as HTML when the job ends."""
    if not path:
        return contextlib.nullcontext()
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--report {path}: folder {folder} does not exist; create it or choose another file")
    return performance_report(filename=path)


DASK_SETTINGS = {
    # Our frames already hold Arrow strings; dask's convert-string pass would copy every text.
    "dataframe.convert-string": False,
    # The optimizer may fuse several ``from_map`` partitions into one task when it drops
    # columns ("tune"): a task must stay one planned partition, whose files it alone writes.
    "optimization.tune.active": False,
}


def partition_tasks(pending: list[Piece], settings: TaskSettings) -> dd.DataFrame:
    """The Dask DataFrame of the job: ``from_map`` reads each piece, ``map_partitions`` tokenizes
    and writes it; one row of ``TaskResult`` per partition. Build and compute it under ``DASK_SETTINGS``."""
    frames = dd.from_map(read_piece, pending, text_column=settings.text_column,
                         storage_options=settings.storage_options, on_bad_file=settings.on_bad_file,
                         meta=FRAME_META, enforce_metadata=False)
    pieces = dd.from_map(piece_frame, pending, meta=PIECE_META, enforce_metadata=False)
    return frames.map_partitions(write_frame, pieces, settings=settings, meta=RESULT_META, enforce_metadata=False)


def _tokenize_pending(client: Client, pending: list[Piece], settings: TaskSettings, config: TokenizeConfig,
                      entries: dict[int, PartitionEntry], unreadable: list[BadInput], *, already_done: int,
                      announce: Callable[[str], None], inputs: Inputs,
                      arriving: frozenset[str] = frozenset()) -> tuple[float, float]:
    """Tokenize every pending piece; fill ``entries`` (and ``unreadable`` under --on-bad-file skip);
    return (first start, last end) times of the tasks. Pieces of an input in ``arriving`` start
    when ``inputs`` says it arrived; each piece runs in its input's lane."""
    if not pending:
        for _ in inputs.arrivals(announce=announce):  # a rerun with everything committed: the sample
            pass                                      # is left downloaded, as a download-first run leaves it
        return 0.0, 0.0

    # By file, small ends last (see ``submission_order``). Batches of arriving inputs keep this
    # order: they are runs of this list.
    pending = submission_order(pending)

    def submit(batch: list[Piece], lane: runner.Lane | None) -> list:
        with dask.config.set(DASK_SETTINGS):
            return client.compute(partition_tasks(batch, settings).to_delayed(), retries=config.retries,
                                  **(lane.restrictions() if lane is not None else {}))

    progress = Progress(already_done + len(pending), mode=config.progress, already_done=already_done)
    first, last = float("inf"), 0.0
    explain = runner.failure(_describe_piece)
    tokens = lambda piece, frame: TaskResult.from_frame(frame).tokens  # noqa: E731
    # Also waits for downloads no partition waits for (inputs skipped as unreadable).
    results = runner.each_result_as_ready(
        client, pending, submit, waiting_for=lambda p: p.input if p.input in arriving else None,
        arrivals=inputs.arrivals(announce=lambda msg: progress.say(announce, msg)),
        lane_of=lambda p: inputs.lane_of(p.input), explain=explain, progress=progress, amount=tokens)
    for piece, frame in results:
        result = TaskResult.from_frame(frame)
        if result.unreadable is not None:
            progress.say(announce, f"skipping unreadable partition {piece.index}: {result.unreadable}")
            unreadable.append(BadInput(url=piece.input, reason=result.unreadable, partition=piece.index,
                                       row_groups=piece.row_groups))
            continue
        entries[piece.index] = result.entry
        first, last = min(first, result.started), max(last, result.finished)
    return first, last


def _describe_piece(piece: Piece) -> str:
    return f"partition {piece.index} ({piece.input}, row groups {piece.row_groups[0]}..{piece.row_groups[1] - 1})"
