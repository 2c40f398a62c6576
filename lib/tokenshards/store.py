"""Storage edge: one fsspec code path for local folders and s3:// (and anything fsspec opens).

Writes are atomic: a reader sees a whole object or none. Locally that is a temporary name in
the same folder, then ``os.replace`` (as tiktoken's cache does); elsewhere it is a file opened
with ``autocommit=False`` and committed only after every byte was written, because s3fs
otherwise commits on ``close()`` even when an exception is unwinding.
"""
from __future__ import annotations

import json
import os
import posixpath
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem

from .errors import UserError


def filesystem(url: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for a local path or URL; each process builds its own."""
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise UserError(f"cannot open {url!r}: {e}") from e


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def join(root: str, *parts: str) -> str:
    return posixpath.join(root, *parts)


def display_url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """The path as a user would type it (``s3://bucket/key``; local paths stay plain)."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial object."""
    if is_local(fs):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return
    f = fs.open(path, "wb", autocommit=False, **_block_size_for(len(data)))
    try:
        f.write(data)
        f.close()
    except BaseException:
        f.discard()
        raise
    f.commit()


def _block_size_for(nbytes: int) -> dict:
    """Multipart part size: at least 5 MiB (S3's minimum), and large enough to stay far below
    S3's 10,000-part limit for this object (here at most 1,000 parts)."""
    minimum = 5 * 2**20
    return {"block_size": max(minimum, -(-nbytes // 1000))}


def write_json(fs: fsspec.AbstractFileSystem, path: str, obj) -> None:
    write_atomic(fs, path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def read_json(fs: fsspec.AbstractFileSystem, path: str):
    with fs.open(path, "rb") as f:
        return json.loads(f.read())


def ensure_writable(fs: fsspec.AbstractFileSystem, root: str, url: str) -> None:
    """Fail before any tokenizing when OUT cannot be written (a probe object, then removed)."""
    probe = join(root, f".tokenshards-write-probe-{uuid.uuid4().hex}")
    try:
        fs.makedirs(join(root, "parts"), exist_ok=True)
        write_atomic(fs, probe, b"ok")
        fs.rm(probe)
    except Exception as e:
        raise UserError(f"cannot write to output {url!r}: {type(e).__name__}: {e}; choose another --out or fix its permissions") from e
