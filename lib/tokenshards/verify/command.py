"""Check a finished run against format v1: every partition, in parallel, on the cluster.

The checks in the middle are pure (``checks``: already-read data in, a list of problem strings
out); reading happens at the edges: the manifest and one listing of ``parts/`` on the client, each
partition's own files in its own task on a worker (so it works the same on s3://), and only
short problem lists travel back. ``deep`` re-reads a seeded sample of documents' text from the
inputs and compares the stored tokens with tiktoken's ``encode_ordinary``, because a sha256 only
proves the bytes are the ones the run wrote, not that the run wrote the right ones.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
from distributed import Client

from .. import limits
from ..cluster import runner
from ..cluster.progress import Progress
from ..format import run as run_files
from ..format import v1
from ..format.docs import DocsError, parse_docs
from ..format.paths import open_input
from ..format.v1 import Manifest, PartitionEntry
from ..cluster import machines
from ..cluster.options import RunOptions
from ..encoding import registry
from ..encoding.boundaries import Boundaries
from ..encoding.chat import BadRow, messages_of, tools_of
from ..encoding.plugin import EncoderPlugin
from ..errors import UserError
from ..wording import counted
from ..corpus.footers import WORKER_FOOTERS
from ..storage.hubreaders import reading_plugins_for_run
from ..storage.location import Location
from ..storage.store import file_identity_like, filesystem, is_local
from ..corpus.plan import tools_to_read
from .checks import (Expected, check_docs, check_done, check_entries, check_listing, check_manifest, check_mask,
                     check_separators,
                     check_tokens, choose_sample, compare_document, expected_document, parse_tokens_file)


@dataclass(frozen=True, kw_only=True)
class VerifyConfig(RunOptions):
    """What to check and where it runs (verify where the run was made: ``cluster_config``); the CLI fills it."""

    out: str
    deep: int = 0
    """Documents to re-tokenize from the inputs (0: none)."""
    seed: int = 0
    download_dir: str | None = None
    """Where ``--deep`` finds each machine's copy of a ``--fetch workers`` run's Hub files (that
    run's ``--download-dir``, a path on every machine); None: the folder the run recorded, else
    each machine's HF cache. A file not there is read from the Hub by range."""
    encoding: str | None = None
    """``--deep``: where the run's tokenizer is now (None: as the manifest records it)."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "deep", limits.whole("--deep", self.deep, high=limits.MAX_COUNT,
                                                      what="a number of documents"))
        if self.deep < 0:
            raise UserError(f"--deep {self.deep} must be 0 or more documents")
        object.__setattr__(self, "seed", limits.whole("--seed", self.seed, low=limits.MIN_SEED, high=limits.MAX_SEED,
                                                      what="a seed"))


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    out: str
    problems: list[str]
    warnings: list[str]
    partitions: int | None
    """None when the manifest itself is unusable (so nothing else was checked)."""
    docs: int
    tokens: int
    compared: int
    """Documents --deep compared with the tokenizer's own library."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        deep = f", {self.compared:,} documents re-tokenized" if self.compared else ""
        verdict = "OK" if self.ok else f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
        if self.partitions is None:
            return f"{self.out}: manifest.json unusable, nothing else checked: {verdict}"
        return f"{counted(self.partitions, 'partition')}, {self.docs:,} documents, {self.tokens:,} tokens{deep}: {verdict}"

    def lines(self) -> list[str]:
        return ([f"warning: {w}" for w in self.warnings] + [f"problem: {p}" for p in self.problems]
                + [self.summary()])


# -- the task that runs on a worker (reads one partition's files) -------------------------------

def verify_partition(entry: PartitionEntry, sample: list[int], *, out: str, storage_options: dict,
                     expected: Expected) -> tuple[list[str], int]:
    """Every check of one partition, plus --deep's comparisons for ``sample`` (document positions).
    Returns (problems, documents compared); never the tokens. Damage nobody foresaw (say, nulls in
    a docs column) is reported as this partition's problem rather than ending the whole check."""
    try:
        return _verify_partition(entry, sample, out=out, storage_options=storage_options, expected=expected)
    except Exception as e:  # noqa: BLE001 -- turned into a problem line that names the partition
        return [f"partition {entry.index}: cannot be checked ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"], 0


def _verify_partition(entry: PartitionEntry, sample: list[int], *, out: str, storage_options: dict,
                      expected: Expected) -> tuple[list[str], int]:
    run = Location.at(out, storage_options)
    where = f"partition {entry.index}"
    problems: list[str] = []

    def read(name: str, what: str = "") -> bytes | None:
        """A file of the partition through ``format.run`` (regular, inside OUT), or None with its problem noted."""
        try:
            return run_files.read_bytes(run, name)
        except FileNotFoundError:
            problems.append(f"{where}: {name} is missing{what}")
        except run_files.BadRunFile as e:
            problems.append(f"{where}: {name} {e.problem}")
        return None

    tokens = None
    raw = read(entry.tokens_file)
    if raw is not None:
        tokens = parse_tokens_file(raw)
        problems += check_tokens(entry, tokens, expected=expected)
    mask = None
    if entry.mask_file and (raw := read(entry.mask_file)) is not None:
        mask = parse_tokens_file(raw)
        problems += check_mask(entry, mask)

    docs = None
    raw = read(entry.docs_file)
    if raw is not None:
        try:
            docs = parse_docs(raw)
        except DocsError as e:
            problems.append(f"{where}: {entry.docs_file} {e}")
        else:
            if entry.docs_sha256 is not None and hashlib.sha256(raw).hexdigest() != entry.docs_sha256:
                problems.append(f"{where}: {entry.docs_file}: sha256 {hashlib.sha256(raw).hexdigest()[:12]}… != "
                                f"manifest's {entry.docs_sha256[:12]}… (the file changed after the run)")
    n_tokens = tokens.shape[0] if tokens is not None and len(tokens.shape) == 1 else None
    docs_problems = check_docs(entry, docs, n_tokens=n_tokens) if docs is not None else []
    problems += docs_problems

    raw = read(v1.done_file(entry.index), ": the partition was never committed")
    if raw is not None:
        try:
            done = run_files.parse_done(run, v1.done_file(entry.index), raw, sums=False)
            problems += check_done(entry, done, job=expected.job)
        except run_files.BadRunFile as e:
            problems.append(f"{where}: {v1.done_file(entry.index)} unreadable ({e.problem})")

    # Look inside the token values only when the layout checks passed (indices are in bounds).
    if docs is None or docs_problems or tokens is None or tokens.values is None:
        return problems, 0
    starts, lengths = (docs.column(c).to_numpy().astype(np.int64) for c in ("start", "length"))
    problems += check_separators(entry, tokens.values, starts, lengths, expected=expected)
    if not sample or expected.encoder is None:
        return problems, 0
    deep_problems, compared = _compare_sample(entry, sorted(sample), docs, tokens.values, expected=expected,
                                              storage_options=storage_options,
                                              mask=mask.values if mask is not None else None)
    return problems + deep_problems, compared


def _compare_sample(entry: PartitionEntry, sample: list[int], docs: pa.Table, values: np.ndarray, *, expected: Expected,
                    storage_options: dict, mask: np.ndarray | None = None) -> tuple[list[str], int]:
    """Re-read the sampled documents' text from the input and re-tokenize it."""
    where = f"partition {entry.index}"
    rows = docs.column("row").to_pylist()
    sample = [i for i in sample if i < len(rows)]  # a wrong docs count is already reported
    recorded = (expected.input_identities or {}).get(entry.input)
    changed = _input_change(entry.input, recorded, storage_options=storage_options)
    tools: dict = {}
    if not changed:
        try:
            texts = _read_rows(entry.input, [rows[i] for i in sample], row_groups=entry.row_groups,
                               text_column=expected.text_column, storage_options=storage_options,
                               identity=tuple(recorded.items()) if recorded else (),
                               tools=expected.tools if expected.chat else None, tools_out=tools)
        except (OSError, pa.ArrowException, KeyError, ValueError) as e:
            texts = e
        # After the read too: a file replaced meanwhile was read through its old, kept footer.
        changed = _input_change(entry.input, recorded, storage_options=storage_options)
    if changed:
        return [f"{where}: input changed since the run ({entry.input}: {changed}); its documents were not "
                "compared; re-tokenize it to check"], 0
    if isinstance(texts, Exception):
        return [f"{where}: --deep cannot read {entry.input} ({type(texts).__name__}: {str(texts).splitlines()[0]})"], 0
    reference = expected.encoder.reference()
    ids, starts, lengths = (docs.column(c).to_pylist() for c in ("id", "start", "length"))
    problems = []
    for i in sample:
        row = rows[i]
        text = texts[row]
        label = f"{where}: document {i} (id {ids[i]!r}, row {row} of {entry.input})"
        if isinstance(text, Exception):
            problems.append(f"{label}: {text}")
            continue
        if not text:
            problems.append(f"{label}: the source text is {'null' if text is None else 'empty'}, "
                            "yet the partition holds tokens for it")
            continue
        if expected.chat:
            at = slice(starts[i], starts[i] + lengths[i])
            problems += _compare_chat(label, text, values[at], mask[at] if mask is not None else None,
                                      template=expected.encoder.chat_template(expected.chat_template),
                                      tools=tools.get(row))
            continue
        want = expected_document(reference.encode_one(text).tolist(), prefix=expected.prefix, suffix=expected.suffix)
        diff = compare_document(values[starts[i]:starts[i] + lengths[i]].tolist(), want)
        if diff:
            problems.append(f"{label}: differs from {getattr(reference, 'judge', reference.name)}: {diff}")
    return problems, len(sample)


def _compare_chat(label: str, value, ids: np.ndarray, mask: np.ndarray | None, *, template, tools=None) -> list[str]:
    """A chat row rendered (with its tools) and encoded again (``encoding.chat``), its ids and mask compared."""
    messages, given = messages_of(value), tools_of(tools)
    row = messages if not isinstance(messages, list) else given if isinstance(given, BadRow) \
        else template.encode(messages, given)
    if not isinstance(row, BadRow) and row is not None:
        diff = compare_document(ids.tolist(), row.ids.tolist())
        if diff:
            return [f"{label}: differs from its conversation rendered by the chat template: {diff}"]
        if mask is not None and not np.array_equal(mask, row.mask):
            differ = int((mask != row.mask).sum())
            return [f"{label}: its assistant mask differs from the chat template's ({differ} of {len(mask)} tokens)"]
        return []
    return [f"{label}: the row is now {'empty' if row is None else row.reason}, yet the partition holds tokens for it"]


def _input_change(url: str, recorded: dict | None, *, storage_options: dict) -> str | None:
    """How the input differs from when it was tokenized, or None (also when nothing was recorded)."""
    if not recorded:
        return None
    fs, path = filesystem(url, storage_options)
    try:
        now = file_identity_like(fs, path, recorded)
    except FileNotFoundError:
        return "removed"
    if dict(now) == recorded:
        return None
    # Named, never shown: the values come from the manifest (anyone's to edit) and from a file it
    # names, which may be one the user never meant to describe (/etc/shadow's size and mtime).
    now = dict(now)
    differ = sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
    return f"its {' and '.join(differ)} differ from what the run recorded" if differ else "changed"


PARQUET_MAGIC = b"PAR1"


def _not_parquet(url: str, storage_options: dict) -> str | None:
    """Why a local input is no parquet file for --deep to read (not a regular file, too short,
    no ``PAR1`` at both ends), or None; said without its size, time or bytes. A missing file,
    and inputs on object stores, are left to the workers' own check (``_input_change``)."""
    if "://" in url and not url.startswith("file://"):  # a store, or hfcache:// (known to the workers' plugin only)
        return None
    fs, path = filesystem(url, storage_options)
    if not is_local(fs):
        return None
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be read ({type(e).__name__})"
    if not stat.S_ISREG(mode):
        return f"is not a regular file ({v1.file_kind(mode)}); it is not opened"
    try:  # O_NONBLOCK: a file swapped for a FIFO since the stat does not hang the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        return f"cannot be read ({type(e).__name__})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "is not a regular file; it is not opened"
        head = os.pread(fd, 4, 0)
        size = os.fstat(fd).st_size
        tail = os.pread(fd, 4, size - 4) if size >= 12 else b""
    except OSError as e:
        return f"cannot be read ({type(e).__name__})"
    finally:
        os.close(fd)
    if head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        return "is not a parquet file"
    return None


def _chat_template(block: dict | None) -> str | None:
    """The template a chat run rendered with, when it was given by ``--chat-template`` (recorded whole)."""
    template = block.get("template") if isinstance(block, dict) else None
    return template if isinstance(template, str) else None


def _chat_template_problems(block: dict | None) -> list[str]:
    """A recorded ``--chat-template`` must be the one whose sha256 the run's identity holds."""
    template = _chat_template(block)
    if template is None or hashlib.sha256(template.encode()).hexdigest() == block.get("template_sha256"):
        return []
    return ["manifest.json: chat.template is not the template whose sha256 chat.template_sha256 records"]


def _chat_tools(block: dict | None) -> tuple[str, bool] | None:
    """The tools column a chat run read (its ``chat`` block; runs from before ``--tools-column``
    read none)."""
    if not block:
        return None
    return tools_to_read(block.get("column"), block.get("tools_column", "none"))


def _read_rows(url: str, rows: list[int], *, row_groups: tuple[int, int], text_column: str,
               storage_options: dict, identity: tuple = (), tools: tuple[str, bool] | None = None,
               tools_out: dict | None = None) -> dict[int, str | None | Exception]:
    """{row: text} for the given source rows, reading only the row groups that hold them; a row
    outside the partition's row groups maps to the problem it is. With the input's ``identity``
    as the run recorded it (checked unchanged just before), the footer is parsed once per worker
    for all the partitions of that file (``corpus.footers``). A chat run's ``tools`` column, where
    the input has it, fills ``tools_out`` ({row: tools}) the same way."""
    fs, path = filesystem(url, storage_options)
    with open_input(fs, path) as f:  # locally a regular file only, opened without blocking
        pf = WORKER_FOOTERS.open(f, url, identity)
        bounds = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)])
        group_of = {row: bisect_right(bounds, row) - 1 for row in rows}
        wanted = sorted({g for g in group_of.values() if row_groups[0] <= g < row_groups[1]})
        tools_column = tools[0] if tools is not None and tools[0] in pf.schema_arrow.names else None
        columns = [text_column] + ([tools_column] if tools_column else [])
        table = pf.read_row_groups(wanted, columns=columns) if wanted else None
    position = dict(zip(wanted, np.cumsum([0] + [int(bounds[g + 1] - bounds[g]) for g in wanted]).tolist()))
    texts: dict[int, str | None | Exception] = {}
    for row, g in group_of.items():
        if g not in position:
            texts[row] = ValueError(f"row {row} is not in the partition's row groups "
                                    f"{row_groups[0]}..{row_groups[1] - 1}")
        else:
            texts[row] = table.column(text_column)[position[g] + row - int(bounds[g])].as_py()
            if tools_column and tools_out is not None:
                tools_out[row] = table.column(tools_column)[position[g] + row - int(bounds[g])].as_py()
    return texts


# -- the client side -------------------------------------------------------------------------

def run_verify(config: VerifyConfig, *, announce: Callable[[str], None] = print) -> VerifyReport:
    """Check OUT; problems are returned, never raised. Raises ``UserError`` only when there is
    nothing to check (no manifest) or the cluster or storage can't be reached."""

    run = Location.at(config.out, config.storage_options)
    run_files.refuse_a_file(run)
    try:
        raw = run_files.read_manifest_json(run)
    except FileNotFoundError as e:
        raise UserError(v1.not_a_run(run) or f"{config.out} has no {v1.MANIFEST}: the run did not finish; "
                        "rerun the same tokenize command to resume") from e
    except run_files.BadRunFile as e:  # not a regular file inside OUT (never opened), or not JSON
        return _report(config, manifest=None, problems=[f"manifest.json: {e.problem}"])

    problems = check_manifest(raw)
    if problems:
        return _report(config, manifest=None, problems=problems)
    try:
        manifest = Manifest.from_dict(raw, bookkeeping=False)  # reported below, with the partitions' own checks
    except v1.ManifestError as e:  # check_manifest asks for more than this: a gap between the two
        return _report(config, manifest=None, problems=[f"manifest.json: {e}"])
    # No file the manifest names is opened unless it is a regular file inside OUT.
    problems = v1.local_file_problems(run, manifest)
    if problems:
        return _report(config, manifest=None, problems=problems)
    problems = check_entries(manifest) + run_files.commit_problems(run, manifest)
    try:
        names = _list_parts(run)
    except OSError as e:
        raise UserError(f"cannot list {config.out}/parts: {type(e).__name__}: {e}") from e
    listing_problems, warnings = check_listing(manifest, names)
    problems += listing_problems
    warnings += [f"input {s.get('path')} was skipped as unreadable when tokenizing ({s.get('reason')})"
                 for s in manifest.skipped_inputs]

    entries = manifest.by_index()
    enc = manifest.encoding
    prefix, suffix = enc.boundaries(manifest.eot_position)
    expected = Expected(dtype=enc.dtype, n_vocab=enc.n_vocab, eot=enc.eot, eot_position=manifest.eot_position,
                        prefix=prefix, suffix=suffix,
                        job=manifest.done_job(), text_column=manifest.text_column, chat=bool(manifest.extra.get("chat")),
                        tools=_chat_tools(manifest.extra.get("chat")), chat_template=_chat_template(manifest.extra.get("chat")))
    problems += _chat_template_problems(manifest.extra.get("chat"))
    loaded = None
    if config.deep:
        loaded, encoding_problems = _deep_encoding(manifest, announce=announce, encoding=config.encoding)
        problems += encoding_problems
    sample = choose_sample([(e.index, int(e.docs)) for e in entries], n=config.deep, seed=config.seed) \
        if loaded is not None else {}

    # An input --deep would read must be a parquet file, said in one line per input otherwise; its
    # documents are not compared (a FIFO would hang the read, /etc/shadow is no one's corpus).
    sampled = {e.input for e in entries if sample.get(e.index)}
    unfit = {path: why for path in sorted(sampled) if (why := _not_parquet(path, config.storage_options))}
    problems += [f"input {path}: {why}; --deep compared none of its documents" for path, why in unfit.items()]
    if unfit:
        input_of = {e.index: e.input for e in entries}
        sample = {i: rows for i, rows in sample.items() if input_of[i] not in unfit}
        sampled -= set(unfit)
    # The workers read the parts (and --deep's inputs): a pass must speak of what this machine sees.
    local_paths = [machines.reading_run("OUT", config.out, manifest.files(run.root)),
                   *[machines.PathUse(option="input", url=path, writes=False, files=(path,)) for path in sorted(sampled)]]
    with runner.connect_to(config, announce=announce, local_paths=local_paths) as client:
        if loaded is not None:
            plugin = EncoderPlugin(loaded, backend="reference")
            client.register_plugin(plugin)
            identities = manifest.input_identities(sampled)
            for hub in reading_plugins_for_run(identities, manifest.extra,
                                               download_dir=config.download_dir):  # a --fetch workers run's inputs
                client.register_plugin(hub)
            expected = dataclasses.replace(expected, encoder=plugin.ref, input_identities=identities)
        announce(f"verifying {counted(len(entries), 'partition')} of {config.out}"
                 + (f", re-tokenizing {sum(map(len, sample.values()))} documents" if sample else ""))
        partition_problems, compared = _verify_partitions(client, run, entries, sample, config=config, expected=expected)
    return _report(config, manifest=manifest, problems=problems + partition_problems, warnings=warnings,
                   compared=compared)


def _verify_partitions(client: Client, run: Location, entries: list[PartitionEntry], sample: dict[int, list[int]], *,
                       config: VerifyConfig, expected: Expected) -> tuple[list[str], int]:
    futures = runner.submit(client, verify_partition, entries, [sample.get(e.index, []) for e in entries],
                            out=run.task_url, storage_options=run.storage_options, expected=expected)
    results = runner.gather(client, futures, entries, explain=runner.failure(lambda e: f"checking partition {e.index}"),
                            progress=Progress(len(entries), mode=config.progress, amount=None))
    problems = [p for partition_problems, _ in results for p in partition_problems]
    return problems, sum(compared for _, compared in results)


def _deep_encoding(manifest: Manifest, *, announce: Callable[[str], None], encoding: str | None = None):
    """(tokenizer, problems): the manifest's tokenizer, loaded here as a run loads it (from
    ``encoding`` when given: the tokenizer's files moved, or the run came from another machine),
    must be the one the run recorded: same fingerprint, same encoding block."""
    block = manifest.encoding
    name = encoding or (block.extra.get("source") if block.kind in ("hf", "sentencepiece") else None) or block.name
    try:
        loaded = registry.load(name, announce=announce)
    except UserError as e:
        return None, [f"--deep: cannot load the manifest's tokenizer {name!r}: {e}; pass --encoding where it is now"]
    problems = []
    what = f"{name!r} as {getattr(loaded, 'library', 'tiktoken')} builds it here"
    if loaded.fingerprint != manifest.encoding_sha256:
        problems.append(f"manifest.json: encoding_sha256 {str(manifest.encoding_sha256)[:12]}… is not the "
                        f"fingerprint of {what} ({loaded.fingerprint[:12]}…): "
                        "the tokens were made with a different vocabulary")
    prefix, suffix = block.boundaries(manifest.eot_position)
    want = loaded.block(Boundaries(prefix=prefix, suffix=suffix))
    have = block.to_dict()
    differ = sorted(k for k in set(want) | set(have) if k not in ("source", "name") and want.get(k) != have.get(k))
    if differ:
        problems.append(f"manifest.json: encoding {', '.join(f'{k}={have.get(k)!r}' for k in differ)} != "
                        f"{', '.join(f'{k}={want.get(k)!r}' for k in differ)} of {what}")
    return loaded, problems


def _list_parts(run: Location) -> list[str]:
    """Every file under parts/, as a path relative to OUT (like the manifest's)."""
    if not run.exists("parts"):
        return []
    prefix = run.root.rstrip("/") + "/"
    return [p[len(prefix):] if p.startswith(prefix) else p for p in run.fs.find(run.join("parts"))]


def _report(config: VerifyConfig, *, manifest: Manifest | None, problems: list[str], warnings: list[str] = (),
            compared: int = 0) -> VerifyReport:
    return VerifyReport(out=config.out, problems=list(problems), warnings=list(warnings),
                        partitions=len(manifest.partitions) if manifest else None,
                        docs=manifest.totals.docs if manifest else 0, tokens=manifest.totals.tokens if manifest else 0,
                        compared=compared)
