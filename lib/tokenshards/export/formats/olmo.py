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

With ``--seq-len N`` (``export/packed.py`` writes it) the array is the packed rows one after
the other, so ``NumpyFSLDataset`` with ``sequence_length=N`` reads exactly our rows; the
``.csv.gz`` holds each row's documents (the pieces packed, padding excluded), and a best-fit
export (or a chat run's) adds ``SPLIT/label_mask/PREFIX.npy``, one bool byte per token (False on
padding and, for a chat run, outside the assistant's turns), for ``label_mask_paths``: OLMo-core's
``get_labels`` never takes the loss where it is False. Inside a row OLMo-core finds documents
from the eos token itself (``generate_doc_lengths``, ``olmo_core.data.utils.get_document_lengths``).
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

from ..layout import DocRecords, MaskRun, OutFile, Streams, TokenRun
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


LABEL_MASK_FOLDER = "label_mask"
"""Under each split's folder, so a glob of ``SPLIT/*.npy`` (OLMo-core's ``paths``) never takes a mask for tokens."""


def packed_names(prefix: str, split: str, *, label_mask: bool) -> dict[str, str]:
    """A packed split's files: the rows, their documents, and the label mask when padding or a chat mask needs one."""
    names = {"input_ids": f"{split}/{prefix}.npy", "documents": f"{split}/{prefix}.csv.gz"}
    if label_mask:
        names["label_mask"] = f"{split}/{LABEL_MASK_FOLDER}/{prefix}.npy"
    return names


def packed_documents(starts: np.ndarray, ends: np.ndarray, *, tokens: int) -> bytes:
    """Gzip members of the ``.csv.gz`` for these documents of a split of ``tokens`` tokens."""
    return doc_index_members(starts, ends, STORED_MAX // row_width(tokens), len(str(tokens)))


def packed_notes(*, seq_len: int, dtype: str, prefix: tuple[int, ...], suffix: tuple[int, ...], label_mask: bool) -> list[str]:
    """What an OLMo-core user needs to read packed rows with their documents (the summary's lines)."""
    args = f"sequence_length={seq_len}, dtype={np.dtype(dtype).name}, generate_doc_lengths=True"
    # No bos_token_id even where documents have one: OLMo-core then ends a document only at an eos followed by
    # it, and the padding after a row's last document would join it.
    eos = suffix[-1] if suffix else prefix[-1] if prefix else None
    if eos is not None:
        args += f", eos_token_id={eos}"
    notes = [f"OLMo-core: NumpyFSLDataset(DEST/train/*.npy, {args}) reads the rows whole (val/ likewise)"
             + ("; label_mask_paths=DEST/train/label_mask/*.npy keeps padding (and a chat run's prompts) out of the loss"
                if label_mask else "")]
    if not suffix:
        notes.append(f"note: this run's documents {'start with ' + str(list(prefix)) if prefix else 'hold no boundary token'}; "
                     "OLMo-core's doc_lens end a document at each eos, so they are exact only from the .csv.gz "
                     "(iter_document_indices with use_array_if_local=False); tokenize with --eot suffix (--boundary eos "
                     "for tokenizers other than tiktoken's) for exact doc_lens")
    return notes


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
            if plan.mask:  # a chat run's: one bool byte per token, True where the loss is taken (label_mask_paths)
                files.append(OutFile(name=f"{split}/{LABEL_MASK_FOLDER}/{plan.prefix}.npy", split=split, tokens=0,
                                     regions=(MaskRun(split, 0, tokens),)))
        return files

    def patterns(self, prefix: str) -> list[str]:
        return [f"{split}/{prefix}{suffix}" for split in ("train", "val") for suffix in (".npy", ".csv.gz")] + [
            f"{split}/{LABEL_MASK_FOLDER}/{prefix}.npy" for split in ("train", "val")]

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
        if any(f"/{LABEL_MASK_FOLDER}/" in f.name for f in files):
            notes.append(f"{LABEL_MASK_FOLDER}/: the assistant mask of this chat run, one bool byte per token; pass "
                         f"label_mask_paths=DEST/train/{LABEL_MASK_FOLDER}/*.npy so OLMo-core takes the loss on the "
                         "assistant's turns only")
        return notes


FORMAT = Olmo()
