"""A partition's docs table (``docs.parquet``: id, row, start, length; format v1) and the one check
that it indexes its tokens exactly, made before any reader uses a row of it: every column there, of
its type, without nulls; one row per document the manifest counts; documents in order, each
starting where the one before ended, none empty, the last ending at the tokens file's end; source
rows increasing and within the partition. Pure: the bytes are read by ``format.run``."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DOCS_COLUMNS = ("id", "row", "start", "length")


class DocsError(ValueError):
    """A docs table that cannot be used; the message says why, without the path."""


def parse_docs(raw: bytes) -> pa.Table:
    """A docs file's bytes as a table (``DocsError`` when they are no parquet Arrow can read)."""
    try:
        return pq.read_table(io.BytesIO(raw))
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError) as e:
        raise DocsError(f"unreadable ({type(e).__name__}: {_first_line(e)}): not a parquet file Arrow can read") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


def docs_problems(docs: pa.Table, *, n_docs: int, n_tokens: int | None, n_rows: int | None) -> list[str]:
    """Every problem of a docs table, first the one that keeps the rest from being looked at:
    ``n_docs`` rows, documents covering tokens [0, ``n_tokens``) exactly, rows within a partition of
    ``n_rows`` rows (None: not checked)."""
    missing = [c for c in DOCS_COLUMNS if c not in docs.column_names]
    if missing:
        return [f"lacks column(s) {', '.join(missing)} (has {', '.join(docs.column_names) or 'none'})"]
    problems = []
    for c in ("row", "start", "length"):  # format v1 says int64: another width is another file than the run's
        if docs.schema.field(c).type != pa.int64():
            problems.append(f"column {c!r} holds {docs.schema.field(c).type}, expected int64")
    if not (pa.types.is_string(docs.schema.field("id").type) or pa.types.is_large_string(docs.schema.field("id").type)):
        problems.append(f"column 'id' holds {docs.schema.field('id').type}, expected strings")
    if problems:
        return problems
    nulls = [f"{docs.column(c).null_count} in {c!r}" for c in DOCS_COLUMNS if docs.column(c).null_count]
    if nulls:
        return [f"holds nulls ({', '.join(nulls)}); every document has an id, a row, a start and a length"]
    if docs.num_rows != n_docs:
        problems.append(f"{docs.num_rows} documents, manifest says docs={n_docs}")
    rows, starts, lengths = (_int64(docs.column(c)) for c in ("row", "start", "length"))
    problems += layout_problems(starts, lengths, n_tokens=n_tokens)
    if rows.size:
        steps = np.flatnonzero(np.diff(rows) <= 0)
        if steps.size:
            i = int(steps[0])
            problems.append(f"rows are not strictly increasing (document {i + 1} has row {rows[i + 1]} after row {rows[i]})")
        if n_rows is not None and (rows.min() < 0 or int(rows.max()) - int(rows.min()) >= n_rows):
            problems.append(f"rows {rows.min()}..{rows.max()} do not fit the partition's {n_rows} rows")
    return problems


def _int64(column: pa.ChunkedArray) -> np.ndarray:
    """An integer column as int64; values past int64 (a uint64 column) become negative, which the
    checks refuse."""
    return column.to_numpy().astype(np.int64, copy=False)


def layout_problems(starts: np.ndarray, lengths: np.ndarray, *, n_tokens: int | None) -> list[str]:
    """``start[0] == 0``, ``start[i+1] == start[i] + length[i]`` (in order, none overlapping), every
    length at least 1, ``sum(length)`` the tokens file's ``n_tokens`` (None: not known)."""
    problems = []
    if starts.size and starts[0] != 0:
        problems.append(f"first document starts at {starts[0]}, expected 0")
    gaps = np.flatnonzero(starts[1:] != starts[:-1] + lengths[:-1])
    if gaps.size:
        i = int(gaps[0]) + 1
        problems.append(f"document {i} starts at {starts[i]}, expected {starts[i - 1] + lengths[i - 1]} "
                        f"({gaps.size} gap(s) or overlap(s))")
    if (lengths < 1).any():
        problems.append(f"{int((lengths < 1).sum())} document(s) with no tokens")
    if n_tokens is not None and int(lengths.sum()) != n_tokens:
        problems.append(f"documents cover {int(lengths.sum())} tokens, the array holds {n_tokens}")
    if not problems:  # int64 arithmetic wraps: sums that agree may still hide documents outside the array
        limit = n_tokens if n_tokens is not None else np.iinfo(np.int64).max
        outside = np.flatnonzero((starts < 0) | (starts > limit) | (lengths > limit - np.clip(starts, 0, limit)))
        if outside.size:
            i = int(outside[0])
            problems.append(f"document {i} spans tokens [{starts[i]}, {starts[i]} + {lengths[i]}), outside the "
                            + (f"array's {n_tokens:,} tokens" if n_tokens is not None else "int64 range"))
    return problems
