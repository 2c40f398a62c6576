"""Merging the counted pre-tokens with gigatoken's BPE trainer (Rust, all cores): GPT-2 pattern only.

``gigatoken.train_bpe`` takes text, not counts, and splits it with its own GPT-2 pre-tokenizer. So
each occurrence of a counted pre-token becomes a document of its own, ``(pre-token + SEPARATOR) *
count``, written to a temporary file that gigatoken streams (``TextFileSource``): the client's memory
holds gigatoken's merge state, never the file, which is about the counted text's size (single bytes
are left out: they hold no pair). ``SEPARATOR`` is ``0xFF``, a byte that UTF-8 never uses, so no
pre-token can contain it.

The merges are those of the counts only if gigatoken's split leaves every pre-token whole. Before
the file is written, every distinct pre-token is split alone by gigatoken's own counting path
(``pretokenized_counts``, which ``train_bpe`` uses; it also drops ``<|endoftext|>``, which no GPT-2
pre-token holds). They agree on ordinary and awkward text; they can disagree on letters and digits
of Unicode versions the two regex engines classify differently. Such pre-tokens are cut gigatoken's
way (said and recorded as ``resplit``); beyond ``MAX_RESPLIT`` of all occurrences the Python loop
merges instead.

Ties go as in Hugging Face tokenizers' ``BpeTrainer`` (gigatoken's ``tie_breaking="huggingface"``):
on the same text the merges are BpeTrainer's own. They do not depend on the order of the counted
table, nor on the number of threads.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..wording import human
from .merge import MergeResult

SEPARATOR = b"\xff"
"""Between documents: never a byte of UTF-8 text, so never inside a pre-token."""
MAX_RESPLIT = 1e-4
"""Pre-token occurrences gigatoken may cut differently (a fraction of all): above, the Python loop."""
SPARE_DISK = 256 << 20
"""Temporary disk left free beyond the file."""
CHUNK = 16 << 20
"""At most this much of one pre-token's repetitions is built in memory at a time."""
MAX_SUSPECTS = 10_000
"""Pre-tokens checked one by one when the bulk check finds a difference (beyond: the Python loop)."""


def version() -> str | None:
    """``gigatoken X.Y.Z``, or None when it is not installed."""
    if importlib.util.find_spec("gigatoken") is None:
        return None
    return f"gigatoken {importlib.metadata.version('gigatoken')}"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What ``merge_counted`` did: a result, or why the Python loop should merge instead."""

    result: MergeResult | None = None
    why_not: str | None = None
    resplit: int = 0
    """Distinct pre-tokens gigatoken cut differently (counted its way)."""
    resplit_occurrences: int = 0


def merge_counted(table: pa.Table, *, n_ranks: int, temp_dir: str | None = None) -> Outcome:
    """Train ``n_ranks`` mergeable tokens (the 256 bytes included) from a counted (pretoken, count)
    table with gigatoken; ``Outcome.why_not`` says why not when it cannot be trusted to merge the counts."""
    started = time.perf_counter()
    if n_ranks < 256:
        raise ValueError(f"n_ranks={n_ranks}: a byte-level vocabulary needs at least the 256 single bytes")
    if version() is None:
        return Outcome(why_not="gigatoken is not installed (pip install 'tokenshards[fast]')")
    from gigatoken import TextFileSource, train_bpe
    from gigatoken.gigatoken_rs import pretokenized_counts

    pairs = table.filter(pc.greater_equal(pc.binary_length(table["pretoken"]), 2))
    pretokens = pairs.column("pretoken").to_pylist()
    counts = pairs.column("count").to_numpy()
    lengths = pc.binary_length(pairs["pretoken"]).to_numpy()
    occurrences = int(counts.sum())
    size = int(((lengths + 1) * counts).sum())

    resplit, resplit_occurrences = 0, 0
    if pretokens:
        with _quiet():
            got = pretokenized_counts(SEPARATOR.join(pretokens), SEPARATOR)
        # Each pre-token whole, once: found among gigatoken's pieces (a hash join) with count 1.
        pieces = pa.array([piece for piece, _ in got], pa.large_binary())
        seen = np.array([n for _, n in got], dtype=np.int64)
        at = pc.index_in(pairs["pretoken"], value_set=pieces).to_numpy(zero_copy_only=False)
        whole = ~np.isnan(at)
        whole[whole] = seen[at[whole].astype(np.int64)] == 1
        suspects = np.flatnonzero(~whole).tolist()
        if len(suspects) > MAX_SUSPECTS:
            return Outcome(why_not=f"gigatoken's GPT-2 split would cut {len(suspects):,} of the {len(pretokens):,} "
                                   "pre-tokens differently")
        if suspects:  # a whole pre-token can be flagged because another one's cut made it too: check each alone
            with _quiet():
                cut = [i for i in suspects if pretokenized_counts(pretokens[i], None) != [(pretokens[i], 1)]]
            resplit, resplit_occurrences = len(cut), int(counts[cut].sum()) if cut else 0
        if resplit_occurrences > MAX_RESPLIT * occurrences:
            return Outcome(why_not=f"gigatoken's GPT-2 split would cut {resplit:,} pre-tokens differently "
                                   f"({resplit_occurrences:,} of {occurrences:,} occurrences)")

    folder = temp_dir or tempfile.gettempdir()
    try:
        free = shutil.disk_usage(folder).free
        if free < size + SPARE_DISK:
            return Outcome(why_not=f"its input file needs {human(size)}B of temporary disk and {folder} has "
                                   f"{human(free)}B free (set TMPDIR to a larger disk)")
        with tempfile.TemporaryDirectory(prefix="tokenshards-bpe-", dir=folder) as tmp:
            path = os.path.join(tmp, "pretokens.bin")
            _write_documents(path, pretokens, counts)
            with _quiet():
                vocab, merges = train_bpe(TextFileSource([path], separator=SEPARATOR), n_ranks, [],
                                          tie_breaking="huggingface")
    except OSError as e:
        return Outcome(why_not=f"cannot write its input file in {folder} ({type(e).__name__}: {e}); set TMPDIR "
                               "to a writable folder with room")
    ranks, merged_ids, duplicates = ranks_from_merges(merges, n_ranks=n_ranks)
    if set(vocab.values()) != set(ranks):
        raise AssertionError(f"gigatoken's vocabulary ({len(vocab)} tokens) is not the tokens its "
                             f"{len(merges)} merges make ({len(ranks)})")
    result = MergeResult(ranks=ranks, merges=merged_ids, duplicates=duplicates, exhausted=len(ranks) < n_ranks,
                         seconds=time.perf_counter() - started)
    return Outcome(result=result, resplit=resplit, resplit_occurrences=resplit_occurrences)


def ranks_from_merges(merges: list[tuple[bytes, bytes]], *, n_ranks: int
                      ) -> tuple[dict[bytes, int], list[tuple[int, int]], int]:
    """(ranks, merged id pairs, duplicates): the 256 single bytes are 0..255 in byte order, then each
    merge's result in order; a result that already is a token (two splits of the same string) gets
    no new rank. Each merge must join two earlier tokens."""
    ranks = {bytes([b]): b for b in range(256)}
    ids: list[tuple[int, int]] = []
    duplicates = 0
    for a, b in merges:
        merged = a + b
        if merged not in ranks and len(ranks) >= n_ranks:
            break
        if a not in ranks or b not in ranks:
            raise AssertionError(f"merge {len(ids)} ({a!r}, {b!r}) joins a token no earlier merge made")
        ids.append((ranks[a], ranks[b]))
        if merged in ranks:
            duplicates += 1
        else:
            ranks[merged] = len(ranks)
    return ranks, ids, duplicates


def _write_documents(path: str, pretokens: list[bytes], counts: np.ndarray) -> None:
    """Each pre-token ``count`` times, each time followed by ``SEPARATOR``."""
    with open(path, "wb", buffering=CHUNK) as f:
        for token, n in zip(pretokens, counts.tolist()):
            doc = token + SEPARATOR
            per = max(1, CHUNK // len(doc))
            while n > per:
                f.write(doc * per)
                n -= per
            f.write(doc * n)


@contextlib.contextmanager
def _quiet():
    """gigatoken prints its progress (unique words, timings) on file descriptors 1 and 2: sent to
    a temporary file while it runs, and shown only if it fails."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # no such descriptors (a daemon): nothing to keep quiet
        yield
        return
    with tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
        except Exception as e:
            sink.seek(0)
            said = sink.read().decode(errors="replace").strip().splitlines()[-5:]
            if said:
                e.add_note("gigatoken said: " + " | ".join(said))
            raise
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
