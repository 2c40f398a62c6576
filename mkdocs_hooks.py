"""mkdocs hooks (mkdocs.yml ``hooks:``): what the site's Markdown renders differently from GitHub's.

A pipe inside a code span in a table is written ``\\|`` in docs/ (GitHub's tables split cells at
every unescaped pipe, code spans included, and drop the backslash: GFM spec, example 200), while
Python-Markdown's tables already keep a code span's pipes in its cell and leave the backslash in
the code (``<\\|endoftext\\|>`` on the page). The escape is taken out of code in table cells here,
so one source reads right in both. Code outside tables keeps its backslashes (a ``grep 'a\\|b'``).
"""
from __future__ import annotations

import re

TABLE = re.compile(r"<table>.*?</table>", re.S)
CODE = re.compile(r"<code>.*?</code>", re.S)


def unescape_table_pipes(html: str) -> str:
    """``\\|`` -> ``|`` inside ``<code>`` within ``<table>`` elements of a page's HTML."""
    return TABLE.sub(lambda t: CODE.sub(lambda c: c.group(0).replace("\\|", "|"), t.group(0)), html)


def on_page_content(html: str, **kwargs) -> str:
    return unescape_table_pipes(html)
