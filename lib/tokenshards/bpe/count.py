"""Counting pre-tokens: the embarrassingly parallel half of BPE training.

Each task reads one planned piece (the same plan and reader as ``tokenize``), splits every
document with the pre-tokenizer pattern and returns a compact Arrow table of (pre-token bytes,
count). Tables are combined by a tree of tasks on the workers, ``split_every`` at a time, so
the client only ever receives the final table: memory is bounded by the number of unique
pre-tokens, and ``min_count`` prunes the rare ones at the root.
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import regex
from distributed import Client

from ..cluster import runner
from ..cluster.progress import Progress
from ..errors import UserError
from ..corpus.plan import Piece
from ..corpus.read import piece_columns, read_piece, unreadable_reason, utf8_or_null

# tiktoken's own split patterns (tiktoken_ext/openai_public.py), copied because tiktoken builds
# them only inside the constructors that also load the ranks.
PATTERNS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "cl100k": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
}
SCHEMA = pa.schema([("pretoken", pa.large_binary()), ("count", pa.int64())])


@dataclass(frozen=True, kw_only=True)
class Counted:
    """What a counting task (or a combining task) hands on: small besides the table."""

    table: pa.Table
    """(pretoken: large_binary, count: int64), each pre-token once."""
    text_bytes: int
    docs: int
    heldout: tuple[str, ...] = field(default=())
    """Held-back documents, never counted: compression is measured on them."""
    unreadable: int = 0
    """Partitions skipped as unreadable (``--on-bad-file skip``)."""
    unreadable_reasons: tuple[str, ...] = field(default=())
    """Why, for the first ``MAX_LISTED`` of them: what reaches the client stays small."""
    skipped_invalid: int = 0
    """Rows skipped because their text is not UTF-8 (``--on-bad-file skip``)."""


MAX_LISTED = 20


def resolve_pattern(spec: str) -> tuple[str, str]:
    """(name, regex) for ``gpt2``, ``cl100k`` or a regex of the user's own."""
    if spec in PATTERNS:
        return spec, PATTERNS[spec]
    try:
        regex.compile(spec)
    except regex.error as e:
        raise UserError(f"--pattern {spec!r} is neither {' nor '.join(PATTERNS)} nor a valid regex ({e}); "
                        "pass gpt2, cl100k or a regex in tiktoken's syntax") from e
    return "custom", spec


@functools.lru_cache(maxsize=8)
def _compiled(pat_str: str) -> regex.Pattern:
    return regex.compile(pat_str)


def count_texts(texts: Iterable[str], *, pat_str: str) -> pa.Table:
    """Pure: every pre-token of ``texts`` with its count, as an Arrow table (``SCHEMA``)."""
    findall = _compiled(pat_str).findall
    counter: Counter[str] = Counter()
    for text in texts:
        counter.update(findall(text))
    keys = pa.array(list(counter), pa.large_string()).cast(pa.large_binary())
    return pa.table([keys, pa.array(list(counter.values()), pa.int64())], schema=SCHEMA)


def combine_tables(tables: list[pa.Table], *, min_count: int = 1) -> pa.Table:
    """Pure: sum the counts of equal pre-tokens; drop those seen fewer than ``min_count`` times.

    A hash kernel (``dictionary_encode``) and ``np.bincount`` rather than ``group_by``: Acero
    warns about the unaligned buffers that tables have after travelling between workers.
    """
    keys = pa.concat_arrays([chunk for t in tables for chunk in t.column("pretoken").chunks])
    counts = np.concatenate([t.column("count").to_numpy() for t in tables]) if tables else np.zeros(0, np.int64)
    encoded = keys.dictionary_encode()
    summed = np.bincount(encoded.indices.to_numpy(), weights=counts, minlength=len(encoded.dictionary))
    # float64 sums are exact below 2**53 occurrences of one pre-token: far beyond any corpus.
    table = pa.table([encoded.dictionary, pa.array(np.rint(summed).astype(np.int64))], schema=SCHEMA)
    if min_count > 1:
        table = table.filter(pc.greater_equal(table["count"], min_count))
    return table


def _trim_heldout(texts: Iterable[str], budget: int) -> tuple[str, ...]:
    """Whole documents while they fit in ``budget`` bytes; the first is cut if it alone is larger."""
    kept, size = [], 0
    for text in texts:
        n = len(text.encode())
        if size + n > budget:
            if not kept and budget > 0:
                kept.append(text.encode()[:budget].decode(errors="ignore"))
            break
        kept.append(text)
        size += n
    return tuple(kept)


def count_piece(piece: Piece, *, pat_str: str, text_column: str, storage_options: dict,
                holdout_every: int, heldout_budget: int, on_bad_file: str = "fail") -> Counted:
    """One task: read the piece, hold back every ``holdout_every``-th row, count the rest. An
    unreadable piece or text that is not UTF-8 fails it, or (``on_bad_file="skip"``) is left out
    and counted as such, as ``tokenize`` does."""
    frame = read_piece(piece, text_column=text_column, storage_options=storage_options, on_bad_file=on_bad_file)
    rows, ids, text = piece_columns(frame)
    unreadable = unreadable_reason(rows, ids)
    if unreadable is not None:
        return Counted(table=SCHEMA.empty_table(), text_bytes=0, docs=0, unreadable=1, unreadable_reasons=(unreadable,))
    text, invalid = utf8_or_null(text, rows, piece, text_column=text_column, on_bad_file=on_bad_file)
    train, heldout = [], []
    for row, doc in zip(rows.tolist(), text.to_pylist()):
        if not doc:
            continue
        if holdout_every and row % holdout_every == holdout_every - 1:
            heldout.append(doc)
        else:
            train.append(doc)
    return Counted(table=count_texts(train, pat_str=pat_str), text_bytes=sum(len(t.encode()) for t in train),
                   docs=len(train), heldout=_trim_heldout(heldout, heldout_budget), skipped_invalid=len(invalid))


def combine_counted(*parts: Counted, min_count: int = 1, heldout_budget: int) -> Counted:
    """One tree node: a few tables in, one table out (on a worker)."""
    return Counted(table=combine_tables([p.table for p in parts], min_count=min_count),
                   text_bytes=sum(p.text_bytes for p in parts), docs=sum(p.docs for p in parts),
                   heldout=_trim_heldout((t for p in parts for t in p.heldout), heldout_budget),
                   unreadable=sum(p.unreadable for p in parts),
                   unreadable_reasons=tuple(r for p in parts for r in p.unreadable_reasons)[:MAX_LISTED],
                   skipped_invalid=sum(p.skipped_invalid for p in parts))


def count_on_cluster(client: Client, pieces: list[Piece], *, pat_str: str, text_column: str, storage_options: dict,
                     min_count: int, holdout_every: int, heldout_bytes: int, on_bad_file: str = "fail",
                     split_every: int = 8, retries: int = 2,
                     lane_of: Callable[[Piece], runner.Lane | None] = lambda piece: None,
                     progress: Progress | None = None) -> Counted:
    """Count every piece and combine the tables in a tree on the workers; only the root comes back.

    Pieces kept in a ``Lane`` (``lane_of``: a ``--fetch workers`` file's machine) go there as it has
    free threads, so the tree is built as its leaves are submitted: each block of ``split_every``
    consecutive leaves gets its node once all of them exist, the same tree as if all went at once."""
    if not pieces:
        raise ValueError("count_on_cluster needs at least one piece")
    per_piece = max(heldout_bytes // len(pieces), 1)
    place = {p.index: i for i, p in enumerate(pieces)}
    waiting: dict[int, object] = {}  # place -> leaf future, until its block's node holds it
    nodes: dict[int, object] = {}  # block -> node future

    def submit(batch: list[Piece], lane: runner.Lane | None) -> list:
        leaves = runner.submit(client, count_piece, batch, pat_str=pat_str, text_column=text_column,
                               storage_options=storage_options, holdout_every=holdout_every, heldout_budget=per_piece,
                               on_bad_file=on_bad_file, retries=retries, **(lane.restrictions() if lane is not None else {}))
        for piece, leaf in zip(batch, leaves):
            waiting[place[piece.index]] = leaf
        for block in sorted({place[piece.index] // split_every for piece in batch}):
            spots = range(block * split_every, min((block + 1) * split_every, len(pieces)))
            if all(spot in waiting for spot in spots):
                nodes[block] = client.submit(combine_counted, *[waiting.pop(spot) for spot in spots], pure=False,
                                             retries=retries, heldout_budget=heldout_bytes)
        return leaves

    root = None
    try:
        # Each leaf's result stays on the workers for its tree node; here only its progress counts.
        for _ in runner.each_result_as_ready(client, pieces, submit, lane_of=lane_of,
                                             explain=runner.failure(_describe_piece), progress=progress,
                                             amount=lambda piece, _: piece.text_bytes, fetch=False):
            pass
        root = runner.reduce_tree(client, [nodes[block] for block in sorted(nodes)], combine_counted,
                                  fan_in=split_every, heldout_budget=heldout_bytes,
                                  root_kwargs={"min_count": min_count}, retries=retries)
        return runner.result_of(client, root, explain=lambda e: UserError(f"combining pre-token counts failed: "
                                                                          f"{type(e).__name__}: {e}"))
    except BaseException:
        runner.drop([*nodes.values(), *waiting.values(), *([root] if root is not None else [])])
        raise


def _describe_piece(piece: Piece) -> str:
    return (f"counting partition {piece.index} ({piece.input}, row groups {piece.row_groups[0]}.."
            f"{piece.row_groups[1] - 1})")
