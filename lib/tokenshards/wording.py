"""Small helpers for the sentences the commands print."""
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
