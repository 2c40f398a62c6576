"""Inputs: paths, globs, folders and URLs resolved to a sorted list of parquet files."""
from __future__ import annotations

import glob as globlib
import posixpath
from dataclasses import dataclass

from .errors import UserError
from .store import display_url, filesystem


@dataclass(frozen=True, kw_only=True)
class Source:
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


def resolve_inputs(specs: tuple[str, ...] | list[str], storage_options: dict | None = None) -> list[Source]:
    """Every parquet file named by ``specs``, sorted by URL, each once."""
    found: dict[str, Source] = {}
    for spec in specs:
        fs, path = filesystem(spec, storage_options)
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
            raise UserError(f"cannot list input {spec!r}: {type(e).__name__}: {e}") from e
        if not paths:
            raise UserError(f"input {spec!r} matches no file; check the path or glob (quote globs so the shell leaves them alone)")
        for p in paths:
            url = display_url(fs, p)
            name = posixpath.relpath(p, base) if base else p
            found.setdefault(url, Source(url=url, name=name))
    return [found[u] for u in sorted(found)]
