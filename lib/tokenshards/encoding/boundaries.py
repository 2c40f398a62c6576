"""Document boundaries: the control tokens placed around each document's own ids.

A document's tokens are ``prefix + ids(text) + suffix``. The ids never hold a control token made
from the document's words; the boundaries are the only control tokens a run writes, and they come
from the tokenizer (what its model was trained with) unless ``--boundary`` says otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError

BOUNDARY_CHOICES = ("auto", "bos", "eos", "both", "none")
"""``--boundary``: the tokenizer's own (auto), its beginning-of-text token before each document,
its end-of-text token after, both, or none."""

EOT_TO_BOUNDARY = {"prefix": "bos", "suffix": "eos", "none": "none"}
"""``--eot`` (tiktoken's encodings have one token, ``<|endoftext|>``, for both ends) in the terms
of ``--boundary``."""


@dataclass(frozen=True)
class Boundaries:
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    why: str = ""
    """One phrase for the summary: where the choice came from."""

    @property
    def eot_position(self) -> str:
        """Format v1's ``eot_position``: a single boundary token before or after (readers of runs
        made before other tokenizers existed know only that), else ``none`` when there is none and
        ``prefix`` when there are tokens on both sides (each document then still starts with ``eot``)."""
        if self.prefix:
            return "prefix"
        return "suffix" if self.suffix else "none"

    def eot(self, fallback: int) -> int:
        """Format v1's ``eot``: the token that starts (or ends) each document, else ``fallback``."""
        if self.prefix:
            return self.prefix[0]
        return self.suffix[-1] if self.suffix else fallback

    @property
    def single(self) -> bool:
        """Whether ``eot``/``eot_position`` alone say everything (one token, or none)."""
        return len(self.prefix) + len(self.suffix) <= 1

    def describe(self, name_of) -> str:
        """``<|begin_of_text|> + text`` style, with ``name_of(id)`` naming each token."""
        parts = [*(name_of(t) for t in self.prefix), "text", *(name_of(t) for t in self.suffix)]
        return " + ".join(parts)


def resolve(request: str, *, natural: Boundaries, bos: int | None, eos: int | None, tokenizer: str) -> Boundaries:
    """The boundaries ``--boundary request`` asks of a tokenizer whose own are ``natural`` and whose
    beginning- and end-of-text tokens are ``bos``/``eos`` (None: it has none)."""
    if request not in BOUNDARY_CHOICES:
        raise UserError(f"--boundary {request!r} not supported, expected one of {', '.join(BOUNDARY_CHOICES)}")
    if request == "auto":
        return natural
    if request == "none":
        return Boundaries(why="--boundary none")
    missing = [what for what, token in (("beginning-of-text", bos), ("end-of-text", eos))
               if token is None and (request == "both" or what.startswith({"bos": "b", "eos": "e"}[request]))]
    if missing:
        raise UserError(f"--boundary {request}: tokenizer {tokenizer} has no {missing[0]} token; "
                        f"use --boundary {'eos' if request == 'bos' else 'bos' if request == 'eos' else 'auto'} or none")
    prefix = (bos,) if request in ("bos", "both") else ()
    suffix = (eos,) if request in ("eos", "both") else ()
    return Boundaries(prefix=prefix, suffix=suffix, why=f"--boundary {request}")
