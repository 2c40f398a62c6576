"""Encoders built before the workers exist, in the forkserver local workers are forked from.

A local run's workers are forked from one server process (``cluster/prestart.py``) that imports
what they need while the client starts. When the command line already says which encodings and
backend the run wants, that server also loads each encoding, verifies the backend against
tiktoken (``backends.choose``) and builds it, on the core the client is not using. Every worker
forked afterwards starts with them built (pages shared with the server, not copied per worker),
and the client asks a child of the server for its verdict instead of verifying a second time.

The server learns what to build from the caller: ``preload`` returns the ``ForkserverPreload``
the command line hands ``cluster.prestart.start_forkserver``, whose last encoding module,
``prebuild``, builds what it names. This module only keeps what was built and answers for it.

Nothing is taken on trust: a worker uses the prebuilt encoder only when its fingerprint (sha256
of pattern, ranks and special tokens) and backend are the run's, and the client takes the
verdict only for the same fingerprint and request. Otherwise both do their own work, as they do
on any other cluster.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from ..cluster.prestart import ForkserverPreload

if TYPE_CHECKING:  # the client imports this module before anything heavy: keep it light
    import tiktoken

    from .backends import Backend, Choice

ENVIRONMENT = "TOKENSHARDS_PREBUILD"
"""The server's start environment entry (``ForkserverPreload.environment``) that names what to prebuild."""
WORKER_MODULES = ("tokenshards.encoding.backends", "gigatoken", "awkward", "splintr", "riptoken")
"""What building an encoder imports in a worker. (gigatoken hands its results back as awkward
arrays but imports awkward only then: ~0.35 s in a worker's first task.)"""


@dataclass(frozen=True)
class Prebuilt:
    fingerprint: str
    requested: str
    choice: Choice
    """Name and note only: the verified instance is ``backend``'s fast half."""
    encoding: tiktoken.Encoding | None
    backend: Backend


@dataclass(frozen=True)
class Request:
    """Which encodings the server builds, and with which ``--backend``."""

    encodings: tuple[str, ...]
    backend: str

    def to_environment(self) -> dict[str, str]:
        return {ENVIRONMENT: json.dumps([list(self.encodings), self.backend])}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Request | None:
        try:
            names, backend = json.loads(environ[ENVIRONMENT])
            return cls(encodings=tuple(dict.fromkeys(map(str, names))), backend=str(backend))
        except (KeyError, ValueError, TypeError):
            return None


_prebuilt: tuple[Prebuilt, ...] = ()
"""One per encoding the command line named (a run of several encodings names several)."""
_requested_here = False
"""True in the process whose forkserver was asked to prebuild (the client): only it asks for the verdict."""


def preload(encodings: str | Sequence[str] = (), backend: str | None = None) -> ForkserverPreload:
    """What local workers need to build an encoder: its modules and, given a ``backend``, the
    encoders ``encodings`` names built in the server (``prebuild``) for every worker forked from it."""
    if backend is None:
        return ForkserverPreload(modules=WORKER_MODULES)
    request = Request(encodings=(encodings,) if isinstance(encodings, str) else tuple(encodings), backend=backend)
    return ForkserverPreload(modules=(*WORKER_MODULES, "tokenshards.encoding.prebuild"),
                             environment=request.to_environment())


def started(preload: ForkserverPreload) -> None:
    """The forkserver started with ``preload``: from now on ``ask`` asks it."""
    global _requested_here
    _requested_here = ENVIRONMENT in preload.environment


def keep(found: Sequence[Prebuilt]) -> None:
    """``prebuild``'s result, kept in the server for the workers forked from it."""
    global _prebuilt
    _prebuilt = tuple(found)


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
    from concurrent.futures import ProcessPoolExecutor  # here: ~10 ms, before the forkserver's start otherwise

    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_verdict, fingerprint, requested).result()
