"""Check a finished run against format v1: every partition, in parallel, on the cluster.

The checks in the middle are pure (already-read data in, a list of problem strings out);
reading happens at the edges: the manifest and one listing of ``parts/`` on the client, each
partition's own files in its own task on a worker (so it works the same on s3://), and only
short problem lists travel back. ``deep`` re-reads a seeded sample of documents' text from the
inputs and compares the stored tokens with tiktoken's ``encode_ordinary``, because a sha256 only
proves the bytes are the ones the run wrote, not that the run wrote the right ones.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import random
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from distributed import Client

from ..cluster import runner
from ..cluster.progress import Progress
from ..format import v1
from ..cluster.options import RunOptions
from ..tokenize.config import EOT_POSITIONS
from ..encoding.encoders import EncoderPlugin, load_encoding, plugin_name, token_dtype, worker_encoding
from ..errors import UserError
from ..storage.store import filesystem, is_local, join, read_json, storage_options

REQUIRED_KEYS = ("format", "encoding", "eot_position", "text_column", "inputs", "partitions", "totals",
                 # not in DESIGN's list, but every tokenshards run writes them and verify needs them:
                 # done records carry `job`, --deep compares the encoding with `encoding_sha256`.
                 "job", "encoding_sha256")
ENCODING_KEYS = ("name", "n_vocab", "eot", "dtype")
ENTRY_KEYS = ("index", "input", "row_groups", "rows", "docs", "skipped_null", "skipped_empty", "tokens",
              "tokens_file", "docs_file", "sha256")
DOCS_COLUMNS = ("id", "row", "start", "length")
TEMPORARY_SUFFIX = ".tmp"
"""store.write_atomic's in-flight names (``<path>.<uuid>.tmp``): left by a killed writer, harmless."""


@dataclass(frozen=True, kw_only=True)
class VerifyConfig(RunOptions):
    """What to check and where it runs (verify where the run was made: ``cluster_config``); the CLI fills it."""

    out: str
    deep: int = 0
    """Documents to re-tokenize from the inputs (0: none)."""
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        # Credentials must not show in a repr or in distributed's log of a failed task.
        object.__setattr__(self, "storage_options", storage_options(self.storage_options))
        if self.deep < 0:
            raise UserError(f"deep={self.deep} must be 0 or more documents")


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
    """Documents --deep compared with tiktoken."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        deep = f", {self.compared:,} documents re-tokenized" if self.compared else ""
        verdict = "OK" if self.ok else f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
        if self.partitions is None:
            return f"{self.out}: manifest.json unusable, nothing else checked: {verdict}"
        return f"{self.partitions:,} partitions, {self.docs:,} documents, {self.tokens:,} tokens{deep}: {verdict}"

    def lines(self) -> list[str]:
        return ([f"warning: {w}" for w in self.warnings] + [f"problem: {p}" for p in self.problems]
                + [self.summary()])


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What every partition must agree with, taken from the manifest; small, rides in each task."""

    dtype: str
    n_vocab: int
    eot: int
    eot_position: str
    job: str
    text_column: str
    encoder_plugin: str | None = None
    """Set when --deep compares documents: the worker plugin holding the encoding."""


@dataclass(frozen=True, kw_only=True)
class TokensFile:
    """What a tokens file holds, read once: its hash, its .npy header and (when sane) its values."""

    sha256: str
    header_problem: str | None
    dtype: str | None
    """The header's descr, e.g. ``<u2``."""
    fortran_order: bool
    shape: tuple
    data_bytes: int
    """Bytes after the header."""
    values: np.ndarray | None


# -- pure checks ---------------------------------------------------------------------------------

def check_manifest(manifest: dict) -> list[str]:
    """Problems with the manifest's own shape; partitions are checked only once this is empty."""
    if manifest.get("format") != v1.FORMAT:
        return [f"manifest.json: format is {manifest.get('format')!r}, expected {v1.FORMAT!r}"]
    problems = [f"manifest.json: required key {k!r} is missing" for k in REQUIRED_KEYS if k not in manifest]
    if problems:
        return problems
    enc = manifest["encoding"]
    if not isinstance(enc, dict) or any(k not in enc for k in ENCODING_KEYS):
        return [f"manifest.json: encoding {enc!r} lacks one of {', '.join(ENCODING_KEYS)}"]
    if enc["dtype"] != token_dtype(enc["n_vocab"]):
        problems.append(f"manifest.json: encoding dtype {enc['dtype']!r} does not fit n_vocab {enc['n_vocab']}, "
                        f"expected {token_dtype(enc['n_vocab'])!r}")
    if not 0 <= enc["eot"] < enc["n_vocab"]:
        problems.append(f"manifest.json: eot {enc['eot']} is not a token id of a {enc['n_vocab']}-token vocabulary")
    if manifest["eot_position"] not in EOT_POSITIONS:
        problems.append(f"manifest.json: eot_position {manifest['eot_position']!r}, expected one of {EOT_POSITIONS}")
    if not isinstance(manifest["partitions"], list):
        return problems + ["manifest.json: partitions is not a list"]
    for i, entry in enumerate(manifest["partitions"]):
        missing = [k for k in ENTRY_KEYS if not isinstance(entry, dict) or k not in entry]
        if missing:
            problems.append(f"manifest.json: partitions[{i}] lacks {', '.join(missing)}")
            continue
        not_counts = [k for k in ("index", *v1.TOTAL_KEYS) if not _is_count(entry[k])]
        if not_counts:
            problems.append(f"manifest.json: partitions[{i}] has {', '.join(not_counts)} that are not counts")
    if not isinstance(manifest["totals"], dict):
        problems.append("manifest.json: totals is not an object")
    return problems


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_entries(manifest: dict) -> list[str]:
    """Cross-partition bookkeeping: indices 0..n-1 once each, counts that add up, known inputs,
    relative paths. Needs a manifest that passed ``check_manifest``."""
    entries = manifest["partitions"]
    problems: list[str] = []
    indices = [e["index"] for e in entries]
    seen: set = set()
    for index in indices:
        if index in seen:
            problems.append(f"partition {index}: listed more than once in manifest.json")
        seen.add(index)
    # Partitions skipped as unreadable (--on-bad-file skip) are listed in skipped_inputs instead.
    skipped = {s["partition"] for s in manifest.get("skipped_inputs", []) if isinstance(s, dict) and "partition" in s}
    planned = manifest.get("planned_partitions", len(seen | skipped))
    missing = sorted(set(range(planned)) - seen - skipped)
    if missing:
        problems.append(f"manifest.json: partition indices {_ranges(missing)} are missing "
                        f"(expected 0..{planned - 1}, each once, less those in skipped_inputs)")
    known_inputs = {i.get("path") for i in manifest["inputs"] if isinstance(i, dict)}
    for e in entries:
        where = f"partition {e['index']}"
        if e["rows"] != e["docs"] + e["skipped_null"] + e["skipped_empty"]:
            problems.append(f"{where}: rows {e['rows']} != docs {e['docs']} + skipped_null {e['skipped_null']} "
                            f"+ skipped_empty {e['skipped_empty']}")
        if e["input"] not in known_inputs:
            problems.append(f"{where}: input {e['input']!r} is not among the manifest's inputs")
        for key in ("tokens_file", "docs_file"):
            path = e[key]
            if not isinstance(path, str) or path.startswith("/") or "://" in path or ".." in path.split("/"):
                problems.append(f"{where}: {key} {path!r} is not a path relative to OUT")
    totals = manifest["totals"]
    for key in v1.TOTAL_KEYS:
        total = sum(int(e[key]) for e in entries)
        if totals.get(key) != total:
            problems.append(f"manifest.json: totals.{key} is {totals.get(key)}, the partitions sum to {total}")
    return problems


def check_listing(manifest: dict, names: list[str]) -> tuple[list[str], list[str]]:
    """(problems, warnings) for files under ``parts/`` (paths relative to OUT) that the manifest
    doesn't list. A reader ignores them, but they mean a different or unfinished run wrote here."""
    listed = set()
    for e in manifest["partitions"]:
        listed.update((e["tokens_file"], e["docs_file"], v1.done_file(e["index"])))
    problems, warnings = [], []
    for name in sorted(set(names) - listed):
        if name.endswith(TEMPORARY_SUFFIX):
            warnings.append(f"{name}: temporary file left by an interrupted write; safe to delete")
        else:
            problems.append(f"{name}: in parts/ but not listed in manifest.json (left by another run?)")
    return problems, warnings


def check_tokens(entry: dict, tokens: TokensFile, *, expected: Expected) -> list[str]:
    """The tokens file is the one the manifest names: same bytes, and a 1-D little-endian array
    of the manifest's dtype with ``tokens`` ids, every id inside the vocabulary."""
    where = f"partition {entry['index']}: {entry['tokens_file']}"
    problems = []
    if tokens.sha256 != entry["sha256"]:
        problems.append(f"{where}: sha256 {tokens.sha256[:12]}… != manifest's {str(entry['sha256'])[:12]}… "
                        "(the file changed after the run)")
    if tokens.header_problem:
        return problems + [f"{where}: {tokens.header_problem}"]
    want = np.dtype(expected.dtype).newbyteorder("<").str
    if tokens.dtype != want:
        problems.append(f"{where}: dtype {tokens.dtype}, expected {want} (little-endian {expected.dtype})")
    if len(tokens.shape) != 1 or tokens.fortran_order:
        problems.append(f"{where}: shape {tokens.shape}, expected a 1-D array")
    elif tokens.shape[0] != entry["tokens"]:
        problems.append(f"{where}: {tokens.shape[0]} tokens, manifest says {entry['tokens']}")
    itemsize = np.dtype(tokens.dtype).itemsize if tokens.dtype else 0
    expected_bytes = int(np.prod(tokens.shape)) * itemsize
    if tokens.data_bytes != expected_bytes:
        problems.append(f"{where}: {tokens.data_bytes} bytes of data, its header promises {expected_bytes} "
                        "(truncated or padded)")
    if tokens.values is not None and tokens.values.size and int(tokens.values.max()) >= expected.n_vocab:
        problems.append(f"{where}: token id {int(tokens.values.max())} is outside the vocabulary "
                        f"(n_vocab {expected.n_vocab})")
    return problems


def check_docs(entry: dict, docs: pa.Table, *, n_tokens: int | None) -> list[str]:
    """The docs table indexes the tokens exactly: contiguous, covering the array, one row per
    document, source rows strictly increasing and within the partition's row count."""
    where = f"partition {entry['index']}: {entry['docs_file']}"
    missing = [c for c in DOCS_COLUMNS if c not in docs.column_names]
    if missing:
        return [f"{where}: lacks column(s) {', '.join(missing)} (has {', '.join(docs.column_names)})"]
    problems = []
    for c in ("row", "start", "length"):
        if not pa.types.is_integer(docs.schema.field(c).type):
            problems.append(f"{where}: column {c!r} holds {docs.schema.field(c).type}, expected int64")
    if not (pa.types.is_string(docs.schema.field("id").type) or pa.types.is_large_string(docs.schema.field("id").type)):
        problems.append(f"{where}: column 'id' holds {docs.schema.field('id').type}, expected strings")
    if problems:
        return problems
    if docs.num_rows != entry["docs"]:
        problems.append(f"{where}: {docs.num_rows} documents, manifest says docs={entry['docs']}")
    rows, starts, lengths = (docs.column(c).to_numpy().astype(np.int64) for c in ("row", "start", "length"))
    problems += check_layout(starts, lengths, n_tokens=n_tokens, where=where)
    if rows.size:
        steps = np.flatnonzero(np.diff(rows) <= 0)
        if steps.size:
            i = int(steps[0])
            problems.append(f"{where}: rows are not strictly increasing (document {i + 1} has row {rows[i + 1]} "
                            f"after row {rows[i]})")
        if rows.min() < 0 or rows.max() - rows.min() >= entry["rows"]:
            problems.append(f"{where}: rows {rows.min()}..{rows.max()} do not fit the partition's {entry['rows']} rows")
    return problems


def check_layout(starts: np.ndarray, lengths: np.ndarray, *, n_tokens: int | None, where: str) -> list[str]:
    """``start[0] == 0``, ``start[i+1] == start[i] + length[i]``, ``sum(length) == len(tokens)``."""
    problems = []
    if starts.size and starts[0] != 0:
        problems.append(f"{where}: first document starts at {starts[0]}, expected 0")
    gaps = np.flatnonzero(starts[1:] != starts[:-1] + lengths[:-1])
    if gaps.size:
        i = int(gaps[0]) + 1
        problems.append(f"{where}: document {i} starts at {starts[i]}, expected {starts[i - 1] + lengths[i - 1]} "
                        f"({gaps.size} gap(s) or overlap(s))")
    if (lengths < 1).any():
        problems.append(f"{where}: {int((lengths < 1).sum())} document(s) with no tokens")
    if n_tokens is not None and int(lengths.sum()) != n_tokens:
        problems.append(f"{where}: documents cover {int(lengths.sum())} tokens, the array holds {n_tokens}")
    return problems


def check_separators(entry: dict, values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, *,
                     expected: Expected) -> list[str]:
    """Each document's eot sits where the manifest says: a cheap check that catches shifted
    boundaries even when a rewritten sha256 hides the change."""
    if expected.eot_position == "none" or not starts.size:
        return []
    at = starts if expected.eot_position == "prefix" else starts + lengths - 1
    wrong = np.flatnonzero(values[at] != expected.eot)
    if not wrong.size:
        return []
    i = int(wrong[0])
    return [f"partition {entry['index']}: {entry['tokens_file']}: document {i} has {values[at[i]]} at token {at[i]} "
            f"where its eot ({expected.eot}, {expected.eot_position}) belongs ({wrong.size} document(s) like this)"]


def check_done(entry: dict, record: dict, *, job: str) -> list[str]:
    """The done record is the partition's commit: it must say what the manifest says."""
    where = f"partition {entry['index']}: {v1.done_file(entry['index'])}"
    problems = []
    if record.get("job") != job:
        problems.append(f"{where}: written by job {str(record.get('job'))[:12]}…, the manifest's is {job[:12]}…")
    body = {k: v for k, v in record.items() if k != "job"}
    differ = sorted(k for k in set(body) | set(entry) if body.get(k) != entry.get(k))
    if differ:
        shown = "; ".join(f"{k}: {body.get(k)!r} vs manifest {entry.get(k)!r}" for k in differ[:3])
        problems.append(f"{where}: disagrees with manifest.json ({shown})")
    return problems


def expected_document(body: list[int], *, eot: int, eot_position: str) -> list[int]:
    if eot_position == "prefix":
        return [eot] + body
    if eot_position == "suffix":
        return body + [eot]
    return body


def compare_document(stored: list[int], expected: list[int]) -> str | None:
    """None when equal, else where they first differ."""
    if stored == expected:
        return None
    i = next((i for i, (a, b) in enumerate(zip(stored, expected)) if a != b), min(len(stored), len(expected)))
    got = stored[i] if i < len(stored) else "end"
    want = expected[i] if i < len(expected) else "end"
    return (f"{len(stored)} tokens stored, tiktoken gives {len(expected)}; first difference at token {i} "
            f"(stored {got}, expected {want})")


def choose_sample(doc_counts: list[tuple[int, int]], *, n: int, seed: int) -> dict[int, list[int]]:
    """{partition index: [document positions]}: ``n`` documents drawn uniformly (seeded) from
    all partitions, so the same seed re-checks the same documents."""
    total = sum(count for _, count in doc_counts)
    picks = sorted(random.Random(seed).sample(range(total), min(n, total)))
    bounds = np.cumsum([0] + [count for _, count in doc_counts])
    chosen: dict[int, list[int]] = {}
    for pick in picks:
        k = bisect_right(bounds, pick) - 1
        chosen.setdefault(doc_counts[k][0], []).append(pick - int(bounds[k]))
    return chosen


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] → '1..3, 7' (a long list of missing indices stays one readable line)."""
    spans, first = [], None
    for a, b in zip(numbers, numbers[1:] + [None]):
        first = a if first is None else first
        if b != a + 1:
            spans.append(str(first) if first == a else f"{first}..{a}")
            first = None
    return ", ".join(spans[:10]) + (f", … ({len(numbers)} in all)" if len(spans) > 10 else "")


# -- the task that runs on a worker (reads one partition's files) -------------------------------

def parse_tokens_file(raw: bytes) -> TokensFile:
    """Hash the bytes and parse the .npy header by hand (np.load would accept what format v1
    doesn't: big-endian, pickles, Fortran order)."""
    sha = hashlib.sha256(raw).hexdigest()
    buf = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(buf)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(buf)
    except (ValueError, EOFError) as e:
        return TokensFile(sha256=sha, header_problem=f"not a .npy file ({e})", dtype=None, fortran_order=False,
                          shape=(), data_bytes=0, values=None)
    offset = buf.tell()
    data_bytes = len(raw) - offset
    values = None
    if dtype.kind == "u" and len(shape) == 1 and data_bytes == shape[0] * dtype.itemsize:
        values = np.frombuffer(raw, dtype=dtype, offset=offset)
    return TokensFile(sha256=sha, header_problem=None, dtype=dtype.str, fortran_order=fortran_order,
                      shape=tuple(shape), data_bytes=data_bytes, values=values)


def verify_partition(entry: dict, sample: list[int], *, out: str, storage_options: dict,
                     expected: Expected) -> tuple[list[str], int]:
    """Every check of one partition, plus --deep's comparisons for ``sample`` (document positions).
    Returns (problems, documents compared); never the tokens. Damage nobody foresaw (say, nulls in
    a docs column) is reported as this partition's problem rather than ending the whole check."""
    try:
        return _verify_partition(entry, sample, out=out, storage_options=storage_options, expected=expected)
    except Exception as e:  # noqa: BLE001 -- turned into a problem line that names the partition
        return [f"partition {entry['index']}: cannot be checked ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"], 0


def _verify_partition(entry: dict, sample: list[int], *, out: str, storage_options: dict,
                      expected: Expected) -> tuple[list[str], int]:
    fs, root = filesystem(out, storage_options)
    where = f"partition {entry['index']}"
    problems: list[str] = []

    tokens = None
    try:
        tokens = parse_tokens_file(fs.cat_file(join(root, entry["tokens_file"])))
    except FileNotFoundError:
        problems.append(f"{where}: {entry['tokens_file']} is missing")
    except OSError as e:
        problems.append(f"{where}: {entry['tokens_file']} unreadable ({type(e).__name__}: {e})")
    if tokens is not None:
        problems += check_tokens(entry, tokens, expected=expected)

    docs = None
    try:
        docs = pq.read_table(io.BytesIO(fs.cat_file(join(root, entry["docs_file"]))))
    except FileNotFoundError:
        problems.append(f"{where}: {entry['docs_file']} is missing")
    except (OSError, pa.ArrowException) as e:
        problems.append(f"{where}: {entry['docs_file']} unreadable ({str(e).splitlines()[0]})")
    n_tokens = tokens.shape[0] if tokens is not None and len(tokens.shape) == 1 else None
    docs_problems = check_docs(entry, docs, n_tokens=n_tokens) if docs is not None else []
    problems += docs_problems

    try:
        problems += check_done(entry, read_json(fs, join(root, v1.done_file(entry["index"]))), job=expected.job)
    except FileNotFoundError:
        problems.append(f"{where}: {v1.done_file(entry['index'])} is missing: the partition was never committed")
    except (OSError, ValueError) as e:
        problems.append(f"{where}: {v1.done_file(entry['index'])} unreadable ({type(e).__name__}: {e})")

    # Look inside the token values only when the layout checks passed (indices are in bounds).
    if docs is None or docs_problems or tokens is None or tokens.values is None:
        return problems, 0
    starts, lengths = (docs.column(c).to_numpy().astype(np.int64) for c in ("start", "length"))
    problems += check_separators(entry, tokens.values, starts, lengths, expected=expected)
    if not sample or expected.encoder_plugin is None:
        return problems, 0
    deep_problems, compared = _compare_sample(entry, sorted(sample), docs, tokens.values, expected=expected,
                                              storage_options=storage_options)
    return problems + deep_problems, compared


def _compare_sample(entry: dict, sample: list[int], docs: pa.Table, values: np.ndarray, *, expected: Expected,
                    storage_options: dict) -> tuple[list[str], int]:
    """Re-read the sampled documents' text from the input and re-tokenize it."""
    where = f"partition {entry['index']}"
    rows = docs.column("row").to_pylist()
    sample = [i for i in sample if i < len(rows)]  # a wrong docs count is already reported
    try:
        texts = _read_rows(entry["input"], [rows[i] for i in sample], row_groups=entry["row_groups"],
                           text_column=expected.text_column, storage_options=storage_options)
    except (OSError, pa.ArrowException, KeyError, ValueError) as e:
        return [f"{where}: --deep cannot read {entry['input']} ({type(e).__name__}: {str(e).splitlines()[0]})"], 0
    encoding = worker_encoding(expected.encoder_plugin)
    ids, starts, lengths = (docs.column(c).to_pylist() for c in ("id", "start", "length"))
    problems = []
    for i in sample:
        row = rows[i]
        text = texts[row]
        label = f"{where}: document {i} (id {ids[i]!r}, row {row} of {entry['input']})"
        if isinstance(text, Exception):
            problems.append(f"{label}: {text}")
            continue
        if not text:
            problems.append(f"{label}: the source text is {'null' if text is None else 'empty'}, "
                            "yet the partition holds tokens for it")
            continue
        want = expected_document(encoding.encode_ordinary(text), eot=expected.eot, eot_position=expected.eot_position)
        diff = compare_document(values[starts[i]:starts[i] + lengths[i]].tolist(), want)
        if diff:
            problems.append(f"{label}: differs from tiktoken encode_ordinary: {diff}")
    return problems, len(sample)


def _read_rows(url: str, rows: list[int], *, row_groups: list[int], text_column: str,
               storage_options: dict) -> dict[int, str | None | Exception]:
    """{row: text} for the given source rows, reading only the row groups that hold them; a row
    outside the partition's row groups maps to the problem it is."""
    fs, path = filesystem(url, storage_options)
    with fs.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        bounds = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)])
        group_of = {row: bisect_right(bounds, row) - 1 for row in rows}
        wanted = sorted({g for g in group_of.values() if row_groups[0] <= g < row_groups[1]})
        table = pf.read_row_groups(wanted, columns=[text_column]) if wanted else None
    position = dict(zip(wanted, np.cumsum([0] + [int(bounds[g + 1] - bounds[g]) for g in wanted]).tolist()))
    texts: dict[int, str | None | Exception] = {}
    for row, g in group_of.items():
        if g not in position:
            texts[row] = ValueError(f"row {row} is not in the partition's row groups "
                                    f"{row_groups[0]}..{row_groups[1] - 1}")
        else:
            texts[row] = table.column(text_column)[position[g] + row - int(bounds[g])].as_py()
    return texts


# -- the client side -------------------------------------------------------------------------

def run_verify(config: VerifyConfig, *, announce: Callable[[str], None] = print) -> VerifyReport:
    """Check OUT; problems are returned, never raised. Raises ``UserError`` only when there is
    nothing to check (no manifest) or the cluster or storage can't be reached."""

    fs, root = filesystem(config.out, config.storage_options)
    try:
        manifest = v1.read_manifest(fs, root)
    except FileNotFoundError as e:
        raise UserError(f"{config.out} has no {v1.MANIFEST}: the run did not finish; "
                        "rerun the same tokenize command to resume") from e
    except ValueError as e:
        return _report(config, manifest=None, problems=[f"manifest.json: not valid JSON ({e})"])

    problems = check_manifest(manifest)
    if problems:
        return _report(config, manifest=None, problems=problems)
    problems = check_entries(manifest)
    try:
        names = _list_parts(fs, root)
    except OSError as e:
        raise UserError(f"cannot list {config.out}/parts: {type(e).__name__}: {e}") from e
    listing_problems, warnings = check_listing(manifest, names)
    problems += listing_problems
    warnings += [f"input {s.get('path')} was skipped as unreadable when tokenizing ({s.get('reason')})"
                 for s in manifest.get("skipped_inputs", [])]

    entries = sorted(manifest["partitions"], key=lambda e: e["index"])
    enc = manifest["encoding"]
    expected = Expected(dtype=enc["dtype"], n_vocab=enc["n_vocab"], eot=enc["eot"],
                        eot_position=manifest["eot_position"], job=manifest["job"],
                        text_column=manifest["text_column"])
    loaded = None
    if config.deep:
        loaded, encoding_problems = _deep_encoding(manifest, announce=announce)
        problems += encoding_problems
    sample = choose_sample([(e["index"], int(e["docs"])) for e in entries], n=config.deep, seed=config.seed) \
        if loaded is not None else {}

    with runner.connect_to(config, announce=announce) as client:
        if loaded is not None:
            client.register_plugin(EncoderPlugin(loaded))
            expected = dataclasses.replace(expected, encoder_plugin=plugin_name(loaded))
        announce(f"verifying {len(entries)} partitions of {config.out}"
                 + (f", re-tokenizing {sum(map(len, sample.values()))} documents" if sample else ""))
        partition_problems, compared = _verify_partitions(client, entries, sample, config=config, expected=expected)
    return _report(config, manifest=manifest, problems=problems + partition_problems, warnings=warnings,
                   compared=compared)


def _verify_partitions(client: Client, entries: list[dict], sample: dict[int, list[int]], *, config: VerifyConfig,
                       expected: Expected) -> tuple[list[str], int]:
    fs, root = filesystem(config.out, config.storage_options)
    # A local OUT goes to workers as an absolute path: their working directory may differ.
    out = root if is_local(fs) else config.out
    futures = runner.submit(client, verify_partition, entries, [sample.get(e["index"], []) for e in entries],
                            out=out, storage_options=config.storage_options, expected=expected)
    results = runner.gather(client, futures, entries, explain=runner.failure(lambda e: f"checking partition {e['index']}"),
                            progress=Progress(len(entries), mode=config.progress, amount=None))
    problems = [p for partition_problems, _ in results for p in partition_problems]
    return problems, sum(compared for _, compared in results)


def _deep_encoding(manifest: dict, *, announce: Callable[[str], None]):
    """(encoding, problems): the manifest's encoding must be the one this tiktoken builds."""
    name = manifest["encoding"]["name"]
    try:
        loaded = load_encoding(name, announce=announce)
    except UserError as e:
        return None, [f"--deep: cannot load the manifest's encoding: {e}"]
    problems = []
    if loaded.fingerprint != manifest["encoding_sha256"]:
        problems.append(f"manifest.json: encoding_sha256 {str(manifest['encoding_sha256'])[:12]}… is not the "
                        f"fingerprint of {name!r} as tiktoken builds it here ({loaded.fingerprint[:12]}…): "
                        "the tokens were made with a different vocabulary")
    if loaded.spec.as_dict() != manifest["encoding"]:
        problems.append(f"manifest.json: encoding {manifest['encoding']} != {loaded.spec.as_dict()} as tiktoken builds it")
    return loaded, problems


def _list_parts(fs, root: str) -> list[str]:
    """Every file under parts/, as a path relative to OUT (like the manifest's)."""
    parts = join(root, "parts")
    if not fs.exists(parts):
        return []
    prefix = root.rstrip("/") + "/"
    return [p[len(prefix):] if p.startswith(prefix) else p for p in fs.find(parts)]


def _report(config: VerifyConfig, *, manifest: dict | None, problems: list[str], warnings: list[str] = (),
            compared: int = 0) -> VerifyReport:
    totals = manifest["totals"] if manifest else {}
    return VerifyReport(out=config.out, problems=list(problems), warnings=list(warnings),
                        partitions=len(manifest["partitions"]) if manifest else None, docs=int(totals.get("docs", 0)),
                        tokens=int(totals.get("tokens", 0)), compared=compared)
