"""Texts in, one token array and per-document lengths out. Pure: no files, no Dask, no S3."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np


class Encoder(Protocol):
    eot_token: int

    def encode_to_numpy(self, text: str, *, disallowed_special=...) -> np.ndarray: ...


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
        starts = np.zeros(len(self.lengths), dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=starts[1:])
        return starts


def tokenize_texts(texts: Sequence[str | None], encoder: Encoder, *, eot_position: str, dtype: str) -> TokenizedBatch:
    """Tokenize every non-null, non-empty text with ``encode_ordinary`` semantics.

    ``encode_to_numpy(text, disallowed_special=())`` with no allowed specials is
    ``encode_ordinary`` (special-token strings stay ordinary text) but hands back a buffer
    instead of a list of Python ints, which is most of the non-BPE cost per token.
    """
    eot = np.array([encoder.eot_token], dtype=np.uint32)
    pieces: list[np.ndarray] = []
    lengths: list[int] = []
    kept: list[int] = []
    skipped_null = skipped_empty = 0
    with_eot = eot_position != "none"
    eot_first = eot_position == "prefix"
    encode = encoder.encode_to_numpy
    for i, text in enumerate(texts):
        if text is None:
            skipped_null += 1
            continue
        if not text:
            skipped_empty += 1
            continue
        body = encode(text, disallowed_special=())
        if with_eot:
            if eot_first:
                pieces.append(eot)
                pieces.append(body)
            else:
                pieces.append(body)
                pieces.append(eot)
            lengths.append(len(body) + 1)
        else:
            pieces.append(body)
            lengths.append(len(body))
        kept.append(i)
    wide = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint32)
    if wide.size and int(wide.max()) > np.iinfo(dtype).max:
        # The dtype was chosen from n_vocab; never truncate an id silently.
        raise ValueError(f"token id {int(wide.max())} does not fit {dtype}; the encoding's n_vocab is wrong")
    tokens = wide.astype(dtype, copy=False)
    return TokenizedBatch(
        tokens=tokens,
        lengths=np.asarray(lengths, dtype=np.int64),
        kept=np.asarray(kept, dtype=np.int64),
        skipped_null=skipped_null,
        skipped_empty=skipped_empty,
    )
