"""The tokenize job: plan on the cluster, tokenize on the cluster, commit the manifest last."""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import dask
from distributed import Client, performance_report

from .. import crashpoints
from ..cluster import interrupt, machines, runner
from ..format import v1 as manifest
from ..format.run import check_destination
from ..format.v1 import PartitionEntry
from .config import TokenizeConfig
from . import grow
from ..encoding import prebuilt
from ..encoding import registry
from ..encoding.backends import backend_version, check_request
from ..encoding.boundaries import Boundaries
from ..encoding.chat import (GENERATION_RE, check_turn_rule, read_template_file, special_tokens_of, stop_warning,
                             template_of, tool_template_of)
from ..encoding.plugin import EncoderPlugin
from ..errors import UserError
from ..corpus.gather import Corpus, find_inputs, gather, open_inputs
from ..corpus.inputs import Inputs
from ..corpus.plan import BadInput, Piece, submission_order
from ..corpus.read import FRAME_META, read_piece
from .task import PIECE_META, RESULT_META, ChatSettings, TaskResult, TaskSettings, piece_frame, write_frame
from . import groups as groups_
from . import resume
from ..cluster.progress import Progress
from ..wording import counted, human
from ..storage.hubspec import PROTOCOL
from ..storage.lease import Lease
from ..storage.location import Location
from ..storage.store import abort_stale_uploads, file_identity_like, filesystem

if TYPE_CHECKING:
    import dask.dataframe as dd  # imported where the graph is built: a user's mistake is said before it


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
    """First task start (its read) to last task end, as the workers saw it."""
    encoding: str = ""

    def lines(self, *, label: str = "") -> list[str]:
        """``label`` follows "done" (a run of several encodings names each one's)."""
        rate = self.tokens / self.seconds if self.seconds else 0.0
        if self.partitions and self.skipped_partitions == self.partitions:  # nothing tokenized: no rate to give
            return [
                f"done{label}: {self.docs:,} documents, {self.tokens:,} tokens, skipped {self.skipped_null:,} null "
                f"and {self.skipped_empty:,} empty rows",
                f"      {counted(self.partitions, 'partition')} ({self.skipped_partitions} already committed): nothing "
                f"to tokenize, {self.seconds:.1f} s",
                f"      output: {self.out}",
            ]
        return [
            f"done{label}: {self.docs:,} documents, {self.tokens:,} tokens, skipped {self.skipped_null:,} null "
            f"and {self.skipped_empty:,} empty rows",
            f"      {counted(self.partitions, 'partition')} ({self.skipped_partitions} already committed), {self.seconds:.1f} s, "
            f"{human(rate)} tokens/s overall, tokenizing phase {self.tokenize_seconds:.2f} s",
            f"      output: {self.out}",
        ]


@dataclass(frozen=True)
class Summaries:
    """A run's summary per output, in the order of ``TokenizeConfig.outputs``."""

    each: tuple[Summary, ...]

    def lines(self) -> list[str]:
        if len(self.each) == 1:
            return self.each[0].lines()
        lines = [line for s in self.each for line in s.lines(label=f" ({s.encoding})")]
        return lines + [f"each partition was read and decoded once for the {len(self.each)} encodings"]


def run_tokenize(config: TokenizeConfig, *, announce: Callable[[str], None] = print) -> Summary:
    """Run a job of one output; returns its summary. Raises ``UserError`` for anything the user can fix."""
    if config.more_outputs:
        raise ValueError("run_tokenize writes one output; call run_tokenize_each for several encodings")
    [summary] = run_tokenize_each(config, announce=announce).each
    return summary


def run_tokenize_each(config: TokenizeConfig, *, announce: Callable[[str], None] = print,
                      started: float | None = None) -> Summaries:
    """Run the whole job, every output of ``config.outputs`` from one read of each partition;
    returns a summary per output. Raises ``UserError`` for anything the user can fix.
    ``started``: when the command began (``time.time()``), so the summary's time includes its
    start-up (imports, the forkserver); default now."""
    t0 = time.perf_counter() - (max(0.0, time.time() - started) if started is not None else 0.0)
    refuse_out_among_inputs(config)
    sources = find_inputs(config.inputs, storage_options=config.storage_options, announce=announce)
    locations = []
    fresh: list[_Fresh] = []
    try:
        for output in config.outputs:
            location = Location.at(output.out, config.storage_options)
            check_destination(location, "--out", may_be_a_run=True)  # not under a file, nor in another run
            fresh.append(_Fresh.before(location))
            location.ensure_writable()  # a missing bucket or dead endpoint fails here, in one line
            locations.append((output, location))
        # One live writer per OUT: taken before anything in OUT is removed or written, held to the end.
        with contextlib.ExitStack() as held:
            outs = []
            for (output, location), new in zip(locations, fresh):
                lease = held.enter_context(Lease(location, command="tokenize", announce=announce))
                new.owned = True
                outs.append(_Output(config=config.for_output(output), location=location, several=len(locations) > 1,
                                    lease=lease))
            try:
                return _run_owned(config, sources, outs, t0=t0, announce=announce)
            except BaseException:
                for new in fresh:
                    new.remove_if_unstarted()  # while the lease is held: no other writer is in OUT
                raise
    except BaseException:
        for new in fresh:
            new.remove_empty_folders()  # after the lease went: its file was the last one there
        raise


@dataclass(kw_only=True)
class _Fresh:
    """What an OUT held before this command, so that a run that stops before its first partition
    (an unknown encoding, an unreadable parquet file, a missing text column, a full disk) takes
    away what it made there: an empty ``parts/`` and a job file would read as a run to resume.
    Only ever what this command made: an OUT that held a job file or a manifest is left as it is,
    and nothing is removed once a partition is committed (a rerun resumes from it)."""

    location: Location
    existed: bool
    """The folder was there (local OUT): it stays, emptied of what this command made."""
    started_here: bool
    """No job file nor manifest was there: a job file now is this command's."""
    owned: bool = False
    """This command held OUT's lease (only then does it remove a job file: another writer's is not ours)."""

    @classmethod
    def before(cls, location: Location) -> "_Fresh":
        try:
            existed = location.exists() if location.is_local else True
            started_here = not (location.exists(manifest.JOB_FILE) or location.exists(manifest.MANIFEST))
        except Exception:  # an unreachable store: ensure_writable says so, in one line
            existed, started_here = True, False
        return cls(location=location, existed=existed, started_here=started_here)

    def remove_if_unstarted(self) -> None:
        if not (self.started_here and self.owned):
            return
        with contextlib.suppress(Exception):  # the error that stopped the run is the one to report
            location = self.location
            if location.exists(manifest.MANIFEST) or location.glob("parts", "part-*.done.json"):
                return  # a partition was committed: a rerun resumes from it
            if location.exists(manifest.JOB_FILE):
                location.fs.rm(location.join(manifest.JOB_FILE))
            if location.is_local:
                resume.remove_stale_temporaries(location)

    def remove_empty_folders(self) -> None:
        """``parts/`` (``ensure_writable`` makes it) and OUT itself if this command made it; each
        only if empty (``rmdir``): anything else there is not ours to remove."""
        if not (self.started_here and self.location.is_local):
            return
        for folder in [self.location.join("parts")] + ([self.location.root] if not self.existed else []):
            with contextlib.suppress(OSError):
                os.rmdir(folder)


@dataclass(kw_only=True)
class _Output:
    """One OUT of the run while it runs: what a run of its encoding alone would hold."""

    config: TokenizeConfig
    """The run as if it wrote this output alone (``TokenizeConfig.for_output``)."""
    location: Location
    """Its OUT."""
    lease: Lease
    several: bool = False
    loaded: object = None
    """The output's tokenizer, as ``encoding.registry.load`` gives it."""
    boundaries: Boundaries = Boundaries()
    backend: str = ""
    identity: dict = field(default_factory=dict)
    job: str = ""
    growth: grow.Growth | None = None
    """What this command adds to the run in OUT (``tokenize --add``), or None."""
    chat: dict | None = None
    """A chat run's ``chat`` block (``chat_block``), or None."""
    committed: dict[int, PartitionEntry] = field(default_factory=dict)
    entries: dict[int, PartitionEntry] = field(default_factory=dict)
    unreadable: list[BadInput] = field(default_factory=list)
    """Partitions its tasks found unreadable (``--on-bad-file skip``)."""
    first: float = float("inf")
    last: float = 0.0

    def about(self, note: str) -> str:
        """``note`` naming this output's folder, when the run has several."""
        return f"{self.config.out}: {note}" if self.several else note

    @property
    def parts_job(self) -> str:
        """The job its done records carry: a growth keeps the first run's."""
        return self.growth.parts_job if self.growth is not None else self.job


def refuse_out_among_inputs(config: TokenizeConfig) -> None:
    """An --out whose part files an --input would read (a folder holding it, a glob matching its
    ``parts/*.docs.parquet``): the next run would take them for corpus files. Refused in one line."""
    for output in config.outputs:
        out = _comparable(output.out)
        part = f"{out}/parts/part-00000.docs.parquet"
        for spec in config.inputs:
            where = _comparable(spec)
            if glob.has_magic(where):
                if re.fullmatch(_glob_regex(where), part):
                    raise UserError(f"--input {spec} would read the part files of --out {output.out} "
                                    f"({part.rsplit('/', 3)[-2]}/...docs.parquet) as corpus files: choose an --out "
                                    "the input glob does not reach")
            elif out == where or out.startswith(where.rstrip("/") + "/"):
                raise UserError(f"--out {output.out} is inside --input {spec}: the next run would read its part files "
                                "as corpus files; choose an --out outside the input folder")


def _comparable(url: str) -> str:
    """A local path made absolute with every symlink resolved (a glob's up to its first wildcard), a
    URL as written: what two locations are compared as."""
    local = url.removeprefix("file://")
    if "://" in local:
        return local.rstrip("/")
    path = os.path.abspath(os.path.expanduser(local))
    parts = path.split("/")
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    return "/".join([os.path.realpath("/".join(parts[:fixed]) or "/").rstrip("/"), *parts[fixed:]])


def _glob_regex(pattern: str) -> str:
    """fsspec's glob semantics as a regex: ``**`` crosses folders, ``*`` and ``?`` do not."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(pattern[i]))
                i += 1
            else:
                out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _run_owned(config: TokenizeConfig, sources: list, outs: list[_Output], *, t0: float,
               announce: Callable[[str], None]) -> Summaries:
    """The run, while it holds every OUT's lease."""
    for o in outs:
        if config.overwrite and o.location.exists():
            announce(f"--overwrite: removing the earlier run in {o.config.out}")
            resume.remove_run(o.location)
    growth = _growth(config, sources, outs, announce=announce)
    if growth is not None:  # a growth (tokenize --add): plan only the inputs it adds, cut as the run was
        if not growth.sources:
            announce(growth.nothing_to_add(config.out, add=config.add))
            return Summaries((_unchanged_summary(config, growth.kept, t0=t0),))
        sources, config = list(growth.sources), config.replace(partition_bytes=growth.partition_bytes)
        outs[0].growth = growth
    report = _performance_report(config.report)
    # Checked before a cluster starts; its notes wait so that the dashboard link comes first.
    encoding_notes: list[str] = []
    loaded: dict[str, object] = {}
    for o in outs:
        name = o.config.encoding
        o.loaded = loaded[name] = loaded.get(name) or registry.load(name, announce=encoding_notes.append)
        o.boundaries = o.config.boundaries(o.loaded)
        if config.chat_column is not None:
            chat_warnings: list[str] = []
            o.chat = chat_block(config, o.loaded, warn=chat_warnings.append)
            whose = f"the chat template in {config.chat_template}" if config.chat_template is not None \
                else f"{o.loaded.name}'s chat template"
            encoding_notes.append(f"chat: conversations in column {config.chat_column!r} rendered through {whose}; "
                                  "assistant tokens marked by "
                                  + ("its {% generation %} blocks" if o.chat["mask"] == "generation"
                                     else "the turn rule (read off the template's renderings of each turn; it marks "
                                          "no {% generation %}: docs/chat.md)")
                                  + _tools_note(config))
            encoding_notes += chat_warnings
        elif not o.loaded.legacy or not o.boundaries.single:
            encoding_notes.append(o.about(f"boundaries: {o.boundaries.describe(o.loaded.token_name)} "
                                          f"({o.boundaries.why})"))
    check_request(config.backend)  # the backend itself is verified once the cluster is starting
    # On a local cluster a Hub download starts here, in the background: it goes on while the
    # cluster starts and tokenizes (on another cluster, once the workers said what they see).
    inputs = open_inputs(sources, hub=config.hub, options=config, announce=announce, overlap=True)
    try:
        return _run_inputs(config, inputs, outs, encoding_notes, report,
                           local_paths=_local_paths(config, sources), t0=t0, announce=announce)
    finally:
        inputs.close()


def _run_inputs(config: TokenizeConfig, inputs: Inputs, outs: list[_Output], encoding_notes: list[str], report, *,
                local_paths: list[machines.PathUse], t0: float, announce: Callable[[str], None]) -> Summaries:
    """The run once its inputs are open (some may still be downloading). ``local_paths``: what
    the workers must see as this machine does, checked first thing on the cluster."""
    # Before any work: workers on other machines must see the same --input files and --out folder.
    with runner.connect_to(config, announce=announce, local_paths=local_paths) as client, report:
        # Local workers' forkserver verified the backend while this process started the cluster.
        notes = [_choose_backend(o, config.backend) for o in outs]
        for note in encoding_notes + notes:
            announce(note)
        growth = outs[0].growth
        corpus = gather(client, inputs, text_column=config.text_column, id_column=config.id_column,
                        chat=config.chat_column is not None,
                        storage_options=config.storage_options, partition_bytes=config.partition_bytes,
                        on_bad_file=config.on_bad_file, announce=announce,
                        first_index=growth.first_index if growth is not None else 0)
        pieces = corpus.pieces
        for o in outs:
            _claim(o, corpus, config, client=client, announce=announce)
        wanted = {p.index: tuple(i for i, o in enumerate(outs) if p.index not in o.committed) for p in pieces}
        pending = [p for p in pieces if wanted[p.index]]
        announce(f"{counted(len(corpus.sources), 'input file')}, {sum(f.rows for f in corpus.files):,} rows, "
                 f"{human(corpus.text_bytes)}B of text in {counted(len(pieces), 'partition')}"
                 + _committed_note(outs))
        settings = tuple(_task_settings(client, o, config) for o in outs)
        _tokenize_pending(client, pending, settings, config, outs, wanted=wanted,
                          already_done=len(pieces) - len(pending), announce=announce,
                          inputs=inputs, arriving=corpus.arriving)

    interrupt.check()  # a Ctrl-C swallowed inside Dask still stops us before the commit point
    for o in outs:
        # A worker killed mid-write during this run left one too; every partition is committed now.
        _clear_leftovers(o.location)
        o.lease.check()  # a run that stalled past its lease must not commit over its successor's files
        _check_parts_here(o.location, o.entries.values())
    _announce_invalid_rows({e.index: e for o in outs for e in o.entries.values()}.values(), announce=announce)
    _announce_bad_rows([e for o in outs for e in o.entries.values()], column=config.text_column, announce=announce)
    summaries = Summaries(tuple(_commit(o, corpus, t0=t0) for o in outs))
    if config.report:
        announce(f"performance report: {config.report}")
    return summaries


def _growth(config: TokenizeConfig, sources: list, outs: list[_Output], *,
            announce: Callable[[str], None]) -> grow.Growth | None:
    """The growth this command makes or finishes (``tokenize --add``, or a grown run resumed), or
    None. A growth is one run's: with several encodings, it is refused in one line."""
    if len(outs) > 1 and config.add:
        raise UserError("--add takes one --encoding and one --out at a time; run it once per output")
    found = [(o, grow.start(o.location, add=config.add, sources=sources, announce=announce,
                            partition_bytes=config.partition_bytes))
             for o in outs]
    grown = [o.config.out for o, growth in found if growth is not None]
    if len(outs) > 1 and grown:
        raise UserError(f"{grown[0]} holds a grown run: resuming it takes one --encoding and one --out at a time; "
                        "run it once per output")
    return found[0][1]


def _choose_backend(o: _Output, requested: str) -> str:
    """Pick the output's tokenizer (each encoding its own: ``auto`` verifies each against
    tiktoken); returns the line that says which."""
    loaded = o.loaded
    if o.chat is not None:  # transformers renders and encodes conversations; workers build the reference only
        o.backend = loaded.library
        return f"tokenizer: {backend_version('transformers')} (apply_chat_template's rendering, message text as text)"
    choice = prebuilt.ask(loaded.fingerprint, requested) or loaded.choose(requested)
    o.backend = choice.name
    return f"tokenizer{f' for {o.config.encoding}' if o.several else ''}: {choice.note}"


def _claim(o: _Output, corpus: Corpus, config: TokenizeConfig, *, client: Client,
           announce: Callable[[str], None]) -> None:
    """The output's job identity, claimed in its OUT, and the partitions an earlier run of the
    same job committed there (kept, never rewritten)."""
    files = corpus.files
    o.identity = resume.job_identity(
        encoding=o.loaded.block(o.boundaries), encoding_fingerprint=o.loaded.fingerprint,
        eot_position=o.boundaries.eot_position,
        text_column=config.text_column, id_column=config.id_column, partition_bytes=corpus.partition_bytes,
        inputs=[manifest.InputRecord(path=f.url, rows=f.rows, bytes=f.bytes, identity=dict(f.identity)).to_dict()
                for f in files],
    )
    # What decides a chat run's bytes besides the encoding (whose files hold the template); not
    # --on-bad-row: a partition committed under fail holds no bad row, and is the same under skip.
    chat = {"chat": {k: v for k, v in o.chat.items() if k != "on_bad_row"}} if o.chat is not None else {}
    if o.growth is not None:
        o.identity = o.growth.identity(o.identity)
        o.growth.claim(o.location, o.identity)
    else:
        resume.claim_output(o.location, o.identity,
                            identity_like=lambda path, recorded: _identity_like(path, recorded, config, files),
                            job=resume.identity_hash({**o.identity, **chat}))
    o.identity = {**o.identity, **chat}
    o.job = resume.identity_hash(o.identity)
    _clear_leftovers(o.location)
    redo: list[str] = []
    o.committed = resume.committed_entries(o.location, job=o.parts_job, pieces=corpus.pieces, redo=redo,
                                           kept=o.growth.kept_entries() if o.growth is not None else None,
                                           client=client, encoding=o.identity["encoding"])
    for note in redo:
        announce(o.about(note))
    o.entries = dict(o.committed)


def _committed_note(outs: list[_Output]) -> str:
    """What the start line adds about partitions earlier runs committed."""
    if not outs[0].several:
        committed = len(outs[0].committed)
        return f"; {committed} already committed, skipping them" if committed else ""
    said = [f"{len(o.committed)} in {o.config.out}" for o in outs if o.committed]
    return f"; already committed: {', '.join(said)} (each read once for the outputs that lack it)" if said else ""


def _task_settings(client: Client, o: _Output, config: TokenizeConfig) -> TaskSettings:
    """The output's settings for its tasks; its encoder is built once per worker by its plugin."""
    plugin = EncoderPlugin(o.loaded, backend=o.backend)
    client.register_plugin(plugin)
    return TaskSettings(out=o.config.out, storage_options=config.storage_options, encoder=plugin.ref,
                        dtype=o.loaded.dtype, boundaries=o.boundaries, job=o.parts_job,
                        text_column=config.text_column, on_bad_file=config.on_bad_file,
                        backend=backend_version("transformers" if o.chat is not None else o.backend), lease=o.lease.record.run,
                        chat=ChatSettings(on_bad_row=config.on_bad_row, tools=config.tools_to_read,
                                          template=o.chat.get("template")) if o.chat is not None else None)


def _commit(o: _Output, corpus: Corpus, *, t0: float) -> Summary:
    """Write the output's manifest, its commit point; its summary."""
    rows_of = {p.index: p.rows for p in corpus.pieces}  # so that verify can check each input's rows are covered
    unreadable = [dataclasses.replace(b, rows=rows_of[b.partition]) if b.partition is not None else b
                  for b in [*corpus.unreadable, *o.unreadable]]
    result = manifest.build_manifest(identity=o.identity, job=o.job, files=corpus.files, skipped=unreadable,
                                     entries=list(o.entries.values()),
                                     extra={"planned_partitions": len(corpus.pieces), **corpus.record,
                                            **({"chat": o.chat} if o.chat is not None else {})})
    if o.growth is not None:
        result = o.growth.manifest(result, planned=o.growth.first_index + len(corpus.pieces))
    manifest.write_manifest(o.location, result)
    crashpoints.reached(crashpoints.MANIFEST)
    totals = result.totals
    kept = len(o.growth.kept.partitions) if o.growth is not None else 0  # a growth's summary counts the whole run
    return Summary(out=o.config.out, partitions=kept + len(corpus.pieces), skipped_partitions=kept + len(o.committed),
                   docs=totals.docs, tokens=totals.tokens, skipped_null=totals.skipped_null,
                   skipped_empty=totals.skipped_empty, seconds=time.perf_counter() - t0,
                   tokenize_seconds=max(o.last - o.first, 0.0), encoding=o.config.encoding)


def _unchanged_summary(config: TokenizeConfig, kept: manifest.Manifest, *, t0: float) -> Summary:
    """The summary of a command that found nothing to do in OUT's finished run."""
    totals, n = kept.totals, len(kept.partitions)
    return Summary(out=config.out, partitions=n, skipped_partitions=n, docs=totals.docs, tokens=totals.tokens,
                   skipped_null=totals.skipped_null, skipped_empty=totals.skipped_empty,
                   seconds=time.perf_counter() - t0, tokenize_seconds=0.0, encoding=config.encoding)


def _local_paths(config: TokenizeConfig, sources: list) -> list[machines.PathUse]:
    """--input files and the --out folder, as the same-view check takes them (it skips URLs)."""
    return [*(machines.PathUse(option="--out", url=o.out, writes=True) for o in config.outputs),
            *machines.reading_inputs(config.inputs, [s.url for s in sources])]


def _identity_like(url: str, recorded: dict, config: TokenizeConfig, files: list) -> dict:
    """An input's file identity now, in the terms an earlier run recorded it in (``claim_output``).
    An input only workers open (``hfcache://``, ``--fetch workers``) has no file here: its identity
    is what the plan knew, as far as the record goes (versions before this one recorded its size)."""
    if url.startswith(f"{PROTOCOL}://"):
        planned = next((dict(f.identity) for f in files if f.url == url), {})
        return {k: v for k, v in planned.items() if k in recorded}
    return dict(file_identity_like(*filesystem(url, config.storage_options), recorded))


def _check_parts_here(out: Location, entries) -> None:
    """The manifest lists only files this machine sees: a worker that joined after the start-up
    check, on a machine that does not share a local OUT, wrote its parts to its own disk."""
    if not out.is_local:
        return
    missing = sorted(e.tokens_file for e in entries if not os.path.exists(out.join(e.tokens_file)))
    if missing:
        raise UserError(f"--out {out.url}: this machine's folder lacks {counted(len(missing), 'part file')} the workers wrote "
                        f"(first: {missing[0]}): some worker's machine does not share it; no manifest was written; "
                        "use s3://BUCKET/PREFIX or a folder on a filesystem every machine mounts, and rerun")


def _announce_invalid_rows(entries, *, announce: Callable[[str], None]) -> None:
    """One line per partition that skipped rows of invalid UTF-8 (``--on-bad-file skip``)."""
    for e in sorted(entries, key=lambda e: e.index):
        if e.skipped_invalid:
            rows = ", ".join(map(str, e.invalid_rows[:5])) + (", …" if e.skipped_invalid > 5 else "")
            announce(f"skipped {counted(e.skipped_invalid, 'row')} of {e.input} (partition {e.index}) whose "
                     f"text is not valid UTF-8: rows {rows}; recorded as skipped_invalid in the manifest")


def _announce_bad_rows(entries, *, column: str, announce: Callable[[str], None]) -> None:
    """One line per partition that skipped malformed chat rows (``--on-bad-row skip``)."""
    for e in sorted(entries, key=lambda e: e.index):
        if e.skipped_bad:
            rows = ", ".join(map(str, e.bad_row_numbers[:5])) + (", …" if e.skipped_bad > 5 else "")
            reasons = ", ".join(f"{n} {reason}" for reason, n in e.bad_rows.items())
            announce(f"skipped {counted(e.skipped_bad, 'row')} of {e.input} (partition {e.index}) whose column "
                     f"{column!r} holds malformed messages ({reasons}): rows {rows}; counted as skipped_bad and "
                     "bad_rows in the manifest")


def _tools_note(config: TokenizeConfig) -> str:
    tools = config.tools_to_read
    if tools is None:
        return "; no tools column"
    return f"; each row's tools from column {tools[0]!r}" + ("" if tools[1] else " where an input has one")


def chat_block(config: TokenizeConfig, loaded, *, warn: Callable[[str], None] = lambda line: None) -> dict:
    """The manifest's (and job identity's) ``chat`` block; a tokenizer without a chat template, or a
    template whose turns cannot be read, is refused here, in one line, before any work; one whose
    turns have no end the model could learn is ``warn``ed of (``chat.stop_warning``).
    ``--chat-template``'s text is recorded whole (``template``), so that verify renders with it."""
    if getattr(loaded, "kind", "") != "hf":
        raise UserError(f"--chat-column needs a Hugging Face tokenizer with a chat template (tokenizer.json + "
                        f"tokenizer_config.json, a folder or a Hub repo id); --encoding {config.encoding} is a "
                        f"{getattr(loaded, 'kind', 'tiktoken')} tokenizer, which has none")
    parsed = json.loads(loaded.extra) if loaded.extra else {}
    if config.chat_template is not None:
        template, tool_template = read_template_file(config.chat_template), None
        given = {"template_file": config.chat_template, "template": template}
    else:
        template, tool_template, given = template_of(parsed, name=config.encoding), tool_template_of(parsed), {}
    special_tokens = special_tokens_of(parsed)
    check_turn_rule(template, special_tokens)
    warning = stop_warning(template, special_tokens)
    if warning:
        warn(warning)
    tool_use = {"tool_use_template_sha256": hashlib.sha256(tool_template.encode()).hexdigest()} if tool_template else {}
    return {"column": config.chat_column, "template_sha256": hashlib.sha256(template.encode()).hexdigest(), **tool_use,
            **given, "mask": "generation" if GENERATION_RE.search(template) else "turn",
            "mask_file": "uint8 per token", "tools_column": config.tools_column, "on_bad_row": config.on_bad_row}


def _clear_leftovers(out: Location) -> None:
    """What killed writers leave: local ``*.tmp`` files, unfinished S3 multipart uploads, write
    probes of commands that failed or died. Only when no writer of this job is active (before its
    tasks start, after they all finished)."""
    resume.remove_stale_temporaries(out)
    out.remove_stale_probes()
    abort_stale_uploads(out.fs, out.join("parts"))


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


def partition_tasks(pending: list[Piece], settings: TaskSettings | tuple[TaskSettings, ...],
                    wanted: dict[int, tuple[int, ...]] | None = None) -> "dd.DataFrame":
    """The Dask DataFrame of the job: ``from_map`` reads each piece, ``map_partitions`` tokenizes
    and writes it, for each output (``settings``, one per output) that ``wanted`` lists for it
    (default: all); a row of ``TaskResult`` per output written. Build and compute it under ``DASK_SETTINGS``."""
    import dask.dataframe as dd  # here: a user error found before the graph is built need not wait for it

    read = _first(settings)
    frames = dd.from_map(read_piece, pending, text_column=read.text_column, storage_options=read.storage_options,
                         on_bad_file=read.on_bad_file, tools=read.chat.tools if read.chat else None, meta=FRAME_META,
                         enforce_metadata=False)
    outputs = [wanted[p.index] if wanted is not None else None for p in pending]
    pieces = dd.from_map(piece_frame, pending, outputs, meta=PIECE_META, enforce_metadata=False)
    return frames.map_partitions(write_frame, pieces, settings=settings, meta=RESULT_META, enforce_metadata=False)


def group_tasks(groups: list[groups_.Group], settings: TaskSettings | tuple[TaskSettings, ...],
                wanted: dict[int, tuple[int, ...]] | None = None) -> "dd.DataFrame":
    """``partition_tasks`` for groups of several pieces (``tokenize.groups``): a task per group,
    each piece of it read, tokenized, written and committed in turn, a row of ``TaskResult`` per
    partition and output. Build and compute it under ``DASK_SETTINGS``."""
    import dask.dataframe as dd  # here: as in partition_tasks

    outputs = [tuple(wanted[p.index] if wanted is not None else None for p in g) for g in groups]
    return dd.from_map(groups_.tokenize_group, groups, outputs, settings=settings, meta=RESULT_META,
                       enforce_metadata=False)


def _first(settings: TaskSettings | tuple[TaskSettings, ...]) -> TaskSettings:
    """What every output's settings share (how the piece is read) comes from the first."""
    return settings if isinstance(settings, TaskSettings) else settings[0]


def _tokenize_pending(client: Client, pending: list[Piece], settings: tuple[TaskSettings, ...], config: TokenizeConfig,
                      outs: list[_Output], *, wanted: dict[int, tuple[int, ...]], already_done: int,
                      announce: Callable[[str], None], inputs: Inputs, arriving: frozenset[str] = frozenset()) -> None:
    """Tokenize every pending piece, for the outputs ``wanted`` lists; fill each output's
    ``entries`` (and ``unreadable`` under --on-bad-file skip) and task times. Pieces of an input
    in ``arriving`` start when ``inputs`` says it arrived; each piece runs in its input's lane."""
    if not pending:
        for _ in inputs.arrivals(announce=announce):  # a rerun with everything committed: the sample
            pass                                      # is left downloaded, as a download-first run leaves it
        return

    # By file, small ends last (see ``submission_order``). Batches of arriving inputs keep this
    # order: they are runs of this list. Small pieces of one input go several to a task (``groups``).
    groups = groups_.group_pieces(submission_order(pending))

    rank = {g[0].index: i for i, g in enumerate(groups)}

    def submit(batch: list[groups_.Group], lane: runner.Lane | None) -> list:
        with dask.config.set(DASK_SETTINGS):
            singles, several = [g for g in batch if len(g) == 1], [g for g in batch if len(g) > 1]
            task_of = {}
            if singles:  # a task per planned partition, as a default run's
                task_of.update(zip((g[0].index for g in singles),
                                   partition_tasks([g[0] for g in singles], settings, wanted).to_delayed()))
            if several:
                task_of.update(zip((g[0].index for g in several), group_tasks(several, settings, wanted).to_delayed()))
            tasks = [task_of[g[0].index] for g in batch]
            # Each task's priority is its planned place, the first highest. Left to itself, Dask
            # orders a graph's independent tasks by their keys' text, backwards (partition 99, 98,
            # ..., 90, 9, 89, ...: measured, distributed 2026.8), and ranks batches sent within a
            # minute of each other as one.
            priority = {task.key: -rank[g[0].index] for task, g in zip(tasks, batch)}
            # to_delayed optimizes (fuses) the graph already; optimizing it again in compute only
            # culls it, a Python pass over every key: ~0.6 ms of client CPU per partition.
            with dask.annotate(priority=priority.__getitem__):
                return client.compute(tasks, retries=config.retries, optimize_graph=False,
                                      **(lane.restrictions() if lane is not None else {}))

    progress = Progress(already_done + len(pending), mode=config.progress, already_done=already_done)
    explain = runner.failure(groups_.describe)
    # Also waits for downloads no partition waits for (inputs skipped as unreadable).
    results = runner.each_result_as_ready(
        client, groups, submit, waiting_for=lambda g: g[0].input if g[0].input in arriving else None,
        arrivals=inputs.arrivals(announce=lambda msg: progress.say(announce, msg)),
        lane_of=lambda g: inputs.lane_of(g[0].input), explain=explain)
    try:
        for group, frame in results:
            each = TaskResult.all_from_frame(frame)
            said: set[int] = set()
            for result in each:
                piece, o = result.piece, outs[result.output]
                if result.unreadable is not None:
                    if piece.index not in said:  # the read failed: the same for every output
                        said.add(piece.index)
                        progress.say(announce, f"skipping unreadable partition {piece.index}: {result.unreadable}")
                    o.unreadable.append(BadInput(url=piece.input, reason=result.unreadable, partition=piece.index,
                                                 row_groups=piece.row_groups))
                    continue
                o.entries[piece.index] = result.entry
                o.first, o.last = min(o.first, result.started), max(o.last, result.finished)
            # Several encodings: the tokens of all of them (each output's own are in its summary).
            progress.update(sum(r.tokens for r in each), items=len(group))
    finally:
        progress.close()
