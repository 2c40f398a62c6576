"""Progress of a run: one live line on a terminal; a line every 10% (and every few minutes)
in logs, so a CI or batch log stays short; or nothing.

``bar`` redraws a single line with ``\\r`` (fitted to the terminal's width so it never wraps),
also between task completions so the elapsed time and ETA keep moving while a slow first
partition runs. ``auto`` picks ``bar`` on a terminal and ``log`` otherwise.
"""
from __future__ import annotations

import io
import os
import shutil
import sys
import threading
import time
from typing import Callable, TextIO

from ..errors import UserError
from ..wording import HUMAN_WIDTH, human

MODES = ("auto", "bar", "log", "none")


TIME_WIDTH = 6
"""``format_eta``'s widest output (``99h59m``, ``99d23h``)."""


def format_eta(seconds: float) -> str:
    """At most ``TIME_WIDTH`` characters: ``9s``, ``1m15s``, ``1h02m``, ``4d07h``, ``>99d``."""
    seconds = int(seconds)
    if seconds >= 100 * 86400:
        return ">99d"
    if seconds >= 100 * 3600:
        return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """Counts finished work items (partitions, chunks, merges) and an amount they carry (tokens,
    bytes) as they finish: every job's one progress reporter."""

    def __init__(self, total: int, *, mode: str = "auto", stream: TextIO | None = None, already_done: int = 0,
                 clock: Callable[[], float] = time.perf_counter, refresh: float | None = 1.0,
                 heartbeat: float = 300.0, width: int | None = None, unit: str = "partitions",
                 amount: str | None = " tokens", label: str = ""):
        """``refresh``: seconds between redraws of the bar while nothing finishes (None: only on
        updates). ``heartbeat``: in log mode, a line at least this often even between 10% steps,
        so a long run's log shows it is alive. ``width``: the terminal's, when not asked for.
        ``unit`` names the items; ``amount`` the quantity they carry, as written after a number
        (``" tokens"``, ``"B"``), or None to show the items' own rate; ``label`` starts the line."""
        if mode not in MODES:
            raise UserError(f"progress={mode!r} not supported, expected one of {', '.join(MODES)}")
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if draws_bars(mode, self.stream) else "log"
        self.mode = mode
        self.total = total
        self.unit, self.amount, self.label = unit, amount, label
        self.done = already_done
        self.carried = 0
        self.finished_here = 0
        self.clock = clock
        self.started = clock()
        self.heartbeat = heartbeat
        self.width = width
        self._last_decile = already_done * 10 // max(total, 1)
        self._last_log = self.started
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._ticker = None
        if self.mode == "bar":
            self._draw()
            if refresh:
                self._ticker = threading.Thread(target=self._tick, args=(refresh,), name="tokenshards-progress",
                                                daemon=True)
                self._ticker.start()

    def update(self, amount: int = 0, *, items: int = 1) -> None:
        """``items`` more finished (one partition, by default), carrying ``amount`` (its tokens)."""
        with self._lock:
            self.done += items
            self.finished_here += items
            self.carried += amount
            if self.mode == "bar":
                self._draw()
            elif self.mode == "log":
                now = self.clock()
                decile = self.done * 10 // max(self.total, 1)
                if decile != self._last_decile or self.done == self.total or now - self._last_log >= self.heartbeat:
                    self._last_decile, self._last_log = decile, now
                    print(self.line(), file=self.stream, flush=True)

    def say(self, announce: Callable[[str], None], message: str) -> None:
        """Print a message without tearing the bar: clear the line, announce, redraw."""
        with self._lock:
            if self.mode == "bar":
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            announce(message)
            if self.mode == "bar":
                self._draw()

    def line(self, *, fixed: bool = False) -> str:
        """The progress in words. ``fixed``: every number padded to its widest (the count to the
        total's digits, amounts and rates to ``human``'s, times to ``format_eta``'s), so the line
        redrawn in place keeps its width and its fields their columns as the numbers change."""
        def pad(text: str, width: int) -> str:
            return text.rjust(width) if fixed else text

        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.carried / elapsed
        remaining = self.total - self.done
        if self.finished_here:
            eta = format_eta(elapsed / self.finished_here * remaining)
        else:
            eta = "--" if remaining else "0s"
        if self.amount is None:
            carried = f"{pad(human(self.finished_here / elapsed), HUMAN_WIDTH)} {self.unit}/s"
        else:
            carried = (f"{pad(human(self.carried), HUMAN_WIDTH)}{self.amount}  "
                       f"{pad(human(rate), HUMAN_WIDTH)}{self.amount}/s")
        done = pad(str(self.done), len(str(self.total)))
        return (f"{self.label}{self.unit} {done}/{self.total}  {carried}  "
                f"elapsed {pad(format_eta(elapsed), TIME_WIDTH)}  ETA {pad(eta, TIME_WIDTH)}")

    def bar_line(self, width: int) -> str:
        """``[#####.....]  42%  partitions ...``, never wider than ``width - 1`` characters, and
        as wide from the first frame to the last (``line(fixed=True)``)."""
        fraction = self.done / self.total if self.total else 1.0
        text = f"{100 * fraction:3.0f}%  {self.line(fixed=True)}"
        room = min(30, width - 1 - len(text) - 3)
        if room >= 10:
            filled = int(room * fraction)
            text = f"[{'#' * filled}{'.' * (room - filled)}] {text}"
        return text[:max(width - 1, 1)]

    def close(self) -> None:
        self._closed.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.mode == "bar":
            with self._lock:
                self._draw()
                self.stream.write("\n")
                self.stream.flush()

    def _draw(self) -> None:
        width = self.width or _terminal_width(self.stream)
        # \x1b[K clears what a longer earlier line left behind.
        self.stream.write("\r" + self.bar_line(width) + "\x1b[K")
        self.stream.flush()

    def _tick(self, refresh: float) -> None:
        while not self._closed.wait(refresh):
            with self._lock:
                if not self._closed.is_set():
                    self._draw()


def _terminal_width(stream: TextIO) -> int:
    """The width of the terminal the bar is drawn on (stderr's own, not stdout's)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        columns = 0
    return columns or shutil.get_terminal_size((100, 24)).columns


def draws_bars(mode: str, stream: TextIO | None = None) -> bool:
    """Whether ``mode`` draws a live bar on ``stream`` (stderr): what other libraries' bars follow."""
    return mode == "bar" or (mode == "auto" and _isatty(stream or sys.stderr))


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
