"""What one task does on a worker: read its piece (``corpus.read``), tokenize, write the part files, commit.

``tokenize_partition(piece, settings=, backend=)`` is all of it as a plain function. On the
cluster the job keeps Dask's DataFrame shape: ``dd.from_map(read_piece, pieces)`` reads, and
``map_partitions(write_frame, <the pieces, one per partition>)`` tokenizes and writes; Dask
fuses them into one task per planned piece (the job pins that, see ``command.py``). A run of several
encodings reads a piece once and writes it for each output that lacks it (``write_outputs``).
"""
from __future__ import annotations

import dataclasses
import pickle
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from dask.sizeof import sizeof
from distributed.protocol import dask_deserialize, dask_serialize

from .. import crashpoints
from ..corpus.plan import Piece, is_chat_type
from ..corpus.read import (READ_AT, frame_of, keep_columns, kept_columns, piece_columns, piece_tools, read_piece,
                           unreadable_reason, utf8_or_null)
from ..encoding.boundaries import Boundaries
from ..encoding.plugin import WorkerEncoder
from ..errors import InputError
from ..format import v1
from ..format.v1 import PartitionEntry
from ..storage.lease import LEASE_FILE, LeaseLost, held_at
from ..storage.store import begin_write, filesystem, join, write_atomic
from .chat import ChatBatch, bad_row_line, tokenize_chats
from .core import tokenize_column

PIECE_META = pd.DataFrame({"piece": pd.Series([], dtype=object), "outputs": pd.Series([], dtype=object)})
RESULT_META = pd.DataFrame({"result": pd.Series([], dtype=object)})


class ResultFrame(pd.DataFrame):
    """What ``write_frame`` returns: a frame of ``TaskResult`` rows, of its own type only so that
    Dask sizes and ships it as the few dataclasses it holds (``_results``, also its one column).
    As a plain frame with an object column, Dask's pandas sizeof (sampling the column, three times
    per result) and pandas serializer cost ~1 ms of a worker's CPU per partition, a fifth of a
    tiny partition's fixed cost (issue 24); so does pandas' own column lookup, ~0.1 ms.
    ``_results`` is a plain attribute, not pandas metadata: a frame derived from this one (a
    slice, a concat) does not inherit it and is read from its column."""

    @property
    def _constructor(self):
        return ResultFrame


@sizeof.register(ResultFrame)
def _sizeof_results(frame: ResultFrame) -> int:
    return RESULT_BYTES * len(frame)


RESULT_BYTES = 2_000
"""Roughly one pickled ``TaskResult`` (~800 bytes) and the Python objects behind it."""


@dask_serialize.register(ResultFrame)
def _serialize_results(frame: ResultFrame) -> tuple[dict, list[bytes]]:
    return {}, [pickle.dumps(TaskResult.all_from_frame(frame), protocol=pickle.HIGHEST_PROTOCOL)]


@dask_deserialize.register(ResultFrame)
def _deserialize_results(header: dict, frames: list) -> ResultFrame:
    return TaskResult.as_frame(pickle.loads(frames[0]))


@dataclass(frozen=True, kw_only=True)
class TaskSettings:
    """The few things every task needs besides its piece; small, so it travels in each task cheaply."""

    out: str
    storage_options: dict
    encoder: WorkerEncoder
    dtype: str
    job: str
    boundaries: Boundaries | None = None
    """Placed around each document's ids (``encoding.boundaries``); None: one eot at ``eot_position``."""
    eot_position: str | None = None
    text_column: str = "text"
    on_bad_file: str = "fail"
    backend: str = ""
    """The tokenizer that writes this run's partitions (``"splintr 0.22.0"``), recorded in each
    done record: a resumed run may have written its partitions with another."""
    chat: ChatSettings | None = None
    """A chat run's (``--chat-column``): rows are conversations, written with an assistant mask."""
    lease: str = ""
    """The run id of the lease this run holds on OUT (``storage.lease``), looked at before each
    done record is written; empty: not looked at (a caller that holds no lease)."""


@dataclass(frozen=True, kw_only=True)
class ChatSettings:
    on_bad_row: str = "fail"
    tools: tuple[str, bool] | None = None
    """The tools column read beside the messages and whether every input must have it
    (``corpus.plan.tools_to_read``), or None."""
    template: str | None = None
    """``--chat-template``'s text, rendered with instead of the tokenizer's own; None: its own."""


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """What one partition's task reports: its manifest entry, or why it was skipped as unreadable."""

    piece: Piece
    entry: PartitionEntry | None
    unreadable: str | None = None
    started: float
    finished: float
    output: int = 0
    """Which of the run's outputs (its place in the job's settings) the entry belongs to."""

    @property
    def tokens(self) -> int:
        return self.entry.tokens if self.entry else 0

    @staticmethod
    def as_frame(results: Sequence["TaskResult"]) -> "ResultFrame":
        """The frame ``map_partitions`` must return: a row per result."""
        frame = frame_of(RESULT_META, [_objects(results)], cls=ResultFrame)
        object.__setattr__(frame, "_results", list(results))
        return frame

    @staticmethod
    def all_from_frame(frame: pd.DataFrame) -> list["TaskResult"]:
        """One per output the task wrote (``write_frame``)."""
        results = frame.__dict__.get("_results")
        return list(results) if results is not None else frame["result"].tolist()


def tokenize_partition(piece: Piece, *, settings: TaskSettings, backend) -> TaskResult:
    """The whole of one partition's work, as a plain function (no Dask): read, tokenize, write, commit."""
    return write_partition(read_piece(piece, text_column=settings.text_column, storage_options=settings.storage_options,
                                      on_bad_file=settings.on_bad_file, tools=settings.chat.tools if settings.chat else None),
                           piece, settings=settings, backend=backend)


def piece_frame(piece: Piece, outputs: tuple[int, ...] | None = None) -> pd.DataFrame:
    """``dd.from_map``'s second collection: each partition's own piece, aligned with its rows, so
    the piece reaches ``write_frame`` as an argument; with the outputs (places in the job's
    settings) that still lack it, None for all."""
    frame = frame_of(PIECE_META, [_objects([piece]), _objects([outputs])])
    return keep_columns(frame, (piece, outputs))


def _objects(values: Sequence) -> np.ndarray:
    """An object column holding ``values`` as they are (a tuple stays one value)."""
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def piece_and_outputs(frame: pd.DataFrame) -> tuple[Piece, tuple[int, ...] | None]:
    """(piece, outputs) of a frame of ``PIECE_META``'s one row."""
    kept = kept_columns(frame)
    if kept is not None:
        return kept
    [piece], [outputs] = frame["piece"].tolist(), frame["outputs"].tolist()
    return piece, outputs


def write_frame(frame: pd.DataFrame, pieces: pd.DataFrame, *,
                settings: TaskSettings | Sequence[TaskSettings]) -> pd.DataFrame:
    """``map_partitions``' function: the piece's rows and the piece in, one result row per output
    written out. ``settings``: one output's, or one per output of a run of several encodings,
    each written from the same rows (read and decoded once) with its worker's own encoder."""
    piece, wanted = piece_and_outputs(pieces)
    each = [settings] if isinstance(settings, TaskSettings) else list(settings)
    chosen = list(range(len(each)) if wanted is None else wanted)
    written = write_outputs(frame, piece, settings=[each[i] for i in chosen],
                            backends=[each[i].encoder.backend() for i in chosen])
    return TaskResult.as_frame([dataclasses.replace(r, output=i) for i, r in zip(chosen, written)])


def write_partition(frame: pd.DataFrame, piece: Piece, *, settings: TaskSettings, backend) -> TaskResult:
    """Tokenize the piece's rows, write tokens + docs, then the done record that commits them.
    Tokens stay on the worker; the result carries the manifest entry."""
    [result] = write_outputs(frame, piece, settings=[settings], backends=[backend])
    return result


def write_outputs(frame: pd.DataFrame, piece: Piece, *, settings: Sequence[TaskSettings],
                  backends: Sequence) -> list[TaskResult]:
    """``write_partition`` for each output (settings, backend) from the same rows: the UTF-8 check
    and the documents' ids, which no encoding changes, are made once for all of them."""
    started = frame.__dict__.get(READ_AT) or time.time()
    all_rows, ids, text = piece_columns(frame)
    unreadable = unreadable_reason(all_rows, ids)
    if unreadable is not None:
        return [TaskResult(piece=piece, entry=None, unreadable=unreadable, started=started, finished=time.time())
                for _ in settings]
    _check_column_kind(text, piece, settings[0])
    if is_chat_type(text.type):  # conversations: their strings are checked as the template reads them
        invalid = []
    else:
        text, invalid = utf8_or_null(text, all_rows, piece, text_column=settings[0].text_column,
                                     on_bad_file=settings[0].on_bad_file)
    all_ids = document_ids(ids, all_rows, piece.name)
    invalid_rows = all_rows[invalid].tolist() if invalid else ()
    results = []
    for each, backend in zip(settings, backends):
        chats = None
        if each.chat is not None:
            chats = _chat_batch(text, all_rows, piece, settings=each, tools=piece_tools(frame))
            batch = chats.batch
        else:
            batch = tokenize_column(text, backend, boundaries=each.boundaries, eot_position=each.eot_position,
                                    dtype=each.dtype)
        fs, root = filesystem(each.out, each.storage_options)
        # The tokens file, most of the bytes, starts on its way to the disk (or S3) first; its
        # checksum and the docs file are made while it goes.
        tokens_bytes = v1.npy_bytes(batch.tokens)
        tokens = begin_write(fs, join(root, v1.tokens_file(piece.index)), tokens_bytes)
        try:
            mask_bytes = v1.npy_bytes(chats.mask) if chats is not None else None
            files = v1.partition_files(piece, batch.tokens, tokens_bytes=tokens_bytes, ids=_kept(all_ids, batch.kept),
                                       rows=all_rows[batch.kept], starts=batch.starts, lengths=batch.lengths,
                                       skipped_null=batch.skipped_null - len(invalid), skipped_empty=batch.skipped_empty,
                                       backend=each.backend, invalid_rows=invalid_rows, mask_bytes=mask_bytes,
                                       bad_rows=chats.bad if chats is not None else None,
                                       bad_row_numbers=all_rows[list(chats.bad_positions)].tolist() if chats else ())
            write_atomic(fs, join(root, files.entry.docs_file), files.docs)
            crashpoints.reached(crashpoints.DOCS, piece.index)
            if mask_bytes is not None:  # committed with the tokens: the done record below names it
                write_atomic(fs, join(root, files.entry.mask_file), mask_bytes)
                crashpoints.reached(crashpoints.MASK, piece.index)
        except BaseException:
            tokens.abort()
            raise
        tokens.finish()
        crashpoints.reached(crashpoints.TOKENS, piece.index)
        # Its presence is what commits the partition: it goes only once both data files are whole,
        # and only while this run still holds OUT (a run that stalled past its lease commits nothing).
        check_lease(fs, root, each, piece)
        write_atomic(fs, join(root, v1.done_file(piece.index)), v1.DoneRecord(entry=files.entry, job=each.job).to_bytes())
        crashpoints.reached(crashpoints.DONE, piece.index)
        results.append(TaskResult(piece=piece, entry=files.entry, started=started, finished=time.time()))
    return results


def check_lease(fs, root: str, settings: TaskSettings, piece: Piece) -> None:
    """``LeaseLost`` unless OUT's lease is still this run's: a run whose client stalled past the
    lease (a suspended machine) and was taken over must not commit partitions into its successor's
    OUT, whose files they could replace. One small read per partition; what is left is the moment
    between this read and the done record's write."""
    if not settings.lease:
        return
    held = held_at(fs, join(root, LEASE_FILE))
    if held is None or held.run != settings.lease:
        by = held.describe(time.time()) if held is not None else "nobody (its lease file is gone or unreadable)"
        raise LeaseLost(f"{settings.out}: this run lost its lease to {by}; partition {piece.index} was not committed "
                        "and no manifest will be written: OUT is that run's now")


def _check_column_kind(column, piece: Piece, settings: TaskSettings) -> None:
    """Conversations need ``--chat-column`` and it needs them (or their JSON text): one line."""
    listed = is_chat_type(column.type)
    if listed and settings.chat is None:
        raise InputError(f"{piece.input}: column {settings.text_column!r} holds {column.type}, not text: if it holds "
                         f"conversations, pass --chat-column {settings.text_column}; else --text-column NAME")
    if settings.chat is not None and not listed and not pa.types.is_string(column.type) \
            and not pa.types.is_large_string(column.type) and not pa.types.is_string_view(column.type):
        raise InputError(f"{piece.input}: --chat-column {settings.text_column!r} holds {column.type}, expected "
                         "a list of {role, content} messages (or that list as JSON text)")


def _chat_batch(column, rows: np.ndarray, piece: Piece, *, settings: TaskSettings, tools=None) -> ChatBatch:
    """The piece's conversations (with their ``tools`` where the input has a tools column)
    tokenized; a malformed row stops the task in one line unless ``--on-bad-row skip``."""
    chats = tokenize_chats(column.to_pylist(), settings.encoder.chat_template(settings.chat.template), dtype=settings.dtype,
                           tools=tools.to_pylist() if tools is not None else None)
    if chats.bad_positions and settings.chat.on_bad_row != "skip":
        raise InputError(bad_row_line(input=piece.input, row=int(rows[chats.bad_positions[0]]),
                                      column=settings.text_column, bad=chats.first_bad,
                                      more=len(chats.bad_positions) - 1,
                                      tools_column=settings.chat.tools[0] if settings.chat.tools else None))
    return chats


def _kept(ids: pa.Array, kept: np.ndarray) -> pa.Array:
    """``ids.take(kept)``, skipped when every row was kept (most partitions: no empty or null text)."""
    return ids if len(kept) == len(ids) else ids.take(kept)


def document_ids(ids: pa.Array | pa.ChunkedArray, rows: np.ndarray, name: str) -> pa.Array:
    """Each row's id as its input gives it, or ``NAME:ROW`` (the input's name and the row) where it
    gives none. In Arrow, not a Python str per document (~2% of a worker's CPU on 1 GB, py-spy)."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if ids.null_count == 0:
        return ids
    return pc.coalesce(ids, pc.binary_join_element_wise(name, pa.array(rows).cast(pa.string()), ":"))

