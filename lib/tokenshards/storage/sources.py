"""Inputs: paths, globs, folders and URLs resolved to a sorted list of parquet files."""
from __future__ import annotations

import glob as globlib
import os
import posixpath
import stat
from dataclasses import dataclass
from typing import Callable

from ..errors import UserError
from ..untrusted import not_regular
from .store import check_bucket, display_url, filesystem, is_local, storage_error


@dataclass(frozen=True, kw_only=True)
class ListedInput:
    """An input found by listing what ``--input`` names (or a Hub sample's file), before its
    footer is read (then it is a ``corpus.plan.InputFile``)."""

    url: str
    """Where workers open it (a local path or ``s3://...``)."""
    name: str
    """Relative to what the user named (the glob's folder, the folder, or the file's own name):
    stable when the corpus moves, used in ``"<name>:<row>"`` document ids."""


def _glob_base(pattern: str) -> str:
    head = pattern
    while globlib.has_magic(head):
        head = posixpath.dirname(head)
    return head


def resolve_inputs(specs: tuple[str, ...] | list[str], storage_options: dict | None = None, *,
                   announce: Callable[[str], None] = lambda msg: None) -> list[ListedInput]:
    """Every parquet file named by ``specs``, sorted by URL, each once: a local file reached by two
    paths (a symlink, a hard link: the same device and inode) is kept under its first URL, and said."""
    found: dict[str, ListedInput] = {}
    real: dict[str, tuple[int, int]] = {}
    for spec in specs:
        fs, path = filesystem(spec, storage_options)
        check_bucket(fs, path, spec, what="input")
        try:
            if globlib.has_magic(path):
                base = _glob_base(path)
                paths = [p for p in fs.glob(path) if fs.isfile(p)]
            elif fs.isdir(path):
                base = path
                paths = [p for p in fs.find(path) if p.endswith(".parquet")]
            elif fs.isfile(path):
                base = posixpath.dirname(path)
                paths = [path]
            else:
                paths = []
        except (PermissionError, OSError) as e:
            if not is_local(fs):
                raise storage_error(e, spec, what="cannot list input", fs=fs) from e
            raise UserError(f"cannot list input {spec!r}: {type(e).__name__}: {e}") from e
        except Exception as e:  # botocore's own errors (no credentials, endpoint gone) are no OSError
            if is_local(fs):
                raise
            raise storage_error(e, spec, what="cannot list input", fs=fs) from e
        if not paths:
            raise UserError(f"input {spec!r} matches no file; check the path or glob (quote globs so the shell leaves them alone)")
        for p in paths:
            url = display_url(fs, p)
            name = posixpath.relpath(p, base) if base else p
            found.setdefault(url, ListedInput(url=url, name=name))
            if is_local(fs):
                st = _local_input(p, spec)
                real[url] = (st.st_dev, st.st_ino)
    by_real: dict[tuple[int, int], list[str]] = {}
    for url in sorted(real):
        by_real.setdefault(real[url], []).append(url)
    for urls in by_real.values():
        if len(urls) > 1:
            for dup in urls[1:]:
                del found[dup]
            announce(f"warning: {', '.join(urls)} are one file (a symlink or hard link); tokenizing it once, "
                     f"as {urls[0]}")
    return [found[u] for u in sorted(found)]


def _local_input(path: str, spec: str) -> os.stat_result:
    """A local input's stat: a regular file, once its symlinks are followed. A dangling symlink, or a
    FIFO, folder or device named like a parquet file, is one line (a FIFO would hang its reader)."""
    try:
        st = os.stat(path)
    except FileNotFoundError as e:
        target = os.path.realpath(path)
        raise UserError(f"input {path} (from --input {spec}) is a symlink to {target}, which does not exist; "
                        "fix or remove the link") from e
    except OSError as e:
        raise UserError(f"input {path} (from --input {spec}) cannot be looked at: {type(e).__name__}: {e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"input {path} (from --input {spec}) {not_regular(st.st_mode)}: a parquet input is a file; "
                        "remove it from the folder, or name the inputs by a glob that leaves it out")
    return st
