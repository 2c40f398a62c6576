"""What the tokenizer kinds loaded through another library than tiktoken share (``hf``,
``sentencepiece``): the library is the reference, gigatoken the fast path where it reproduces it.

A kind module subclasses ``LibraryTokenizer`` with its loader, its reference and how gigatoken is
built for it; everything a run asks of a tokenizer (boundaries, the manifest block, the backend
choice, the worker's build) is here once.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
from typing import Callable

import numpy as np

from ..errors import UserError
from .backends import FAST_BACKENDS, Choice, CheckedBackend, backend_version, verification_texts, verified_against
from .boundaries import Boundaries
from .records import SourceFile, token_dtype


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LibraryTokenizer:
    """A loaded tokenizer of a kind whose reference is a library other than tiktoken. Pickles as
    its files' bytes (what the worker plugin ships); the built objects are made again where used."""

    kind = ""
    library = ""
    """The reference's distribution name (``tokenizers``, ``sentencepiece``): ``--backend reference``."""
    legacy = False
    encoding = None
    """No tiktoken encoding behind it."""

    def __init__(self, *, name: str, source: str, files: tuple[SourceFile, ...], payload: bytes, extra: bytes = b""):
        self.name, self.source, self.files = name, source, files
        self.payload = payload
        """The bytes that rebuild the tokenizer anywhere (``tokenizer.json``'s, the ``.model``'s)."""
        self.extra = extra
        """Bytes that change what a document becomes besides the payload (``tokenizer_config.json``'s)."""

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 over the kind and its files' bytes: two runs agree on it iff ids and boundaries agree."""
        h = hashlib.sha256(self.kind.encode() + b"\0")
        h.update(sha256(self.payload).encode())
        h.update(sha256(self.extra).encode())
        return h.hexdigest()

    # -- what a kind module provides -----------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        raise NotImplementedError

    @property
    def bos(self) -> int | None:
        raise NotImplementedError

    @property
    def eos(self) -> int | None:
        raise NotImplementedError

    @property
    def natural(self) -> Boundaries:
        raise NotImplementedError

    def token_name(self, token: int) -> str:
        raise NotImplementedError

    def reference(self):
        raise NotImplementedError

    def gigatoken(self):
        """A ``GigatokenBackend`` that matches no special token in text; raises when it cannot load."""
        raise NotImplementedError

    def special_strings(self) -> list[str]:
        """Texts made of the tokenizer's control tokens' strings: verified as ordinary text."""
        return []

    # -- shared ---------------------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return token_dtype(self.n_vocab)

    def block(self, boundaries: Boundaries) -> dict:
        """The manifest's ``encoding`` block (format v1, extended: DESIGN.md)."""
        fallback = self.eos if self.eos is not None else self.bos if self.bos is not None else 0
        return {"name": self.name, "n_vocab": self.n_vocab, "eot": boundaries.eot(fallback), "dtype": self.dtype,
                "kind": self.kind, "source": self.source, "files": [f.to_dict() for f in self.files],
                "prefix": list(boundaries.prefix), "suffix": list(boundaries.suffix)}

    def choose(self, requested: str) -> Choice:
        """``auto``: gigatoken when installed and it reproduces the reference on awkward text,
        else the reference library's own encoder (one thread per worker), said in one line."""
        if requested in ("tiktoken", *[b for b in FAST_BACKENDS if b != "gigatoken"]):
            raise UserError(f"--backend {requested} encodes tiktoken encodings only; {self.name} is a {self.kind} "
                            "tokenizer: use --backend auto, reference or gigatoken")
        reference = backend_version(self.library)
        if requested == "reference":
            return Choice(self.library, f"{reference} (the reference, as asked)")
        if importlib.util.find_spec("gigatoken") is None:
            if requested == "gigatoken":
                raise UserError("--backend gigatoken: gigatoken is not installed; pip install gigatoken (or tokenshards[fast])")
            return Choice(self.library, f"{reference} (gigatoken is not installed: the reference library's own encoder, "
                                        "one thread per worker)")
        texts = verification_texts() + self.special_strings()
        want, _ = self.reference().encode_many(texts)
        fast, why = verified_against(self.gigatoken, texts, want, reference=self.library)
        if fast is not None:
            return Choice("gigatoken", f"{backend_version('gigatoken')} (verified against {reference}; "
                                       "spot-checked in every partition)", fast)
        if requested == "gigatoken":
            raise UserError(f"--backend gigatoken cannot encode {self.name} exactly: {why}; use --backend reference")
        return Choice(self.library, f"{reference}: gigatoken cannot reproduce this tokenizer exactly ({why}); "
                                    "the reference library's own encoder encodes it, one thread per worker")

    def build(self, backend: str, *, verified=None):
        reference = self.reference()
        if backend in (self.library, "reference"):
            return reference
        if backend == "gigatoken":
            return CheckedBackend(verified if verified is not None else self.gigatoken(), reference)
        raise UserError(f"--backend {backend!r} cannot encode a {self.kind} tokenizer; use auto, reference or gigatoken")


def flat_ids(lists, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(all ids as uint32, int64 count per text) from one list of ids per text."""
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=count)
    flat = np.fromiter((i for ids in lists for i in ids), dtype=np.uint32, count=int(lengths.sum()))
    return flat, lengths


def read_file(path, what: str, *, fix: str) -> bytes:
    """A local file's bytes; a missing or unreadable one is one line naming it and the fix."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or type(e).__name__}; {fix}") from e


Loader = Callable[..., LibraryTokenizer]
