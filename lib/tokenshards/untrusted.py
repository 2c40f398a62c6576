"""Reading bytes nothing vouches for: a file that must be a regular file, and JSON that must be
bounded. Beneath every reader of a run (``format``) and of a lease (``storage.lease``), and of the
inputs a command lists (``storage.sources``): what they share, with no knowledge of runs.

- A file is opened without following a link at its end and without blocking
  (``O_NOFOLLOW | O_NONBLOCK``: a FIFO swapped in neither hangs the open nor is read), looked at
  through the open descriptor, and read no further than its reader allows.
- JSON is parsed once its nesting was measured (linear, no recursion: 100,000 nested arrays are
  one line, never a RecursionError), without NaN or Infinity.

Messages say what is wrong without the path: the caller names the file.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat

import numpy as np

OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
"""How a file nothing vouches for is opened: never through a link at its end, never waiting on a FIFO."""
READ_PIECE = 8 << 20
"""Bytes read at a time from a local file (and hashed meanwhile)."""


class UnsafeFile(ValueError):
    """A file that is not opened, or not read (not a regular file, outside where it must be, larger
    than its reader allows); the message says why, without the path."""


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(mode: int) -> str:
    return f"is not a regular file ({file_kind(mode)}); it is not opened"


def open_regular(path: str) -> int:
    """A descriptor of the regular file ``path``, opened without following a link at its end and
    without blocking; ``UnsafeFile`` for anything else (a FIFO never hangs the open)."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFile("is a symlink; it is not opened") from e
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile(not_regular(mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, *, limit: int | None = None, size: int | None = None) -> bytes:
    """A local file's bytes through its descriptor, at most ``limit`` (``UnsafeFile`` past it)."""
    size = os.fstat(fd).st_size if size is None else size
    if limit is not None and size > limit:
        raise UnsafeFile(f"is {size:,} bytes, more than such a file may be ({limit:,}); it is not read")
    pieces, at = [], 0
    while True:
        piece = os.pread(fd, READ_PIECE, at)
        if not piece:
            break
        pieces.append(piece)
        at += len(piece)
        if limit is not None and at > limit:
            raise UnsafeFile(f"grew past {limit:,} bytes while read; it is not read")
    return b"".join(pieces)


MAX_DEPTH = 64
"""How deeply a record's JSON may nest: tokenshards writes at most 5 levels (a manifest's encoding
files, its chat block); Python's parser gives up near 1,000 with a RecursionError."""
class JsonError(ValueError):
    """Bytes that are not a record's JSON; the message says why, without the path."""


_ESCAPE = re.compile(rb"\\.", re.S)
_STRING = re.compile(rb'"[^"]*"')


def json_depth(raw: bytes) -> int:
    """How deeply ``raw``'s arrays and objects nest, brackets inside strings left out; linear
    time, no recursion, for bytes that may not even be JSON."""
    bare = _STRING.sub(b"", _ESCAPE.sub(b"", raw))
    b = np.frombuffer(bare, dtype=np.uint8)
    step = ((b == 0x5B) | (b == 0x7B)).astype(np.int64) - ((b == 0x5D) | (b == 0x7D))
    return int(np.cumsum(step).max()) if step.size else 0


def parse_json(raw: bytes | str):
    """JSON nothing vouches for: ``JsonError`` for bytes that are not UTF-8 JSON, nest deeper than
    ``MAX_DEPTH`` (looked at before the parser recurses) or hold NaN or Infinity."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    # Fewer opening brackets than the bound cannot nest past it: most records skip the scan.
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and (depth := json_depth(data)) > MAX_DEPTH:
        raise JsonError(f"nested {depth:,} levels deep, more than a record may be ({MAX_DEPTH})")
    try:
        return json.loads(data, parse_constant=_no_constant)
    except RecursionError as e:  # not reached below MAX_DEPTH; kept in case a parser recurses more
        raise JsonError("nested too deeply to parse") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an int of more than 4,300 digits
        raise JsonError(f"not valid JSON ({str(e).splitlines()[0][:200]})") from e


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")
