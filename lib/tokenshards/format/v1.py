"""Format v1, the contract with training code (DESIGN.md): what a run writes (the manifest of a
finished run or a growth, the bytes of a partition's files), and, under the one name every module
has used, the rest of the format, each in its own module: the files' names (``names``), the typed
records and their one parser (``records``), paths and file kinds (``paths``), token arrays and the
``.npy`` header (``arrays``), docs tables (``docs``), and the one reader of a run (``run``).

Which partitions a rerun may keep (job identity, done records, claiming OUT) is not the format:
that lives in ``tokenize.resume``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
from typing import NamedTuple, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..corpus.plan import BadInput, InputFile
from ..storage.location import Location
from .arrays import NPY_HEAD_PROBE, NpyHeader, NpyHeaderError, header_problem, npy_bytes, read_npy_header  # noqa: F401
from .docs import DOCS_COLUMNS, docs_problems, layout_problems  # noqa: F401
from .names import (FORMAT, JOB_FILE, MANIFEST, docs_file, done_file, mask_file, part_index,  # noqa: F401
                    part_stem, tokens_file)
from .paths import file_kind, relative_path_problem  # noqa: F401
from .records import (COUNT_KEYS, DTYPES, ENCODING_KEYS, ENTRY_KEYS, EOT_POSITIONS, FORMAT_KEYS,  # noqa: F401
                      MAX_LISTED_INVALID, MAX_TOKENS, MAX_VOCAB, OPTIONAL_ENTRY_KEYS, REQUIRED_KEYS, TOTAL_KEYS,
                      DoneRecord, Encoding, InputRecord, JobRecord, JsonError, Manifest, ManifestError,
                      PartitionEntry, Totals, _first, _is_count, _is_int, _show, bookkeeping_problems,
                      coverage_problems, encoding_problems, entry_problems, input_problems, job_problems,
                      manifest_problems, parse_json, ranges, totals_problems, vocabulary_dtype)
from .run import (BadRunFile, FinishedRun, local_file_problems, not_a_run, open_finished,  # noqa: F401
                  read_manifest, read_manifest_json)


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
        tokens_bytes=len(tokens_bytes), docs_bytes=len(docs_bytes), docs_sha256=hashlib.sha256(docs_bytes).hexdigest(),
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


DICTIONARY_COLUMNS = ["length"]
"""The docs file's only column whose values repeat. Dictionary-encoding the others (an id, a row
and a start per document, all distinct) only costs: a 12,810-document file took 4.3 ms and
686 KB with every column tried, 3.0 ms and 619 KB with this one."""


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, use_dictionary=DICTIONARY_COLUMNS)
    return buf.getvalue()
