"""``megatron``: Megatron-LM's indexed dataset (``MMIDIDX``), one sequence per document.

With ``--seq-len N`` (``export/packed.py`` writes it) every packed row is one document of exactly
N tokens: Megatron-core's ``GPTDataset`` with ``sequence_length=N`` and
``add_extra_token_to_sequence=False`` then yields our rows whole (in its own shuffled order), and
finds the documents inside a row as Megatron always does, from its eod token
(``reset_position_ids``, ``reset_attention_mask``, ``eod_mask_loss``): its files have no other
place for them, and its reader no other way (``megatron/core/datasets/gpt_dataset.py``,
``_get_ltor_masks_and_position_ids``).
"""
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


def packed_index(*, dtype: str, rows: int, seq_len: int, batch: int = 1 << 20):
    """The ``.idx`` of ``rows`` packed rows of ``seq_len`` tokens, one document each, in pieces
    of at most ``batch`` rows (so a large split is never held whole)."""
    itemsize = np.dtype(dtype).itemsize
    yield idx_header(dtype=dtype, docs=rows)
    for r0 in range(0, rows, batch):
        yield np.full(min(batch, rows - r0), seq_len, "<i4").tobytes()
    for r0 in range(0, rows, batch):
        yield (np.arange(r0, min(rows, r0 + batch), dtype="<i8") * (seq_len * itemsize)).astype("<i8").tobytes()
    for r0 in range(0, rows + 1, batch):
        yield np.arange(r0, min(rows + 1, r0 + batch), dtype="<i8").tobytes()


def packed_notes(*, seq_len: int, prefix: tuple[int, ...], suffix: tuple[int, ...], pad: int, padded: bool,
                 mask: bool = False) -> list[str]:
    """What a Megatron user needs to read packed rows with their documents (the summary's lines)."""
    notes = [(f"Megatron: one document per row of {seq_len:,} tokens; GPTDataset with --seq-length {seq_len} and "
              "add_extra_token_to_sequence=False yields the rows whole; --reset-position-ids --reset-attention-mask "
              "--eod-mask-loss find the documents in a row from the eod token")]
    if suffix:
        notes.append(f"each document ends with id {suffix[-1]}: with it as the tokenizer's eod, Megatron's document "
                     "boundaries are exactly the packed ones")
    elif prefix:
        notes.append(f"note: this run's documents start with {list(prefix)} and end with {list(suffix) or 'no token'}, "
                     "but Megatron ends a document after each eod: with the eod at a document's start its boundaries "
                     "land one token late (the eod joins the document before); tokenize with --eot suffix (--boundary "
                     "eos for tokenizers other than tiktoken's) for exact ones")
    else:
        notes.append("note: this run's documents hold no boundary token, so Megatron sees each row as one document; "
                     "tokenize with --eot suffix (--boundary eos) for boundaries")
    if padded:
        notes.append(f"padding is id {pad}" + (", the eod: --eod-mask-loss keeps it out of the loss" if suffix[-1:] == (pad,)
                                               else ": --eod-mask-loss keeps it out of the loss when it is Megatron's eod"))
    if mask:
        notes.append("note: a chat run's assistant mask has no place in Megatron's files, so every token takes the loss; "
                     "--format olmo, npy or hf carry it")
    return notes


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
