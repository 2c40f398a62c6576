"""Where the suite keeps what it fetches or builds once: trainers' reader venvs, real tokenizer
files, Azurite's npm install.

Outside the checkout, as pip and pre-commit keep theirs (``$TOKENSHARDS_TEST_CACHE``, else
``$XDG_CACHE_HOME/tokenshards-tests``, else ``~/.cache/tokenshards-tests``), so a fresh clone (CI's)
reuses what an earlier run built: the reader venvs alone took 3-5 minutes of every fresh run.
Each entry is named by what it holds (a hash of a venv's requirements, a pinned version) and is
checked or rebuilt when absent or half-built, so a stale or damaged entry is never trusted.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    explicit = os.environ.get("TOKENSHARDS_TEST_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tokenshards-tests"


ROOT = cache_root()
