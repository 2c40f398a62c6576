"""Named crash points on the write path: the moments right after each commit, where a test stops
a command to show that what it leaves is either committed whole or ignored by the next run.

Two rules hold only if every writer keeps them in the right order: a partition's done record
goes after its tokens and docs files (and a chat run's mask file), the manifest after every done
record; an export's record after every file it lists (and hf's card). A rule broken by moving one
line passes every test that only compares a finished run's bytes, so each commit calls
``reached(POINT, key)`` right after it is made, and ``tests/test_crash_points.py`` kills or fails
the command at every point, checks what is on disk, and reruns.

Production never arms a point: ``reached`` then costs one dict lookup. Tests arm them in one of
two ways (test hooks, nothing else):

- ``arm("tokenize.done@3", "fail")`` in this process: the client's points, and a worker's through
  ``client.run(crashpoints.arm, ...)``; ``disarm()`` undoes it;
- the environment variable ``TOKENSHARDS_CRASH_AT`` (``POINT[@KEY]=ACTION``, several separated by
  commas), read once, when this module is first imported: for processes a test starts (a CLI
  run, and the local workers it forks, which inherit its environment).

``POINT@KEY`` fires only where ``reached`` is given that key (a partition's index, an export
file's name as its record lists it); ``POINT`` alone fires at the first one. An armed point fires once per process.
Actions: ``fail`` raises ``CrashPointFailure`` (an ``OSError``, as a storage error would be),
``kill`` SIGKILLs this process (a worker or a client lost at that moment); in-process tests may
arm a callable, called with the point and key.
"""
from __future__ import annotations

import errno
import os
import signal
from typing import Callable

ENVIRONMENT = "TOKENSHARDS_CRASH_AT"

TOKENS = "tokenize.tokens"
"""A partition's tokens file is whole under its name (renamed, or its upload completed)."""
DOCS = "tokenize.docs"
"""Its docs file is whole (the tokens file may still be on its way)."""
MASK = "tokenize.mask"
"""A chat run's: its mask file is whole."""
DONE = "tokenize.done"
"""Its done record is written: the partition is committed."""
MANIFEST = "tokenize.manifest"
"""The run's manifest is written: the run is finished."""
EXPORT_FILE = "export.file"
"""One file of an export is committed under its name (its record not yet written)."""
EXPORT_CARD = "export.card"
"""An hf export's dataset card (README.md) is written, before its record."""
EXPORT_RECORD = "export.record"
"""The export record is written (and the note that listed its files while they were committed,
``export.common.begin_commits``, is gone): the export is finished."""

POINTS = (TOKENS, DOCS, MASK, DONE, MANIFEST, EXPORT_FILE, EXPORT_CARD, EXPORT_RECORD)
ACTIONS = ("fail", "kill")


class CrashPointFailure(OSError):
    """What an armed ``fail`` raises: a write path failing right after a commit."""

    def __init__(self, point: str, key: object):
        super().__init__(errno.EIO, f"crash point {point}{'' if key is None else f'@{key}'} (armed by a test)")


_armed: dict[str, dict[str | None, str | Callable]] = {}
"""point → key (None: any) → action."""


def reached(point: str, key: object = None) -> None:
    """Called by a writer right after the commit ``point`` names; nothing happens unless armed."""
    if not _armed:
        return
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}, expected one of {', '.join(POINTS)}")
    keyed = _armed.get(point)
    if not keyed:
        return
    if key is not None and str(key) in keyed:
        wanted = str(key)
    elif None in keyed:
        wanted = None
    else:
        return
    action = keyed.pop(wanted)
    if not keyed:
        del _armed[point]
    if callable(action):
        action(point, key)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise CrashPointFailure(point, key)


def arm(spec: str, action: str | Callable | None = None) -> None:
    """Arm ``POINT[@KEY]`` with ``action``, or each of ``POINT[@KEY]=ACTION,...`` (the
    environment variable's form) when ``action`` is None. A test hook."""
    for point, key, each in _parse(spec) if action is None else [(*_split(spec), action)]:
        if not callable(each) and each not in ACTIONS:
            raise ValueError(f"crash point {point}: action {each!r}, expected one of {', '.join(ACTIONS)} or a callable")
        _armed.setdefault(point, {})[key] = each


def disarm() -> None:
    """Every point unarmed in this process. A test hook."""
    _armed.clear()


def _split(spec: str) -> tuple[str, str | None]:
    point, at, key = spec.strip().partition("@")
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}, expected one of {', '.join(POINTS)}")
    return point, (key if at else None)


def _parse(text: str) -> list[tuple[str, str | None, str]]:
    specs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        where, equals, action = item.rpartition("=")
        if not equals:
            raise ValueError(f"{ENVIRONMENT}: {item!r}, expected POINT[@KEY]=ACTION")
        specs.append((*_split(where), action.strip()))
    return specs


arm(os.environ.get(ENVIRONMENT, ""))  # the one read of the environment: a test hook, see the docstring
