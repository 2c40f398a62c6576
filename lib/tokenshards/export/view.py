"""Worker side: one piece of a split's stream (a partition of an export in manifest order, or a
bucket of a shuffled one) as the documents it holds, read from the part files they came from.

Both drivers render chunks through ``DocView``; what differs is only which documents a piece
holds, in what order. Reads go file by file, nearby ranges joined, in bounded batches.
"""
from __future__ import annotations

import numpy as np

from ..errors import UserError
from ..format.reader import MaskFiles, PartitionFiles

GAP_BYTES = 1 << 20
"""Reading a gap this small costs less than another request to S3."""
LOCAL_GAP_BYTES = 1 << 14
"""On a local disk a read costs a system call: join only ranges a few pages apart."""
READ_BATCH_BYTES = 32 << 20
"""What a writer reads before copying it out: its memory besides its chunk."""


class DocView:
    """Documents ``i`` = tokens [start[i], start[i] + length[i]) of partition ``part[i]`` of run
    ``src[i]``, in stream order, seen as one contiguous stream of tokens."""

    def __init__(self, files: list[PartitionFiles], src, part, start, length):
        self.files = files
        self.src, self.part, self.start, self.length = (np.asarray(x, dtype=np.int64) for x in (src, part, start, length))
        self.cum = np.concatenate([[0], np.cumsum(self.length)]).astype(np.int64)

    def tokens(self, split: str, lo: int, hi: int) -> np.ndarray:
        """Tokens [lo, hi) of this piece's stream."""
        cum, length = self.cum, self.length
        d0 = int(np.searchsorted(cum, lo, side="right")) - 1
        d1 = int(np.searchsorted(cum, hi, side="left"))
        a = self.start[d0:d1] + np.maximum(lo - cum[d0:d1], 0)
        b = self.start[d0:d1] + np.minimum(hi - cum[d0:d1], length[d0:d1])
        return gather(self.files, self.src[d0:d1], self.part[d0:d1], a, b)

    def mask(self, split: str, lo: int, hi: int) -> np.ndarray:
        """The assistant mask (uint8, 1: train on it) of tokens [lo, hi): a chat run's mask files,
        read as ``tokens`` reads the tokens."""
        if not hasattr(self, "_mask_files"):
            self._mask_files = [MaskFiles(f) for f in self.files]
        cum, length = self.cum, self.length
        d0 = int(np.searchsorted(cum, lo, side="right")) - 1
        d1 = int(np.searchsorted(cum, hi, side="left"))
        a = self.start[d0:d1] + np.maximum(lo - cum[d0:d1], 0)
        b = self.start[d0:d1] + np.minimum(hi - cum[d0:d1], length[d0:d1])
        return gather(self._mask_files, self.src[d0:d1], self.part[d0:d1], a, b)

    def lengths(self, split: str, lo: int, hi: int) -> np.ndarray:
        """int32 token counts of documents [lo, hi) (Megatron's sequence lengths)."""
        lengths = self.length[lo:hi]
        if len(lengths) and lengths.max() > np.iinfo(np.int32).max:
            where = ", ".join(sorted({self.files[s].partitions[k].docs_file
                                      for s, k in zip(self.src[lo:hi].tolist(), self.part[lo:hi].tolist())}))
            raise UserError(f"{where}: a document of {lengths.max():,} tokens does not fit Megatron's int32 sequence lengths")
        return lengths.astype("<i4")

    def sized(self, split: str, lo: int, hi: int, dtype: str) -> bytes:
        """Documents [lo, hi), each as its uint32 byte count then its tokens as ``dtype`` (MDS samples)."""
        itemsize = np.dtype(dtype).itemsize
        nbytes = self.length[lo:hi] * itemsize
        if len(nbytes) and nbytes.max() > np.iinfo(np.uint32).max:
            where = ", ".join(sorted({self.files[s].partitions[k].docs_file
                                      for s, k in zip(self.src[lo:hi].tolist(), self.part[lo:hi].tolist())}))
            raise UserError(f"{where}: a document of {nbytes.max() // itemsize:,} tokens does not fit an MDS sample's "
                            "uint32 byte count")
        body = self.tokens(split, int(self.cum[lo]), int(self.cum[hi])).astype(dtype, copy=False).view(np.uint8)
        out = np.empty(4 * len(nbytes) + len(body), np.uint8)
        # Sample i starts after i heads and the bytes of the documents before it.
        at = 4 * np.arange(len(nbytes)) + (np.cumsum(nbytes) - nbytes)
        head = np.zeros(len(out), bool)
        for j in range(4):
            head[at + j] = True
        out[head] = nbytes.astype("<u4").view(np.uint8)
        out[~head] = body
        return out.tobytes()

    def offsets(self, split: str, lo: int, hi: int, base: int, scale: int, end: bool, dtype: str) -> np.ndarray:
        """``base + scale x`` the stream offset of each document [lo, hi)'s first token (or, with
        ``end``, one past its last), as ``dtype``: byte pointers, token ends."""
        at = self.cum[lo + 1:hi + 1] if end else self.cum[lo:hi]
        return (base + at * scale).astype(dtype)


def coalesce(a: np.ndarray, b: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranges [a, b) sorted by a → (merged starts, merged ends, which merged range holds each),
    joining ranges less than ``gap`` apart."""
    if len(a) == 0:
        return a, b, np.zeros(0, np.int64)
    reach = np.maximum.accumulate(b)
    new = np.r_[True, a[1:] - reach[:-1] >= gap]
    group = np.cumsum(new) - 1
    starts = a[new]
    ends = np.maximum.reduceat(b, np.flatnonzero(new))
    return starts, ends, group


def gather(files: list[PartitionFiles], src: np.ndarray, part: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Token ranges [a, b) of (run src, partition part), concatenated in the order given.

    Reads go file by file, nearby ranges joined (``GAP_BYTES`` on S3, ``LOCAL_GAP_BYTES`` on a
    local disk), in batches of about ``READ_BATCH_BYTES`` (one concurrent request batch on S3):
    a task holds its output and one batch, however large the run."""
    n = b - a
    offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
    dtype = files[int(src[0])].dtype if len(src) else np.dtype("<u2")
    out = np.empty(int(offsets[-1]), dtype)
    by_file = np.lexsort((a, part, src))
    key = src.astype(np.int64)[by_file] * (1 << 32) + part[by_file]
    cuts = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True]).tolist()
    batch: dict[int, list] = {}
    held = 0

    def flush():
        for s, groups in batch.items():
            arrays = files[s].token_ranges([r for _, _, ranges in groups for r in ranges])
            base = 0
            for idx, group, ranges in groups:
                for i, g in zip(idx.tolist(), group.tolist()):
                    lo = int(a[i]) - ranges[g][1]
                    out[offsets[i]:offsets[i + 1]] = arrays[base + g][lo:lo + int(n[i])]
                base += len(ranges)
        batch.clear()

    for g0, g1 in zip(cuts[:-1], cuts[1:]):
        idx = by_file[g0:g1]
        s, k = int(src[idx[0]]), int(part[idx[0]])
        pf = files[s]
        gap = (LOCAL_GAP_BYTES if pf.run.is_local else GAP_BYTES) // pf.dtype.itemsize
        starts, ends, group = coalesce(a[idx], b[idx], gap)
        batch.setdefault(s, []).append((idx, group, [(k, int(x), int(y)) for x, y in zip(starts.tolist(), ends.tolist())]))
        held += int((ends - starts).sum()) * pf.dtype.itemsize
        if held >= READ_BATCH_BYTES:
            flush()
            held = 0
    flush()
    return out
