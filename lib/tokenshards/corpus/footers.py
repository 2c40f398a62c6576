"""A worker's parquet footers, parsed once per file instead of once per partition.

FineWeb's files (written by datatrove: a row group per 1,000 documents) carry a thousand or more
row groups and footers of several MB; parsing one costs ~13 ms, more than tokenizing a small
partition. A task reads its rows through the footer this process parsed for an earlier
partition of the same file, when the file is still the version the plan recorded (its identity,
checked by the task before and after reading): the key holds that identity, so a replaced file
never meets an old footer.

The job submits partitions grouped by file, so a worker moves through one file at a time (two
while the workers cross from one to the next) and two footers serve it; the bound is by count and
by the footers' serialized size. A parsed footer takes ~4.5x its serialized size in memory
(measured: 19 MB for a 4.3 MB footer), so FineWeb's ~6 MB footers cost a worker ~60 MB at most.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow.parquet as pq

MAX_FILES = 2
MAX_BYTES = 32 * 2**20
"""Serialized footer bytes kept per worker process; a larger footer is parsed for each partition."""


class FooterCache:
    """Least recently used footers by (url, identity); safe for a worker's several threads."""

    def __init__(self, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES):
        self._max_files, self._max_bytes = max_files, max_bytes
        self._kept: OrderedDict[tuple, pq.FileMetaData] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, url: str, identity: tuple) -> pq.FileMetaData | None:
        if not identity:
            return None  # a file with no recorded identity could have changed: parse it again
        with self._lock:
            meta = self._kept.get((url, identity))
            if meta is not None:
                self._kept.move_to_end((url, identity))
            return meta

    def keep(self, url: str, identity: tuple, meta: pq.FileMetaData) -> None:
        if not identity or meta.serialized_size > self._max_bytes:
            return
        with self._lock:
            self._kept[(url, identity)] = meta
            self._kept.move_to_end((url, identity))
            while len(self._kept) > self._max_files or self._held() > self._max_bytes:
                self._kept.popitem(last=False)

    def open(self, source, url: str, identity: tuple, **kwargs) -> pq.ParquetFile:
        """``pq.ParquetFile(source, **kwargs)`` through the footer kept for (url, identity), which
        it keeps in turn: the one way a worker opens an input it may open again."""
        parquet = pq.ParquetFile(source, metadata=self.get(url, identity), **kwargs)
        self.keep(url, identity, parquet.metadata)
        return parquet

    def _held(self) -> int:
        return sum(m.serialized_size for m in self._kept.values())

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


WORKER_FOOTERS = FooterCache()
"""This process's footers: module state is per worker process, never pickled into a task."""
