"""Imported by the local workers' forkserver when the command line asks it to prebuild
(``prebuilt.preload``), never elsewhere: it loads each encoding the request names, verifies the
backend against the tokenizer's reference (``choose``) and builds it, on the core the client is
not using, and leaves them in ``prebuilt`` for every worker forked afterwards. Never raises:
whatever fails here, the workers and the client do their own work."""
from __future__ import annotations

import os

from . import prebuilt
from .backends import Choice
from .registry import load_offline


def _build(name: str, requested: str) -> prebuilt.Prebuilt | None:
    """``name``'s encoder verified and built, or None (not loadable offline, or anything failed)."""
    try:
        loaded = load_offline(name)
        if loaded is None:
            return None
        choice = loaded.choose(requested)
        backend = loaded.build(choice.name, verified=choice.verified)
        return prebuilt.Prebuilt(fingerprint=loaded.fingerprint, requested=requested, choice=Choice(choice.name, choice.note),
                                 encoding=getattr(loaded, "encoding", None), backend=backend)
    except Exception:  # noqa: BLE001  (a UserError included: the client raises it itself, in one line)
        return None


def build_requested() -> None:
    request = prebuilt.Request.from_environment(os.environ)
    if request is None:
        return
    os.environ.pop(prebuilt.ENVIRONMENT, None)  # the workers forked from here need it no more
    built = (_build(name, request.backend) for name in request.encodings)
    prebuilt.keep([found for found in built if found is not None])


build_requested()
