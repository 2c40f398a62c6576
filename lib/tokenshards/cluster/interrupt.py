"""Ctrl-C that cannot get lost.

Python turns SIGINT into KeyboardInterrupt wherever the main thread happens to be; when that is
inside a weakref callback or a ``__del__`` (Dask runs many), the exception is printed as
"ignored" and the program carries on. The CLI's handler therefore also sets a flag, which the
job checks between partitions and before it commits the manifest.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator

_requested = threading.Event()
_terminated = threading.Event()


def _on_sigint(signum, frame):
    _requested.set()
    raise KeyboardInterrupt


def _on_sigterm(signum, frame):
    """SIGTERM (``kill``, a batch system's stop) takes Ctrl-C's way out: the work cancelled, the
    cluster closed in order. Its default, dying at once, left the local workers' multiprocessing
    resource tracker to warn of leaked semaphores after the command was gone."""
    _terminated.set()
    _on_sigint(signum, frame)


def terminated() -> bool:
    """Whether the stop was a SIGTERM rather than Ctrl-C (the exit code and the message differ)."""
    return _terminated.is_set()


def install() -> None:
    """Route SIGINT (and SIGTERM) through the flag (main thread only: that is where Python runs handlers), and
    keep a swallowed KeyboardInterrupt from printing an "Exception ignored" traceback: the flag
    already carries it to the next check."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is _on_sigint:
        return
    signal.signal(signal.SIGINT, _on_sigint)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # a host application's own handler stays
        signal.signal(signal.SIGTERM, _on_sigterm)
    previous_hook = sys.unraisablehook

    def hook(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _requested.is_set():
            return
        previous_hook(unraisable)

    sys.unraisablehook = hook


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed, even if its first raise was swallowed."""
    if _requested.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def children_ignore_ctrl_c() -> Iterator[None]:
    """Processes started in here ignore SIGINT (the disposition survives fork and exec), so a
    terminal's Ctrl-C reaches only this process, which cancels the work and closes the cluster
    in order, instead of every worker printing its own KeyboardInterrupt traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
