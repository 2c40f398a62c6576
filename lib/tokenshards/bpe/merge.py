"""The byte-level BPE merge loop: pure, sequential, fast because of its data structures.

Each merge touches only the words that hold the chosen pair (found through a pair → words
index), updates pair counts by local deltas around each occurrence, and finds the next pair
with a heap whose stale entries are skipped when popped (lazy invalidation). Words are
rewritten in place with ``list.count``/``list.index``, which scan at C speed, so a long word
costs little when the pair is rare in it. Nothing here is parallel: spawning processes per
merge step costs more than the step itself.

Ties in count go to the lexicographically greater pair of byte strings (``(bytes_a, bytes_b)``),
as in common reference implementations, so the same counts always give the same ranks,
whatever order the words come in.
"""
from __future__ import annotations

import gc
import heapq
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

SHIFT = 32
"""Pairs are keyed by one int ``a << 32 | b``: hashing an int is cheaper than a tuple."""
LOW = (1 << SHIFT) - 1


@dataclass(frozen=True, kw_only=True)
class MergeResult:
    ranks: dict[bytes, int]
    """Every mergeable token's bytes → its rank (= token id); the 256 single bytes are 0..255."""
    merges: list[tuple[int, int]]
    """The pair of ids that each merge joined, in order (duplicates included)."""
    duplicates: int
    """Merges whose bytes already were a token (two splits of the same string): no new rank."""
    exhausted: bool
    """True when no pair was left before reaching the requested size (the corpus is too small)."""
    seconds: float


def _order_key(token: bytes) -> tuple[int, ...]:
    """A key that sorts byte strings in *reverse* lexicographic order (so a min-heap pops the
    greatest): each byte inverted, and a terminator above every byte so a prefix sorts after
    the longer strings it starts."""
    return tuple(255 - b for b in token) + (256,)


def train_merges(words: Iterable[tuple[bytes, int]], *, n_ranks: int,
                 on_progress: Callable[[int, int], None] | None = None, progress_every: int = 1000) -> MergeResult:
    """Merge until there are ``n_ranks`` mergeable tokens (the 256 bytes included) or no pair is left.

    ``words`` are (pre-token bytes, count) pairs, each pre-token once.
    """
    if n_ranks < 256:
        raise ValueError(f"n_ranks={n_ranks}: a byte-level vocabulary needs at least the 256 single bytes")
    # The loop allocates millions of small lists, sets and tuples and never makes a cycle; the
    # cyclic collector would walk every word again and again (~20% of the time). Paused, then restored.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _train(words, n_ranks=n_ranks, on_progress=on_progress, progress_every=progress_every)
    finally:
        if collecting:
            gc.enable()


def _train(words: Iterable[tuple[bytes, int]], *, n_ranks: int, on_progress: Callable[[int, int], None] | None,
           progress_every: int) -> MergeResult:
    started = time.perf_counter()
    token_bytes: list[bytes] = [bytes([b]) for b in range(256)]
    order: list[tuple[int, ...]] = [_order_key(t) for t in token_bytes]
    ranks: dict[bytes, int] = {t: i for i, t in enumerate(token_bytes)}

    seqs: list[list[int]] = []
    counts: list[int] = []
    pair_counts: defaultdict[int, int] = defaultdict(int)
    where: dict[int, set[int]] = {}
    for raw, n in words:
        if len(raw) < 2 or n <= 0:
            continue
        w = len(seqs)
        seq = list(raw)
        seqs.append(seq)
        counts.append(n)
        for i in range(len(seq) - 1):
            key = seq[i] << SHIFT | seq[i + 1]
            pair_counts[key] += n
            s = where.get(key)
            if s is None:
                where[key] = {w}
            else:
                s.add(w)

    heap = [(-n, order[k >> SHIFT], order[k & LOW], k) for k, n in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    duplicates = 0
    exhausted = False
    next_report = progress_every
    get = pair_counts.get
    push, pop = heapq.heappush, heapq.heappop

    while len(token_bytes) < n_ranks:
        # The most frequent pair, skipping entries that went stale since they were pushed.
        while heap:
            negative, _, _, key = pop(heap)
            current = get(key, 0)
            if current == -negative:
                break
            if current > 0:
                push(heap, (-current, order[key >> SHIFT], order[key & LOW], key))
        else:
            exhausted = True
            break
        a, b = key >> SHIFT, key & LOW
        merged = token_bytes[a] + token_bytes[b]
        c = ranks.get(merged)
        if c is None:
            c = len(token_bytes)
            token_bytes.append(merged)
            order.append(_order_key(merged))
            ranks[merged] = c
        else:
            duplicates += 1
        merges.append((a, b))

        # Rewrite every word holding (a, b) in place; counts change only next to each occurrence.
        # Pairs holding c are counted apart, in small dicts that stay in cache, then folded in.
        del pair_counts[key]
        grown: defaultdict[int, int] = defaultdict(int)
        grown_where: dict[int, set[int]] = {}
        for w in where.pop(key):
            seq = seqs[w]
            remaining = seq.count(a)  # C-speed scans; no exception ends the loop
            n = counts[w]
            i = 0
            while remaining:
                i = seq.index(a, i)
                remaining -= 1
                if i + 1 == len(seq):
                    break
                if seq[i + 1] != b:
                    i += 1
                    continue
                if a == b:
                    remaining -= 1  # the second a is consumed by this merge
                if i:
                    prev = seq[i - 1]
                    pair_counts[prev << SHIFT | a] -= n
                    k = prev << SHIFT | c
                    grown[k] += n
                    s = grown_where.get(k)
                    if s is None:
                        grown_where[k] = {w}
                    else:
                        s.add(w)
                if i + 2 < len(seq):
                    nxt = seq[i + 2]
                    pair_counts[b << SHIFT | nxt] -= n
                    k = c << SHIFT | nxt
                    grown[k] += n
                    s = grown_where.get(k)
                    if s is None:
                        grown_where[k] = {w}
                    else:
                        s.add(w)
                seq[i] = c
                del seq[i + 1]
                i += 1
        # With a == b, "aaa" decremented (a, a) again after it was deleted above.
        pair_counts.pop(key, None)
        for k, n in grown.items():
            # Plus what the big dict holds for k: a decrement of (c, a) after an earlier (c, a)
            # grew in the same word, or, when c was a token already, counts from before.
            n += pair_counts.pop(k, 0)
            if n > 0:
                pair_counts[k] = n
                push(heap, (-n, order[k >> SHIFT], order[k & LOW], k))
                s = where.get(k)
                if s is None:
                    where[k] = grown_where[k]
                else:
                    s |= grown_where[k]
        if on_progress is not None and len(merges) >= next_report:
            next_report += progress_every
            on_progress(len(token_bytes), n_ranks)

    if on_progress is not None:
        on_progress(len(token_bytes), n_ranks)
    return MergeResult(ranks=ranks, merges=merges, duplicates=duplicates, exhausted=exhausted,
                       seconds=time.perf_counter() - started)
