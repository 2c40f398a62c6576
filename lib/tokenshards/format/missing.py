"""Why a folder has no manifest.json: a run still going or cut short, or no run at all.

A run writes ``tokenshards-job.json`` before anything else and its partitions under ``parts/``,
so a folder with neither was never a tokenshards output (a typo, an input folder): telling
that user to "rerun the same command to resume" would send them the wrong way.
"""
from __future__ import annotations

import fsspec

from ..storage.store import join

JOB_FILE = "tokenshards-job.json"
"""``tokenize.resume.JOB_FILE``, the first file a run writes in OUT (format must not import tokenize)."""


def not_a_run(fs: fsspec.AbstractFileSystem, root: str, url: str) -> str | None:
    """The one-line reason when ``root`` (which has no manifest.json) holds no tokenshards run at
    all; None when it holds an unfinished one (its job file or ``parts/`` is there)."""
    start = f"{url}: no manifest.json; not a finished tokenshards run"
    advice = "pass the --out folder of a `tokenshards tokenize` run"
    if not fs.exists(root):
        return f"{start} (there is no such folder: check the path, or {advice})"
    if fs.exists(join(root, JOB_FILE)) or fs.exists(join(root, "parts")):
        return None
    looks_like = ""
    try:  # one listing of the folder itself: cheap even when it is a large input prefix
        if fs.glob(join(root, "*.parquet")):
            looks_like = "; it holds parquet files, like an input folder"
    except OSError:
        pass
    return f"{start} (not a tokenshards output at all: no parts/, no {JOB_FILE}{looks_like}; {advice})"
