"""Texts in, one token array and per-document lengths out. Pure: no files, no Dask, no S3."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..encoding.backends import Backend


@dataclass(frozen=True)
class TokenizedBatch:
    tokens: np.ndarray
    """All kept documents' tokens, back to back, eot placed as asked."""
    lengths: np.ndarray
    """int64 token count of each kept document, eot included."""
    kept: np.ndarray
    """int64 positions (in the input sequence) of the kept documents, ascending."""
    skipped_null: int
    skipped_empty: int

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths


def tokenize_texts(texts: Sequence[str | None], backend: Backend, *, eot_position: str, dtype: str) -> TokenizedBatch:
    """Tokenize every non-null, non-empty text with ``encode_ordinary`` semantics and place
    one eot per document (before it, after it, or not at all)."""
    kept = [i for i, text in enumerate(texts) if text]
    skipped_null = sum(1 for text in texts if text is None)
    skipped_empty = len(texts) - len(kept) - skipped_null
    body, body_lengths = backend.encode_many([texts[i] for i in kept])
    return _assemble(body, body_lengths, np.asarray(kept, dtype=np.int64), backend.eot_token, eot_position=eot_position,
                     dtype=dtype, skipped_null=skipped_null, skipped_empty=skipped_empty)


def tokenize_column(column: pa.Array | pa.ChunkedArray, backend: Backend, *, eot_position: str, dtype: str) -> TokenizedBatch:
    """``tokenize_texts`` for an Arrow string column. A backend that reads Arrow buffers itself
    (``encode_arrow``) gets them as they are, with no Python str made per document (the kept
    rows are copied out first only when some are null or empty); any other gets Python strs."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    encode_arrow = getattr(backend, "encode_arrow", None)
    if encode_arrow is None:
        return tokenize_texts(column.to_pylist(), backend, eot_position=eot_position, dtype=dtype)
    if pa.types.is_string_view(column.type):
        column = column.cast(pa.large_string())
    nonempty = pc.fill_null(pc.greater(pc.binary_length(column), 0), False)
    kept = np.flatnonzero(nonempty.to_numpy(zero_copy_only=False))
    skipped_null = column.null_count
    skipped_empty = len(column) - len(kept) - skipped_null
    body, body_lengths = encode_arrow(column if len(kept) == len(column) else column.filter(nonempty))
    return _assemble(body, body_lengths, kept.astype(np.int64, copy=False), backend.eot_token, eot_position=eot_position,
                     dtype=dtype, skipped_null=skipped_null, skipped_empty=skipped_empty)


def _assemble(body: np.ndarray, body_lengths: np.ndarray, kept: np.ndarray, eot: int, *, eot_position: str, dtype: str,
              skipped_null: int, skipped_empty: int) -> TokenizedBatch:
    """The documents' ids back to back in ``dtype``, one eot each where asked."""
    widest = max(int(body.max()) if body.size else 0, eot if eot_position != "none" else 0)
    if widest > np.iinfo(dtype).max:
        # The dtype was chosen from n_vocab; never truncate an id silently.
        raise ValueError(f"token id {widest} does not fit {dtype}; the encoding's n_vocab is wrong")
    if eot_position == "none":
        tokens, lengths = body.astype(dtype), body_lengths
    else:
        lengths = body_lengths + 1
        ends = np.cumsum(lengths)
        eot_at = ends - lengths if eot_position == "prefix" else ends - 1
        tokens = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
        is_body = np.ones(len(tokens), dtype=bool)
        is_body[eot_at] = False
        tokens[eot_at] = eot
        tokens[is_body] = body
    return TokenizedBatch(tokens=tokens, lengths=lengths, kept=kept, skipped_null=skipped_null, skipped_empty=skipped_empty)
