"""Small helpers for the sentences the commands print: counts, sizes, causes."""
from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 file``, ``2 files``, ``1,024 partitions``: a count with its noun in the right number."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def brief(text: object, width: int = 200) -> str:
    """An error's text for one line: whitespace collapsed, cut at a word with `` …`` past
    ``width`` (a hard cut left "NameResolutio" behind)."""
    import textwrap

    flat = " ".join(str(text).split())
    return textwrap.shorten(flat, width=width, placeholder=" …") if len(flat) > width else flat


def human(n: float) -> str:
    """At most 6 characters below 1000P (``999``, ``999.9k``): a value that rounds up to 1000
    moves to the next unit (``1.0k``, not ``1000``)."""
    for unit in ("", "k", "M", "G", "T"):
        if abs(round(n, 1 if unit else 0)) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}P"


HUMAN_WIDTH = 6
"""``human``'s widest output below 1000P; the bar pads its numbers to it."""
