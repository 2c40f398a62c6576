"""Pure: the files each training codebase reads, as names and regions (see layout.py).

- ``llmc``: llm.c's ``write_datafile`` layout: 256 little-endian int32 (magic, version, token
  count, then zeros) followed by the tokens. GPT-2-sized vocabularies: magic 20240520, version 1,
  uint16, read unchanged by llm.c's C loader and modded-nanogpt's ``_load_data_shard``. Larger
  ones: llm.c's llama-3 variant, magic 20240801, version 7, uint32, which only llm.c's
  ``train_llama3.py`` reads (the C loader says "Bad magic", modded-nanogpt asserts the magic).
- ``npy``: build-nanogpt's shards, ``np.save`` of a 1-D array (its ``load_tokens`` casts to int32).
- ``nanogpt``: nanoGPT's ``train.bin`` / ``val.bin``: raw uint16, its ``np.memmap`` dtype.
- ``megatron``: Megatron-LM's indexed dataset (``MMIDIDX``), one sequence per document.

Shard names follow llm.c's ``fineweb.py``: one running number, validation shards first.
"""
from __future__ import annotations

import io
import struct

import numpy as np

from ..errors import UserError
from .layout import DocIndex, DocLengths, DocPointers, Literal, OutFile, Streams, TokenRun

FORMATS = ("llmc", "npy", "nanogpt", "megatron")
DEFAULT_PREFIX = "fineweb"
"""llm.c's and modded-nanogpt's default globs (``fineweb_train_*.bin``) then match unchanged."""

LLMC_HEADER_INTS = 256
LLMC_GPT2 = (20240520, 1, "<u2")
LLMC_LLAMA3 = (20240801, 7, "<u4")
LLMC_MAX_TOKENS = 2**31 - 1
"""The header stores the token count in an int32."""
LLAMA3_READERS = ("llm.c's llama-3 layout (magic 20240801, version 7, uint32 tokens) for this {n_vocab:,}-token "
                  "vocabulary: llm.c's train_llama3.py reads it; llm.c's C dataloader (train_gpt2.c/.cu) and "
                  "modded-nanogpt read only the GPT-2 layout (magic 20240520, uint16) and reject these files")
"""What a llama-3 layout export says, so nobody finds out from a trainer's "Bad magic"."""
MIN_SHARD_FRACTION = 100
"""Default --min-shard-tokens: 1% of --shard-tokens (1,000,000 of the default 100,000,000, more
than one step of 8 processes x B 64 x T 1024 in llm.c), so no shard is over 1.01x the size asked."""

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
MEGATRON_DTYPE_CODES = {"<u2": 8, "<i4": 4}
"""Megatron's DType enum: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
It has no uint32; its own preprocessing writes int32 for vocabularies over uint16's range."""


def llmc_header(*, magic: int, version: int, tokens: int) -> bytes:
    header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
    header[:3] = magic, version, tokens
    return header.tobytes()


def npy_header(*, dtype: str, count: int) -> bytes:
    """Exactly the bytes ``np.save`` writes before a 1-D C-order array of this dtype and length."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": (count,)})
    return buf.getvalue()


def megatron_idx_header(*, dtype: str, docs: int) -> bytes:
    """Magic, version, dtype code, sequence count, then the length of the document index
    array (documents + 1: it starts with 0), as Megatron's ``_IndexWriter`` writes them."""
    return (MEGATRON_MAGIC + struct.pack("<Q", MEGATRON_VERSION) + struct.pack("<B", MEGATRON_DTYPE_CODES[dtype])
            + struct.pack("<Q", docs) + struct.pack("<Q", docs + 1))


def output_dtype(fmt: str, source_dtype: str) -> str:
    """The dtype a format stores; refuses what its reader cannot take."""
    wide = np.dtype(source_dtype).itemsize > 2
    if fmt == "llmc":
        return LLMC_LLAMA3[2] if wide else LLMC_GPT2[2]
    if fmt == "npy":
        return "<u4" if wide else "<u2"
    if fmt == "nanogpt":
        if wide:
            raise UserError("nanoGPT's train.py reads train.bin/val.bin as uint16, but this output's encoding needs "
                            "uint32 ids; export --format llmc (llama-3 layout), npy or megatron instead")
        return "<u2"
    if fmt == "megatron":
        return "<i4" if wide else "<u2"
    raise UserError(f"--format {fmt!r} not supported, expected one of {FORMATS}")


def shard_sizes(total: int, *, shard_tokens: int, min_shard_tokens: int = 0) -> list[int]:
    """Tokens per shard of a split: ``shard_tokens`` each, the remainder last; a last shard under
    ``min_shard_tokens`` joins the one before it (again, until it holds enough or is the only one).
    llm.c's loader stops on a shard smaller than one step (processes x B x T + 1 tokens)."""
    sizes = [shard_tokens] * (total // shard_tokens) + ([total % shard_tokens] if total % shard_tokens else [])
    while len(sizes) > 1 and sizes[-1] < min_shard_tokens:
        tail = sizes.pop()
        sizes[-1] += tail
    return sizes


def shard_files(*, fmt: str, prefix: str, streams: Streams, shard_tokens: int, dtype: str,
                min_shard_tokens: int = 0) -> list[OutFile]:
    """The files of ``fmt`` for these streams; splits with no tokens get no file."""
    if fmt in ("llmc", "npy"):
        files = []
        number = 0
        for split in ("val", "train"):
            first = 0
            for count in shard_sizes(streams.tokens(split), shard_tokens=shard_tokens, min_shard_tokens=min_shard_tokens):
                if fmt == "llmc" and count > LLMC_MAX_TOKENS:
                    raise UserError(f"the last {split} shard would hold {count:,} tokens, over llm.c's limit of "
                                    f"{LLMC_MAX_TOKENS:,} (an int32 in its header); pass a smaller --min-shard-tokens")
                if fmt == "llmc":
                    magic, version, _ = LLMC_LLAMA3 if dtype == "<u4" else LLMC_GPT2
                    head = llmc_header(magic=magic, version=version, tokens=count)
                    name = f"{prefix}_{split}_{number:06d}.bin"
                else:
                    head = npy_header(dtype=dtype, count=count)
                    name = f"{prefix}_{split}_{number:06d}.npy"
                files.append(OutFile(name=name, split=split, tokens=count,
                                     regions=(Literal(head), TokenRun(split, first, count, dtype))))
                number += 1
                first += count
        return files
    if fmt == "nanogpt":
        return [OutFile(name=f"{split}.bin", split=split, tokens=streams.tokens(split),
                        regions=(TokenRun(split, 0, streams.tokens(split), dtype),))
                for split in ("train", "val") if streams.tokens(split)]
    if fmt == "megatron":
        files = []
        for split in ("train", "val"):
            if not streams.tokens(split):
                continue
            stem = f"{prefix}_text_document" if split == "train" else f"{prefix}_val_text_document"
            n = streams.docs(split)
            files.append(OutFile(name=f"{stem}.bin", split=split, tokens=streams.tokens(split),
                                 regions=(TokenRun(split, 0, streams.tokens(split), dtype),)))
            files.append(OutFile(name=f"{stem}.idx", split=split, tokens=0, regions=(
                Literal(megatron_idx_header(dtype=dtype, docs=n)), DocLengths(split, n),
                DocPointers(split, n, np.dtype(dtype).itemsize), DocIndex(n + 1))))
        return files
    raise UserError(f"--format {fmt!r} not supported, expected one of {FORMATS}")


def shard_notes(files: list[OutFile], *, shard_tokens: int, min_shard_tokens: int) -> list[str]:
    """For sharded formats: each split's shard count and what became of its last, shorter part."""
    notes = []
    for split in ("val", "train"):
        shards = [f for f in files if f.split == split]
        if not shards:
            continue
        last = shards[-1]
        if len(shards) == 1:
            note = f"{split}: 1 shard, {last.name}, {last.tokens:,} tokens"
            if last.tokens < min_shard_tokens:
                note += (f": the whole split, under --min-shard-tokens ({min_shard_tokens:,}); llm.c reads it with "
                         f"processes x B x T up to {last.tokens - 1:,}")
        elif last.tokens > shard_tokens:
            note = (f"{split}: {len(shards)} shards; the last, {last.name}, holds {last.tokens:,} tokens: its final "
                    f"{last.tokens - shard_tokens:,} joined it rather than make a shard under --min-shard-tokens "
                    f"({min_shard_tokens:,})")
        else:
            note = f"{split}: {len(shards)} shards; the last, {last.name}, holds {last.tokens:,} tokens"
        notes.append(note)
    return notes


def name_patterns(fmt: str, prefix: str) -> list[str]:
    """Globs matching every file an export of ``fmt`` could write (to find an earlier one's)."""
    return {
        "llmc": [f"{prefix}_val_*.bin", f"{prefix}_train_*.bin"],
        "npy": [f"{prefix}_val_*.npy", f"{prefix}_train_*.npy"],
        "nanogpt": ["train.bin", "val.bin"],
        "megatron": [f"{prefix}_text_document.bin", f"{prefix}_text_document.idx",
                     f"{prefix}_val_text_document.bin", f"{prefix}_val_text_document.idx"],
    }[fmt]


def record_name(fmt: str, prefix: str) -> str:
    return "export.json" if fmt == "nanogpt" else f"{prefix}_export.json"
