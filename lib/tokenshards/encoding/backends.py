"""Tokenizer backends: tiktoken (the reference) and faster exact BPE implementations.

A backend turns many texts into one flat uint32 array plus per-text lengths, in whatever way
is cheapest for it. Any backend other than tiktoken is trusted only while it agrees with
tiktoken: on a verification sample when the job starts, and on a sample of every partition.
"""
from __future__ import annotations

import array
import importlib.metadata
import re
from typing import Protocol, Sequence

import numpy as np
import tiktoken

from ..errors import UserError

FAST_BACKENDS = ("splintr", "riptoken")
"""Exact Rust BPEs ``auto`` tries, fastest first (GPT-2, one core, bench corpus: splintr ~2.9x and riptoken
~1.8x the tokens/s of tiktoken's ``encode_ordinary``)."""
BACKENDS = ("auto", "tiktoken", *FAST_BACKENDS)
DISTRIBUTIONS = {"tiktoken": "tiktoken", "riptoken": "riptoken", "splintr": "splintr-rs"}
UINT32_CODE = next(code for code in ("I", "L") if array.array(code).itemsize == 4)
CHECK_EVERY = 101
"""In every partition, documents 0, 101, 202, ... are re-encoded with tiktoken and compared
(~1% of the work): a fast backend that disagrees fails the job instead of writing wrong ids."""
HUGE_CHARS = 8_000_000
"""Documents longer than this go to tiktoken even under a fast backend: for one 100 MB document
splintr peaked ~0.5 GB higher than tiktoken here, and such documents are too rare for speed to matter."""
CHECK_MAX_CHARS = 1_000_000
"""A document longer than this is not the one spot-checked (the next shorter one of its stride is):
re-encoding a 200 MB document would double the worker's peak memory for one check."""


class Backend(Protocol):
    name: str
    eot_token: int

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all tokens as uint32, int64 token count per text), ``encode_ordinary`` semantics."""


class TiktokenBackend:
    """``encode_to_numpy`` with no special tokens allowed or disallowed is ``encode_ordinary``
    (special-token strings stay text) but returns a buffer, not a list of Python ints."""

    name = "tiktoken"

    def __init__(self, encoding: tiktoken.Encoding):
        self.encoding = encoding
        self.eot_token = encoding.eot_token

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encode = self.encoding.encode_to_numpy
        arrays = [encode(text, disallowed_special=()) for text in texts]
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
        return flat, lengths


class RiptokenBackend:
    """riptoken's Rust BPE built from the same ranks, pattern and special tokens."""

    name = "riptoken"

    def __init__(self, params: dict):
        import riptoken

        self.core = riptoken.CoreBPE(params["mergeable_ranks"], params["special_tokens"], params["pat_str"])
        self.eot_token = params["special_tokens"].get("<|endoftext|>")

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # riptoken hands back Python lists; array.fromlist copies them in C, ~2x np.fromiter.
        encode = self.core.encode_ordinary
        flat = array.array(UINT32_CODE)
        append_ids = flat.fromlist
        lengths = np.empty(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            ids = encode(text)
            append_ids(ids)
            lengths[i] = len(ids)
        return np.frombuffer(flat, dtype=np.uint32), lengths


class SplintrBackend:
    """splintr's Rust BPE with PCRE2 (its fastest regex engine here), built from the same ranks and
    pattern. No special tokens are given to it, so a special-token string in a text can only ever
    be text (``encode_ordinary``); the eot the job places is its own. Each text comes back as one
    ``bytes`` of little-endian uint32 ids: no Python int is ever made."""

    name = "splintr"

    def __init__(self, params: dict):
        import splintr

        from .ranks import dump_ranks

        vocab = dump_ranks(params["mergeable_ranks"])  # the .tiktoken format splintr reads
        tokenizer = splintr.Tokenizer.from_bytes(vocab, without_possessive_quantifiers(params["pat_str"]), {})
        try:
            tokenizer = tokenizer.pcre2(True)
        except ValueError:  # a build without PCRE2 keeps its own engine
            pass
        self.tokenizer = tokenizer
        self.eot_token = params["special_tokens"].get("<|endoftext|>")

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        chunks = list(map(self.tokenizer.encode_flat, texts))
        lengths = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks)) // 4
        return np.frombuffer(b"".join(chunks), dtype="<u4").astype(np.uint32, copy=False), lengths


_POSSESSIVE = re.compile(r"\\.|\[(?:\\.|[^\]])*\]|([*+?]|\{\d+(?:,\d*)?\})\+")


def without_possessive_quantifiers(pattern: str) -> str:
    """``x++`` → ``x+``, ``x?+`` → ``x?``, ``x{1,3}+`` → ``x{1,3}``; escapes and classes untouched.

    splintr's engine rejects possessive quantifiers, which tiktoken's patterns use only for
    speed: each is followed by something its repeat can never match, so dropping them changes
    no split. That is a claim about tiktoken's patterns, not all patterns, so the start-up
    verification and the per-partition spot checks are what make the backend trusted."""
    return _POSSESSIVE.sub(lambda m: m.group(1) or m.group(0), pattern)


class CheckedBackend:
    """A fast backend whose output is spot-checked against tiktoken in every batch."""

    def __init__(self, fast: Backend, reference: TiktokenBackend):
        self.fast, self.reference = fast, reference
        self.name = fast.name
        self.eot_token = reference.eot_token

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        if any(len(text) > HUGE_CHARS for text in texts):
            return self._with_huge(texts)
        flat, lengths = self.fast.encode_many(texts)
        ends = np.cumsum(lengths)
        for start in range(0, len(texts), CHECK_EVERY):
            i = next((j for j in range(start, min(start + CHECK_EVERY, len(texts)))
                      if len(texts[j]) <= CHECK_MAX_CHARS), None)
            if i is None:
                continue
            want = self.reference.encoding.encode_to_numpy(texts[i], disallowed_special=())
            if not np.array_equal(flat[ends[i] - lengths[i]:ends[i]], want):
                raise BackendMismatch(f"backend {self.name} disagrees with tiktoken on a document starting "
                                      f"{texts[i][:40]!r}; rerun with --backend tiktoken")
        return flat, lengths


    def _with_huge(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """tiktoken for documents over HUGE_CHARS (same ids, a third less peak memory than splintr's
        measured here), the fast backend for the rest, in the original order."""
        small = [i for i, text in enumerate(texts) if len(text) <= HUGE_CHARS]
        flat, lengths = self.encode_many([texts[i] for i in small]) if small else (np.zeros(0, np.uint32), [])
        ends = np.cumsum(lengths).tolist()
        pieces, all_lengths, k = [], np.empty(len(texts), dtype=np.int64), 0
        for i, text in enumerate(texts):
            if k < len(small) and small[k] == i:
                pieces.append(flat[ends[k] - lengths[k]:ends[k]])
                k += 1
            else:
                pieces.append(self.reference.encoding.encode_to_numpy(text, disallowed_special=()))
            all_lengths[i] = len(pieces[-1])
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.uint32)), all_lengths


class BackendMismatch(RuntimeError):
    pass


def backend_version(name: str) -> str:
    return f"{name} {importlib.metadata.version(DISTRIBUTIONS[name])}"


def build_backend(name: str, encoding: tiktoken.Encoding, params: dict) -> Backend:
    """The backend a worker uses (``name`` already resolved by ``choose_backend``)."""
    reference = TiktokenBackend(encoding)
    if name == "tiktoken":
        return reference
    if name in FAST_BACKENDS:
        return CheckedBackend(_fast_backend(name, params), reference)
    raise UserError(f"--backend {name!r} not supported, expected one of {BACKENDS}")


def _installed(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def verification_texts() -> list[str]:
    """Awkward strings plus real prose: what a fast backend must reproduce before it is used."""
    from pydoc_data.topics import topics

    awkward = [
        " ", "\n\n\t ", "<|endoftext|> stays text", "<|fim_prefix|><|endofprompt|>", "emoji 🙂👍🏽 👨‍👩‍👧‍👦 🇺🇦",
        "שלום עולם مرحبا", "中文、日本語、한국어", "NUL\x00byte", "a" * 20_000, "don't I'LL we've 123456789 1,000.5",
        "e\u0301 \ufeff \u200b", "    indented\r\n\r\ncode()  ", "x" + " " * 500 + "y",
    ]
    # Every Unicode White_Space character (regex engines disagree on what \s is) and letters and
    # digits outside the basic planes (and on which Unicode version \p{L} / \p{N} follow).
    for space in "\u00a0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000\u0085\x0b\x0c\x1c\x1f":
        awkward.append(f"a{space}b a {space}b a{space} b{space}{space}1{space}2 !{space}? x{space}\n{space}")
    awkward += ["ǅ ǈ ⅷ Ⅻ ① ½ ² ٣ ߁ 𝟘 𝐀 ʰ 〆 ヽ", "\U0001F600\U0001FAE8 \U00031350 \U0002EBF0 ꟊ 𑵀 𞀰 \U0001E4D0"]
    return awkward + [topics[k] for k in sorted(topics)[:60]]


def _fast_backend(name: str, params: dict) -> Backend:
    return {"splintr": SplintrBackend, "riptoken": RiptokenBackend}[name](params)


def _disagreement(name: str, params: dict, texts: list[str], want: np.ndarray) -> str | None:
    """None when backend ``name`` reproduces ``want`` on ``texts``, else why not."""
    try:
        fast, _ = _fast_backend(name, params).encode_many(texts)
    except Exception as e:  # a pattern its regex engine cannot compile, a crash in the extension...
        return f"{type(e).__name__}: {e}"
    return None if np.array_equal(fast, want) else "its ids differ from tiktoken's on the verification sample"


def choose_backend(requested: str, encoding: tiktoken.Encoding, params: dict) -> tuple[str, str]:
    """(backend name, one line saying why). ``auto`` takes the fastest installed backend that
    reproduces tiktoken on the verification sample, else tiktoken."""
    if requested not in BACKENDS:
        raise UserError(f"--backend {requested!r} not supported, expected one of {', '.join(BACKENDS)}")
    if requested == "tiktoken":
        return "tiktoken", backend_version("tiktoken")
    if requested != "auto" and not _installed(requested):
        raise UserError(f"--backend {requested}: {requested} is not installed; "
                        f"pip install {DISTRIBUTIONS[requested]} (or tokenshards[fast])")
    candidates = [requested] if requested != "auto" else [name for name in FAST_BACKENDS if _installed(name)]
    if not candidates:
        return "tiktoken", backend_version("tiktoken")
    texts = verification_texts()
    want, _ = TiktokenBackend(encoding).encode_many(texts)
    refused = []
    for name in candidates:
        why = _disagreement(name, params, texts, want)
        if why is None:
            return name, f"{backend_version(name)} (verified against tiktoken; spot-checked in every partition)"
        if requested == name:
            raise UserError(f"--backend {name} cannot be used for {encoding.name}: {why}; use --backend tiktoken")
        refused.append(f"{name} not used: {why}")
    return "tiktoken", f"{backend_version('tiktoken')} ({'; '.join(refused)})"
