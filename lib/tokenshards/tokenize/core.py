"""Texts in, one token array and per-document lengths out. Pure: no files, no Dask, no S3."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..encoding.backends import Backend
from ..encoding.boundaries import Boundaries


@dataclass(frozen=True)
class TokenizedBatch:
    tokens: np.ndarray
    """All kept documents' tokens, back to back, boundaries placed as asked."""
    lengths: np.ndarray
    """int64 token count of each kept document, boundaries included."""
    kept: np.ndarray
    """int64 positions (in the input sequence) of the kept documents, ascending."""
    skipped_null: int
    skipped_empty: int

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths


def eot_boundaries(eot_position: str, eot: int) -> Boundaries:
    """``--eot``'s one token before, after or nowhere, as boundaries."""
    return Boundaries(prefix=(eot,) if eot_position == "prefix" else (), suffix=(eot,) if eot_position == "suffix" else ())


def tokenize_texts(texts: Sequence[str | None], backend: Backend, *, dtype: str, eot_position: str | None = None,
                   boundaries: Boundaries | None = None) -> TokenizedBatch:
    """Tokenize every non-null, non-empty text with ``encode_ordinary`` semantics (a text's words
    never become control tokens) and place the boundaries around each document: ``boundaries``,
    or one ``backend.eot_token`` as ``eot_position`` says."""
    kept = [i for i, text in enumerate(texts) if text]
    skipped_null = sum(1 for text in texts if text is None)
    skipped_empty = len(texts) - len(kept) - skipped_null
    body, body_lengths = backend.encode_many([texts[i] for i in kept])
    return _assemble(body, body_lengths, np.asarray(kept, dtype=np.int64), _boundaries(backend, eot_position, boundaries),
                     dtype=dtype, skipped_null=skipped_null, skipped_empty=skipped_empty)


def _boundaries(backend: Backend, eot_position: str | None, boundaries: Boundaries | None) -> Boundaries:
    if boundaries is not None:
        return boundaries
    if eot_position is None:
        raise ValueError("pass boundaries or eot_position")
    return eot_boundaries(eot_position, backend.eot_token)


def tokenize_column(column: pa.Array | pa.ChunkedArray, backend: Backend, *, dtype: str, eot_position: str | None = None,
                    boundaries: Boundaries | None = None) -> TokenizedBatch:
    """``tokenize_texts`` for an Arrow string column. A backend that reads Arrow buffers itself
    (``encode_arrow``) gets them as they are, with no Python str made per document (the kept
    rows are copied out first only when some are null or empty); any other gets Python strs."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    boundaries = _boundaries(backend, eot_position, boundaries)
    encode_arrow = getattr(backend, "encode_arrow", None)
    if encode_arrow is None:
        return tokenize_texts(column.to_pylist(), backend, boundaries=boundaries, dtype=dtype)
    if pa.types.is_string_view(column.type):
        column = column.cast(pa.large_string())
    nonempty = pc.fill_null(pc.greater(pc.binary_length(column), 0), False)
    kept = np.flatnonzero(nonempty.to_numpy(zero_copy_only=False))
    skipped_null = column.null_count
    skipped_empty = len(column) - len(kept) - skipped_null
    body, body_lengths = encode_arrow(column if len(kept) == len(column) else column.filter(nonempty))
    return _assemble(body, body_lengths, kept.astype(np.int64, copy=False), boundaries,
                     dtype=dtype, skipped_null=skipped_null, skipped_empty=skipped_empty)


def _assemble(body: np.ndarray, body_lengths: np.ndarray, kept: np.ndarray, boundaries: Boundaries, *, dtype: str,
              skipped_null: int, skipped_empty: int) -> TokenizedBatch:
    """The documents' ids back to back in ``dtype``, the boundaries around each."""
    prefix, suffix = boundaries.prefix, boundaries.suffix
    widest = max(int(body.max()) if body.size else 0, *prefix, *suffix, 0)
    if widest > np.iinfo(dtype).max:
        # The dtype was chosen from n_vocab; never truncate an id silently.
        raise ValueError(f"token id {widest} does not fit {dtype}; the encoding's n_vocab is wrong")
    if not prefix and not suffix:
        tokens, lengths = body.astype(dtype), body_lengths
    else:
        # A boolean mask of the boundary positions: faster than np.insert or a slice per document
        # at web documents' lengths (docs/speed-history.md, 26 Nov).
        lengths = body_lengths + (len(prefix) + len(suffix))
        ends = np.cumsum(lengths)
        starts = ends - lengths
        tokens = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
        is_body = np.ones(len(tokens), dtype=bool)
        for k, token in enumerate(prefix):
            is_body[starts + k] = False
            tokens[starts + k] = token
        for k, token in enumerate(suffix):
            at = ends - len(suffix) + k
            is_body[at] = False
            tokens[at] = token
        tokens[is_body] = body
    return TokenizedBatch(tokens=tokens, lengths=lengths, kept=kept, skipped_null=skipped_null, skipped_empty=skipped_empty)
