"""Parquet metadata → a deterministic partition plan.

A partition is a run of consecutive row groups of one file, about ``target_bytes`` of text.
The plan depends only on the inputs and the target, never on the cluster, so partition N is
the same rows whoever runs it, and a rerun can trust what an earlier run committed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError, UnreadableInput, UserError
from ..storage.failures import read_failure
from ..storage.store import file_identity, filesystem

STRING_TYPES = (pa.string(), pa.large_string(), pa.string_view())
ON_BAD_FILE = ("fail", "skip")
DEFAULT_PARTITION_BYTES = 8 * 1024 * 1024
"""Text bytes per partition for corpora up to ~128 GB of text: ~1.5 s of tiktoken on one core, so
the last wave of tasks idles cores only briefly, while Dask's ~1 ms per task stays noise."""
MAX_AUTO_PARTITIONS = 16_384
"""Past this many partitions the automatic size grows instead, so the client's records, the
manifest and the scheduler's task count stay bounded whatever the corpus (docs/scaling.md)."""


def check_on_bad_file(value: str) -> None:
    """``--on-bad-file``, as every command that reads the corpus takes it (tokenize, train-bpe)."""
    if value not in ON_BAD_FILE:
        raise UserError(f"--on-bad-file {value!r} not supported, expected one of {ON_BAD_FILE}")


def auto_partition_bytes(corpus_text_bytes: int) -> int:
    """8 MiB, or more when that would make over MAX_AUTO_PARTITIONS partitions."""
    return max(DEFAULT_PARTITION_BYTES, -(-corpus_text_bytes // MAX_AUTO_PARTITIONS))


def is_text_type(t: pa.DataType) -> bool:
    """Strings, or dictionary-encoded strings (how some writers store repetitive text)."""
    return t in STRING_TYPES or (pa.types.is_dictionary(t) and t.value_type in STRING_TYPES)


def is_chat_type(t: pa.DataType) -> bool:
    """A list of messages (``tokenize --chat-column``): each row's conversation, checked per row."""
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)


@dataclass(frozen=True, kw_only=True)
class InputFile:
    url: str
    name: str
    rows: int
    bytes: int
    row_group_rows: tuple[int, ...]
    row_group_text_bytes: tuple[int, ...]
    id_column: str | None
    """The column document ids come from, or None for ``"<name>:<row>"``."""
    identity: tuple = ()
    """``store.file_identity`` when the footer was read: tasks check it before and after reading."""


@dataclass(frozen=True, kw_only=True)
class BadInput:
    """An input (or, found while tokenizing, one partition of it) skipped as unreadable."""

    url: str
    reason: str
    partition: int | None = None
    row_groups: tuple[int, int] | None = None
    rows: int | None = None
    """The skipped partition's rows, so that verify can check the partitions cover each input."""


@dataclass(frozen=True, kw_only=True)
class Piece:
    index: int
    input: str
    name: str
    row_groups: tuple[int, int]
    """[first, stop) row-group numbers."""
    first_row: int
    rows: int
    text_bytes: int
    id_column: str | None
    identity: tuple = ()

    def as_dict(self) -> dict:
        return asdict(self)


def read_input_metadata(url: str, name: str, *, text_column: str, id_column: str | None, chat: bool = False,
                        storage_options: dict | None = None) -> InputFile:
    """Footer only: row counts, row groups and the text column's size. Runs on a worker."""
    fs, path = filesystem(url, storage_options)

    def footer() -> tuple[tuple, pq.FileMetaData]:
        identity = file_identity(fs, path)
        try:
            with fs.open(path, "rb") as f:
                return identity, pq.ParquetFile(f).metadata
        except OSError as e:  # the store's failure stops the run; only a bad file may be skipped
            raise read_failure(e, url, fs) or e

    return input_from_footer(url, name, footer, text_column=text_column, id_column=id_column, chat=chat)


def input_from_footer(url: str, name: str, footer: Callable[[], tuple[tuple, pq.FileMetaData]], *,
                      text_column: str, id_column: str | None, chat: bool = False) -> InputFile:
    """The ``InputFile`` of the file at ``url`` whose identity and metadata ``footer()`` gives,
    wherever it reads them (the file itself, or the Hub before the file is downloaded to ``url``):
    the plan cannot tell the two apart. ``chat``: ``text_column`` is ``--chat-column``'s."""
    try:
        identity, meta = footer()
        size = dict(identity)["size"]
        schema = meta.schema.to_arrow_schema()
    except FileNotFoundError as e:
        # The client found it, a worker did not: the worker runs on another machine.
        raise InputError(f"{url}: file not found on a worker; workers must see the same path as this machine "
                         "(a shared filesystem, or s3://; for --dataset, --fetch workers)") from e
    except (pa.ArrowException, OSError) as e:
        raise UnreadableInput(f"{url}: not a readable parquet file ({str(e).splitlines()[0]})",
                              "re-download or remove it") from e
    if text_column not in schema.names:
        raise InputError(f"{url}: no {'chat' if chat else 'text'} column {text_column!r}; columns are "
                         f"{', '.join(schema.names)}" + ("; pass --text-column NAME" if text_column == "text" and not chat
                                                         else ""))
    text_type = schema.field(text_column).type
    if chat and not is_text_type(text_type) and not is_chat_type(text_type):
        raise InputError(f"{url}: --chat-column {text_column!r} holds {text_type}; it must hold each row's messages: a "
                         "list of {role, content} (or that list as JSON text)")
    if not is_text_type(text_type) and not is_chat_type(text_type):
        strings = [f.name for f in schema if is_text_type(f.type) and f.name != text_column]
        hint = (f"; string columns are {', '.join(strings)}" if strings else "; it has no string column")
        raise InputError(f"{url}: column {text_column!r} holds {text_type}, not strings{hint}"
                         + ("; pass --text-column NAME" if strings and text_column == "text" else ""))
    if id_column is not None and id_column not in schema.names:
        raise InputError(f"{url}: no id column {id_column!r}; columns are {', '.join(schema.names)}")
    resolved_id = id_column if id_column is not None else ("id" if "id" in schema.names else None)
    rg_rows, rg_bytes = [], []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        rg_rows.append(rg.num_rows)
        rg_bytes.append(_column_bytes(rg, text_column))
    return InputFile(url=url, name=name, rows=meta.num_rows, bytes=size, row_group_rows=tuple(rg_rows),
                     row_group_text_bytes=tuple(rg_bytes), id_column=resolved_id, identity=identity)


def _column_bytes(row_group: pq.RowGroupMetaData, name: str) -> int:
    for j in range(row_group.num_columns):
        col = row_group.column(j)
        if col.path_in_schema == name:
            return col.total_uncompressed_size
    nested = [row_group.column(j).total_uncompressed_size for j in range(row_group.num_columns)
              if row_group.column(j).path_in_schema.startswith(name + ".")]  # a chat column's leaves
    return sum(nested) if nested else row_group.total_byte_size


def read_input_or_bad(url: str, name: str, *, on_bad_file: str, **kwargs) -> InputFile | BadInput:
    """``--on-bad-file skip``: an unreadable file becomes a ``BadInput`` instead of an error."""
    return _or_bad(url, on_bad_file, lambda: read_input_metadata(url, name, **kwargs))


def footer_or_bad(url: str, name: str, footer, *, on_bad_file: str, **kwargs) -> InputFile | BadInput:
    """``input_from_footer``, with an unreadable file a ``BadInput`` under ``--on-bad-file skip``."""
    return _or_bad(url, on_bad_file, lambda: input_from_footer(url, name, footer, **kwargs))


def _or_bad(url: str, on_bad_file: str, read: Callable[[], InputFile]) -> InputFile | BadInput:
    try:
        return read()
    except InputError as e:
        if on_bad_file == "skip":
            return BadInput(url=url, reason=e.reason)
        raise


def plan_pieces(files: list[InputFile], *, target_bytes: int, first_index: int = 0) -> list[Piece]:
    """Greedy runs of row groups per file, each about ``target_bytes`` of text; a row group
    larger than the target is a piece by itself. Empty row groups join their neighbours.
    Numbered from ``first_index``: a growth (``tokenize --add``) numbers after the run it grows,
    and each file's pieces are the same rows whatever else is planned with it."""
    pieces: list[Piece] = []
    for f in sorted(files, key=lambda f: f.url):
        start = row = first_row = size = 0
        for i, (n, b) in enumerate(zip(f.row_group_rows, f.row_group_text_bytes)):
            if i > start and size + b > target_bytes:
                pieces.append(_piece(first_index + len(pieces), f, start, i, first_row, row - first_row, size))
                start, first_row, size = i, row, 0
            row += n
            size += b
        if len(f.row_group_rows) > start:
            pieces.append(_piece(first_index + len(pieces), f, start, len(f.row_group_rows), first_row, row - first_row,
                                 size))
    return pieces


def _piece(index: int, f: InputFile, start: int, stop: int, first_row: int, rows: int, size: int) -> Piece:
    return Piece(index=index, input=f.url, name=f.name, row_groups=(start, stop), first_row=first_row,
                 rows=rows, text_bytes=size, id_column=f.id_column, identity=f.identity)


def submission_order(pieces: list[Piece]) -> list[Piece]:
    """The order tasks are submitted and run in (the job gives each its place as its priority); output
    does not depend on it.

    Full-sized pieces grouped by file, in file order: the workers then move through few files at
    a time, so each reads a file's footer once (``footers.FooterCache``) instead of once per
    partition. Small pieces (the ends of files, under half the median size) go last, largest
    first: they fill the final wave, so cores idle less at the end.
    """
    if not pieces:
        return []
    sizes = sorted(p.text_bytes for p in pieces)
    small = sizes[len(sizes) // 2] / 2
    full = sorted((p for p in pieces if p.text_bytes >= small), key=lambda p: (p.input, p.index))
    tail = sorted((p for p in pieces if p.text_bytes < small), key=lambda p: (-p.text_bytes, p.index))
    return full + tail


TOOLS_AUTO, TOOLS_NONE, TOOLS_DEFAULT_COLUMN = "auto", "none", "tools"
"""``--tools-column``: a column named ``tools`` where an input has one (TRL's name), none, or a name."""


def tools_to_read(chat_column: str | None, tools_column: str) -> tuple[str, bool] | None:
    """A chat run's tools column and whether every input must have it (named), or None (no tools
    read); also what ``verify --deep`` reads again, from the manifest's ``chat`` block."""
    if chat_column is None or tools_column == TOOLS_NONE:
        return None
    if tools_column == TOOLS_AUTO:
        return None if chat_column == TOOLS_DEFAULT_COLUMN else (TOOLS_DEFAULT_COLUMN, False)
    return tools_column, True
