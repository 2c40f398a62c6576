"""The records of a run (format v1), each parsed once and checked into a typed, frozen record:
the manifest (``Manifest``, its ``Encoding``, ``Totals``, ``PartitionEntry`` and ``InputRecord``s),
a partition's done record (``DoneRecord``) and the job file (``JobRecord``).

``parse_json`` is the one way their bytes become JSON: bounded in depth (a manifest nested 100,000
arrays deep is one line, never a RecursionError), no NaN nor Infinity (their readers bound the
size). Each ``*_problems`` function says, pure, what makes a record unusable, naming the field;
each ``from_dict`` refuses with the first of them (``ManifestError``).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ..storage.store import join
from ..untrusted import MAX_DEPTH, JsonError, json_depth, parse_json  # noqa: F401
from .names import FORMAT, MANIFEST
from .paths import relative_path_problem

RECORD_LIMITS = {"manifest": 1 << 30, "job file": 256 << 20, "done record": 4 << 20, "export record": 256 << 20,
                 "lease": 1 << 20}
"""The largest each record may be, in bytes: a manifest of 16,384 partitions and 2,000 inputs is
~12 MB, a done record ~1 KB (it lists at most ``MAX_LISTED_INVALID`` rows)."""


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
OPTIONAL_ENTRY_KEYS = ("backend", "tokens_bytes", "docs_bytes", "docs_sha256", "skipped_invalid", "invalid_rows",
                       "mask_file", "mask_sha256", "mask_bytes", "skipped_bad", "bad_rows", "bad_row_numbers")
"""Written after ``ENTRY_KEYS``, in this order, when set."""
MAX_LISTED_INVALID = 100
"""How many rows of invalid UTF-8 an entry lists (it counts them all)."""


class ManifestError(ValueError):
    """A manifest (or entry) that is not format v1; the message says what is wrong, without a path."""


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


def is_sha256(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _is_count(value) -> bool:
    return _is_int(value) and 0 <= value <= MAX_TOKENS


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first(problems: list[str]) -> str:
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more problem{'s' if more != 1 else ''})" if more else "")



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
    for key in ("sha256", "docs_sha256", "mask_sha256"):
        sha = d.get(key)
        if (key == "sha256" or sha is not None) and not is_sha256(sha):
            problems.append(f"{where}.{key} is {_show(sha)}, expected 64 hex digits")
    if d.get("backend") is not None and not isinstance(d["backend"], str):
        problems.append(f"{where}.backend is {_show(d['backend'])}, expected a string")
    rows = d.get("invalid_rows")
    if rows is not None and not (isinstance(rows, list) and all(_is_count(r) for r in rows)):
        problems.append(f"{where}.invalid_rows is {_show(rows)}, expected a list of row numbers")
    reasons = d.get("bad_rows")
    if reasons is not None and not (isinstance(reasons, dict) and all(_is_count(v) for v in reasons.values())):
        problems.append(f"{where}.bad_rows is {_show(reasons)}, expected counts by reason")
    numbers = d.get("bad_row_numbers")
    if numbers is not None and not (isinstance(numbers, list) and all(_is_count(r) for r in numbers)):
        problems.append(f"{where}.bad_row_numbers is {_show(numbers)}, expected a list of row numbers")
    elif not bad:  # what lists the skipped rows agrees with what counts them
        problems += _listed_problems(d, where)
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
    for key in ("id_column", "job", "parts_job", "encoding_sha256", "backend"):
        if d.get(key) is not None and not isinstance(d[key], str):
            problems.append(f"{key} is {_show(d[key])}, expected a string")
    for key in ("chat", "hub"):  # blocks readers look into: a chat run's columns, a Hub run's download folder
        block = d.get(key)
        if block is not None and not (isinstance(block, dict) and all(
                v is None or isinstance(v, (str, bool, int)) for k, v in block.items() if k != "template")):
            problems.append(f"{key} is {_show(block)}, expected an object of names and flags")
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
    beyond = sorted(i for i in seen | skipped if isinstance(i, int) and i >= planned)
    if beyond:
        problems.append(f"partition indices {ranges(beyond)} are past planned_partitions {planned}")
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


def _listed_problems(d: dict, where: str) -> list[str]:
    """The rows an entry lists (the first ``MAX_LISTED_INVALID``) are as many as it counts."""
    problems = []
    for listed, counted in (("invalid_rows", "skipped_invalid"), ("bad_row_numbers", "skipped_bad")):
        rows, count = d.get(listed) or [], d.get(counted) or 0
        if isinstance(rows, list) and _is_count(count) and len(rows) != min(count, MAX_LISTED_INVALID):
            problems.append(f"{where}.{listed} lists {len(rows)} rows, {counted} {count} makes it "
                            f"{min(count, MAX_LISTED_INVALID)}")
    reasons = d.get("bad_rows") or {}
    if isinstance(reasons, dict) and _is_count(d.get("skipped_bad") or 0) and sum(reasons.values()) != (d.get("skipped_bad") or 0):
        problems.append(f"{where}.bad_rows add up to {sum(reasons.values())}, skipped_bad is {d.get('skipped_bad') or 0}")
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
    docs_sha256: str | None = None
    """Of the docs file's bytes: every reader of a docs table checks it (absent in runs made before
    3 Dec 2026, whose docs tables are checked for consistency alone)."""
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


def job_problems(d) -> list[str]:
    """What makes a job file (``tokenize.resume.job_identity``, written first in OUT) unusable:
    its version, the types of the keys it holds, each input. Keys a version may lack are checked
    only when present, and the encoding block is compared whole: a rerun compares the identity
    with its own, key by key, and says what differs."""
    if not isinstance(d, dict):
        return [f"not a JSON object but {_show(d)}"]
    if d.get("format") != FORMAT:
        return [f"format is {_show(d.get('format'))}, expected {FORMAT!r}"]
    problems = [] if isinstance(d.get("encoding"), dict) else [f"encoding is {_show(d.get('encoding'))}, expected an object"]
    for key in ("encoding_sha256", "text_column", "parts_job"):
        if key in d and not isinstance(d[key], str):
            problems.append(f"{key} is {_show(d[key])}, expected a string")
    if "id_column" in d and d["id_column"] is not None and not isinstance(d["id_column"], str):
        problems.append(f"id_column is {_show(d['id_column'])}, expected a string or null")
    if "eot_position" in d and d["eot_position"] not in EOT_POSITIONS:
        problems.append(f"eot_position is {_show(d['eot_position'])}, expected one of {EOT_POSITIONS}")
    if "partition_bytes" in d and not (_is_count(d["partition_bytes"]) and d["partition_bytes"] >= 1):
        problems.append(f"partition_bytes is {_show(d['partition_bytes'])}, expected a count of at least 1")
    if "chat" in d and not isinstance(d["chat"], dict):
        problems.append(f"chat is {_show(d['chat'])}, expected an object")
    inputs = d.get("inputs")
    if not isinstance(inputs, list):
        problems.append(f"inputs is {_show(inputs)}, expected a list")
    else:
        for i, inp in enumerate(inputs):
            problems += input_problems(inp, where=f"inputs[{i}]")
    return problems


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    """The job file, ``tokenshards-job.json``: what the run in OUT was asked to do (its job
    identity). A rerun compares ``identity`` with its own, key by key."""

    identity: dict
    """As read (checked by ``job_problems``): what ``tokenize.resume`` compares and hashes."""
    inputs: tuple[InputRecord, ...]
    parts_job: str | None = None
    """Set once the run was grown (``tokenize --add``): the job its done records carry."""

    @classmethod
    def from_dict(cls, d) -> "JobRecord":
        """Parse and check (``job_problems``): ``ManifestError`` names the first problem."""
        problems = job_problems(d)
        if problems:
            raise ManifestError(_first(problems))
        return cls(identity=d, inputs=InputRecord.all_from(d["inputs"]), parts_job=d.get("parts_job"))


def done_problems(entry: PartitionEntry, record: DoneRecord, *, job: str | None) -> list[str]:
    """A done record against the manifest's entry of its partition: the partition's commit must say
    what the manifest says, key by key (keys this version does not know included), and carry the
    run's job (a manifest that records none disagrees with every done record). Pure; the caller
    names the file."""
    problems = []
    if record.job != job:
        problems.append(f"written by job {record.job[:12]}…, the manifest's is "
                        + (f"{job[:12]}…" if job is not None else "not recorded"))
    body, listed = record.entry.to_dict(), entry.to_dict()
    differ = sorted(k for k in set(body) | set(listed) if body.get(k) != listed.get(k))
    if differ:
        shown = "; ".join(f"{k}: {body.get(k)!r} vs manifest {listed.get(k)!r}" for k in differ[:3])
        problems.append(f"disagrees with manifest.json ({shown})")
    return problems


JOB_SHARED = ("encoding", "encoding_sha256", "eot_position", "text_column", "partition_bytes")
"""What a manifest and its run's job file both record, from one job identity (``build_manifest``)."""


def job_file_problems(manifest: "Manifest", job: JobRecord) -> list[str]:
    """A finished run's manifest against its job file, written first from the same job identity:
    the settings both record are equal, and every input of the manifest is one of the job file's
    with the same rows and bytes (a growth under way has added more there). A manifest edited
    after the run (a vocabulary, an eot, an input's size) disagrees: one problem naming what
    differs, as a done record's (``done_problems``). Pure."""
    recorded = job.identity
    ours = {"encoding": manifest.encoding.to_dict(), "encoding_sha256": manifest.encoding_sha256,
            "eot_position": manifest.eot_position, "text_column": manifest.text_column,
            "partition_bytes": manifest.partition_bytes}
    differ = [f"{key}: {_show(recorded[key])} vs manifest {_show(ours[key])}"
              for key in JOB_SHARED if key in recorded and ours[key] is not None and ours[key] != recorded[key]]
    theirs = {i.path: (i.rows, i.bytes) for i in job.inputs}
    for i in manifest.input_records:
        if i.path not in theirs:
            differ.append(f"the manifest's input {_show(i.path)} is not among its inputs")
        elif theirs[i.path] != (i.rows, i.bytes) and None not in theirs[i.path]:
            differ.append(f"input {_show(i.path)}: rows and bytes {theirs[i.path]} vs manifest {(i.rows, i.bytes)}")
    return [f"disagrees with manifest.json ({'; '.join(differ[:3])}"
            + (f"; and {len(differ) - 3} more" if len(differ) > 3 else "") + ")"] if differ else []


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

