"""Pure: documents → fixed-length training sequences (``export --seq-len N``), and the seeded order
of sequences in a shuffled or mixed packed export.

A packing is a list of *pieces* (document, first token, count) grouped into sequences; a
sequence holds at most N tokens and is padded to N by the writer. Every function here takes
document lengths and returns arrays: no files, no cluster, so the same lengths give the same
sequences wherever they run. The drivers call the packers once per piece of the run's stream
(a partition's validation or train documents, in row order): the run's partitions are fixed by
its plan, so the sequences never depend on the export's cluster.

- ``concat``: the stream cut into N-token windows; a window crosses document boundaries and
  only the stream's tail (under N tokens) is left over. With ``bos_align`` a window starts at a
  document's first token and the document it cuts loses the rest (modded-nanogpt's BOS-aligned
  loader does the same); the rest and the piece's tail are counted as dropped.
- ``best_fit``: best-fit decreasing over windows of ``window`` documents: documents longer than N
  are split at N, pieces placed longest first into the open sequence with the least room that
  holds them. Nothing is dropped (with ``bos_align``, the parts of a split document after its
  first N tokens are, so every sequence starts at a document's start); the room left is padding.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from .order import fmix64

MODES = ("concat", "best-fit")
WINDOW_DOCS = 16_384
"""Documents best-fit looks at together: ~16 M tokens of lengths and ~8,000 open sequences at
FineWeb's ~1,000-token mean, a few MB whatever the corpus size; padding at N = 2048 stays far
under 1% (tests/test_packing.py measures it on FineWeb-like lengths)."""
FEISTEL_ROUNDS = 4


@dataclass(frozen=True, kw_only=True)
class PackSpec:
    """How documents become rows. ``seq_len`` None: one document per row (``--format hf`` unpacked)."""

    seq_len: int | None = None
    mode: str = "concat"
    bos_align: bool = False
    window: int = WINDOW_DOCS

    @property
    def packed(self) -> bool:
        return self.seq_len is not None


@dataclass(frozen=True)
class Packing:
    """Pieces (``doc``: index in the lengths packed, ``offset``: first token in it, ``length``)
    of sequence i are ``[bounds[i], bounds[i+1])``, in the order they appear in the sequence."""

    doc: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    bounds: np.ndarray
    dropped: int = 0
    """Tokens of the documents packed that no sequence holds."""

    @property
    def sequences(self) -> int:
        return len(self.bounds) - 1

    @property
    def tokens(self) -> int:
        return int(self.length.sum())

    def filled(self) -> np.ndarray:
        """Tokens in each sequence (padding excluded)."""
        cum = np.concatenate([[0], np.cumsum(self.length)])
        return (cum[self.bounds[1:]] - cum[self.bounds[:-1]]).astype(np.int64)

    def take(self, seqs: np.ndarray) -> "Packing":
        """Sequences ``seqs`` (in that order) as a packing of their own."""
        seqs = np.asarray(seqs, dtype=np.int64)
        counts = self.bounds[seqs + 1] - self.bounds[seqs]
        idx = ranges(self.bounds[seqs], counts)
        return Packing(self.doc[idx], self.offset[idx], self.length[idx],
                       np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each pair, without a Python loop."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(counts)
    return np.repeat(np.asarray(starts, np.int64) - (ends - counts), counts) + np.arange(total, dtype=np.int64)


def empty() -> Packing:
    z = np.zeros(0, np.int64)
    return Packing(z, z, z, np.zeros(1, np.int64))


def pack(lengths: np.ndarray, spec: PackSpec, *, first: int = 0, own: int | None = None) -> Packing:
    """The packing of one piece of a stream (see the module docstring); ``first`` and ``own``:
    ``concat`` only, see there."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not spec.packed:
        keep = np.flatnonzero(lengths > 0)
        return Packing(keep, np.zeros(len(keep), np.int64), lengths[keep], np.arange(len(keep) + 1, dtype=np.int64))
    if spec.mode == "concat":
        if spec.bos_align:
            return concat_aligned(lengths, spec.seq_len)
        return concat(lengths, spec.seq_len, first=first, own=own)
    if spec.mode == "best-fit":
        return best_fit(lengths, spec.seq_len, window=spec.window, bos_align=spec.bos_align)
    raise ValueError(f"pack mode {spec.mode!r}, expected one of {MODES}")


def _cut(lengths: np.ndarray, starts: np.ndarray, seq_len: int) -> Packing:
    """Sequences ``[s, s + seq_len)`` of the concatenated documents, one per start (each must fit)."""
    cum = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if len(starts) == 0:
        return empty()
    ends = starts + seq_len
    inner = cum[(cum > starts[0]) & (cum < ends[-1])]
    points = np.unique(np.concatenate([starts, ends, inner]))
    a, b = points[:-1], points[1:]
    seq = np.searchsorted(starts, a, side="right") - 1
    inside = a < ends[seq]  # gaps between sequences (bos-align's dropped rests) are no piece
    a, b, seq = a[inside], b[inside], seq[inside]
    doc = np.searchsorted(cum, a, side="right") - 1
    bounds = np.searchsorted(seq, np.arange(len(starts) + 1), side="left").astype(np.int64)
    return Packing(doc.astype(np.int64), a - cum[doc], b - a, bounds)


def concat(lengths: np.ndarray, seq_len: int, *, first: int = 0, own: int | None = None) -> Packing:
    """Windows of ``seq_len`` tokens starting at ``first``, ``first + seq_len``, ... before
    ``own`` (default: the end), each wholly inside the documents given: a piece of a longer
    stream passes its own documents and enough of the next pieces' for its last window, and
    ``first`` = where its first window starts (the tokens before belong to the piece before's
    last window). ``dropped`` is left 0: the stream's tail is the caller's to count."""
    total = int(np.sum(lengths))
    own = total if own is None else own
    last = min(own - 1, total - seq_len)
    n = max(0, (last - first) // seq_len + 1) if last >= first else 0
    return _cut(lengths, first + seq_len * np.arange(n, dtype=np.int64), seq_len)


def concat_aligned(lengths: np.ndarray, seq_len: int) -> Packing:
    """Each window starts at the first document starting at or after the previous window's end."""
    cum = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(cum[-1])
    starts = []
    d = 0
    n = len(lengths)
    while d < n and int(cum[d]) + seq_len <= total:
        if lengths[d] > 0:
            starts.append(int(cum[d]))
        else:
            d += 1
            continue
        d = int(np.searchsorted(cum, cum[d] + seq_len, side="left"))
    p = _cut(lengths, np.asarray(starts, dtype=np.int64), seq_len)
    return Packing(p.doc, p.offset, p.length, p.bounds, dropped=total - p.tokens)


def best_fit(lengths: np.ndarray, seq_len: int, *, window: int = WINDOW_DOCS, bos_align: bool = False) -> Packing:
    """Best-fit decreasing, window by window of documents (see the module docstring). Ties are
    broken by document and offset (items) and by opening order (sequences), so it is
    deterministic; a sequence's pieces are in document order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    docs, offs, lens, bins = [], [], [], []
    base_bin = 0
    dropped = 0
    for w0 in range(0, len(lengths), window):
        wl = lengths[w0:w0 + window]
        full = wl // seq_len
        if bos_align:
            counts = (wl > 0).astype(np.int64)
            dropped += int(np.maximum(wl - seq_len, 0).sum())
        else:
            counts = full + (wl % seq_len > 0)
        doc = np.repeat(np.arange(w0, w0 + len(wl), dtype=np.int64), counts)
        off = (ranges(np.zeros(len(wl), np.int64), counts) * seq_len).astype(np.int64)
        ln = np.minimum(lengths[doc] - off, seq_len)
        order = np.lexsort((off, doc, -ln))  # longest first; ties in stream order
        open_bins: list[tuple[int, int]] = []  # (room, bin), sorted: the first with room >= l fits best
        where = np.empty(len(ln), np.int64)
        n_bins = 0
        for i, l in zip(order.tolist(), ln[order].tolist()):
            if l == seq_len:
                where[i] = n_bins
                n_bins += 1
                continue
            j = bisect.bisect_left(open_bins, (l, -1))
            if j < len(open_bins):
                room, b = open_bins.pop(j)
            else:
                room, b = seq_len, n_bins
                n_bins += 1
            where[i] = b
            if room - l:
                bisect.insort(open_bins, (room - l, b))
        docs.append(doc), offs.append(off), lens.append(ln), bins.append(where + base_bin)
        base_bin += n_bins
    if not docs:
        return empty()
    doc, off, ln, b = (np.concatenate(x) for x in (docs, offs, lens, bins))
    by = np.lexsort((off, doc, b))
    bounds = np.searchsorted(b[by], np.arange(base_bin + 1), side="left").astype(np.int64)
    return Packing(doc[by], off[by], ln[by], bounds, dropped=dropped)


# -- what the writer makes of a sequence ------------------------------------------------------------
def segments(piece_lengths: np.ndarray, bounds: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's segments as trainers read a packed row: its pieces (documents), then its padding,
    where the row is not full, as one segment more; (lengths, bounds) as the pieces' are given.

    A row's segments cover its ``seq_len`` tokens exactly: TRL's padding-free collator builds position
    ids from them (``DataCollatorForLanguageModeling.get_position_ids_from_packed_seq_lengths``) and
    flash-attention's varlen kernels take ``cu_seqlens = [0, *cumsum(lengths)]`` up to the last token.
    The padding, a segment of its own, attends to itself alone and is never a target (labels -100)."""
    piece_lengths = np.asarray(piece_lengths, np.int64)
    bounds = np.asarray(bounds, np.int64)
    n = len(bounds) - 1
    counts = np.diff(bounds)
    row_of = np.repeat(np.arange(n), counts)
    filled = np.bincount(row_of, weights=piece_lengths, minlength=n).astype(np.int64) if n else np.zeros(0, np.int64)
    pad = seq_len - filled
    if (pad < 0).any():
        raise ValueError(f"a row holds {int(filled.max())} tokens, more than seq_len={seq_len}")
    padded = (pad > 0).astype(np.int64)
    out_bounds = np.concatenate([[0], np.cumsum(counts + padded)]).astype(np.int64)
    lengths = np.empty(int(out_bounds[-1]), np.int64)
    lengths[np.arange(len(piece_lengths)) + np.repeat(out_bounds[:-1] - bounds[:-1], counts)] = piece_lengths
    lengths[out_bounds[1:][padded == 1] - 1] = pad[padded == 1]
    return lengths, out_bounds


def position_ids(piece_lengths: np.ndarray, bounds: np.ndarray, seq_len: int) -> np.ndarray:
    """(sequences, seq_len) int32: 0, 1, ... restarting at each segment (``segments``: each piece,
    then the padding), as TRL's collator derives them from the segments' lengths; transformers'
    mask from position ids (``masking_utils.find_packed_sequence_indices``) and flash-attention's
    (``prepare_fa_kwargs_from_position_ids``) then keep the documents and the padding apart."""
    lengths, _ = segments(piece_lengths, bounds, seq_len)
    return ranges(np.zeros(len(lengths), np.int64), lengths).reshape(len(bounds) - 1, seq_len).astype(np.int32)


# -- the order of sequences -----------------------------------------------------------------------
def permute(i: np.ndarray, n: int, salt: np.uint64) -> np.ndarray:
    """A seeded bijection of [0, n), evaluated at ``i``: a balanced Feistel network on the
    smallest even number of bits covering n (murmur3's finalizer as round function), cycle-walked
    back into range. Any position's sequence is computed alone, in O(1) memory."""
    i = np.asarray(i, dtype=np.uint64)
    if n <= 1:
        return i.astype(np.int64)
    half = max(1, math.ceil(math.ceil(math.log2(n)) / 2))
    mask = np.uint64((1 << half) - 1)
    keys = [np.uint64(int(fmix64(np.array([int(salt) ^ (r + 1)], np.uint64))[0])) for r in range(FEISTEL_ROUNDS)]

    def encrypt(x):
        left, right = x >> np.uint64(half), x & mask
        for k in keys:
            left, right = right, left ^ (fmix64(right ^ k) & mask)
        return (left << np.uint64(half)) | right

    x = encrypt(i)
    out = x >= np.uint64(n)
    while out.any():
        x[out] = encrypt(x[out])
        out = x >= np.uint64(n)
    return x.astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class Copies:
    """What one run gives a split of a packed export: every one of its ``sequences`` ``epochs``
    times, then ``extra`` more chosen by its own seeded order (a mixture's top-up)."""

    sequences: int
    epochs: int = 1
    extra: int = 0
    salt: int = 0
    """Order of the top-up's choice."""

    @property
    def total(self) -> int:
        return self.sequences * self.epochs + self.extra


def sequence_order(lo: int, hi: int, copies: list[Copies], *, salt: np.uint64 | None) -> tuple[np.ndarray, np.ndarray]:
    """(run, sequence) at output positions [lo, hi) of a split: runs' copies one after the other
    (run 0's epochs, its top-up, run 1's, ...), permuted by ``salt`` (None: not shuffled)."""
    total = sum(c.total for c in copies)
    pos = np.arange(lo, hi, dtype=np.int64)
    idx = pos if salt is None else permute(pos, total, salt)
    edges = np.cumsum([0] + [c.total for c in copies])
    run = np.searchsorted(edges, idx, side="right") - 1
    local = idx - edges[run]
    seq = np.empty(len(idx), np.int64)
    for r, c in enumerate(copies):
        mine = run == r
        if not mine.any():
            continue
        x = local[mine]
        whole = x < c.sequences * c.epochs
        y = np.where(whole, x % max(c.sequences, 1), 0)
        extra = ~whole
        if extra.any():
            y[extra] = permute(x[extra] - c.sequences * c.epochs, c.sequences, np.uint64(c.salt))
        seq[mine] = y
    return run, seq
