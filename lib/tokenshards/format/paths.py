"""Where a run's files may be and what kind of file may be opened: the checks that come before any
byte of a run is read (format v1's readers trust nothing on disk).

- A path a record names is relative to OUT, with no ``..``, scheme, drive or absolute part
  (``relative_path_problem``: pure).
- Locally, a file is opened only when it is a regular file inside OUT once every symlink is
  resolved: looked at first (``stat`` of its real path), then that real path opened without
  following a link and without blocking (``O_NOFOLLOW | O_NONBLOCK``: a FIFO or a link swapped in
  meanwhile neither hangs the reader nor leads it elsewhere), and looked at again through the
  open descriptor.
- On an object store there are no links nor FIFOs: an object must be a file (not a prefix).
- A record's reader says how large it may be (``limit``): a 50 GB "manifest" is refused before
  it is read.

Messages say what is wrong without the path (``UnsafeFile``): the caller names the file.
"""
from __future__ import annotations

import os
import stat

from ..untrusted import UnsafeFile, file_kind, not_regular, open_regular, read_fd  # noqa: F401


def relative_path_problem(path) -> str | None:
    """Why ``path`` is not a path inside OUT, relative to it (None: it is one). A manifest is input
    like any other: an absolute path, a ``..``, a scheme or a drive letter would let it name any
    file, of another run or of the system, so none is allowed."""
    if not isinstance(path, str) or not path:
        return f"{_show(path)} is not a path"
    if path.startswith(("/", "\\", "~")) or "\\" in path or "\0" in path:
        return f"{_show(path)} is not a path relative to OUT (absolute, or with a backslash or NUL)"
    if "://" in path or ":" in path.split("/", 1)[0]:
        return f"{_show(path)} is not a path relative to OUT (it names a scheme or a drive)"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return f"{_show(path)} is not a plain path relative to OUT (empty, '.' or '..' parts)"
    return None


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def inside(base: str, real: str) -> bool:
    """Whether the real path ``real`` lies in the real folder ``base`` (or is it)."""
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def local_look(root: str, relative: str) -> tuple[str, os.stat_result]:
    """(real path, its stat) of ``root/relative``: a regular file inside ``root`` once symlinks are
    resolved, looked at without being opened. ``FileNotFoundError`` when it is missing (a dangling
    link too), ``UnsafeFile`` when it lies outside ``root`` or is no regular file."""
    path = os.path.join(root, relative)
    real = os.path.realpath(path)
    if not inside(os.path.realpath(root), real):
        if stat.S_ISLNK(os.lstat(path).st_mode):  # FileNotFoundError: missing
            raise UnsafeFile(f"is a symlink to {real}, outside OUT; it is not opened")
        raise UnsafeFile("lies outside OUT (a folder on its way is a symlink); it is not opened")
    info = os.stat(real)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile(not_regular(info.st_mode))
    return real, info


def open_local(root: str, relative: str) -> int:
    """A descriptor of ``root/relative``, opened only once ``local_look`` passed, by its real path,
    never through a link nor waiting on a FIFO, and looked at again once open."""
    real, _ = local_look(root, relative)
    return open_regular(real)


def read_local(root: str, relative: str, *, limit: int | None = None) -> bytes:
    fd = open_local(root, relative)
    try:
        return read_fd(fd, limit=limit)
    finally:
        os.close(fd)


def remote_size(fs, path: str) -> int:
    """An object's size; ``UnsafeFile`` for a prefix (a "folder") or anything that is not a file."""
    info = fs.info(path)  # FileNotFoundError: missing
    if info.get("type") != "file":
        kind = "a folder" if info.get("type") == "directory" else repr(info.get("type"))
        raise UnsafeFile(f"is not a file but {kind}; it is not read")
    size = info.get("size")
    if not isinstance(size, int) or size < 0:
        raise UnsafeFile(f"has no size its store can tell ({size!r}); it is not read")
    return size


def read_remote(fs, path: str, *, limit: int | None = None) -> bytes:
    """An object's bytes, at most ``limit`` of them read (one ranged GET: a record is read in one
    request, and a store's refusal is the answer to a GET, whose body says why, not to a HEAD);
    a prefix (a "folder") is said as such when no object has the name."""
    try:
        raw = fs.cat_file(path) if limit is None else fs.cat_file(path, start=0, end=limit + 1)
    except (FileNotFoundError, IsADirectoryError):
        remote_size(fs, path)  # UnsafeFile for a prefix; FileNotFoundError when nothing is there
        raise
    if limit is not None and len(raw) > limit:
        raise UnsafeFile(f"is more than such a file may be ({limit:,} bytes); it is not read")
    return raw


def open_input(fs, path: str):
    """An input a reader of a run opens again (inspect's languages, verify --deep's rows), as a
    binary file: on a local disk only a regular file, opened without blocking (``UnsafeFile``: a
    FIFO would hang the open, a device never ends); any other store through its filesystem."""
    if "file" not in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        return fs.open(path, "rb")
    return os.fdopen(open_regular(path), "rb")
