"""Random access to a finished format v1 output: documents, token ranges, training windows.

Reads only what ``manifest.json`` lists (a partition without a manifest entry is not part of
the run). Locally the token files are memory-mapped; elsewhere (s3://) each request is one
range read, so opening a dataset costs one small object and nothing is downloaded whole.
"""
from __future__ import annotations

import mmap
import os
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from . import paths
from . import run as run_files
from .arrays import NPY_HEAD_PROBE
from .records import Manifest, PartitionEntry
from ..errors import UserError
from ..storage.location import Location


@dataclass(frozen=True)
class PartDocs:
    """One partition's docs table as arrays (ids stay an Arrow array: cheap to keep)."""

    ids: pa.StringArray
    rows: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray


def open_manifest(out: str, storage_options: dict | None = None) -> run_files.FinishedRun:
    """(place, manifest) for OUT; a folder without a format v1 manifest is refused."""
    return run_files.open_finished(out, storage_options)


class PartitionFiles:
    """Range reads of one output's part files, through ``format.run``'s checks; shared by
    ``TokenDataset`` and the exporter. Before a partition's first read its ``.npy`` header (and
    size) is checked exactly against its entry, and a docs table is checked whole before any of
    its rows is used. With ``check_sha256``, a tokens file is also hashed whole at its first read
    (``TokenDataset`` does where the run is on a local disk; an export checks every file it
    copies before it writes, ``export.common.check_sources``)."""

    def __init__(self, run: Location, *, dtype: str, partitions: list[PartitionEntry] | dict[int, PartitionEntry],
                 check_sha256: bool = False):
        """``run``: the run's folder; ``partitions``: manifest entries indexed by their position in
        manifest order (a list, or a dict holding only the few a task touches, so tasks stay small)."""
        self.run = run
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.partitions = partitions
        self.check_sha256 = check_sha256
        self._local = run.is_local
        self._maps: dict[int, np.ndarray] = {}
        self._offsets: dict[int, int] = {}

    def __getstate__(self):
        # Memory maps would pickle as full copies (e.g. into DataLoader worker processes): reopen instead.
        return {**self.__dict__, "_maps": {}}

    def _tokens_file(self, k: int) -> str:
        return self.partitions[k].tokens_file

    def _sha256(self, k: int) -> str | None:
        return self.partitions[k].sha256

    def _tokens_path(self, k: int) -> str:
        return self.run.join(self._tokens_file(k))

    def docs(self, k: int, columns: tuple[str, ...] = ("id", "row", "start", "length")) -> PartDocs:
        """The docs table of the k-th partition (manifest order), checked whole against its entry
        (``format.run.read_docs``) before any row is used."""
        entry = self.partitions[k]
        try:
            table = run_files.read_docs(self.run, entry)
        except FileNotFoundError as e:
            raise UserError(f"{self.run.shown(entry.docs_file)}: listed in the manifest but missing; the output is "
                            "damaged: run `tokenshards verify`, or tokenize the run again") from e
        get = lambda name: table.column(name).to_numpy().astype(np.int64, copy=False) if name in columns else None  # noqa: E731
        ids = table.column("id").combine_chunks() if "id" in columns else None
        return PartDocs(ids=ids, rows=get("row"), starts=get("start"), lengths=get("length"))

    def tokens(self, k: int, lo: int, hi: int) -> np.ndarray:
        """Tokens [lo, hi) of the k-th partition: a view of a memory map locally, one range read elsewhere."""
        n = self.partitions[k].tokens
        if not 0 <= lo <= hi <= n:
            raise IndexError(f"tokens [{lo}, {hi}) outside partition {self.partitions[k].index} of {n} tokens")
        if self._local:
            if k not in self._maps:
                self._maps[k] = self._map(k)
            return self._maps[k][lo:hi]
        if lo == hi:
            return np.empty(0, self.dtype)
        if self.check_sha256 and k not in self._offsets:  # asked on an object store: the whole object once
            rel = self._tokens_file(k)
            run_files.read_array(self.run, rel, dtype=self.dtype.name, length=n, sha256=self._sha256(k))
        offset = self._data_offset(k)
        size = self.dtype.itemsize
        raw = self.run.fs.cat_file(self._tokens_path(k), start=offset + lo * size, end=offset + hi * size)
        if len(raw) != (hi - lo) * size:
            raise UserError(f"{self._tokens_path(k)}: short read; the object is smaller than the manifest says")
        return np.frombuffer(raw, self.dtype)

    def _map(self, k: int) -> np.ndarray:
        """A local tokens file memory-mapped, once it was opened as ``format.paths`` allows and its
        header and size were checked (and, with ``check_sha256``, its bytes hashed)."""
        rel, n = self._tokens_file(k), self.partitions[k].tokens
        try:
            fd = paths.open_local(self.run.root, rel)
        except paths.UnsafeFile as e:
            raise run_files.BadRunFile(self.run.shown(rel), str(e)) from e
        except FileNotFoundError as e:
            raise UserError(f"{self.run.shown(rel)}: listed in the manifest but missing; the output is damaged: "
                            "run `tokenshards verify`, or tokenize the run again") from e
        try:
            size = os.fstat(fd).st_size
            offset = run_files.check_array(self.run, rel, os.pread(fd, NPY_HEAD_PROBE, 0), size, dtype=self.dtype.name,
                                           length=n).offset
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        if self.check_sha256:
            run_files.check_values(self.run, rel, mapped, dtype=self.dtype.name, length=n, sha256=self._sha256(k))
        self._offsets[k] = offset
        return np.frombuffer(mapped, dtype=self.dtype, count=n, offset=offset)

    def token_ranges(self, ranges: list[tuple[int, int, int]]) -> list[np.ndarray]:
        """Copies of tokens [lo, hi) of partition k for each (k, lo, hi), read with one ``pread``
        each locally (no memory map, whose fault-around would pull in far more than asked), or
        with one batched ``cat_ranges`` elsewhere (s3fs fetches the ranges concurrently)."""
        size = self.dtype.itemsize
        paths_, starts, ends = [], [], []
        for k, lo, hi in ranges:
            if not 0 <= lo <= hi <= self.partitions[k].tokens:
                raise IndexError(f"tokens [{lo}, {hi}) outside partition {self.partitions[k].index}")
            offset = self._data_offset(k)
            paths_.append(k)
            starts.append(offset + lo * size)
            ends.append(offset + hi * size)
        if self._local:
            raws, fds = [], {}
            try:
                for k, a, b in zip(paths_, starts, ends):
                    if k not in fds:
                        fds[k] = self._open(k)
                    raws.append(os.pread(fds[k], b - a, a))
            finally:
                for fd in fds.values():
                    os.close(fd)
        else:
            raws = self.run.fs.cat_ranges([self._tokens_path(k) for k in paths_], starts, ends) if paths_ else []
        out = []
        for raw, k, a, b in zip(raws, paths_, starts, ends):
            path = self._tokens_path(k)
            if isinstance(raw, Exception):
                raise UserError(f"{path}: unreadable ({type(raw).__name__}: {raw}); the output is damaged, rerun tokenize") from raw
            if len(raw) != b - a:
                raise UserError(f"{path}: short read; the object is smaller than the manifest says")
            out.append(np.frombuffer(raw, self.dtype))
        return out

    def _open(self, k: int) -> int:
        try:
            return paths.open_local(self.run.root, self._tokens_file(k))
        except paths.UnsafeFile as e:
            raise run_files.BadRunFile(self.run.shown(self._tokens_file(k)), str(e)) from e

    def _data_offset(self, k: int) -> int:
        """Where the array starts in a ``.npy`` file, once its header and size were checked
        exactly against the entry (``format.run.array_file``)."""
        if k not in self._offsets:
            rel = self._tokens_file(k)
            try:
                self._offsets[k] = run_files.array_file(self.run, rel, dtype=self.dtype.name,
                                                        length=self.partitions[k].tokens).offset
            except FileNotFoundError as e:
                raise UserError(f"{self.run.shown(rel)}: listed in the manifest but missing; the output is damaged: "
                                "run `tokenshards verify`, or tokenize the run again") from e
        return self._offsets[k]


class MaskFiles(PartitionFiles):
    """A chat run's assistant masks (``mask_file``: uint8 ``.npy``, one value per token), read
    exactly as its tokens are, so every exporter takes a token range's mask the same way."""

    def __init__(self, files: PartitionFiles):
        super().__init__(files.run, dtype="uint8", partitions=files.partitions, check_sha256=files.check_sha256)

    def _tokens_file(self, k: int) -> str:
        entry = self.partitions[k]
        if not entry.mask_file:
            raise UserError(f"partition {entry.index} ({entry.tokens_file}) has no assistant mask: its run was not "
                            "tokenized with --chat-column; export chat runs and text runs apart")
        return entry.mask_file

    def _sha256(self, k: int) -> str | None:
        return self.partitions[k].mask_sha256


def has_masks(manifest: Manifest) -> bool:
    """Whether the run is a chat run whose partitions carry assistant masks (``tokenize --chat-column``)."""
    return bool(manifest.partitions) and all(e.mask_file for e in manifest.partitions)


class TokenDataset:
    """A tokenized output (local folder or s3://) as documents and one long token stream.

    Documents are numbered in manifest order: partition by partition, source row order inside
    each, the same order ``tokenshards export`` writes. The token stream is every document's
    tokens back to back, as in the part files (eot placement as the manifest says).

    Nothing is trusted: the manifest is checked when the dataset opens, each partition's docs
    table and ``.npy`` header before its first use (a ``UserError`` names the file and what is
    wrong). ``check_sha256`` (default: where the run is on a local disk) hashes each tokens file
    whole at its first use, ~20 ms per 16 MB here; on an object store that would download every
    partition a random read touches, so it is off there unless asked (``tokenshards verify``
    checks every hash).
    """

    def __init__(self, out: str, *, storage_options: dict | None = None, check_sha256: bool | None = None):
        self.out = out
        run, self.manifest = open_manifest(out, storage_options)
        parts = self.manifest.by_index()
        self._files = PartitionFiles(run, dtype=self.manifest.encoding.dtype, partitions=parts,
                                     check_sha256=run.is_local if check_sha256 is None else check_sha256)
        self._doc_bounds = np.concatenate([[0], np.cumsum([p.docs for p in parts], dtype=np.int64)])
        self._token_bounds = np.concatenate([[0], np.cumsum([p.tokens for p in parts], dtype=np.int64)])
        self._docs: dict[int, PartDocs] = {}
        self._by_id: dict[str, int] | None = None

    # -- sizes --------------------------------------------------------------------------------
    @property
    def n_docs(self) -> int:
        return int(self._doc_bounds[-1])

    @property
    def n_tokens(self) -> int:
        return int(self._token_bounds[-1])

    @property
    def dtype(self) -> np.dtype:
        return self._files.dtype

    @property
    def encoding(self) -> dict:
        return self.manifest.encoding.to_dict()

    def __len__(self) -> int:
        return self.n_docs

    def __repr__(self) -> str:
        return f"TokenDataset({self.out!r}: {self.n_docs:,} documents, {self.n_tokens:,} tokens, {self.encoding['name']})"

    # -- documents ----------------------------------------------------------------------------
    def _locate_doc(self, i: int) -> tuple[int, int]:
        n = self.n_docs
        if not -n <= i < n:
            raise IndexError(f"document {i} out of range: the dataset holds {n:,} documents")
        i = i + n if i < 0 else i
        k = bisect_right(self._doc_bounds, i) - 1
        return k, i - int(self._doc_bounds[k])

    def _part_docs(self, k: int) -> PartDocs:
        if k not in self._docs:
            self._docs[k] = self._files.docs(k)
        return self._docs[k]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.doc(i)

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(self.n_docs):
            yield self.doc(i)

    def doc(self, i: int) -> np.ndarray:
        """Document i's tokens (eot included as the manifest's ``eot_position`` says)."""
        k, j = self._locate_doc(i)
        docs = self._part_docs(k)
        start = int(docs.starts[j])
        return self._files.tokens(k, start, start + int(docs.lengths[j]))

    def doc_id(self, i: int) -> str:
        k, j = self._locate_doc(i)
        return self._part_docs(k).ids[j].as_py()

    def doc_source(self, i: int) -> tuple[str, int]:
        """(input file, row) the document came from."""
        k, j = self._locate_doc(i)
        return self._files.partitions[k].input, int(self._part_docs(k).rows[j])

    def index_of(self, doc_id: str) -> int:
        """The number of the document with this id. The first call reads every docs table
        (ids only), which for a web-scale corpus is gigabytes: prefer numbers when you can."""
        if self._by_id is None:
            by_id: dict[str, int] = {}
            for k in range(len(self._files.partitions)):
                ids = self._files.docs(k, columns=("id",)).ids.to_pylist()
                base = int(self._doc_bounds[k])
                for j, value in enumerate(ids):
                    by_id.setdefault(value, base + j)
            self._by_id = by_id
        try:
            return self._by_id[doc_id]
        except KeyError:
            raise KeyError(f"no document with id {doc_id!r} in {self.out}") from None

    def by_id(self, doc_id: str) -> np.ndarray:
        return self.doc(self.index_of(doc_id))

    # -- the token stream ---------------------------------------------------------------------
    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the whole stream; a copy when it spans partitions."""
        if not 0 <= start <= stop <= self.n_tokens:
            raise IndexError(f"tokens [{start}, {stop}) outside the stream of {self.n_tokens:,} tokens")
        k0 = bisect_right(self._token_bounds, start) - 1
        pieces = []
        k = k0
        while start < stop:
            while int(self._token_bounds[k + 1]) <= start:  # skip empty partitions
                k += 1
            base = int(self._token_bounds[k])
            hi = min(stop, int(self._token_bounds[k + 1]))
            pieces.append(self._files.tokens(k, start - base, hi - base))
            start = hi
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty(0, self.dtype)

    def sample_windows(self, *, batch_size: int, seq_len: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
        """``batch_size`` windows of ``seq_len + 1`` consecutive tokens (inputs and shifted
        targets, as nanoGPT's ``get_batch`` draws them), starting at uniform random positions.
        Windows may cross document boundaries, as in llm.c and nanoGPT. int64, shape (B, T+1)."""
        if batch_size < 1 or seq_len < 1:
            raise UserError(f"batch_size={batch_size} and seq_len={seq_len} must both be at least 1")
        span = seq_len + 1
        if span > self.n_tokens:
            raise UserError(f"seq_len={seq_len} needs {span:,} tokens per window, the dataset holds {self.n_tokens:,}")
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        starts = rng.integers(0, self.n_tokens - span + 1, size=batch_size)
        out = np.empty((batch_size, span), dtype=np.int64)
        for b, s in enumerate(starts.tolist()):
            out[b] = self.tokens(s, s + span)
        return out
