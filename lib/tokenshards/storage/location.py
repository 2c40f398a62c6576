"""A location in storage: one folder (OUT, DEST, a run an export reads) or file, as the user named it
and as fsspec reaches it, in one value instead of a filesystem, a path and a URL passed side by side.

Built in one place, ``Location.at(url, storage_options)``; the operations its callers repeat (join
a relative path, read and write atomically, exists, the URL to show) are methods that name the
path relative to it.

A location crosses processes as what built it, never as its filesystem: pickled, it is the URL and
the wrapped storage options (``StorageOptions``, whose repr hides every value), and the process
that unpickles it builds its own filesystem from them, as every task does (``store``'s rule: an
``S3FileSystem``'s event loop and connections belong to one process, and Azure's filesystem class
is made per process). A local location travels as its absolute path: a worker's working directory
may differ from the client's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import fsspec

from .store import (StorageOptions, display_url, filesystem, is_local, is_object_store, join, read_json,
                    write_atomic, write_json)
from .store import storage_options as checked_options


@dataclass(frozen=True)
class Location:
    """A folder or file in storage (glossary: **location**). Equal when the URL and path are."""

    url: str
    """As the user gave it (``--out out``, ``s3://b/run``): what messages name."""
    fs: fsspec.AbstractFileSystem = field(repr=False, compare=False)
    root: str
    """The location's path as ``fs`` names it (a local one absolute; no protocol)."""
    storage_options: StorageOptions = field(default_factory=StorageOptions, repr=False, compare=False)

    @classmethod
    def at(cls, url: str, storage_options: dict | None = None) -> Location:
        """The location ``url`` names; each process builds its own (``store.filesystem``: a one-line
        ``UserError`` for a URL or options it cannot open)."""
        options = checked_options(storage_options)
        fs, root = filesystem(url, options)
        return cls(url=url, fs=fs, root=root, storage_options=options)

    def __reduce__(self):
        return (_reopened, (self.url, self.root if self.is_local else self.url, self.storage_options))

    @property
    def is_local(self) -> bool:
        return is_local(self.fs)

    @property
    def is_object_store(self) -> bool:
        return is_object_store(self.fs)

    @property
    def task_url(self) -> str:
        """What a task opens this location by: a local one as its absolute path (a worker's working
        directory may differ), any other as the URL given."""
        return self.root if self.is_local else self.url

    def join(self, *parts: str) -> str:
        """The path of ``parts`` inside the location, as ``fs`` names it."""
        return join(self.root, *parts)

    def shown(self, *parts: str) -> str:
        """The path of ``parts`` as a user would type it (``s3://bucket/key``; local paths plain)."""
        return display_url(self.fs, self.join(*parts))

    def exists(self, *parts: str) -> bool:
        return self.fs.exists(self.join(*parts))

    def glob(self, *parts: str) -> list[str]:
        return self.fs.glob(self.join(*parts))

    def read_json(self, *parts: str):
        return read_json(self.fs, self.join(*parts))

    def write_json(self, relative: str, obj) -> None:
        """``relative`` written atomically (``store.write_atomic``), as indented JSON."""
        write_json(self.fs, self.join(relative), obj)

    def write_atomic(self, relative: str, data: bytes) -> None:
        write_atomic(self.fs, self.join(relative), data)


def _reopened(url: str, opened_as: str, options: StorageOptions) -> Location:
    """A pickled location in this process: its own filesystem, built from what built the first."""
    fs, root = filesystem(opened_as, options)
    return Location(url=url, fs=fs, root=root, storage_options=options)
