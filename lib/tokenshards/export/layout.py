"""Pure: where every output byte comes from, computed from per-partition counts (prefix sums).

Each split (``val``, ``train``) is a stream: its documents in manifest order (partition by
partition, row order inside each). An output file is a list of regions (a literal header, a run
of a split's tokens, or one of Megatron's index arrays); a file is cut into byte-range chunks,
and each chunk becomes a list of small operations that a worker can carry out by reading only
the partitions it names. The cut never changes the bytes, only who writes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

SPLITS = ("val", "train")
PIECE_OPS = ("tokens", "lengths", "offsets", "sized", "mask")
"""Operations that read a piece of a split's stream: op[1] is the piece, op[2] the split."""


@dataclass(frozen=True)
class Streams:
    """Prefix sums of each split's documents and tokens over partitions (length P+1)."""

    doc_bounds: dict[str, np.ndarray]
    token_bounds: dict[str, np.ndarray]

    @classmethod
    def from_counts(cls, *, docs: np.ndarray, tokens: np.ndarray, val_docs: np.ndarray, val_tokens: np.ndarray) -> "Streams":
        def bounds(counts):
            return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)

        return cls(doc_bounds={"val": bounds(val_docs), "train": bounds(docs - val_docs)},
                   token_bounds={"val": bounds(val_tokens), "train": bounds(tokens - val_tokens)})

    def docs(self, split: str) -> int:
        return int(self.doc_bounds[split][-1])

    def tokens(self, split: str) -> int:
        return int(self.token_bounds[split][-1])


# -- regions: what a file is made of ------------------------------------------------------------
@dataclass(frozen=True)
class Literal:
    data: bytes
    itemsize = 1

    @property
    def count(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class TokenRun:
    """Tokens [first, first + count) of a split's stream, written as ``dtype``."""

    split: str
    first: int
    count: int
    dtype: str

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class MaskRun:
    """The assistant mask of tokens [first, first + count) of a split's stream (a chat run's):
    one byte per token, 1 where the loss is taken (datatrove's ``.loss``, the npy mask shards)."""

    split: str
    first: int
    count: int
    itemsize = 1


@dataclass(frozen=True)
class DocLengths:
    """int32 token count of every document of a split (Megatron's sequence lengths)."""

    split: str
    count: int
    itemsize = 4


@dataclass(frozen=True)
class DocOffsets:
    """Where every document of a split starts (or, with ``end``, ends) in the split's stream:
    ``base + scale x`` its token offset, as ``dtype``. Megatron's byte pointers are
    ``DocPointers``; datatrove's index is token ends from 0."""

    split: str
    count: int
    scale: int = 1
    end: bool = False
    dtype: str = "<i8"
    base: int = 0

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize


def DocPointers(split: str, count: int, token_itemsize: int) -> DocOffsets:  # noqa: N802 - a region, like the classes
    """int64 byte offset of every document of a split in its ``.bin`` (Megatron's pointers)."""
    return DocOffsets(split, count, scale=token_itemsize)


@dataclass(frozen=True)
class DocRecords:
    """Documents [first, first + docs) of a split as records of ``per`` documents each (the last may
    hold fewer, and is then best a region of its own, since every element of a region has one
    size): ``encode(starts, ends, *params)`` turns the records' documents' int64 start and end
    offsets in the split's stream into exactly ``itemsize`` bytes per record. ``encode`` is a
    module-level function: it travels to the workers by name."""

    split: str
    first: int
    docs: int
    per: int
    itemsize: int
    encode: Callable
    params: tuple = ()

    @property
    def count(self) -> int:
        return -(-self.docs // self.per)


@dataclass(frozen=True)
class SizedDocs:
    """Documents [first, first + docs) of a split, which hold ``tokens`` tokens, each written as
    its uint32 byte count then its tokens as ``dtype`` (an MDS sample of one variable-size
    ``bytes`` column). Its size needs only the counts; a format makes one per piece of the stream
    (whose document and token counts the client knows), so a chunk renders only what it holds.
    One element: a chunk that takes any of it renders it whole."""

    split: str
    first: int
    docs: int
    tokens: int
    dtype: str
    count = 1

    @property
    def itemsize(self) -> int:
        return 4 * self.docs + self.tokens * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class DocIndex:
    """int64 0, 1, ..., count-1 (Megatron's document indices: one sequence per document)."""

    count: int
    itemsize = 8


@dataclass(frozen=True)
class OutFile:
    name: str
    split: str
    regions: tuple
    tokens: int
    """Tokens of the split this file carries (for the export record)."""

    @property
    def nbytes(self) -> int:
        return sum(r.count * r.itemsize for r in self.regions)


@dataclass(frozen=True)
class Chunk:
    """Bytes [offset, offset + nbytes) of one file: ``segments`` are (head, take, ops); each
    segment's ops render whole elements, of which bytes [head, head + take) belong here."""

    file: str
    number: int
    offset: int
    nbytes: int
    segments: tuple

    def partitions(self) -> set[int]:
        return {op[1] for _, _, ops in self.segments for op in ops if op[0] in PIECE_OPS}


def locate(bounds: np.ndarray, lo: int, hi: int):
    """(k, local_lo, local_hi) for each partition k that holds part of stream range [lo, hi)."""
    k = int(np.searchsorted(bounds, lo, side="right")) - 1
    while lo < hi:
        end = int(bounds[k + 1])
        if end > lo:
            base = int(bounds[k])
            top = min(hi, end)
            yield k, lo - base, top - base
            lo = top
        k += 1


def _ops(region, e0: int, e1: int, streams: Streams) -> list[tuple]:
    """Operations rendering elements [e0, e1) of ``region``."""
    if isinstance(region, Literal):
        return [("literal", region.data[e0:e1])]
    if isinstance(region, TokenRun):
        bounds = streams.token_bounds[region.split]
        return [("tokens", k, region.split, a, b, region.dtype)
                for k, a, b in locate(bounds, region.first + e0, region.first + e1)]
    if isinstance(region, MaskRun):
        bounds = streams.token_bounds[region.split]
        return [("mask", k, region.split, a, b) for k, a, b in locate(bounds, region.first + e0, region.first + e1)]
    if isinstance(region, DocLengths):
        return [("lengths", k, region.split, a, b) for k, a, b in locate(streams.doc_bounds[region.split], e0, e1)]
    if isinstance(region, DocOffsets):
        tb = streams.token_bounds[region.split]
        return [("offsets", k, region.split, a, b, region.base + int(tb[k]) * region.scale, region.scale, region.end,
                 region.dtype)
                for k, a, b in locate(streams.doc_bounds[region.split], e0, e1)]
    if isinstance(region, DocRecords):
        d0, d1 = region.first + e0 * region.per, region.first + min(e1 * region.per, region.docs)
        tb = streams.token_bounds[region.split]
        ops = []
        for end in (False, True):
            ops += [("offsets", k, region.split, a, b, int(tb[k]), 1, end, "<i8")
                    for k, a, b in locate(streams.doc_bounds[region.split], d0, d1)]
        return [*ops, ("encode", region.encode, d1 - d0, region.params)]
    if isinstance(region, SizedDocs):
        return [("sized", k, region.split, a, b, region.dtype)
                for k, a, b in locate(streams.doc_bounds[region.split], region.first, region.first + region.docs)]
    if isinstance(region, DocIndex):
        return [("arange", e0, e1)]
    raise TypeError(f"unknown region {region!r}")


def chunk_file(f: OutFile, streams: Streams, *, chunk_bytes: int) -> list[Chunk]:
    """Cut ``f`` into chunks of ``chunk_bytes`` (the last one shorter), numbered from 1."""
    size = f.nbytes
    chunks = []
    for number, a in enumerate(range(0, size, chunk_bytes), start=1):
        b = min(a + chunk_bytes, size)
        segments = []
        r0 = 0
        for region in f.regions:
            r1 = r0 + region.count * region.itemsize
            x0, x1 = max(a, r0), min(b, r1)
            if x0 < x1:
                e0 = (x0 - r0) // region.itemsize
                e1 = -(-(x1 - r0) // region.itemsize)
                head = x0 - (r0 + e0 * region.itemsize)
                segments.append((head, x1 - x0, tuple(_ops(region, e0, e1, streams))))
            r0 = r1
        chunks.append(Chunk(file=f.name, number=number, offset=a, nbytes=b - a, segments=tuple(segments)))
    return chunks
