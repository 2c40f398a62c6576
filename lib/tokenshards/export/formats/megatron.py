"""``megatron``: Megatron-LM's indexed dataset (``MMIDIDX``), one sequence per document."""
from __future__ import annotations

import struct

import numpy as np

from ..layout import DocIndex, DocLengths, DocPointers, Literal, OutFile, Streams, TokenRun
from .base import Format, Plan, wide

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {"<u2": 8, "<i4": 4}
"""Megatron's DType enum: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
It has no uint32; its own preprocessing writes int32 for vocabularies over uint16's range."""


def idx_header(*, dtype: str, docs: int) -> bytes:
    """Magic, version, dtype code, sequence count, then the length of the document index
    array (documents + 1: it starts with 0), as Megatron's ``_IndexWriter`` writes them."""
    return (MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", DTYPE_CODES[dtype])
            + struct.pack("<Q", docs) + struct.pack("<Q", docs + 1))


class Megatron(Format):
    name = "megatron"
    reader = "Megatron-LM"
    help = "Megatron-LM .bin/.idx (MMIDIDX, one sequence per document)"
    card = "Megatron-LM indexed dataset (`.bin` + `.idx`, MMIDIDX), one sequence per document"

    def dtype(self, source_dtype: str) -> str:
        return "<i4" if wide(source_dtype) else "<u2"

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        files = []
        for split in ("train", "val"):
            if not streams.tokens(split):
                continue
            stem = f"{plan.prefix}_text_document" if split == "train" else f"{plan.prefix}_val_text_document"
            n = streams.docs(split)
            files.append(OutFile(name=f"{stem}.bin", split=split, tokens=streams.tokens(split),
                                 regions=(TokenRun(split, 0, streams.tokens(split), plan.dtype),)))
            files.append(OutFile(name=f"{stem}.idx", split=split, tokens=0, regions=(
                Literal(idx_header(dtype=plan.dtype, docs=n)), DocLengths(split, n),
                DocPointers(split, n, np.dtype(plan.dtype).itemsize), DocIndex(n + 1))))
        return files

    def patterns(self, prefix: str) -> list[str]:
        return [f"{prefix}_text_document.bin", f"{prefix}_text_document.idx",
                f"{prefix}_val_text_document.bin", f"{prefix}_val_text_document.idx"]


FORMAT = Megatron()
