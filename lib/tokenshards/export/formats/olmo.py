"""``olmo``: OLMo-core's token arrays, read by ``olmo_core.data`` (``NumpyFSLDataset`` and its
other numpy datasets, ``load_array_slice``, ``iter_document_indices``): per split a folder
(``train/``, ``val/``; OLMo-core takes a list of paths or a glob) holding ``PREFIX.npy``, the
tokens as a *headerless* little-endian uint16 (uint32 for vocabularies over 65,536 ids) memmap,
Dolma's naming though it is not NumPy's format (``np.load`` refuses it; our ``npy`` format writes
real ``.npy`` files), and ``PREFIX.csv.gz``, the ``start,end`` token offsets of every document,
the metadata file ``iter_document_indices`` reads for remote paths or with
``use_array_if_local=False``.

The ``.csv.gz`` is written by chunks, so its size must be known before a document is read: every
row is ``start,end`` with both numbers zero-padded to the width of the split's token count
(``int()`` reads ``000123`` as 123, as OLMo-core parses it), and the file is a series of gzip
members (``gzip`` reads them as one stream) of one stored deflate block each, holding as many
rows as fit in a stored block's 65,535 bytes.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

from ..layout import DocRecords, OutFile, Streams, TokenRun
from .base import Format, Plan

GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
"""Deflate, no name or time (mtime 0, so the same export gives the same bytes), OS unknown."""
STORED_MAX = 65_535
MEMBER_OVERHEAD = len(GZIP_HEADER) + 5 + 8
"""Header, the stored block's header (BFINAL|BTYPE=00, LEN, NLEN), CRC32 and ISIZE."""


def row_width(tokens: int) -> int:
    """Bytes of one ``start,end\\n`` row for a split of ``tokens`` tokens."""
    return 2 * len(str(tokens)) + 2


def doc_index_members(starts: np.ndarray, ends: np.ndarray, per: int, digits: int) -> bytes:
    """Gzip members of ``per`` rows each (the last fewer) for these documents (worker side)."""
    out = []
    for i in range(0, len(starts), per):
        text = "".join(f"{a:0{digits}d},{b:0{digits}d}\n" for a, b in zip(starts[i:i + per].tolist(), ends[i:i + per].tolist()))
        data = text.encode()
        out.append(GZIP_HEADER + struct.pack("<BHH", 1, len(data), len(data) ^ 0xFFFF) + data
                   + struct.pack("<II", zlib.crc32(data), len(data)))
    return b"".join(out)


def doc_index_regions(split: str, docs: int, tokens: int) -> tuple[DocRecords, ...]:
    digits = len(str(tokens))
    width = row_width(tokens)
    per = STORED_MAX // width
    full, rest = divmod(docs, per)
    regions = []
    if full:
        regions.append(DocRecords(split, 0, full * per, per, MEMBER_OVERHEAD + per * width, doc_index_members,
                                  (per, digits)))
    if rest:
        regions.append(DocRecords(split, full * per, rest, rest, MEMBER_OVERHEAD + rest * width, doc_index_members,
                                  (rest, digits)))
    return tuple(regions)


class Olmo(Format):
    name = "olmo"
    reader = "OLMo-core"
    help = ("OLMo-core headerless token memmaps (named .npy, not NumPy's format) + .csv.gz document offsets, in "
            "train/ and val/")

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        files = []
        for split in ("train", "val"):
            tokens, docs = streams.tokens(split), streams.docs(split)
            if not tokens:
                continue
            files.append(OutFile(name=f"{split}/{plan.prefix}.npy", split=split, tokens=tokens,
                                 regions=(TokenRun(split, 0, tokens, plan.dtype),)))
            files.append(OutFile(name=f"{split}/{plan.prefix}.csv.gz", split=split, tokens=0,
                                 regions=doc_index_regions(split, docs, tokens)))
        return files

    def patterns(self, prefix: str) -> list[str]:
        return [f"{split}/{prefix}{suffix}" for split in ("train", "val") for suffix in (".npy", ".csv.gz")]

    def notes(self, files: list[OutFile], plan: Plan) -> list[str]:
        dtype = np.dtype(plan.dtype).name
        notes = [f"OLMo-core: paths DEST/train/*.npy (val/ likewise), dtype={dtype}, eos_token_id={plan.eot}; raw "
                 "token arrays without NumPy's header (np.load refuses them)"]
        if plan.eot_position != "suffix":
            where = "at the start of each document" if plan.eot_position == "prefix" else "absent (--eot none)"
            notes.append(f"note: OLMo-core finds documents by a trailing eos in local arrays; this run's eot is {where}, "
                         "so its document boundaries (generate_doc_lengths, padded and VSL datasets) are exact only from "
                         "the .csv.gz: pass use_array_if_local=False (remote paths read it anyway), or tokenize with --eot suffix "
                         "(--boundary eos for tokenizers other than tiktoken's)")
        return notes


FORMAT = Olmo()
