"""A location in storage: one folder (OUT, DEST, a run an export reads) or file, as the user named it
and as fsspec reaches it, in one value instead of a filesystem, a path and a URL passed side by side.

Built in one place, ``Location.at(url, storage_options)``; the operations its callers repeat (join
a relative path, read and write atomically, exists, the URL to show) are methods that name the
path relative to it, and so are the checks a command makes before it writes a folder (its bucket,
a write probe, the probes earlier commands left): ``store`` cannot take a location (this module
imports it), and those checks are of a folder, never of a bare path.

A location crosses processes as what built it, never as its filesystem: pickled, it is the URL and
the wrapped storage options (``StorageOptions``, whose repr hides every value), and the process
that unpickles it builds its own filesystem from them, as every task does (``store``'s rule: an
``S3FileSystem``'s event loop and connections belong to one process, and Azure's filesystem class
is made per process). A local location travels as its absolute path: a worker's working directory
may differ from the client's.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass, field

import fsspec

from ..errors import UserError
from ..untrusted import UnsafeFile
from .store import (StorageOptions, _one_line, check_bucket, display_url, filesystem, is_local, is_object_store, join,
                    storage_error, write_advice, write_atomic, write_json)
from .store import storage_options as checked_options

WRITE_PROBE_PREFIX = ".tokenshards-write-probe-"
"""The name of the small file written (and removed) to learn that a folder takes writes."""

STALE_PROBE_SECONDS = 60.0
"""A probe lives milliseconds; one this old in a local folder was left by a process that died or
failed while writing it (and another command's probe may be in flight now: younger ones stay)."""


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
        """The path of ``parts`` as the user wrote the location (``az://c/run/x``, not adlfs's ``abfs://``;
        local paths plain)."""
        if self.is_local:
            return display_url(self.fs, self.join(*parts))
        return "/".join([self.url.rstrip("/"), *parts]) if parts else self.url

    def exists(self, *parts: str) -> bool:
        with self.worded(*parts, what="cannot check"):
            return self.fs.exists(self.join(*parts))

    def glob(self, *parts: str) -> list[str]:
        return self.fs.glob(self.join(*parts))

    def read_json(self, *parts: str):
        with self.worded(*parts, what="cannot read"):
            raw = self.fs.cat_file(self.join(*parts))
        return json.loads(raw)

    @contextlib.contextmanager
    def worded(self, *parts: str, what: str):
        """A store's failure (a refusal, a failure the retry policy gave up on) as one line naming the
        file as the user writes it (``storage_error``); "not there" stays ``FileNotFoundError``, the
        callers' to say, and a local folder's errors stay theirs too."""
        try:
            yield
        except (FileNotFoundError, UserError, UnsafeFile):  # not the store's failure: the caller's to say
            raise
        except Exception as e:
            if not self.is_object_store:
                raise
            raise storage_error(e, self.shown(*parts), what=what, fs=self.fs) from e

    def write_json(self, relative: str, obj) -> None:
        """``relative`` written atomically (``store.write_atomic``), as indented JSON."""
        write_json(self.fs, self.join(relative), obj)

    def write_atomic(self, relative: str, data: bytes) -> None:
        write_atomic(self.fs, self.join(relative), data)

    # -- before a command writes here -----------------------------------------------------------
    def check_bucket(self, *, what: str) -> None:
        """Object stores: fail now, in one line naming the URL, if the bucket is missing or the
        endpoint or credentials fail (``store.check_bucket``, which inputs' globs also use)."""
        check_bucket(self.fs, self.root, self.url, what=what)

    def ensure_writable(self) -> None:
        """Fail before any tokenizing when OUT cannot be written (a probe object, then removed).

        On object stores nothing is created but the probe: s3fs's ``makedirs`` would create a
        missing bucket, and a typo in ``--out`` must be an error, not a new bucket.
        """
        if self.is_local:
            try:
                self.fs.makedirs(self.join("parts"), exist_ok=True)
            except OSError as e:
                raise UserError(f"cannot write to output {self.url!r}: {type(e).__name__}: {_one_line(e)}; "
                                "choose another --out or fix its permissions") from e
        self.check_bucket(what="output")
        probe = self.join(f"{WRITE_PROBE_PREFIX}{uuid.uuid4().hex}")
        try:
            write_atomic(self.fs, probe, b"ok")
        except UserError:
            raise
        except Exception as e:
            if self.is_local:
                raise UserError(f"cannot write to output {self.url!r}: {type(e).__name__}: {_one_line(e)}; "
                                f"{write_advice(e, '--out')}") from e
            raise storage_error(e, self.url, what="cannot write to output", fs=self.fs) from e
        # Write-only credentials are enough for a run; a probe already gone (a run that cleared this
        # folder's leftovers meanwhile) is no error.
        with contextlib.suppress(PermissionError, FileNotFoundError):
            self.fs.rm(probe)

    def remove_stale_probes(self) -> int:
        """Write probes (``ensure_writable``'s, an export's) and their temporaries that earlier
        commands left here: local ones older than ``STALE_PROBE_SECONDS``; on an object store,
        every one (a probe there is one PUT: whole or absent, and removing it twice is no error).
        Called by the folder's lease holder; returns how many went."""
        gone = 0
        try:
            found = self.glob(WRITE_PROBE_PREFIX + "*")
        except (OSError, ValueError):
            return 0
        now = time.time()
        for path in found:
            if self.is_local:
                try:
                    if now - os.lstat(path).st_mtime < STALE_PROBE_SECONDS:
                        continue
                except FileNotFoundError:
                    continue
            with contextlib.suppress(FileNotFoundError, PermissionError):
                self.fs.rm(path)
                gone += 1
        return gone


def _reopened(url: str, opened_as: str, options: StorageOptions) -> Location:
    """A pickled location in this process: its own filesystem, built from what built the first."""
    fs, root = filesystem(opened_as, options)
    return Location(url=url, fs=fs, root=root, storage_options=options)
