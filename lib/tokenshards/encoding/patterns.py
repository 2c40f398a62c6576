"""Split patterns rewritten for the regex engines that are not tiktoken's (fancy-regex).

Where each rewrite is exact is a claim about tiktoken's patterns, not all patterns: the start-up
verification and the per-partition spot checks are what make a backend trusted.
"""
from __future__ import annotations

import re

_POSSESSIVE = re.compile(r"\\.|\[(?:\\.|[^\]])*\]|([*+?]|\{\d+(?:,\d*)?\})\+")


def without_possessive_quantifiers(pattern: str) -> str:
    """``x++`` → ``x+``, ``x?+`` → ``x?``, ``x{1,3}+`` → ``x{1,3}``; escapes and classes untouched.

    splintr's engine rejects possessive quantifiers, which tiktoken's patterns use only for
    speed: each is followed by something its repeat can never match, so dropping them changes
    no split. That is a claim about tiktoken's patterns, not all patterns, so the start-up
    verification and the per-partition spot checks are what make the backend trusted."""
    return _POSSESSIVE.sub(lambda m: m.group(1) or m.group(0), pattern)


_DOLLAR = re.compile(r"\\.|\[(?:\\.|[^\]])*\]|\$")


def onig_pattern(pat_str: str) -> str:
    """tiktoken's pattern (fancy-regex) as Oniguruma, which ``tokenizers``' ``Regex`` uses, reads it
    the same: possessive quantifiers dropped (``without_possessive_quantifiers`` says why
    that changes no split of tiktoken's patterns) and ``$`` → ``\\z`` (end of text, as in Rust)."""
    return _DOLLAR.sub(lambda m: r"\z" if m.group(0) == "$" else m.group(0), without_possessive_quantifiers(pat_str))
