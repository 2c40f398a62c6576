"""The export record, ``DEST/NAME_export.json``: what ``tokenshards export`` wrote, written last
(an export without one is not finished) and read back by ``publish`` (what to upload, the dataset
card), by an hf export's own card and by the next export into DEST (``--overwrite`` removes the
files of the format it names).

Its bytes are a contract: users' download scripts read ``files`` (the card shows how), and each of
the three exports writes its own keys in its own order (``KEYS``). One class reads and writes all
three; ``from_dict`` is the one parser, and what it refuses never reaches a reader.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .records import JsonError, parse_json
from .v1 import EOT_POSITIONS, Encoding, _first, _is_count, _is_int, _show, encoding_problems, relative_path_problem

RECORD_FORMAT = "tokenshards-export/1"
SPLITS = ("val", "train")
"""The order in which ``splits`` lists them."""

ORDERED, SHUFFLED, ROWS = "ordered", "shuffled", "rows"
"""Which export wrote a record: documents in manifest order (``export/command.py``), shuffled or
mixed documents (``export/shuffle.py``), rows of a row-group format or of packed sequences
(``export/packed.py``)."""
_SETTINGS = ("encoding", "eot_position", "dtype", "shard_tokens", "min_shard_tokens", "val_tokens_requested")
KEYS = {
    ORDERED: ("format", "export_format", "source", "source_job", *_SETTINGS, "val_selection", "splits", "files"),
    SHUFFLED: ("format", "export_format", "source", *_SETTINGS, "val_selection", "order", "tokens_requested",
               "train_tokens_target", "sources", "splits", "files"),
    ROWS: ("format", "export_format", "source", "source_job", *_SETTINGS, "val_selection", "packing", "columns", "order",
           "sources", "splits", "files"),
}
"""The keys each kind of export writes, in the order it writes them: every one, even when null."""


class ExportRecordError(ValueError):
    """JSON that is not an export record; the message says what is wrong, without a path."""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional_counts(d: dict, keys, where: str = "") -> list[str]:
    return [f"{where + '.' if where else ''}{k} is {_show(d[k])}, expected a count" for k in keys
            if d.get(k) is not None and not _is_count(d[k])]


@dataclass(frozen=True, kw_only=True)
class ExportFile:
    """One file an export wrote, relative to DEST, with the split it holds."""

    name: str
    split: str
    tokens: int
    bytes: int

    def to_dict(self) -> dict:
        return {"name": self.name, "split": self.split, "tokens": self.tokens, "bytes": self.bytes}

    @staticmethod
    def problems(d, where: str) -> list[str]:
        if not isinstance(d, dict):
            return [f"{where} is {_show(d)}, expected an object with name, split, tokens and bytes"]
        problems = [f"{where}.name {p}" for p in [relative_path_problem(d.get("name"))] if p]
        if d.get("split") not in SPLITS:
            problems.append(f"{where}.split is {_show(d.get('split'))}, expected one of {SPLITS}")
        return problems + [f"{where}.{k} is {_show(d.get(k))}, expected a count" for k in ("tokens", "bytes")
                           if not _is_count(d.get(k))]

    @classmethod
    def from_dict(cls, d: dict) -> "ExportFile":
        return cls(name=d["name"], split=d["split"], tokens=d["tokens"], bytes=d["bytes"])


@dataclass(frozen=True, kw_only=True)
class SplitCounts:
    """What one split holds: documents and tokens; a rows export also counts its rows, the tokens
    its documents had, and (packed) the padding added and the tokens left over."""

    docs: int
    tokens: int
    rows: int | None = None
    source_tokens: int | None = None
    padding: int | None = None
    dropped: int | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in (("docs", self.docs), ("tokens", self.tokens), ("rows", self.rows),
                                  ("source_tokens", self.source_tokens), ("padding", self.padding),
                                  ("dropped", self.dropped)) if v is not None}

    @staticmethod
    def problems(d, where: str) -> list[str]:
        if not isinstance(d, dict):
            return [f"{where} is {_show(d)}, expected an object with docs and tokens"]
        return ([f"{where}.{k} is {_show(d.get(k))}, expected a count" for k in ("docs", "tokens")
                 if not _is_count(d.get(k))]
                + _optional_counts(d, ("rows", "source_tokens", "padding", "dropped"), where))

    @classmethod
    def from_dict(cls, d: dict) -> "SplitCounts":
        return cls(**{k: d.get(k) for k in ("docs", "tokens", "rows", "source_tokens", "padding", "dropped")})


@dataclass(frozen=True, kw_only=True)
class Order:
    """A shuffled order: its seed and how the key of each document (or row) is made."""

    seed: int
    key: str

    def to_dict(self) -> dict:
        return {"shuffle": True, "seed": self.seed, "key": self.key}

    @staticmethod
    def problems(d, where: str) -> list[str]:
        if not (isinstance(d, dict) and _is_int(d.get("seed")) and isinstance(d.get("key"), str)):
            return [f"{where} is {_show(d)}, expected an object with an int seed and a key"]
        return []

    @classmethod
    def from_dict(cls, d: dict) -> "Order":
        return cls(seed=d["seed"], key=d["key"])


@dataclass(frozen=True, kw_only=True)
class PackedRows:
    """How a packed export made its rows of ``seq_len`` tokens."""

    seq_len: int
    mode: str
    bos_align: bool
    window_docs: int | None
    """best-fit's window; None for concat."""
    unit: str
    """What is packed on its own (each partition of each run)."""

    def to_dict(self) -> dict:
        return {"seq_len": self.seq_len, "mode": self.mode, "bos_align": self.bos_align,
                "window_docs": self.window_docs, "unit": self.unit}

    @staticmethod
    def problems(d, where: str) -> list[str]:
        if not (isinstance(d, dict) and _is_count(d.get("seq_len")) and isinstance(d.get("mode"), str)
                and isinstance(d.get("bos_align"), bool) and isinstance(d.get("unit"), str)):
            return [f"{where} is {_show(d)}, expected an object with seq_len, mode, bos_align and unit"]
        return _optional_counts(d, ("window_docs",), where)

    @classmethod
    def from_dict(cls, d: dict) -> "PackedRows":
        return cls(seq_len=d["seq_len"], mode=d["mode"], bos_align=d["bos_align"], window_docs=d.get("window_docs"),
                   unit=d["unit"])


_SOURCE_COUNTS = ("sequences", "tokens", "documents", "full_epochs", "val_tokens", "val_documents", "extra")


@dataclass(frozen=True, kw_only=True)
class ExportSource:
    """One run a shuffled or rows export read, and what it gave: a mixture's share (``weight``,
    train ``tokens`` and ``documents``, ``epochs``, ``full_epochs``, the validation set's), or a
    rows export's train ``sequences``, ``epochs`` and ``extra`` (a mixture's top-up)."""

    path: str
    source_job: str | None
    weight: float | None = None
    sequences: int | None = None
    tokens: int | None = None
    documents: int | None = None
    epochs: float | None = None
    full_epochs: int | None = None
    val_tokens: int | None = None
    val_documents: int | None = None
    extra: int | None = None

    def to_dict(self) -> dict:
        """``path`` and ``source_job`` always (a job may be null), the rest when set."""
        out: dict = {"path": self.path, "source_job": self.source_job}
        for key in ("weight", "sequences", "tokens", "documents", "epochs", "full_epochs", "val_tokens", "val_documents",
                    "extra"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @staticmethod
    def problems(d, where: str) -> list[str]:
        if not (isinstance(d, dict) and isinstance(d.get("path"), str)):
            return [f"{where} is {_show(d)}, expected an object with a path"]
        problems = [] if d.get("source_job") is None or isinstance(d["source_job"], str) else [
            f"{where}.source_job is {_show(d['source_job'])}, expected a string"]
        problems += [f"{where}.{k} is {_show(d[k])}, expected a number" for k in ("weight", "epochs")
                     if d.get(k) is not None and not _is_number(d[k])]
        return problems + _optional_counts(d, _SOURCE_COUNTS, where)

    @classmethod
    def from_dict(cls, d: dict) -> "ExportSource":
        return cls(path=d["path"], source_job=d.get("source_job"),
                   **{k: d.get(k) for k in ("weight", "epochs", *_SOURCE_COUNTS)})


@dataclass(frozen=True, kw_only=True)
class ExportRecord:
    """``NAME_export.json``. Fields a kind of export does not write (``KEYS``) stay None or empty."""

    kind: str
    """``ORDERED``, ``SHUFFLED`` or ``ROWS``: which keys the file holds (not itself written)."""
    export_format: str
    source: str | None
    """The run exported; None for a mixture of several (``sources`` lists them)."""
    source_job: str | None = None
    """Its tokenize job (the first run's, in a rows export); shuffled records name it in ``sources``."""
    encoding: Encoding
    """The run's encoding block, as its manifest has it (a mixture's runs share it)."""
    eot_position: str
    dtype: str
    """Of the exported tokens, as NumPy names it (``<u2``)."""
    shard_tokens: int | None = None
    min_shard_tokens: int | None = None
    """Both None for formats that are not sharded, and in records written before 23 Nov 2026."""
    val_tokens_requested: int
    val_selection: str
    """How validation documents were chosen, in words."""
    packing: PackedRows | None = None
    columns: tuple[str, ...] = ()
    """A rows export's columns, in order."""
    order: Order | None = None
    """None: source order (manifest order of the run's partitions)."""
    tokens_requested: int | None = None
    train_tokens_target: int | None = None
    sources: tuple[ExportSource, ...] = ()
    splits: dict[str, SplitCounts]
    files: tuple[ExportFile, ...]
    extra: dict = field(default_factory=dict)
    """Keys this version does not know, kept so that nothing read is lost."""
    format: str = RECORD_FORMAT

    def files_of(self, split: str) -> list[ExportFile]:
        return [f for f in self.files if f.split == split]

    def to_dict(self) -> dict:
        """The JSON object: ``KEYS[kind]`` in order, then any keys read and not known."""
        as_json = {"encoding": self.encoding.to_dict(), "columns": list(self.columns),
                   "packing": self.packing.to_dict() if self.packing else None,
                   "order": self.order.to_dict() if self.order else None,
                   "sources": [s.to_dict() for s in self.sources],
                   "splits": {s: self.splits[s].to_dict() for s in SPLITS},
                   "files": [f.to_dict() for f in self.files]}
        return {**{k: as_json[k] if k in as_json else getattr(self, k) for k in KEYS[self.kind]}, **self.extra}

    @classmethod
    def from_dict(cls, d) -> "ExportRecord":
        """The one parser: ``ExportRecordError`` names the first problem. Which kind a record is
        follows from its keys (only rows exports write ``packing``, only shuffled ones
        ``train_tokens_target``)."""
        problems = record_problems(d)
        if problems:
            raise ExportRecordError(_first(problems))
        kind = ROWS if "packing" in d else SHUFFLED if "train_tokens_target" in d else ORDERED
        known = set(KEYS[kind])
        return cls(
            kind=kind, format=d["format"], export_format=d["export_format"], source=d.get("source"),
            source_job=d.get("source_job"), encoding=Encoding.from_dict(d["encoding"]), eot_position=d["eot_position"],
            dtype=d["dtype"], shard_tokens=d.get("shard_tokens"), min_shard_tokens=d.get("min_shard_tokens"),
            val_tokens_requested=d["val_tokens_requested"], val_selection=d["val_selection"],
            packing=PackedRows.from_dict(d["packing"]) if d.get("packing") is not None else None,
            columns=tuple(d.get("columns") or ()),
            order=Order.from_dict(d["order"]) if d.get("order") is not None else None,
            tokens_requested=d.get("tokens_requested"), train_tokens_target=d.get("train_tokens_target"),
            sources=tuple(ExportSource.from_dict(s) for s in d.get("sources") or ()),
            splits={s: SplitCounts.from_dict(d["splits"][s]) for s in SPLITS},
            files=tuple(ExportFile.from_dict(f) for f in d["files"]),
            extra={k: v for k, v in d.items() if k not in known})

    @classmethod
    def from_bytes(cls, raw: bytes) -> "ExportRecord":
        """``ExportRecordError`` for bytes that are not JSON, too."""
        try:
            d = parse_json(raw)
        except JsonError as e:  # also bytes nested too deeply, NaN, invalid UTF-8
            raise ExportRecordError(str(e).replace("not valid JSON", "not JSON", 1)) from e
        return cls.from_dict(d)


def record_problems(d) -> list[str]:
    """What makes an export record's JSON unusable, first problem first: its version, every
    field's type and range, every file name (relative to DEST: publish uploads them by it)."""
    if not isinstance(d, dict):
        return [f"not a JSON object but {type(d).__name__}"]
    if d.get("format") != RECORD_FORMAT:
        return [f"format {_show(d.get('format'))}, expected {RECORD_FORMAT!r}"]
    required = ("export_format", "encoding", "eot_position", "dtype", "val_tokens_requested", "val_selection", "splits",
                "files")
    missing = [f"required key {k!r} is missing" for k in required if k not in d]
    if missing:
        return missing
    problems = encoding_problems(d["encoding"])
    for key in ("export_format", "val_selection"):
        if not isinstance(d[key], str):
            problems.append(f"{key} is {_show(d[key])}, expected a string")
    for key in ("source", "source_job"):
        if d.get(key) is not None and not isinstance(d[key], str):
            problems.append(f"{key} is {_show(d[key])}, expected a string")
    if d["eot_position"] not in EOT_POSITIONS:
        problems.append(f"eot_position is {_show(d['eot_position'])}, expected one of {EOT_POSITIONS}")
    if not _is_dtype(d["dtype"]):
        problems.append(f"dtype is {_show(d['dtype'])}, expected an integer dtype such as '<u2'")
    if not _is_count(d["val_tokens_requested"]):
        problems.append(f"val_tokens_requested is {_show(d['val_tokens_requested'])}, expected a count")
    problems += _optional_counts(d, ("shard_tokens", "min_shard_tokens", "tokens_requested", "train_tokens_target"))
    if d.get("packing") is not None:
        problems += PackedRows.problems(d["packing"], "packing")
    if d.get("order") is not None:
        problems += Order.problems(d["order"], "order")
    columns = d.get("columns")
    if columns is not None and not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        problems.append(f"columns is {_show(columns)}, expected a list of names")
    sources = d.get("sources")
    if sources is not None and not isinstance(sources, list):
        problems.append(f"sources is {_show(sources)}, expected a list")
    elif sources:
        problems += [p for i, s in enumerate(sources) for p in ExportSource.problems(s, f"sources[{i}]")]
    splits = d["splits"]
    if not isinstance(splits, dict) or any(s not in splits for s in SPLITS):
        problems.append(f"splits is {_show(splits)}, expected an object with {' and '.join(SPLITS)}")
    else:
        problems += [p for s in SPLITS for p in SplitCounts.problems(splits[s], f"splits.{s}")]
    files = d["files"]
    if not isinstance(files, list):
        problems.append(f"files is {_show(files)}, expected a list")
    else:
        problems += [p for i, f in enumerate(files) for p in ExportFile.problems(f, f"files[{i}]")]
    return problems


def _is_dtype(value) -> bool:
    try:
        return isinstance(value, str) and np.dtype(value).kind in "ui"
    except TypeError:
        return False
