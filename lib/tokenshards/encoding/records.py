"""What every tokenizer kind shares: the records a manifest and a worker receive.

A leaf module (no tokenizer library, nothing of ours but errors), so each kind's module and the
worker plugin can import it without importing one another.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken


def cache_root() -> Path:
    """Where tokenshards keeps what it derives once per machine (parsed ranks, converted tokenizers)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tokenshards"


def token_dtype(n_vocab: int) -> str:
    """uint16 holds every id of a vocabulary of at most 65,536 (GPT-2: max id 50,256 < 2**16)."""
    return "uint16" if n_vocab <= 2**16 else "uint32"


@dataclass(frozen=True)
class SourceFile:
    """A file a tokenizer was loaded from, as the manifest records it (``files``)."""

    name: str
    sha256: str

    def to_dict(self) -> dict:
        return {"name": self.name, "sha256": self.sha256}


@dataclass(frozen=True, kw_only=True)
class EncodingSpec:
    """What the manifest records about an encoding (format v1 ``encoding`` block)."""

    name: str
    n_vocab: int
    eot: int
    dtype: str

    def as_dict(self) -> dict:
        return {"name": self.name, "n_vocab": self.n_vocab, "eot": self.eot, "dtype": self.dtype}


@dataclass(frozen=True, kw_only=True, eq=True)
class TiktokenParams:
    """What rebuilds a tiktoken encoding anywhere: ``tiktoken.Encoding``'s keyword arguments, typed.
    tiktoken's constructors return them as a dict; ``from_constructor`` takes that dict once, and
    everything after reads fields (a misspelt key is an AttributeError at once, not a None later)."""

    name: str
    pat_str: str
    mergeable_ranks: dict[bytes, int] = field(repr=False)
    special_tokens: dict[str, int]
    explicit_n_vocab: int | None = None

    @classmethod
    def from_constructor(cls, params: dict) -> TiktokenParams:
        """From a ``tiktoken_ext`` constructor's dict: ``tiktoken.Encoding``'s keywords, no others."""
        return cls(**params)

    def kwargs(self) -> dict:
        found = {"name": self.name, "pat_str": self.pat_str, "mergeable_ranks": self.mergeable_ranks,
                 "special_tokens": self.special_tokens}
        if self.explicit_n_vocab is not None:
            found["explicit_n_vocab"] = self.explicit_n_vocab
        return found

    def encoding(self) -> tiktoken.Encoding:
        import tiktoken  # here: this module stays a leaf (see its docstring)

        return tiktoken.Encoding(**self.kwargs())
