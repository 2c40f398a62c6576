"""Chat rows in, one token array, its assistant mask and per-row counts out (``tokenize
--chat-column``). Pure: the rendering is ``encoding.chat``'s; no files, no Dask."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..encoding.chat import FIXES, BadRow, ChatTemplate, messages_of, tools_of
from .core import TokenizedBatch


@dataclass(frozen=True)
class ChatBatch:
    batch: TokenizedBatch
    """The kept conversations' ids back to back (the template's own markup is their only boundary)."""
    mask: np.ndarray
    """uint8, one per token of ``batch.tokens``: 1 where the token is the assistant's."""
    bad: dict[str, int] = field(default_factory=dict)
    """Malformed rows counted by reason (``encoding.chat.BAD_REASONS``)."""
    bad_positions: tuple[int, ...] = ()
    """Their positions in the input, ascending."""
    first_bad: BadRow | None = None


def tokenize_chats(values: Sequence, template: ChatTemplate, *, dtype: str, tools: Sequence | None = None) -> ChatBatch:
    """Each row's messages (``messages_of``) rendered and encoded by ``template``, with the row's
    ``tools`` (``tools_of``; None: no tools column) where given; null rows and empty lists are
    counted as ``skipped_null``/``skipped_empty`` as text runs count them, whatever their tools."""
    ids, masks, kept, bad_positions = [], [], [], []
    bad: dict[str, int] = {}
    first_bad = None
    null = empty = 0
    for i, value in enumerate(values):
        messages = messages_of(value)
        if messages is None:
            null, empty = (null + 1, empty) if value is None else (null, empty + 1)
            continue
        given = tools_of(tools[i]) if tools is not None and not isinstance(messages, BadRow) else None
        if isinstance(messages, BadRow) or isinstance(given, BadRow):
            row = messages if isinstance(messages, BadRow) else given
        else:
            row = template.encode(messages, given)
        if isinstance(row, BadRow):
            bad[row.reason] = bad.get(row.reason, 0) + 1
            bad_positions.append(i)
            first_bad = first_bad or row
            continue
        ids.append(row.ids)
        masks.append(row.mask)
        kept.append(i)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    if flat.size and int(flat.max()) > np.iinfo(dtype).max:
        raise ValueError(f"token id {int(flat.max())} does not fit {dtype}; the encoding's n_vocab is wrong")
    batch = TokenizedBatch(tokens=flat.astype(dtype), lengths=lengths, kept=np.asarray(kept, dtype=np.int64),
                           skipped_null=null, skipped_empty=empty)
    mask = np.concatenate(masks).astype(np.uint8) if masks else np.zeros(0, np.uint8)
    return ChatBatch(batch=batch, mask=mask, bad=dict(sorted(bad.items())), bad_positions=tuple(bad_positions),
                     first_bad=first_bad)


def bad_row_line(*, input: str, row: int, column: str, bad: BadRow, more: int = 0, tools_column: str | None = None) -> str:
    """The one line that names a malformed row: file, row, column (the tools column for
    ``bad_tools``), what is wrong, what to do."""
    if bad.reason == "bad_tools" and tools_column:
        column = tools_column
    others = f" (and {more} more malformed rows in this partition)" if more else ""
    return (f"{input}: row {row} of column {column!r}: {bad.detail} ({bad.reason}){others}; {FIXES[bad.reason]}, "
            "or pass --on-bad-row skip to skip such rows (counted per reason in the manifest)")
