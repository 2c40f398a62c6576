"""One live progress line on a terminal; a line every ~10% in logs; or nothing."""
from __future__ import annotations

import sys
import time
from typing import TextIO


def human(n: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}P"


def format_eta(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """Counts partitions and tokens as tasks finish; ``mode`` is bar, log, none or auto."""

    def __init__(self, total: int, *, mode: str = "auto", stream: TextIO | None = None, already_done: int = 0):
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "log"
        self.mode = mode
        self.total = total
        self.done = already_done
        self.tokens = 0
        self.finished_here = 0
        self.started = time.perf_counter()
        self._last_logged = -1

    def update(self, tokens: int) -> None:
        self.done += 1
        self.finished_here += 1
        self.tokens += tokens
        if self.mode == "bar":
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()
        elif self.mode == "log":
            decile = self.done * 10 // max(self.total, 1)
            if decile != self._last_logged or self.done == self.total:
                self._last_logged = decile
                print(self.line(), file=self.stream, flush=True)

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rate = self.tokens / elapsed
        remaining = self.total - self.done
        eta = elapsed / self.finished_here * remaining if self.finished_here else 0
        return (f"partitions {self.done}/{self.total}  {human(self.tokens)} tokens  "
                f"{human(rate)} tokens/s  ETA {format_eta(eta)}")

    def close(self) -> None:
        if self.mode == "bar":
            self.stream.write("\n")
            self.stream.flush()
