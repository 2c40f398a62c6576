"""Encoders built before the workers exist, in the forkserver local workers are forked from.

A local run's workers are forked from one server process (``cluster/prestart.py``) that imports
what they need while the client starts. When the command line already says which encodings and
backend the run wants, that server also loads each encoding, verifies the backend against
tiktoken (``backends.choose``) and builds it, on the core the client is not using. Every worker
forked afterwards starts with them built (pages shared with the server, not copied per worker),
and the client asks a child of the server for its verdict instead of verifying a second time.

Nothing is taken on trust: a worker uses the prebuilt encoder only when its fingerprint (sha256
of pattern, ranks and special tokens) and backend are the run's, and the client takes the
verdict only for the same fingerprint and request. Otherwise both do their own work, as they do
on any other cluster.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # the client imports this module before anything heavy: keep it light
    import tiktoken

    from .backends import Backend, Choice

ENVIRONMENT = "TOKENSHARDS_PREBUILD"
"""``[[encoding, ...], backend]`` as JSON: what the forkserver started after ``request`` prebuilds."""


@dataclass(frozen=True)
class Prebuilt:
    fingerprint: str
    requested: str
    choice: Choice
    """Name and note only: the verified instance is ``backend``'s fast half."""
    encoding: tiktoken.Encoding
    backend: Backend


_prebuilt: tuple[Prebuilt, ...] = ()
"""One per encoding the command line named (a run of several encodings names several)."""
_requested_here = False
"""True in the process that called ``request`` (the client): only it asks for the verdict."""


def request(encodings: str | Sequence[str], backend: str) -> None:
    """Have the forkserver, started after this call, prebuild each of ``encodings`` with ``backend``."""
    global _requested_here
    os.environ[ENVIRONMENT] = json.dumps([[encodings] if isinstance(encodings, str) else list(encodings), backend])
    _requested_here = True


def build_requested() -> None:
    """The forkserver's last preload step: prebuild what ``request`` asked for (``forkserver_preload``
    then freezes the server's heap). Never raises: whatever fails here, the workers build their own."""
    global _prebuilt
    try:
        names, requested = json.loads(os.environ[ENVIRONMENT])
    except (KeyError, ValueError):
        names, requested = [], ""
    built = (_build(name, requested) for name in dict.fromkeys(names))
    _prebuilt = tuple(found for found in built if found is not None)


def _build(name: str, requested: str) -> Prebuilt | None:
    """``name``'s encoder verified and built, or None (not loadable offline, or anything failed)."""
    from .backends import Choice
    from .registry import load_offline

    try:
        loaded = load_offline(name)
        if loaded is None:
            return None
        choice = loaded.choose(requested)
        backend = loaded.build(choice.name, verified=choice.verified)
        return Prebuilt(fingerprint=loaded.fingerprint, requested=requested,
                        choice=Choice(choice.name, choice.note), encoding=loaded.encoding, backend=backend)
    except Exception:  # noqa: BLE001  (a UserError included: the client raises it itself, in one line)
        return None


def for_worker(fingerprint: str, backend: str) -> tuple[tiktoken.Encoding, Backend] | None:
    """(encoding, backend) prebuilt in the server this worker was forked from, if they are these."""
    for found in _prebuilt:
        if found.fingerprint == fingerprint and found.choice.name == backend:
            return found.encoding, found.backend
    return None


def _verdict(fingerprint: str, requested: str) -> Choice | None:
    """Runs in a child of the server: its choice, if it was made for this encoding and request."""
    for found in _prebuilt:
        if found.fingerprint == fingerprint and found.requested == requested:
            return found.choice
    return None


def ask(fingerprint: str, requested: str) -> Choice | None:
    """The server's choice for this encoding and request (None: choose here). A child forked from
    the server answers; it exists only once the server has finished its preload."""
    if not _requested_here:
        return None
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_verdict, fingerprint, requested).result()
