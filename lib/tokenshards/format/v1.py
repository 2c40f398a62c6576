"""Format v1, the contract with training code (DESIGN.md): its names, the typed partition entry
and manifest, the bytes of a partition's files, and the one ``.npy`` header parser.

Every module that writes or reads a run goes through here, so a new field is one edit. Which
partitions a rerun may keep (job identity, done records, claiming OUT) is not the format: that
lives in ``tokenize.resume``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import stat
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..corpus.plan import BadInput, InputFile
from ..errors import UserError
from ..storage.location import Location
from ..storage.store import join


FORMAT = "tokenshards/1"
MANIFEST = "manifest.json"
JOB_FILE = "tokenshards-job.json"
"""What the run in OUT was asked to do; the first file a run writes there, so a rerun with other
inputs or options can say exactly what differs (``tokenize.resume``), and a folder without it
and without ``parts/`` was never a run."""
TOTAL_KEYS = ("rows", "docs", "tokens", "skipped_null", "skipped_empty")
FORMAT_KEYS = ("format", "encoding", "eot_position", "text_column", "inputs", "partitions", "totals")
"""DESIGN's required keys: what any format v1 manifest holds, whoever wrote it."""
REQUIRED_KEYS = FORMAT_KEYS + (
    # not in DESIGN's list, but every tokenshards run writes them and verify needs them:
    # done records carry `job`, --deep compares the encoding with `encoding_sha256`.
    "job", "encoding_sha256")
ENCODING_KEYS = ("name", "n_vocab", "eot", "dtype")
ENTRY_KEYS = ("index", "input", "row_groups", "rows", "docs", "skipped_null", "skipped_empty", "tokens",
              "tokens_file", "docs_file", "sha256")
OPTIONAL_ENTRY_KEYS = ("backend", "tokens_bytes", "docs_bytes", "skipped_invalid", "invalid_rows",
                       "mask_file", "mask_sha256", "mask_bytes", "skipped_bad", "bad_rows", "bad_row_numbers")
"""Written after ``ENTRY_KEYS``, in this order, when set."""
MAX_LISTED_INVALID = 100
"""How many rows of invalid UTF-8 an entry lists (it counts them all)."""
DOCS_COLUMNS = ("id", "row", "start", "length")
NPY_HEAD_PROBE = 4096
"""Bytes enough to parse a ``.npy`` header; np.save pads 1-D headers to 64 or 128 bytes."""


class ManifestError(ValueError):
    """A manifest (or entry) that is not format v1; the message says what is wrong, without a path."""


class NpyHeaderError(ValueError):
    """Bytes that do not start with a ``.npy`` header."""


def part_stem(index: int) -> str:
    return f"parts/part-{index:05d}"


def tokens_file(index: int) -> str:
    return f"{part_stem(index)}.tokens.npy"


def docs_file(index: int) -> str:
    return f"{part_stem(index)}.docs.parquet"


def mask_file(index: int) -> str:
    """A chat run's assistant mask (``tokenize --chat-column``): ``.npy``, uint8, one per token."""
    return f"{part_stem(index)}.mask.npy"


def done_file(index: int) -> str:
    return f"{part_stem(index)}.done.json"


def part_index(name: str) -> int | None:
    """The partition number in a part file's name (``parts/part-00042.tokens.npy`` → 42), or None."""
    base = name.rsplit("/", 1)[-1]
    number = base[len("part-"):].split(".", 1)[0]
    return int(number) if base.startswith("part-") and number.isdigit() else None


# -- the one parser's checks: types, ranges, paths (pure: no file is opened) -------------------------

DTYPES = ("uint16", "uint32")
EOT_POSITIONS = ("prefix", "suffix", "none")
MAX_VOCAB = 2**32
"""n_vocab at most 2**32: every id then fits uint32, the widest dtype format v1 stores."""
MAX_TOKENS = 2**63 - 1
"""Counts and offsets are int64 in the docs files and in every reader."""
COUNT_KEYS = ("rows", "docs", "skipped_null", "skipped_empty", "tokens")


def vocabulary_dtype(n_vocab: int) -> str:
    """uint16 holds every id of a vocabulary of at most 65,536 (GPT-2: max id 50,256 < 2**16)."""
    return "uint16" if n_vocab <= 2**16 else "uint32"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_count(value) -> bool:
    return _is_int(value) and 0 <= value <= MAX_TOKENS


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first(problems: list[str]) -> str:
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more problem{'s' if more != 1 else ''})" if more else "")


def relative_path_problem(path) -> str | None:
    """Why ``path`` is not a path inside OUT, relative to it (None: it is one). A manifest is input
    like any other: an absolute path, a ``..``, a scheme or a drive letter would let it name any
    file, of another run or of the system, so none is allowed."""
    if not isinstance(path, str) or not path:
        return f"{_show(path)} is not a path"
    if path.startswith(("/", "\\", "~")) or "\\" in path or "\0" in path:
        return f"{_show(path)} is not a path relative to OUT (absolute, or with a backslash or NUL)"
    if "://" in path or ":" in path.split("/", 1)[0]:
        return f"{_show(path)} is not a path relative to OUT (it names a scheme or a drive)"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return f"{_show(path)} is not a plain path relative to OUT (empty, '.' or '..' parts)"
    return None


def encoding_problems(enc) -> list[str]:
    """The ``encoding`` block's types and ranges: a vocabulary that can exist, the dtype it needs,
    boundary ids inside it. Keys other tokenizer kinds add (``kind``, ``source``, ``files``) are
    kept as they are; ``prefix`` and ``suffix``, when present, are checked like ``eot``."""
    if not isinstance(enc, dict):
        return [f"encoding is {_show(enc)}, expected an object with {', '.join(ENCODING_KEYS)}"]
    missing = [k for k in ENCODING_KEYS if k not in enc]
    if missing:
        return [f"encoding {_show(enc)} lacks one of {', '.join(ENCODING_KEYS)}"]
    problems = []
    if not isinstance(enc["name"], str):
        problems.append(f"encoding.name is {_show(enc['name'])}, expected a string")
    n_vocab = enc["n_vocab"]
    if not (_is_int(n_vocab) and 1 <= n_vocab <= MAX_VOCAB):
        return problems + [f"encoding.n_vocab is {_show(n_vocab)}, expected an int in 1..{MAX_VOCAB} (2**32)"]
    if enc["dtype"] not in DTYPES:
        problems.append(f"encoding.dtype is {_show(enc['dtype'])}, expected one of {DTYPES}")
    elif enc["dtype"] != vocabulary_dtype(n_vocab):
        problems.append(f"encoding.dtype {enc['dtype']!r} does not fit n_vocab {n_vocab}, expected "
                        f"{vocabulary_dtype(n_vocab)!r} (uint16 iff n_vocab <= 65536)")
    if not (_is_int(enc["eot"]) and 0 <= enc["eot"] < n_vocab):
        problems.append(f"encoding.eot is {_show(enc['eot'])}, expected a token id: an int in 0..{n_vocab - 1}")
    for key in ("prefix", "suffix"):
        if key not in enc:
            continue
        ids = enc[key]
        if not isinstance(ids, list):
            problems.append(f"encoding.{key} is {_show(ids)}, expected a list of token ids")
            continue
        bad = [i for i in ids if not (_is_int(i) and 0 <= i < n_vocab)]
        if bad:
            problems.append(f"encoding.{key} holds {_show(bad[0])}, expected token ids: ints in 0..{n_vocab - 1}")
    for key in ("kind", "source"):
        if key in enc and enc[key] is not None and not isinstance(enc[key], (str, dict)):
            problems.append(f"encoding.{key} is {_show(enc[key])}, expected a string")
    if "files" in enc and not isinstance(enc["files"], (list, dict, type(None))):
        problems.append(f"encoding.files is {_show(enc['files'])}, expected a list")
    return problems


def entry_problems(d, *, where: str = "partition entry", sums: bool = True) -> list[str]:
    """One partition entry's (or done record's) types, ranges and paths; with ``sums``, its rows
    must add up too (a manifest's are checked with the rest of its bookkeeping)."""
    if not isinstance(d, dict):
        return [f"{where} is {_show(d)}, expected an object"]
    missing = [k for k in ENTRY_KEYS if k not in d]
    if missing:
        return [f"{where} lacks {', '.join(missing)}"]
    problems = []
    bad = [k for k in ("index", *COUNT_KEYS) if not _is_count(d[k])]
    bad += [k for k in ("skipped_invalid", "tokens_bytes", "docs_bytes", "mask_bytes", "skipped_bad")
            if d.get(k) is not None and not _is_count(d[k])]
    for k in bad:
        problems.append(f"{where}.{k} is {_show(d[k])}, expected a count (an int in 0..2**63-1)")
    rg = d["row_groups"]
    if not (isinstance(rg, list) and len(rg) == 2 and all(_is_count(g) for g in rg) and rg[0] <= rg[1]):
        problems.append(f"{where}.row_groups is {_show(rg)}, expected [first, stop] with 0 <= first <= stop")
    if not isinstance(d["input"], str):
        problems.append(f"{where}.input is {_show(d['input'])}, expected a string")
    sha = d["sha256"]
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        problems.append(f"{where}.sha256 is {_show(sha)}, expected 64 hex digits")
    if d.get("backend") is not None and not isinstance(d["backend"], str):
        problems.append(f"{where}.backend is {_show(d['backend'])}, expected a string")
    rows = d.get("invalid_rows")
    if rows is not None and not (isinstance(rows, list) and all(_is_count(r) for r in rows)):
        problems.append(f"{where}.invalid_rows is {_show(rows)}, expected a list of row numbers")
    reasons = d.get("bad_rows")
    if reasons is not None and not (isinstance(reasons, dict) and all(_is_count(v) for v in reasons.values())):
        problems.append(f"{where}.bad_rows is {_show(reasons)}, expected counts by reason")
    for key in ("tokens_file", "docs_file", *(("mask_file",) if d.get("mask_file") is not None else ())):
        problem = relative_path_problem(d[key])
        if problem:
            problems.append(f"{where}.{key} {problem}")
    if sums and not bad:
        problems += [f"{where}: {p}" for p in _rows_problem(d["rows"], d["docs"], d["skipped_null"], d["skipped_empty"],
                                                             d.get("skipped_invalid") or 0, d.get("skipped_bad") or 0)]
    return problems


def manifest_problems(d) -> list[str]:
    """What makes a manifest's JSON unusable, first problem first: version and keys, every field's
    type and range, every path (relative, inside OUT). No file is needed to see any of it, and no
    file may be opened before it is empty. ``Manifest.from_dict`` refuses a manifest with any (and
    with any ``bookkeeping_problems``); ``verify`` reports them all."""
    if not isinstance(d, dict):
        return [f"not a JSON object but {type(d).__name__}"]
    if d.get("format") != FORMAT:
        return [f"format {d.get('format')!r}, expected {FORMAT!r}"]
    missing = [f"required key {k!r} is missing" for k in FORMAT_KEYS if k not in d]
    if missing:
        return missing
    problems = encoding_problems(d["encoding"])
    if d["eot_position"] not in EOT_POSITIONS:
        problems.append(f"eot_position is {_show(d['eot_position'])}, expected one of {EOT_POSITIONS}")
    if not isinstance(d["text_column"], str):
        problems.append(f"text_column is {_show(d['text_column'])}, expected a string")
    inputs = d["inputs"]
    if not isinstance(inputs, list):
        problems.append(f"inputs is {_show(inputs)}, expected a list")
    else:
        for i, inp in enumerate(inputs):
            problems += input_problems(inp, where=f"inputs[{i}]")
    for key in ("skipped_inputs",):
        if d.get(key) is not None and not (isinstance(d[key], list) and all(isinstance(s, dict) for s in d[key])):
            problems.append(f"{key} is {_show(d[key])}, expected a list of objects")
    for key in ("partition_bytes", "planned_partitions"):
        if d.get(key) is not None and not _is_count(d[key]):
            problems.append(f"{key} is {_show(d[key])}, expected a count")
    partitions = d["partitions"]
    if not isinstance(partitions, list):
        return problems + [f"partitions is {_show(partitions)}, expected a list"]
    for i, entry in enumerate(partitions):
        problems += entry_problems(entry, where=f"partitions[{i}]", sums=False)
    problems += totals_problems(d["totals"])
    return problems


def totals_problems(totals) -> list[str]:
    """The ``totals`` block's keys and types; whether they are the partitions' sums is bookkeeping."""
    if not isinstance(totals, dict):
        return [f"totals is {_show(totals)}, expected an object"]
    missing = [k for k in TOTAL_KEYS if k not in totals]
    if missing:
        return [f"totals lacks {', '.join(missing)}"]
    problems = [f"totals.{k} is {_show(totals[k])}, expected a count (an int in 0..2**63-1)"
                for k in (*TOTAL_KEYS, "skipped_invalid", "skipped_bad") if k in totals and not _is_count(totals[k])]
    reasons = totals.get("bad_rows")
    if reasons is not None and not (isinstance(reasons, dict) and all(_is_count(v) for v in reasons.values())):
        problems.append(f"totals.bad_rows is {_show(reasons)}, expected counts by reason")
    return problems


def input_problems(d, *, where: str = "input") -> list[str]:
    """What makes one ``inputs`` entry (of the manifest or the job file) unusable."""
    if not (isinstance(d, dict) and isinstance(d.get("path"), str)):
        return [f"{where} is {_show(d)}, expected an object with a path"]
    problems = [f"{where}.{k} is {_show(d[k])}, expected a count" for k in ("rows", "bytes", "generation")
                if d.get(k) is not None and not _is_count(d[k])]
    if d.get("identity") is not None and not isinstance(d["identity"], dict):
        problems.append(f"{where}.identity is {_show(d['identity'])}, expected an object")
    return problems


def bookkeeping_problems(manifest: "Manifest") -> list[str]:
    """Counts that must agree across a manifest whose fields passed ``manifest_problems``: each
    partition's rows, indices 0..n-1 once each (less partitions skipped as unreadable), totals
    that are the partitions' sums, known inputs, each input's rows covered once. Pure."""
    entries = manifest.partitions
    problems: list[str] = []
    seen: set = set()
    for e in entries:
        if e.index in seen:
            problems.append(f"partition {e.index}: listed more than once in manifest.json")
        seen.add(e.index)
    # Partitions skipped as unreadable (--on-bad-file skip) are listed in skipped_inputs instead.
    skipped = {s["partition"] for s in manifest.skipped_inputs if isinstance(s, dict) and "partition" in s}
    planned = manifest.planned_partitions if manifest.planned_partitions is not None else len(seen | skipped)
    missing = sorted(set(range(planned)) - seen - skipped)
    if missing:
        problems.append(f"partition indices {ranges(missing)} are missing "
                        f"(expected 0..{planned - 1}, each once, less those in skipped_inputs)")
    known_inputs = {i.path for i in manifest.input_records}
    for e in entries:
        where = f"partition {e.index}"
        problems += [f"{where}: {p}" for p in _rows_problem(e.rows, e.docs, e.skipped_null, e.skipped_empty,
                                                            e.skipped_invalid, e.skipped_bad)]
        if e.input not in known_inputs:
            problems.append(f"{where}: input {e.input!r} is not among the manifest's inputs")
    problems += coverage_problems(manifest)
    totals = manifest.totals
    keys = list(TOTAL_KEYS)
    if totals.skipped_invalid is not None or any(e.skipped_invalid for e in entries):
        keys.append("skipped_invalid")
    if totals.skipped_bad is not None or any(e.skipped_bad for e in entries):
        keys.append("skipped_bad")
    for key in keys:
        total = sum(int(getattr(e, key)) for e in entries)
        if getattr(totals, key) != total:
            problems.append(f"totals.{key} is {_show(getattr(totals, key))}, the partitions sum to {total}")
        elif total > MAX_TOKENS:
            problems.append(f"totals.{key} is {total}, more than an int64 holds")
    return problems


def _rows_problem(rows: int, docs: int, null: int, empty: int, invalid: int, bad: int = 0) -> list[str]:
    if rows == docs + null + empty + invalid + bad:
        return []
    return [f"rows {rows} != docs {docs} + skipped_null {null} + skipped_empty {empty}"
            + (f" + skipped_invalid {invalid}" if invalid else "") + (f" + skipped_bad {bad}" if bad else "")]


def coverage_problems(manifest: "Manifest") -> list[str]:
    """Each input's rows are covered once: its partitions (and partitions skipped as unreadable)
    run over consecutive row groups from the first, and their rows add up to the input's."""
    by_input: dict[str, list[tuple]] = {}
    for e in manifest.partitions:
        by_input.setdefault(e.input, []).append((e.row_groups, e.rows, e.index))
    for s in manifest.skipped_inputs:
        if isinstance(s, dict) and "partition" in s:
            by_input.setdefault(s.get("path"), []).append((s.get("row_groups"), s.get("rows"), s["partition"]))
    problems = []
    for inp in manifest.input_records:
        if inp.rows is None:
            continue
        path, rows = inp.path, inp.rows
        parts = [p for p in by_input.get(path, []) if isinstance(p[0], (list, tuple)) and len(p[0]) == 2]
        parts.sort(key=lambda p: tuple(p[0]))
        if not by_input.get(path):
            if rows:
                problems.append(f"input {path}: no partition covers its {rows:,} rows")
            continue
        stop = 0
        for groups, _, index in parts:
            if groups[0] != stop:
                problems.append(f"input {path}: partition {index} starts at row group {groups[0]}, expected {stop} "
                                f"(row groups {'missing' if groups[0] > stop else 'covered twice'})")
            stop = groups[1]
        counts = [r for _, r, _ in by_input[path]]
        if all(_is_count(r) for r in counts) and sum(counts) != rows:
            problems.append(f"input {path}: its partitions cover {sum(counts):,} rows, the input has {rows:,} "
                            "(a partition is missing from manifest.json)")
    return problems


def ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] → '1..3, 7' (a long list of missing indices stays one readable line)."""
    spans, first = [], None
    for a, b in zip(numbers, numbers[1:] + [None]):
        first = a if first is None else first
        if b != a + 1:
            spans.append(str(first) if first == a else f"{first}..{a}")
            first = None
    return ", ".join(spans[:10]) + (f", … ({len(numbers)} in all)" if len(spans) > 10 else "")


# -- the typed manifest ----------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class PartitionEntry:
    """One manifest ``partitions`` entry (also the body of the partition's done record)."""

    index: int
    input: str
    row_groups: tuple[int, int]
    rows: int
    docs: int
    skipped_null: int
    skipped_empty: int
    tokens: int
    tokens_file: str
    docs_file: str
    sha256: str
    """Of the tokens file's bytes."""
    backend: str | None = None
    """The tokenizer that wrote the partition (``"splintr 0.22.0"``); absent in older runs."""
    tokens_bytes: int | None = None
    docs_bytes: int | None = None
    """Sizes of the two files, so a rerun can tell a committed partition's files are whole from
    one listing; absent in older runs."""
    skipped_invalid: int = 0
    """Rows whose text was not valid UTF-8, skipped under ``--on-bad-file skip`` (written only when
    some were): then ``rows == docs + skipped_null + skipped_empty + skipped_invalid``."""
    invalid_rows: tuple[int, ...] = ()
    """The first of those rows (at most ``MAX_LISTED_INVALID``), for the user to look at."""
    mask_file: str | None = None
    """A chat run's assistant mask (``mask_file(index)``), written and committed with the tokens."""
    mask_sha256: str | None = None
    mask_bytes: int | None = None
    skipped_bad: int = 0
    """Chat rows whose messages were malformed, skipped under ``--on-bad-row skip``: then
    ``rows == docs + skipped_null + skipped_empty + skipped_invalid + skipped_bad``."""
    bad_rows: dict = field(default_factory=dict)
    """Those rows counted by reason (``encoding.chat.BAD_REASONS``)."""
    bad_row_numbers: tuple[int, ...] = ()
    """The first of them (at most ``MAX_LISTED_INVALID``)."""
    extra: dict = field(default_factory=dict, compare=True)
    """Keys this version does not know, kept so that nothing read is lost."""

    def to_dict(self) -> dict:
        """The JSON object, keys in the order every tokenshards run has written them."""
        entry = {k: getattr(self, k) for k in ENTRY_KEYS}
        entry["row_groups"] = list(self.row_groups)
        if self.backend is not None:
            entry["backend"] = self.backend
        for key in OPTIONAL_ENTRY_KEYS[1:]:
            value = getattr(self, key)
            if value:  # None, 0 and () are left out, as older runs had no such key
                entry[key] = list(value) if isinstance(value, tuple) else value
        entry.update(self.extra)
        return entry

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "partition entry", sums: bool = True) -> "PartitionEntry":
        """Parse and check (``entry_problems``): ``ManifestError`` names the first problem."""
        problems = entry_problems(d, where=where, sums=sums)
        if problems:
            raise ManifestError(_first(problems))
        known = ENTRY_KEYS + OPTIONAL_ENTRY_KEYS
        values = {k: d[k] for k in ENTRY_KEYS}
        rg = d["row_groups"]
        values["row_groups"] = tuple(rg) if isinstance(rg, (list, tuple)) else rg
        optional = {k: d[k] for k in OPTIONAL_ENTRY_KEYS if d.get(k) is not None}
        for key in ("invalid_rows", "bad_row_numbers"):
            if key in optional:
                optional[key] = tuple(optional[key])
        return cls(**values, **optional, extra={k: v for k, v in d.items() if k not in known})


@dataclass(frozen=True, kw_only=True)
class InputRecord:
    """One input as OUT records it: an entry of the manifest's ``inputs`` and of the job file's
    (which has no ``name``). Its ``identity`` guards a rerun against a replaced file."""

    path: str
    """Where tasks open it (a path, a URL, ``hfcache://``); the key every partition's ``input`` names."""
    name: str | None = None
    """What ``"<name>:<row>"`` ids are made of (manifest only)."""
    rows: int | None = None
    bytes: int | None = None
    identity: dict | None = None
    """``store.file_identity`` when it was planned; absent in runs of early versions."""
    generation: int | None = None
    """Which growth (``tokenize --add``) added it; written once a run is grown."""
    extra: dict = field(default_factory=dict)
    """Keys this version does not know, kept so that nothing read is lost."""

    @property
    def added_by(self) -> int:
        """The generation that added it: 0 for the first run (a run never grown records none)."""
        return self.generation or 0

    def to_dict(self) -> dict:
        """The JSON object, keys in the order every tokenshards run has written them."""
        out: dict = {"path": self.path}
        for key in ("name", "rows", "bytes", "identity", "generation"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d, *, where: str = "input") -> "InputRecord":
        """Parse and check (``input_problems``): ``ManifestError`` names the first problem."""
        problems = input_problems(d, where=where)
        if problems:
            raise ManifestError(_first(problems))
        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        return cls(**{k: d[k] for k in names if d.get(k) is not None},
                   extra={k: v for k, v in d.items() if k not in names})

    @classmethod
    def all_from(cls, inputs, *, where: str = "inputs") -> "tuple[InputRecord, ...]":
        """A list of entries (a manifest's or a job file's ``inputs``)."""
        if not isinstance(inputs, (list, tuple)):
            raise ManifestError(f"{where} is {_show(inputs)}, expected a list")
        return tuple(cls.from_dict(d, where=f"{where}[{i}]") for i, d in enumerate(inputs))


@dataclass(frozen=True, kw_only=True)
class DoneRecord:
    """``parts/part-NNNNN.done.json``: a partition's manifest entry and the job that wrote it.
    Its presence commits the partition; it is written last, once both data files are whole."""

    entry: PartitionEntry
    job: str

    def to_dict(self) -> dict:
        return {**self.entry.to_dict(), "job": self.job}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    @classmethod
    def from_dict(cls, d, *, where: str = "done record", sums: bool = True) -> "DoneRecord":
        """``ManifestError`` names the first problem; ``sums=False`` (verify) leaves the counts'
        agreement to be reported rather than refused."""
        if not isinstance(d, dict):
            raise ManifestError(f"{where} is {_show(d)}, expected an object")
        if not isinstance(d.get("job"), str):
            raise ManifestError(f"{where}: job is {_show(d.get('job'))}, expected a string")
        body = {k: v for k, v in d.items() if k != "job"}
        return cls(entry=PartitionEntry.from_dict(body, where=where, sums=sums), job=d["job"])


@dataclass(frozen=True, kw_only=True)
class Encoding:
    """The manifest's ``encoding`` block: what a reader needs to interpret the token ids."""

    name: str
    n_vocab: int
    eot: int
    dtype: str
    """``uint16`` when n_vocab <= 65536, else ``uint32``; stored little-endian."""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "n_vocab": self.n_vocab, "eot": self.eot, "dtype": self.dtype, **self.extra}

    @property
    def kind(self) -> str:
        """``tiktoken`` when the block does not say (runs of tiktoken's encodings, and every run
        made before other tokenizers existed)."""
        return self.extra.get("kind", "tiktoken")

    def boundaries(self, eot_position: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prefix, suffix): each document is ``prefix + ids(text) + suffix``. The block's own lists
        where it has them (DESIGN: other tokenizers extend the block), else the manifest's one
        ``eot`` at ``eot_position``."""
        if "prefix" in self.extra or "suffix" in self.extra:
            return tuple(self.extra.get("prefix") or ()), tuple(self.extra.get("suffix") or ())
        return ((self.eot,) if eot_position == "prefix" else ()), ((self.eot,) if eot_position == "suffix" else ())

    @classmethod
    def from_dict(cls, d) -> "Encoding":
        """Parse and check (``encoding_problems``): ``ManifestError`` names the first problem."""
        problems = encoding_problems(d)
        if problems:
            raise ManifestError(_first(problems))
        return cls(**{k: d[k] for k in ENCODING_KEYS}, extra={k: v for k, v in d.items() if k not in ENCODING_KEYS})


@dataclass(frozen=True, kw_only=True)
class Totals:
    """The manifest's ``totals``: its partitions' sums (``bookkeeping_problems`` checks they are)."""

    rows: int
    docs: int
    tokens: int
    skipped_null: int
    skipped_empty: int
    skipped_invalid: int | None = None
    """Written only by runs that skipped rows of invalid UTF-8."""
    skipped_bad: int | None = None
    bad_rows: dict | None = None
    """Both written only by chat runs that skipped malformed rows (``bad_rows``: counts by reason)."""
    extra: dict = field(default_factory=dict)
    """Keys this version does not know, kept so that nothing read is lost."""

    def to_dict(self) -> dict:
        """``TOTAL_KEYS``, then the optional counts that are set, then unknown keys."""
        out = {k: getattr(self, k) for k in TOTAL_KEYS}
        for key in ("skipped_invalid", "skipped_bad", "bad_rows"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d) -> "Totals":
        """Parse and check (``totals_problems``): ``ManifestError`` names the first problem."""
        problems = totals_problems(d)
        if problems:
            raise ManifestError(_first(problems))
        known = (*TOTAL_KEYS, "skipped_invalid", "skipped_bad", "bad_rows")
        return cls(**{k: d[k] for k in known if d.get(k) is not None}, extra={k: v for k, v in d.items() if k not in known})


_ABSENT_IF_NONE = ("job", "parts_job", "encoding_sha256", "partition_bytes", "planned_partitions")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """``manifest.json``: the commit point of a run and the index a reader trusts.

    Fields other than DESIGN's required ones are None (or empty) when a manifest lacks them and
    are then not written back; keys nobody here knows stay in ``extra``, in their order.
    """

    encoding: Encoding
    eot_position: str
    text_column: str
    id_column: str | None = None
    """None: the source had no id column (ids are ``"<file>:<row>"``); always written."""
    inputs: tuple[dict, ...]
    partitions: tuple[PartitionEntry, ...]
    totals: Totals
    job: str | None = None
    """The hash of the job identity (every input, and for a grown run each one's generation)."""
    parts_job: str | None = None
    """Only in a grown run (``tokenize --add``): the job hash its done records carry, which is its
    first run's ``job``, kept by every growth so that no committed partition is rewritten."""
    encoding_sha256: str | None = None
    partition_bytes: int | None = None
    skipped_inputs: tuple[dict, ...] = ()
    planned_partitions: int | None = None
    extra: dict = field(default_factory=dict)
    backend: str | None = None
    """Every tokenizer that wrote a partition, joined by ", " (a resumed run may have used two)."""
    format: str = FORMAT

    # The order of the keys in the file: the order of the fields above, ``format`` first.
    def to_dict(self) -> dict:
        out: dict = {"format": self.format, "encoding": self.encoding.to_dict(), "eot_position": self.eot_position,
                     "text_column": self.text_column, "id_column": self.id_column, "inputs": list(self.inputs),
                     "partitions": [e.to_dict() for e in self.partitions], "totals": self.totals.to_dict()}
        for key in ("job", "parts_job", "encoding_sha256", "partition_bytes"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.skipped_inputs:
            out["skipped_inputs"] = list(self.skipped_inputs)
        if self.planned_partitions is not None:
            out["planned_partitions"] = self.planned_partitions
        out.update(self.extra)
        if self.backend is not None:
            out["backend"] = self.backend
        return out

    @classmethod
    def from_dict(cls, d, *, bookkeeping: bool = True) -> "Manifest":
        """The one parser of a manifest: version, every field's type and range, every path
        (``manifest_problems``), then (``bookkeeping``) counts that agree (``bookkeeping_problems``).
        ``ManifestError`` names the first problem; only ``verify``, which reports the bookkeeping
        rather than refusing, passes ``bookkeeping=False``."""
        problems = manifest_problems(d)
        if problems:
            raise ManifestError(_first(problems))
        partitions = tuple(PartitionEntry.from_dict(e, where=f"partitions[{i}]", sums=False)
                           for i, e in enumerate(d["partitions"]))
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        manifest = cls(
            format=d["format"], encoding=Encoding.from_dict(d["encoding"]), eot_position=d["eot_position"],
            text_column=d["text_column"], id_column=d.get("id_column"), inputs=tuple(d["inputs"]),
            partitions=partitions, totals=Totals.from_dict(d["totals"]), skipped_inputs=tuple(d.get("skipped_inputs") or ()),
            backend=d.get("backend"), **{k: d.get(k) for k in _ABSENT_IF_NONE},
            extra={k: v for k, v in d.items() if k not in names},
        )
        if bookkeeping and (problems := bookkeeping_problems(manifest)):
            raise ManifestError(_first(problems))
        return manifest

    @property
    def input_records(self) -> tuple[InputRecord, ...]:
        """``inputs`` as records (``manifest_problems`` checked each one)."""
        return InputRecord.all_from(self.inputs)

    def input_identities(self, paths: set[str] | None = None) -> dict[str, dict]:
        """Each input's recorded file identity by path (``paths``: only those), where one was recorded."""
        return {i.path: i.identity for i in self.input_records
                if i.identity is not None and (paths is None or i.path in paths)}

    def by_index(self) -> list[PartitionEntry]:
        """The partitions in plan order (the order readers and exporters number documents in)."""
        return sorted(self.partitions, key=lambda e: e.index)

    def done_job(self) -> str | None:
        """The job hash every done record of this run carries."""
        return self.parts_job or self.job

    def files(self, root: str) -> list[str]:
        """The manifest and every tokens file, under ``root``: what a reader of the run opens."""
        return [join(root, MANIFEST), *(join(root, e.tokens_file) for e in self.by_index())]


def build_manifest(*, identity: dict, job: str, files: Sequence[InputFile], skipped: Sequence[BadInput],
                   entries: list[PartitionEntry], extra: dict | None = None) -> Manifest:
    """The manifest of a finished run: ``identity`` is the job identity (``tokenize.resume``),
    ``job`` its hash."""
    entries = sorted(entries, key=lambda e: e.index)
    totals = _totals(entries)
    extra = dict(extra or {})
    planned = extra.pop("planned_partitions", None)
    id_column, without_id = used_id_column(files)
    if without_id:
        extra["inputs_without_id_column"] = without_id
    # Which tokenizers wrote the partitions: a resumed run's earlier partitions keep theirs.
    used = sorted({e.backend for e in entries if e.backend})
    return Manifest(
        encoding=Encoding.from_dict(identity["encoding"]), eot_position=identity["eot_position"],
        text_column=identity["text_column"], id_column=id_column,
        inputs=tuple(InputRecord(path=f.url, name=f.name, rows=f.rows, bytes=f.bytes, identity=dict(f.identity)).to_dict()
                     for f in files),
        partitions=tuple(entries), totals=totals, job=job, encoding_sha256=identity["encoding_sha256"],
        partition_bytes=identity["partition_bytes"], skipped_inputs=tuple(_skipped_entry(b) for b in skipped),
        planned_partitions=planned, extra=extra, backend=", ".join(used) if used else None,
    )


def _totals(entries: Sequence[PartitionEntry]) -> Totals:
    totals = {k: sum(int(getattr(e, k)) for e in entries) for k in TOTAL_KEYS}
    if any(e.skipped_invalid for e in entries):  # only runs that skipped such rows carry the key
        totals["skipped_invalid"] = sum(e.skipped_invalid for e in entries)
    if any(e.skipped_bad for e in entries):  # chat runs that skipped malformed rows: by reason too
        totals["skipped_bad"] = sum(e.skipped_bad for e in entries)
        reasons: dict[str, int] = {}
        for e in entries:
            for reason, n in e.bad_rows.items():
                reasons[reason] = reasons.get(reason, 0) + n
        totals["bad_rows"] = dict(sorted(reasons.items()))
    return Totals(**totals)


def grown_manifest(kept: Manifest, added: Manifest, *, generation: int, parts_job: str) -> Manifest:
    """The manifest of a run grown by ``added`` (a manifest of the new inputs alone, whose ``job``
    is the grown run's): ``kept``'s inputs and partitions unchanged, then the new ones, each input
    recording the ``generation`` that added it. Pure."""
    inputs = [dataclasses.replace(i, generation=i.added_by).to_dict() for i in kept.input_records]
    inputs += [dataclasses.replace(i, generation=generation).to_dict() for i in added.input_records]
    entries = sorted(kept.partitions + added.partitions, key=lambda e: e.index)
    extra = {**kept.extra, **added.extra}
    without_id = [*kept.extra.get("inputs_without_id_column", []), *added.extra.get("inputs_without_id_column", [])]
    if without_id:
        extra["inputs_without_id_column"] = without_id
    backends = sorted({b for m in (kept, added) if m.backend for b in m.backend.split(", ")})
    # A whole input skipped as unreadable before and added again (fixed since) is no longer skipped.
    now_in = {i.path for i in added.input_records} | {s["path"] for s in added.skipped_inputs if s.get("partition") is None}
    skipped = tuple(s for s in kept.skipped_inputs if s.get("partition") is not None or s.get("path") not in now_in)
    return dataclasses.replace(
        added, id_column=kept.id_column or added.id_column, inputs=tuple(inputs), partitions=tuple(entries),
        totals=_totals(entries), parts_job=parts_job, skipped_inputs=skipped + added.skipped_inputs,
        extra=extra, backend=", ".join(backends) if backends else None)


def planned_count(manifest: Manifest) -> int:
    """How many partition numbers a finished run used (skipped partitions included): a growth
    numbers its partitions from here."""
    if manifest.planned_partitions is not None:
        return manifest.planned_partitions
    used = [e.index for e in manifest.partitions] + [s["partition"] for s in manifest.skipped_inputs
                                                     if s.get("partition") is not None]
    return max(used) + 1 if used else 0


def used_id_column(files: Sequence[InputFile]) -> tuple[str | None, list[str]]:
    """(the column document ids came from, inputs that lacked it): ``id`` when it was found, not the
    option (None: find it), which stays in the job identity so runs made before still resume.
    One name at most: ``--id-column X`` (every input must have it) or ``id``."""
    used = sorted({f.id_column for f in files if f.id_column})
    if not used:
        return None, []
    return used[0], [f.url for f in files if not f.id_column]


def _skipped_entry(bad: BadInput) -> dict:
    entry = {"path": bad.url, "reason": bad.reason}
    if bad.partition is not None:
        entry.update(partition=bad.partition, row_groups=list(bad.row_groups))
        if getattr(bad, "rows", None) is not None:
            entry["rows"] = bad.rows
    return entry


def write_manifest(run: Location, manifest: Manifest) -> None:
    run.write_json(MANIFEST, manifest.to_dict())


def read_manifest_json(run: Location):
    """The manifest as JSON, unchecked: for ``verify``, which reports what is wrong rather than
    refusing. ``ManifestError`` when a local manifest.json is not a regular file (never opened:
    a FIFO would hang the reader)."""
    if run.is_local:
        mode = os.stat(run.join(MANIFEST)).st_mode  # FileNotFoundError as the read's would be
        if not stat.S_ISREG(mode):
            raise ManifestError(f"not a regular file ({file_kind(mode)}); it is not opened")
    return run.read_json(MANIFEST)


def read_manifest(run: Location) -> Manifest:
    """Raises FileNotFoundError, ``ManifestError`` (not format v1) or ValueError (not JSON)."""
    return Manifest.from_dict(read_manifest_json(run))


def local_file_problems(run: Location, manifest: Manifest) -> list[str]:
    """Where OUT is a local folder: every file the manifest lists that exists must be a regular
    file inside OUT once symlinks are followed (a FIFO would hang whoever opens it, a symlink
    could lead into another run or the system). Only ``lstat``/``stat``, never an open; a missing
    file is left to whoever reads it. Paths already passed ``relative_path_problem``."""
    if not run.is_local:
        return []
    root = run.root
    base = os.path.realpath(root)
    inside = base.rstrip(os.sep) + os.sep
    folders: dict[str, bool] = {}
    problems = []
    for e in manifest.by_index():
        files = (("tokens_file", e.tokens_file), ("docs_file", e.docs_file), ("done record", done_file(e.index)),
                 *((("mask_file", e.mask_file),) if e.mask_file else ()))
        for key, rel in files:
            path = os.path.join(root, rel)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError as err:
                problems.append(f"partition {e.index}: {key} {rel!r} cannot be looked at ({type(err).__name__}: {err})")
                continue
            folder = os.path.dirname(rel)
            if folder not in folders:
                folders[folder] = (os.path.realpath(os.path.join(root, folder)) + os.sep).startswith(inside)
            if stat.S_ISLNK(info.st_mode):
                real = os.path.realpath(path)
                if not real.startswith(inside):
                    problems.append(f"partition {e.index}: {key} {rel!r} is a symlink to {real}, outside OUT")
                    continue
                try:
                    info = os.stat(real)
                except OSError:
                    continue  # a dangling link reads as missing
            elif not folders[folder]:
                problems.append(f"partition {e.index}: {key} {rel!r} lies outside OUT (its folder is a symlink)")
                continue
            if not stat.S_ISREG(info.st_mode):
                problems.append(f"partition {e.index}: {key} {rel!r} is not a regular file "
                                f"({file_kind(info.st_mode)}); it is not opened")
    return problems


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


class FinishedRun(NamedTuple):
    """A finished run, opened: where it is and its checked manifest."""

    location: Location
    manifest: Manifest


def open_finished(out: str, storage_options: dict | None = None) -> FinishedRun:
    """A finished run; anything else is a one-line ``UserError``."""
    run = Location.at(out, storage_options)
    path = run.join(MANIFEST)
    try:
        manifest = read_manifest(run)
    except FileNotFoundError as e:
        raise UserError(not_a_run(run) or
                        f"{out}: no {MANIFEST}; not a finished tokenshards run (is `tokenshards tokenize` still "
                        "running, or was it interrupted? rerun the same command to finish it)") from e
    except ManifestError as e:
        hint = "" if str(e).startswith("format ") else f"; run `tokenshards verify {out}`"
        raise UserError(f"{path}: {e}{hint}") from e
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e}); rerun `tokenshards tokenize` to rewrite it") from e
    problems = local_file_problems(run, manifest)
    if problems:
        raise UserError(f"{path}: {_first(problems)}; run `tokenshards verify {out}`")
    return FinishedRun(run, manifest)


# -- the bytes of a partition's files --------------------------------------------------------------

class _Piece(Protocol):
    """What ``partition_files`` reads of a planned piece (``corpus.plan.Piece``)."""

    index: int
    input: str
    row_groups: tuple[int, int]
    rows: int


class PartFiles(NamedTuple):
    tokens: bytes | bytearray
    """``tokens.npy``: a 1-D little-endian array."""
    docs: bytes
    """``docs.parquet``: id, row, start, length."""
    entry: PartitionEntry


def partition_files(piece: _Piece, tokens: np.ndarray, *, ids: pa.Array | Sequence[str], rows, starts, lengths,
                    skipped_null: int, skipped_empty: int, backend: str = "", invalid_rows: Sequence[int] = (),
                    tokens_bytes: bytes | bytearray | None = None, mask_bytes: bytes | bytearray | None = None,
                    bad_rows: dict | None = None, bad_row_numbers: Sequence[int] = ()) -> PartFiles:
    """A partition's two data files and its entry, from its tokens and docs columns. Pure: the
    caller writes them (data files first, the done record that commits them last). ``tokens_bytes``:
    ``npy_bytes(tokens)``, when the caller made them already (to start writing them sooner)."""
    tokens_bytes = npy_bytes(tokens) if tokens_bytes is None else tokens_bytes
    docs = pa.table({
        "id": ids.cast(pa.string()) if isinstance(ids, pa.Array) else pa.array(ids, pa.string()),
        "row": pa.array(rows, pa.int64()),
        "start": pa.array(starts, pa.int64()),
        "length": pa.array(lengths, pa.int64()),
    })
    docs_bytes = _parquet_bytes(docs)
    entry = PartitionEntry(
        index=piece.index, input=piece.input, row_groups=tuple(piece.row_groups), rows=piece.rows,
        docs=len(lengths), skipped_null=skipped_null, skipped_empty=skipped_empty, tokens=int(len(tokens)),
        tokens_file=tokens_file(piece.index), docs_file=docs_file(piece.index),
        sha256=hashlib.sha256(tokens_bytes).hexdigest(), backend=backend or None,
        tokens_bytes=len(tokens_bytes), docs_bytes=len(docs_bytes),
        skipped_invalid=len(invalid_rows), invalid_rows=tuple(invalid_rows[:MAX_LISTED_INVALID]),
        **_mask_fields(piece.index, mask_bytes, bad_rows or {}, bad_row_numbers),
    )
    return PartFiles(tokens_bytes, docs_bytes, entry)


def _mask_fields(index: int, mask: bytes | bytearray | None, bad_rows: dict, numbers: Sequence[int]) -> dict:
    """A chat partition's entry fields: its mask file and the malformed rows it skipped."""
    fields: dict = {}
    if mask is not None:
        fields.update(mask_file=mask_file(index), mask_sha256=hashlib.sha256(mask).hexdigest(), mask_bytes=len(mask))
    if bad_rows:
        fields.update(skipped_bad=sum(bad_rows.values()), bad_rows=dict(sorted(bad_rows.items())),
                      bad_row_numbers=tuple(numbers[:MAX_LISTED_INVALID]))
    return fields


def npy_bytes(tokens: np.ndarray) -> bytearray:
    """``np.save``'s bytes of the 1-D array stored little-endian, whatever the machine's order.
    Made with one copy of the tokens (``np.save`` into a buffer makes two or three)."""
    little = np.ascontiguousarray(tokens.astype(tokens.dtype.newbyteorder("<"), copy=False))
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(little))
    header = head.getvalue()
    out = bytearray(len(header) + little.nbytes)
    out[:len(header)] = header
    np.frombuffer(out, dtype=little.dtype, offset=len(header))[:] = little
    return out


DICTIONARY_COLUMNS = ["length"]
"""The docs file's only column whose values repeat. Dictionary-encoding the others (an id, a row
and a start per document, all distinct) only costs: a 12,810-document file took 4.3 ms and
686 KB with every column tried, 3.0 ms and 619 KB with this one."""


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, use_dictionary=DICTIONARY_COLUMNS)
    return buf.getvalue()


# -- the one .npy header parser --------------------------------------------------------------------

class NpyHeader(NamedTuple):
    shape: tuple
    fortran_order: bool
    dtype: np.dtype
    offset: int
    """Where the array's bytes start."""


def read_npy_header(raw: bytes) -> NpyHeader:
    """Parse a ``.npy`` header from the file's first bytes (``NPY_HEAD_PROBE`` are enough for
    what np.save writes). By hand, because np.load accepts what format v1 doesn't (big-endian,
    pickles, Fortran order) and a range reader has only the head."""
    buf = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(buf)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read(buf)
    except (ValueError, EOFError) as e:
        raise NpyHeaderError(str(e)) from e
    return NpyHeader(shape=tuple(shape), fortran_order=bool(fortran_order), dtype=dtype, offset=buf.tell())


def not_a_run(run: Location) -> str | None:
    """The one-line reason when ``run`` (which has no manifest.json) holds no tokenshards run at
    all, or one that stopped before committing anything; None when it holds an unfinished run
    that a rerun resumes (its job file, or a committed partition, is there)."""
    start = f"{run.url}: no manifest.json; not a finished tokenshards run"
    advice = "pass the --out folder of a `tokenshards tokenize` run"
    if not run.exists():
        return f"{start} (there is no such folder: check the path, or {advice})"
    if run.exists(JOB_FILE):
        return None
    if run.exists("parts"):
        # Without a job file, a parts/ holding no done record is what a run that failed before its
        # first partition (unknown encoding, missing column) leaves: there is nothing to resume.
        try:
            if run.glob("parts", "part-*.done.json"):
                return None
        except OSError:
            return None
        return (f"{start}: parts/ holds no committed partition and there is no {JOB_FILE}, so there is nothing "
                "to check or resume: a tokenize run there stopped (or is still starting) before its first "
                "partition; fix what it reported and run it again")
    return _not_a_run_at_all(run, start, advice)


def _not_a_run_at_all(run: Location, start: str, advice: str) -> str:
    looks_like = ""
    try:  # one listing of the folder itself: cheap even when it is a large input prefix
        if run.glob("*.parquet"):
            looks_like = "; it holds parquet files, like an input folder"
    except OSError:
        pass
    return f"{start} (not a tokenshards output at all: no parts/, no {JOB_FILE}{looks_like}; {advice})"
