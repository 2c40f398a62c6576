"""A piece's rows, read from its parquet file on a worker: the corpus half of a task.

``read_piece`` is ``dd.from_map``'s function in ``tokenize`` and ``train-bpe`` alike: the piece's
rows as a (row, id, text) frame, through this worker's parsed footers (``footers``), with the
input's identity checked before and after the read so a partition never mixes two versions of
its file. What the rows become (tokens, pair counts) is the command's.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputChanged, InputError, UnreadableInput
from ..storage.failures import read_failure
from ..storage.store import describe_identity_change, file_identity_like, filesystem
from .footers import WORKER_FOOTERS
from .plan import STRING_TYPES, Piece, is_chat_type

FRAME_META = pd.DataFrame({
    "row": pd.Series([], dtype="int64"),
    "id": pd.Series([], dtype=pd.ArrowDtype(pa.string())),
    "text": pd.Series([], dtype=pd.ArrowDtype(pa.string())),  # or large_string, as the file has it
})


def read_piece(piece: Piece, *, text_column: str, storage_options: dict, on_bad_file: str = "fail",
               tools: tuple[str, bool] | None = None) -> pd.DataFrame:
    """The piece's rows as (row, id, text); ids are None when the source has no id column. A chat
    run's ``tools`` (column, required) adds a ``tools`` column (``piece_tools``) where the input
    has that column; a required one it lacks is an ``InputError``.

    With ``on_bad_file="skip"`` an unreadable piece becomes one row whose ``text`` is null and
    whose ``id`` says why (``UNREADABLE`` marks it): the task then commits nothing for it.
    """
    read_at = time.time()
    try:
        frame = _read_piece(piece, text_column=text_column, storage_options=storage_options, tools=tools)
    except InputError as e:
        if on_bad_file != "skip":
            raise
        frame = pd.DataFrame({
            "row": np.array([UNREADABLE], dtype=np.int64),
            "id": pd.arrays.ArrowExtensionArray(pa.array([e.reason], pa.string())),
            "text": pd.arrays.ArrowExtensionArray(pa.nulls(1, pa.string())),
        }, copy=False)
    object.__setattr__(frame, READ_AT, read_at)
    return frame


READ_AT = "_tokenshards_read_at"
"""When ``read_piece`` began, kept on its frame (a plain attribute, like ``KEPT_COLUMNS``): a task's
``started``, so that a run's tokenizing phase counts its first read too."""


RELEASE_AFTER_BYTES = 32 * 2**20
"""Arrow's allocator keeps a read's scratch (decompressed pages, buffers outgrown: ~3-5x its text)
for the next read, which reuses it instead of faulting in fresh pages (``prestart.ARROW_MIMALLOC``).
After a read of more text than this it is handed back at once: 440 -> 106 MB held after 100 MB of
text, so one huge document or a large ``--partition-mb`` does not keep its scratch through the task.
Below it, at most ~120 MB stays per worker (108 MB measured after 30 MB); handing it back after
every read refaulted it each time (with ``ARROW_MIMALLOC``: ~7% of a worker's CPU on default-sized
pieces, 1 GB bench, interleaved)."""

UNREADABLE = -1
"""The ``row`` of the one row ``read_piece`` returns for a piece it could not read (under skip)."""


def _check_unchanged(fs, path: str, piece: Piece) -> None:
    """Stop before a partition mixes two versions of its input (replaced while the run went on)."""
    if not piece.identity:
        return
    try:
        now = file_identity_like(fs, path, piece.identity)
    except FileNotFoundError:
        now = ()
    if now != piece.identity:
        what = describe_identity_change(piece.identity, now) if now else "removed"
        raise InputChanged(f"{piece.input} changed since this run planned it ({what}); stopped before partition "
                           f"{piece.index} mixed old and new content; rerun once the input is final")


def _read_piece(piece: Piece, *, text_column: str, storage_options: dict,
                tools: tuple[str, bool] | None = None) -> pd.DataFrame:
    fs, path = filesystem(piece.input, storage_options)
    columns = [text_column] + ([piece.id_column] if piece.id_column and piece.id_column != text_column else [])
    tools_column = None
    _check_unchanged(fs, path, piece)
    try:
        with fs.open(path, "rb") as f:
            # One thread per worker process already fills every core: Arrow's own pool and
            # pre-buffering would only add CPU (~40% of the read time measured here).
            parquet = WORKER_FOOTERS.open(f, piece.input, piece.identity, pre_buffer=False)
            if tools is not None:
                tools_column = _tools_column(parquet.schema_arrow.names, piece, *tools)
                columns += [tools_column] if tools_column and tools_column not in columns else []
            table = parquet.read_row_groups(list(range(*piece.row_groups)), columns=columns, use_threads=False)
    except (pa.ArrowException, OSError) as e:
        _check_unchanged(fs, path, piece)  # a replaced file is not an unreadable one
        store_failed = read_failure(e, piece.input, fs)  # nor is a store that failed to serve it
        if store_failed is not None:
            raise store_failed from e
        raise UnreadableInput(f"{piece.input}: row groups {piece.row_groups[0]}..{piece.row_groups[1] - 1} unreadable "
                              f"({str(e).splitlines()[0]})", "re-download the file") from e
    _check_unchanged(fs, path, piece)  # after too: a replacement during the read
    if piece.text_bytes > RELEASE_AFTER_BYTES:
        pa.default_memory_pool().release_unused()
    text = table.column(text_column)
    if pa.types.is_dictionary(text.type) and text.type.value_type in STRING_TYPES:
        text = text.cast(text.type.value_type)  # dictionary-encoded strings are text
    if text.type not in STRING_TYPES and not is_chat_type(text.type):  # conversations: the task checks each row
        raise InputError(f"{piece.input}: column {text_column!r} holds {text.type}, not strings")
    if len(text) != piece.rows:
        raise InputError(f"{piece.input}: row groups {piece.row_groups} hold {len(text)} rows, metadata said {piece.rows}; the file changed during the run")
    ids = table.column(piece.id_column).cast(pa.string()) if piece.id_column else pa.nulls(len(text), pa.string())
    rows = np.arange(piece.first_row, piece.first_row + piece.rows, dtype=np.int64)
    frame = frame_of(FRAME_META, [rows, pd.arrays.ArrowExtensionArray(ids), pd.arrays.ArrowExtensionArray(text)])
    if tools_column is not None:
        chat_tools = table.column(tools_column)
        frame[TOOLS] = pd.arrays.ArrowExtensionArray(chat_tools)  # a column: it travels when the frame does
        object.__setattr__(frame, KEPT_TOOLS, chat_tools)
    return keep_columns(frame, (rows, ids, text))


TOOLS = "tools"
"""The frame's column of a chat run's tools, when its input has them."""
KEPT_TOOLS = "_tokenshards_tools"
"""The same, kept as the Arrow array it was read as (as ``KEPT_COLUMNS``)."""


def _tools_column(names: list[str], piece: Piece, column: str, required: bool) -> str | None:
    if column in names:
        return column
    if required:
        raise InputError(f"{piece.input}: no tools column {column!r}; columns are {', '.join(names)}; pass "
                         "--tools-column NAME, or --tools-column none for conversations without tools")
    return None


def piece_tools(frame: pd.DataFrame) -> pa.Array | pa.ChunkedArray | None:
    """A chat run's tools of the frame's rows (``read_piece``), or None: its input has no tools column."""
    kept = frame.__dict__.get(KEPT_TOOLS)
    if kept is not None:
        return kept
    return pa.array(frame[TOOLS]) if TOOLS in frame.columns else None


KEPT_COLUMNS = "_tokenshards_columns"
"""The frames the two ``from_map`` make for a task also keep their columns as what they were made
of (``read_piece``: rows, ids, texts as arrays; ``tokenize.task.piece_frame``: the piece and its
outputs), a plain attribute that ``write_frame`` reads instead of pandas' column lookups: five of
them cost ~90 us a partition measured warm, more in a worker whose caches the tokenizer just
cleared (issue 24). Not pandas metadata: a frame derived from one (a slice, a copy) or pickled has
its columns read."""


def keep_columns(frame: pd.DataFrame, values: tuple) -> pd.DataFrame:
    object.__setattr__(frame, KEPT_COLUMNS, values)
    return frame


def kept_columns(frame: pd.DataFrame) -> tuple | None:
    """What ``keep_columns`` kept on this very frame, or None (a derived or unpickled frame)."""
    return frame.__dict__.get(KEPT_COLUMNS)


def piece_columns(frame: pd.DataFrame) -> tuple[np.ndarray, pa.Array | pa.ChunkedArray, pa.Array | pa.ChunkedArray]:
    """(rows, ids, texts) of a frame of ``FRAME_META``'s columns."""
    kept = kept_columns(frame)
    if kept is not None:
        return kept
    return frame["row"].to_numpy(), pa.array(frame["id"]), pa.array(frame["text"])


def unreadable_reason(rows: np.ndarray, ids: pa.Array | pa.ChunkedArray) -> str | None:
    """Why ``read_piece`` could not read its piece (its one row under skip), or None: it read it."""
    return ids[0].as_py() if len(rows) == 1 and rows[0] == UNREADABLE else None


def utf8_or_null(text: pa.Array | pa.ChunkedArray, rows: np.ndarray, piece: Piece, *, text_column: str,
                 on_bad_file: str) -> tuple[pa.Array | pa.ChunkedArray, list[int]]:
    """(text with values that are not UTF-8 made null, their positions) under ``--on-bad-file
    skip``; else, when there are any, an ``InputError`` naming the first row."""
    text, invalid = _null_invalid_utf8(text)
    if invalid and on_bad_file != "skip":
        more = f" (and {len(invalid) - 1} more rows of this partition)" if len(invalid) > 1 else ""
        raise InputError(f"{piece.input}: partition {piece.index}, row {int(rows[invalid[0]])}: column "
                         f"{text_column!r} is not valid UTF-8{more}; fix the file, or pass --on-bad-file skip "
                         "to skip such rows")
    return text, invalid


def _null_invalid_utf8(text: pa.Array | pa.ChunkedArray) -> tuple[pa.Array | pa.ChunkedArray, list[int]]:
    """(text with undecodable values made null, their positions). Parquet writers do not all
    validate UTF-8; Arrow's full validation is one fast pass, the per-row search runs only on failure."""
    try:
        text.validate(full=True)
        return text, []
    except pa.ArrowInvalid:
        pass
    invalid = []
    for i, value in enumerate(text.cast(pa.large_binary()).to_pylist()):
        if value is not None:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                invalid.append(i)
    mask = np.zeros(len(text), dtype=bool)
    mask[invalid] = True
    return pc.if_else(pa.array(mask), pa.scalar(None, text.type), text), invalid


def frame_of(meta: pd.DataFrame, columns: list, *, cls: type[pd.DataFrame] = pd.DataFrame) -> pd.DataFrame:
    """A frame of ``meta``'s columns holding these arrays (numpy or pandas extension arrays, of one
    length), as they are. A partition makes three frames, one of them again in the client, and the
    public constructor builds its column names' Index from a dict's keys each time (pandas 3 infers
    a string dtype for it): ~40 us of ~60 measured warm, and py-spy put that Index at ~0.2 ms of a
    worker's CPU per partition. So pandas' own constructor from arrays and a ready Index is used:
    ``DataFrame._from_arrays``, private but in pandas since 0.23;
    ``test_frames_from_arrays_are_what_the_public_constructor_makes`` holds it to the public
    one's result, and where it is gone the public one is used."""
    build = getattr(cls, "_from_arrays", None)
    if build is not None:
        return build(columns, columns=meta.columns, index=pd.RangeIndex(len(columns[0])), verify_integrity=False)
    return cls(dict(zip(meta.columns, columns)), copy=False)
