"""Verify's pure checks: already-read data in (the manifest, one partition's files, a listing of
``parts/``), a list of problem strings out. No I/O here: ``job`` reads, on the client and on workers.

``check_manifest`` looks at the raw JSON (a damaged manifest is reported, not refused); once it
passes, everything else reads the typed ``v1.Manifest`` and ``v1.PartitionEntry``.
"""
from __future__ import annotations

import hashlib
import random
import re
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..encoding.plugin import WorkerEncoder
from ..format import v1
from ..format.docs import docs_problems, layout_problems
from ..format.records import done_problems
from ..format.v1 import REQUIRED_KEYS, Manifest, PartitionEntry

TEMPORARY_SUFFIX = ".tmp"
"""store.write_atomic's in-flight names (``<path>.<uuid>.tmp``): left by a killed writer, harmless."""


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What every partition must agree with, taken from the manifest; small, rides in each task."""

    dtype: str
    n_vocab: int
    eot: int
    eot_position: str
    job: str
    text_column: str
    prefix: tuple[int, ...] | None = None
    suffix: tuple[int, ...] | None = None
    """Each document's boundary tokens (``Encoding.boundaries``): ``prefix + ids(text) + suffix``;
    None: the one ``eot`` at ``eot_position``."""

    def __post_init__(self):
        if self.prefix is None or self.suffix is None:
            one = (self.eot,)
            object.__setattr__(self, "prefix", one if self.eot_position == "prefix" else ())
            object.__setattr__(self, "suffix", one if self.eot_position == "suffix" else ())
    encoder: WorkerEncoder | None = None
    """Set when --deep compares documents: the encoding its worker's plugin holds."""
    input_identities: dict | None = None
    """--deep: {input path: its identity when tokenized} for the sampled partitions' inputs."""
    chat: bool = False
    """A chat run's (``tokenize --chat-column``): --deep renders the rows' conversations again."""
    tools: tuple[str, bool] | None = None
    """A chat run's tools column, read again with the messages (``corpus.plan.tools_to_read``)."""
    chat_template: str | None = None
    """A chat run's ``--chat-template`` text (its ``chat.template``), rendered with again; None: the tokenizer's own."""


@dataclass(frozen=True, kw_only=True)
class TokensFile:
    """What a tokens file holds, read once: its hash, its .npy header and (when sane) its values."""

    sha256: str
    header_problem: str | None
    dtype: str | None
    """The header's descr, e.g. ``<u2``."""
    fortran_order: bool
    shape: tuple
    data_bytes: int
    """Bytes after the header."""
    values: np.ndarray | None


# -- pure checks ---------------------------------------------------------------------------------

def check_manifest(manifest: dict) -> list[str]:
    """Problems with the manifest's own fields (format v1's one parser, ``v1.manifest_problems``,
    plus the keys verify needs); partitions are checked, and files opened, only once this is empty."""
    if not isinstance(manifest, dict):
        return [f"manifest.json: not a JSON object but {type(manifest).__name__}"]
    if manifest.get("format") != v1.FORMAT:
        return [f"manifest.json: format is {manifest.get('format')!r}, expected {v1.FORMAT!r}"]
    problems = [f"manifest.json: required key {k!r} is missing" for k in REQUIRED_KEYS if k not in manifest]
    if problems:
        return problems
    return [f"manifest.json: {p}" for p in v1.manifest_problems(manifest)]


def check_entries(manifest: Manifest) -> list[str]:
    """Cross-partition bookkeeping (``v1.bookkeeping_problems``, which every other command refuses
    a manifest for): reported here, so the partitions' own files are still checked."""
    return [p if re.match(r"(partition \d+|input .*?): ", p) else f"manifest.json: {p}"
            for p in v1.bookkeeping_problems(manifest)]


_ranges = v1.ranges


def check_listing(manifest: Manifest, names: list[str]) -> tuple[list[str], list[str]]:
    """(problems, warnings) for files under ``parts/`` (paths relative to OUT) that the manifest
    doesn't list. A reader ignores them, but they mean a different or unfinished run wrote here."""
    listed = set()
    for e in manifest.partitions:
        listed.update((e.tokens_file, e.docs_file, v1.done_file(e.index), *((e.mask_file,) if e.mask_file else ())))
    problems, warnings = [], []
    planned = v1.planned_count(manifest)
    for name in sorted(set(names) - listed):
        if name.endswith(TEMPORARY_SUFFIX):
            warnings.append(f"{name}: temporary file left by an interrupted write; safe to delete")
        elif (index := v1.part_index(name)) is not None and index >= planned:  # readers never see it
            warnings.append(f"{name}: numbered after the run's {planned} partitions, not listed in manifest.json: "
                            "left by an unfinished `tokenize --add` (rerun it to finish) or another run")
        else:
            problems.append(f"{name}: in parts/ but not listed in manifest.json (left by another run?)")
    return problems, warnings


def _as_named(where: str, found: TokensFile, *, sha256: str | None) -> list[str]:
    """An .npy file against its manifest entry: the bytes it names, and a header that reads."""
    problems = []
    if found.sha256 != sha256:
        problems.append(f"{where}: sha256 {found.sha256[:12]}… != manifest's {str(sha256)[:12]}… "
                        "(the file changed after the run)")
    if found.header_problem:
        problems.append(f"{where}: {found.header_problem}")
    return problems


def check_tokens(entry: PartitionEntry, tokens: TokensFile, *, expected: Expected) -> list[str]:
    """The tokens file is the one the manifest names: same bytes, and a 1-D little-endian array
    of the manifest's dtype with ``tokens`` ids, every id inside the vocabulary."""
    where = f"partition {entry.index}: {entry.tokens_file}"
    problems = _as_named(where, tokens, sha256=entry.sha256)
    if tokens.header_problem:
        return problems
    want = np.dtype(expected.dtype).newbyteorder("<").str
    if tokens.dtype != want:
        problems.append(f"{where}: dtype {tokens.dtype}, expected {want} (little-endian {expected.dtype})")
    if len(tokens.shape) != 1 or tokens.fortran_order:
        problems.append(f"{where}: shape {tokens.shape}, expected a 1-D array")
    elif tokens.shape[0] != entry.tokens:
        problems.append(f"{where}: {tokens.shape[0]} tokens, manifest says {entry.tokens}")
    itemsize = np.dtype(tokens.dtype).itemsize if tokens.dtype else 0
    expected_bytes = int(np.prod(tokens.shape)) * itemsize
    if tokens.data_bytes != expected_bytes:
        problems.append(f"{where}: {tokens.data_bytes} bytes of data, its header promises {expected_bytes} "
                        "(truncated or padded)")
    if tokens.values is not None and tokens.values.size and int(tokens.values.max()) >= expected.n_vocab:
        problems.append(f"{where}: token id {int(tokens.values.max())} is outside the vocabulary "
                        f"(n_vocab {expected.n_vocab})")
    return problems


def check_mask(entry: PartitionEntry, mask: TokensFile) -> list[str]:
    """A chat partition's mask file (format v1's optional extension, docs/chat.md): the bytes the
    manifest names, a 1-D uint8 array of 0 and 1 with one value per token."""
    where = f"partition {entry.index}: {entry.mask_file}"
    problems = _as_named(where, mask, sha256=entry.mask_sha256)
    if mask.header_problem:
        return problems
    if mask.dtype != "|u1" or len(mask.shape) != 1 or mask.fortran_order:
        return problems + [f"{where}: {mask.dtype} {mask.shape}, expected a 1-D uint8 array"]
    if mask.shape[0] != entry.tokens:
        problems.append(f"{where}: {mask.shape[0]} values, the partition has {entry.tokens} tokens")
    if mask.values is None:
        problems.append(f"{where}: {mask.data_bytes} bytes of data, its header promises {mask.shape[0]}")
    elif mask.values.size and int(mask.values.max()) > 1:
        problems.append(f"{where}: holds {int(mask.values.max())}, expected only 0 and 1")
    return problems


def check_docs(entry: PartitionEntry, docs: pa.Table, *, n_tokens: int | None) -> list[str]:
    """The docs table indexes the tokens exactly (format v1's one check, ``format.docs``): every
    column, no nulls, one row per document, contiguous, covering the array, source rows strictly
    increasing and within the partition's row count."""
    where = f"partition {entry.index}: {entry.docs_file}"
    return [f"{where}: {p}" for p in docs_problems(docs, n_docs=entry.docs, n_tokens=n_tokens, n_rows=entry.rows)]


def check_layout(starts: np.ndarray, lengths: np.ndarray, *, n_tokens: int | None, where: str) -> list[str]:
    """``start[0] == 0``, ``start[i+1] == start[i] + length[i]``, ``sum(length) == len(tokens)``."""
    return [f"{where}: {p}" for p in layout_problems(starts, lengths, n_tokens=n_tokens)]


def check_separators(entry: PartitionEntry, values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, *,
                     expected: Expected) -> list[str]:
    """Each document's boundary tokens sit where the manifest says: a cheap check that catches
    shifted boundaries even when a rewritten sha256 hides the change."""
    if not starts.size:
        return []
    places = [(starts + k, token, "prefix") for k, token in enumerate(expected.prefix)]
    places += [(starts + lengths - len(expected.suffix) + k, token, "suffix") for k, token in enumerate(expected.suffix)]
    for at, token, side in places:
        inside = at < len(values)
        wrong = np.flatnonzero(~inside | (values[np.where(inside, at, 0)] != token))
        if wrong.size:
            i = int(wrong[0])
            found = values[at[i]] if at[i] < len(values) else "nothing"
            what = (f"its eot ({expected.eot}, {expected.eot_position})" if len(expected.prefix) + len(expected.suffix) == 1
                    else f"its {side} token {token}")
            return [f"partition {entry.index}: {entry.tokens_file}: document {i} has {found} at token {at[i]} "
                    f"where {what} belongs ({wrong.size} document(s) like this)"]
    return []


def check_done(entry: PartitionEntry, record: v1.DoneRecord, *, job: str) -> list[str]:
    """The done record is the partition's commit: it must say what the manifest says (``records.done_problems``)."""
    where = f"partition {entry.index}: {v1.done_file(entry.index)}"
    return [f"{where}: {p}" for p in done_problems(entry, record, job=job)]


def expected_document(body: list[int], *, prefix: tuple[int, ...] = (), suffix: tuple[int, ...] = ()) -> list[int]:
    return [*prefix, *body, *suffix]


def compare_document(stored: list[int], expected: list[int]) -> str | None:
    """None when equal, else where they first differ."""
    if stored == expected:
        return None
    i = next((i for i, (a, b) in enumerate(zip(stored, expected)) if a != b), min(len(stored), len(expected)))
    got = stored[i] if i < len(stored) else "end"
    want = expected[i] if i < len(expected) else "end"
    return (f"{len(stored)} tokens stored, tiktoken gives {len(expected)}; first difference at token {i} "
            f"(stored {got}, expected {want})")


def choose_sample(doc_counts: list[tuple[int, int]], *, n: int, seed: int) -> dict[int, list[int]]:
    """{partition index: [document positions]}: ``n`` documents drawn uniformly (seeded) from
    all partitions, so the same seed re-checks the same documents."""
    total = sum(count for _, count in doc_counts)
    picks = sorted(random.Random(seed).sample(range(total), min(n, total)))
    bounds = np.cumsum([0] + [count for _, count in doc_counts])
    chosen: dict[int, list[int]] = {}
    for pick in picks:
        k = bisect_right(bounds, pick) - 1
        chosen.setdefault(doc_counts[k][0], []).append(pick - int(bounds[k]))
    return chosen


def parse_tokens_file(raw: bytes) -> TokensFile:
    """Hash a whole tokens file and read it through format v1's header parser; values only when
    the header describes exactly the bytes that follow."""
    sha = hashlib.sha256(raw).hexdigest()
    try:
        shape, fortran_order, dtype, offset = v1.read_npy_header(raw)
    except v1.NpyHeaderError as e:
        return TokensFile(sha256=sha, header_problem=f"not a .npy file ({e})", dtype=None, fortran_order=False,
                          shape=(), data_bytes=0, values=None)
    data_bytes = len(raw) - offset
    values = None
    if dtype.kind == "u" and len(shape) == 1 and data_bytes == shape[0] * dtype.itemsize:
        values = np.frombuffer(raw, dtype=dtype, offset=offset)
    return TokensFile(sha256=sha, header_problem=None, dtype=dtype.str, fortran_order=fortran_order,
                      shape=tuple(shape), data_bytes=data_bytes, values=values)
