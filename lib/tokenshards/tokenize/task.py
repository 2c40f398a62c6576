"""What one task does on a worker: read its piece, tokenize, write the part files, commit.

Reading happens in ``read_piece`` (the ``dd.from_map`` function) and the rest in
``tokenize_and_write`` (the ``map_partitions`` function). Dask fuses the two into one task
per piece, so the piece description rides along in the frame's ``attrs``.
"""
from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..format import v1 as manifest
from ..encoding.encoders import worker_backend
from ..errors import InputError
from .plan import STRING_TYPES, Piece
from ..storage.store import filesystem, join, write_atomic
from .core import tokenize_texts

PIECE_ATTR = "tokenshards_piece"
SKIP_ATTR = "tokenshards_unreadable"
FRAME_META = pd.DataFrame({
    "row": pd.Series([], dtype="int64"),
    "id": pd.Series([], dtype=pd.ArrowDtype(pa.string())),
    "text": pd.Series([], dtype=pd.ArrowDtype(pa.string())),  # or large_string, as the file has it
})
RECORD_META = pd.DataFrame({
    "entry": pd.Series([], dtype=object),
    "unreadable": pd.Series([], dtype=object),
    "started": pd.Series([], dtype="float64"),
    "finished": pd.Series([], dtype="float64"),
})


@dataclass(frozen=True, kw_only=True)
class PartitionJob:
    """The few things every task needs; small, so it travels in each task cheaply."""

    out: str
    storage_options: dict
    encoder_plugin: str
    dtype: str
    eot_position: str
    job: str
    backend: str = ""
    """The tokenizer that writes this run's partitions (``"splintr 0.22.0"``), recorded in each
    done record: a resumed run may have written its partitions with another."""


def read_piece(piece: Piece, *, text_column: str, storage_options: dict, on_bad_file: str = "fail") -> pd.DataFrame:
    """The piece's rows as (row, id, text); ids are None when the source has no id column.

    With ``on_bad_file="skip"`` an unreadable piece becomes an empty frame that says why.
    """
    try:
        frame = _read_piece(piece, text_column=text_column, storage_options=storage_options)
    except InputError as e:
        if on_bad_file != "skip":
            raise
        frame = FRAME_META.copy()
        frame.attrs[SKIP_ATTR] = str(e)
    frame.attrs[PIECE_ATTR] = piece
    return frame


def _read_piece(piece: Piece, *, text_column: str, storage_options: dict) -> pd.DataFrame:
    fs, path = filesystem(piece.input, storage_options)
    columns = [text_column] + ([piece.id_column] if piece.id_column and piece.id_column != text_column else [])
    try:
        with fs.open(path, "rb") as f:
            # One thread per worker process already fills every core: Arrow's own pool and
            # pre-buffering would only add CPU (~40% of the read time measured here).
            table = pq.ParquetFile(f, pre_buffer=False).read_row_groups(
                list(range(*piece.row_groups)), columns=columns, use_threads=False)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{piece.input}: row groups {piece.row_groups[0]}..{piece.row_groups[1] - 1} unreadable "
                         f"({str(e).splitlines()[0]}); re-download the file or pass --on-bad-file skip") from e
    text = table.column(text_column)
    if text.type not in STRING_TYPES:
        raise InputError(f"{piece.input}: column {text_column!r} holds {text.type}, not strings")
    if len(text) != piece.rows:
        raise InputError(f"{piece.input}: row groups {piece.row_groups} hold {len(text)} rows, metadata said {piece.rows}; the file changed during the run")
    ids = table.column(piece.id_column).cast(pa.string()) if piece.id_column else pa.nulls(len(text), pa.string())
    frame = pd.DataFrame({
        "row": np.arange(piece.first_row, piece.first_row + piece.rows, dtype=np.int64),
        "id": pd.Series(pd.arrays.ArrowExtensionArray(ids)),
        "text": pd.Series(pd.arrays.ArrowExtensionArray(text)),
    })
    return frame


def tokenize_and_write(frame: pd.DataFrame, *, job: PartitionJob) -> pd.DataFrame:
    """Tokenize the piece, write tokens + docs, then the done record that commits them.

    Returns one small row (the manifest entry as JSON, and timings); tokens stay on the worker.
    """
    started = time.time()
    piece: Piece = frame.attrs[PIECE_ATTR]
    if SKIP_ATTR in frame.attrs:
        return pd.DataFrame({"entry": [None], "unreadable": [frame.attrs[SKIP_ATTR]], "started": [started],
                             "finished": [time.time()]})
    texts = pa.array(frame["text"]).to_pylist()
    batch = tokenize_texts(texts, worker_backend(job.encoder_plugin), eot_position=job.eot_position, dtype=job.dtype)
    rows = frame["row"].to_numpy()[batch.kept]
    ids = pa.array(frame["id"]).take(pa.array(batch.kept)).to_pylist()
    ids = [i if i is not None else f"{piece.name}:{r}" for i, r in zip(ids, rows.tolist())]

    tokens_bytes = _npy_bytes(batch.tokens)
    docs = pa.table({
        "id": pa.array(ids, pa.string()),
        "row": pa.array(rows, pa.int64()),
        "start": pa.array(batch.starts, pa.int64()),
        "length": pa.array(batch.lengths, pa.int64()),
    })
    fs, root = filesystem(job.out, job.storage_options)
    write_atomic(fs, join(root, manifest.tokens_file(piece.index)), tokens_bytes)
    write_atomic(fs, join(root, manifest.docs_file(piece.index)), _parquet_bytes(docs))
    entry = manifest.partition_entry(
        piece, docs=len(batch.lengths), skipped_null=batch.skipped_null, skipped_empty=batch.skipped_empty,
        tokens=int(len(batch.tokens)), sha256=hashlib.sha256(tokens_bytes).hexdigest(), backend=job.backend,
    )
    # The done record goes last: its presence is what commits the partition.
    write_atomic(fs, join(root, manifest.done_file(piece.index)), json.dumps(manifest.done_record(entry, job.job)).encode())
    return pd.DataFrame({"entry": [entry], "unreadable": [None], "started": [started], "finished": [time.time()]})


def _npy_bytes(tokens: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, tokens.astype(tokens.dtype.newbyteorder("<"), copy=False), allow_pickle=False)
    return buf.getvalue()


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()
