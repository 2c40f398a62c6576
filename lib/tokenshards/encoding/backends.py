"""Tokenizer backends: tiktoken (the reference) and faster exact BPE implementations.

A backend turns many texts into one flat uint32 array plus per-text lengths, in whatever way
is cheapest for it. Any backend other than tiktoken is trusted only while it agrees with
tiktoken: on a verification sample when the job starts, and on a sample of every partition.
"""
from __future__ import annotations

import array
import functools
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tiktoken

from ..errors import UserError

from .patterns import without_possessive_quantifiers
from .ranks import dump_ranks
from .records import TiktokenParams
from .tojson import kept_tokenizer_json
from .names import BACKENDS, FAST_BACKENDS  # noqa: F401  (the CLI's choices; re-exported for the kinds)
DISTRIBUTIONS = {"tiktoken": "tiktoken", "riptoken": "riptoken", "splintr": "splintr-rs", "gigatoken": "gigatoken",
                 "tokenizers": "tokenizers", "sentencepiece": "sentencepiece", "transformers": "transformers"}
UINT32_CODE = next(code for code in ("I", "L") if array.array(code).itemsize == 4)
HUGE_CHARS = 8_000_000
"""Documents longer than this go to tiktoken even under a fast backend: for one 100 MB document
splintr peaked ~0.5 GB higher than tiktoken here, and such documents are too rare for speed to matter."""
CHECK_MAX_CHARS = 1_000_000
"""A document longer than this is never the one spot-checked: re-encoding a 200 MB document would
double the worker's peak memory for one check."""
SPOT_CHECK_CHARS = 16_384
"""In every partition, documents picked by a fixed hash of their position are re-encoded with
tiktoken and compared, up to this many characters (bytes, for Arrow input) in all: a fast backend
that disagrees fails the job instead of writing wrong ids. Bounded in text, not a share of
documents, because tiktoken runs at a tenth of gigatoken's speed: checking 1% of an 8 MB partition
cost ~10% of its time; 16 K characters cost ~1-5% (5% of a gigatoken task, sampled with py-spy)
and still reach a few documents of every partition."""

SPOT_CHECK_SHARE = 16
"""A batch of less than ``SPOT_CHECK_CHARS`` x this much text checks this share of it instead (at
least its shortest document): tiny partitions re-encoded ~80% of their text with tiktoken, ~1 ms of
a ~5 ms task at 20 KB (issue 24). A sixteenth is still ~30x the share a default 8.4 MB partition
gets."""


class Backend(Protocol):
    name: str
    eot_token: int | None

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all tokens as uint32, int64 token count per text), ``encode_ordinary`` semantics."""


class Reference(Backend, Protocol):
    """A tokenizer's own library (tiktoken, Hugging Face ``tokenizers``, ``sentencepiece``): the
    judge of every id a fast backend writes."""

    def encode_one(self, text: str) -> np.ndarray:
        """One text's ids (uint32), as ``encode_many`` gives them."""


class TiktokenBackend:
    """``encode_to_numpy`` with no special tokens allowed or disallowed is ``encode_ordinary``
    (special-token strings stay text) but returns a buffer, not a list of Python ints."""

    name = "tiktoken"
    judge = "tiktoken encode_ordinary"
    """How problems name it: the call whose ids every other backend must give."""

    def __init__(self, encoding: tiktoken.Encoding):
        self.encoding = encoding
        # tiktoken's eot_token raises where there is no <|endoftext|> (Llama 3's vocabulary)
        eot = "<|endoftext|>"
        self.eot_token = encoding.encode_single_token(eot) if eot in encoding.special_tokens_set else None

    def encode_one(self, text: str) -> np.ndarray:
        return self.encoding.encode_to_numpy(text, disallowed_special=())

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encode = self.encoding.encode_to_numpy
        arrays = [encode(text, disallowed_special=()) for text in texts]
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
        return flat, lengths


class RiptokenBackend:
    """riptoken's Rust BPE built from the same ranks, pattern and special tokens."""

    name = "riptoken"

    def __init__(self, params: TiktokenParams):
        import riptoken  # optional: tokenshards[fast]

        self.core = riptoken.CoreBPE(params.mergeable_ranks, params.special_tokens, params.pat_str)
        self.eot_token = params.special_tokens.get("<|endoftext|>")

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

    def __init__(self, params: TiktokenParams):
        import splintr  # optional: tokenshards[fast]

        vocab = dump_ranks(params.mergeable_ranks)  # the .tiktoken format splintr reads
        tokenizer = splintr.Tokenizer.from_bytes(vocab, without_possessive_quantifiers(params.pat_str), {})
        try:
            tokenizer = tokenizer.pcre2(True)
        except ValueError:  # a build without PCRE2 keeps its own engine
            pass
        self.tokenizer = tokenizer
        self.eot_token = params.special_tokens.get("<|endoftext|>")

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        chunks = list(map(self.tokenizer.encode_flat, texts))
        lengths = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks)) // 4
        return np.frombuffer(b"".join(chunks), dtype="<u4").astype(np.uint32, copy=False), lengths


GIGATOKEN_PRETOKENIZERS = {
    # tiktoken's r50k/p50k/gpt2 pattern (tiktoken_ext.openai_public.r50k_pat_str)
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""": "gpt2",
    # cl100k_base's
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""": "gpt4",
    # Meta's Llama 4 (llama_models.llama4.tokenizer.Tokenizer.O200K_PATTERN)
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""": "o200k",
}
"""gigatoken splits text with hand-written pretokenizers, one per known pattern, not with a regex:
it can stand in for tiktoken only where the encoding's pattern is one of these."""

GIGATOKEN_THROUGH_JSON = {
    # Meta's Llama 3 (llama_models.llama3.tokenizer.Tokenizer.pat_str), Llama 3.1's tokenizer.json's too
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
"""Patterns gigatoken knows from a tokenizer.json but not from a rank file: gigatoken 0.10's
``from_tiktoken`` panics on Meta's Llama 3 ranks ("assertion left == right", tiktoken.rs:614), so
they go through ``tojson.tokenizer_json`` (exact: tested on Meta's ranks) and ``from_json``."""


class GigatokenBackend:
    """gigatoken's Rust BPE (the one Megatron-LM's fast preprocessing path uses) from the same ranks,
    with no special tokens (a special-token string in a text stays text). ``encode_batch`` runs on
    the calling thread (``parallel=False``: one worker process per core already fills the cores)
    and returns one flat id buffer plus offsets.

    Its per-tokenizer pretoken cache is unbounded (measured: +1.3 GB over 200 MB of text made of
    unique words); the tokenizer is rebuilt (~0.15 s) whenever the memory its calls kept since the
    last build passes ``cache_bound`` bytes, so a worker's memory stays flat as the corpus grows."""

    name = "gigatoken"

    def __init__(self, params: TiktokenParams | None, *, cache_bound: int = 256 * 2**20, make=None, eot_token: int | None = None):
        """From tiktoken's ``params``, or from ``make()``, which builds a ``gigatoken.Tokenizer`` that
        matches no special token in text (the Hugging Face and SentencePiece kinds give one)."""
        import gigatoken  # noqa: F401  (ImportError here means: not installed)

        if make is None:
            pretokenizer = GIGATOKEN_PRETOKENIZERS.get(params.pat_str)
            if pretokenizer is not None:
                make = functools.partial(_gigatoken_from_ranks, dump_ranks(params.mergeable_ranks), pretokenizer)
            elif params.pat_str in GIGATOKEN_THROUGH_JSON:
                # Converted once per machine (~2-4 s for 128k ranks, then kept); a rebuild only parses it again.
                make = functools.partial(_gigatoken_from_json, kept_tokenizer_json(params.mergeable_ranks, params.pat_str))
            else:
                raise ValueError("gigatoken has no pretokenizer for this encoding's split pattern")
            eot_token = params.special_tokens.get("<|endoftext|>")
        self._make = make
        self.cache_bound = cache_bound
        self.eot_token = eot_token
        self.rebuilds = 0
        self._build()

    def _build(self) -> None:
        self.tokenizer = self._make()
        self._kept = 0

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        texts = list(texts)
        # A character is at most four UTF-8 bytes.
        return self._encode_list(texts, longest_bytes=4 * max(map(len, texts), default=0))

    def encode_arrow(self, column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """``encode_many`` of an Arrow string array without nulls. A column of more than
        ``BYTES_BELOW_BYTES`` is read in place: gigatoken takes an awkward array over the same UTF-8
        bytes. A smaller one goes as a list of Python bytes, one per document, copied by Arrow, never
        decoded to str (see there)."""
        if column.nbytes > BYTES_BELOW_BYTES:
            return self._encode(_awkward_strings(column))
        longest = pc.max(pc.binary_length(column)).as_py() or 0
        binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        return self._encode_list(column.view(binary).to_pylist(), longest_bytes=longest)

    def _encode_list(self, texts: list[str] | list[bytes], *, longest_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """A token holds at least one byte, so rows x the longest document's bytes bounds the
        padded matrix (``PADDED_MAX_CELLS``)."""
        if texts and len(texts) * longest_bytes <= PADDED_MAX_CELLS:
            return self._encode_padded(texts)
        return self._encode(texts)

    def _encode(self, texts) -> tuple[np.ndarray, np.ndarray]:
        before = _rss()
        layout = self.tokenizer.encode_batch(texts, parallel=False).layout
        offsets = np.asarray(layout.offsets)
        flat = np.asarray(layout.content.data)[offsets[0]:offsets[-1]]
        self._account(before, flat.nbytes + offsets.nbytes)
        return flat.view(np.uint32), np.diff(offsets).astype(np.int64, copy=False)

    def _encode_padded(self, texts: list[str] | list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """``_encode`` through gigatoken's padded matrix (rows x longest), which skips the awkward
        output (see ``PADDED_MAX_CELLS``); its rows, cut to their lengths, in order."""
        before = _rss()
        matrix, lengths = self.tokenizer.encode_batch_padded(texts, 0, parallel=False)
        self._account(before, matrix.nbytes + lengths.nbytes)
        flat = matrix[np.arange(matrix.shape[1]) < lengths[:, None]]
        return flat.astype(np.uint32, copy=False), lengths.astype(np.int64, copy=False)

    def _account(self, before: int, output_bytes: int) -> None:
        """What a call kept beyond its own output is (mostly) cache: past the bound, start afresh."""
        self._kept += max(0, _rss() - before - output_bytes)
        if self._kept > self.cache_bound:
            self._build()
            self.rebuilds += 1


def _gigatoken_from_json(text: str):
    import gigatoken  # optional: tokenshards[fast]

    return gigatoken.Tokenizer.from_json(text)


def _gigatoken_from_ranks(vocab: bytes, pretokenizer: str):
    import tempfile

    import gigatoken  # optional: tokenshards[fast]

    # from_tiktoken reads a path only; the file lives just long enough to be read.
    with tempfile.NamedTemporaryFile(suffix=".tiktoken") as f:
        f.write(vocab)
        f.flush()
        return gigatoken.Tokenizer.from_tiktoken(f.name, pretokenizer=pretokenizer, special_tokens={})


BYTES_BELOW_BYTES = 3 * 2**20
"""gigatoken unpacks an awkward input with a few awkward operations in Python: ~0.4 ms a call
whatever its size. A list of Python bytes costs a copy of the text instead (Arrow makes them; a str
per document would also decode the UTF-8, which gigatoken then encodes back: slower than awkward
from ~300 KB on). Whole calls through ``encode_arrow``, CPU medians of 5 over real row groups
(28 Nov), awkward vs bytes: 30 KB 0.56 vs 0.26 ms, 125 KB 1.04 vs 0.60, 0.5 MB 2.36 vs 1.85, 2 MB
7.0 vs 6.5, 4 MB 15.1 vs 14.9, 6 MB 21.7 vs 22.8 (the copy costs more per byte). Below this size
bytes win: a partition of ~0.5 MB saves ~0.5 ms, a tenth of its fixed cost (``docs/speed.md``)."""


PADDED_MAX_CELLS = 256 * 2**10
"""Batches whose rows x longest document (in bytes, which bounds its tokens) fit this go through
gigatoken's padded matrix (1 MiB of uint32 at most): gigatoken builds its awkward output with
awkward operations in Python, ~0.13 ms a call whatever the batch's size; the padded matrix
skips that (a 5-document, 18 KB batch: 0.07 against 0.20 ms of CPU, medians). Larger batches
would pad too much: they keep the awkward output, whose cost is nothing next to theirs."""


def _awkward_strings(column: pa.Array):
    """An awkward array of strings over an Arrow string/large_string array's own buffers (gigatoken
    reads int64 offsets; an Arrow ``string`` array's int32 ones are widened, one int per row)."""
    import awkward as ak  # heavy (~0.2 s), and gigatoken's: only its backend takes awkward strings

    if column.null_count:
        raise ValueError("null texts are skipped before encoding, not encoded")
    _, offsets_buf, data_buf = column.buffers()
    wide = pa.types.is_large_string(column.type)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if wide else np.int32, count=len(column) + 1,
                            offset=column.offset * (8 if wide else 4))
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return ak.Array(ak.contents.ListOffsetArray(
        ak.index.Index64(offsets.astype(np.int64, copy=False)),
        ak.contents.NumpyArray(data, parameters={"__array__": "char"}),
        parameters={"__array__": "string"}))


def _rss() -> int:
    """This process's resident bytes: Linux's /proc (one read), else psutil's (macOS, Windows;
    installed with distributed), so gigatoken's cache is bounded on a laptop too. A psutil
    ``Process`` is made per call: one kept would name the forkserver in the workers it forks."""
    try:
        with open(STATM, "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


STATM = "/proc/self/statm"


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class CheckedBackend:
    """A fast backend whose output is spot-checked against its tokenizer's reference library
    (tiktoken, ``tokenizers``, ``sentencepiece``) in every batch."""

    def __init__(self, fast: Backend, reference: Reference):
        self.fast, self.reference = fast, reference
        self.name = fast.name
        self.eot_token = reference.eot_token
        if hasattr(fast, "encode_arrow"):
            self.encode_arrow = self._encode_arrow

    def encode_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        if any(len(text) > HUGE_CHARS for text in texts):
            return self._with_huge(texts)
        flat, lengths = self.fast.encode_many(texts)
        self._check(flat, lengths, np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), texts.__getitem__)
        return flat, lengths

    def _encode_arrow(self, column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        sizes = pc.binary_length(column).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        if len(sizes) and sizes.max() > HUGE_CHARS:  # maybe a huge document: tiktoken takes those
            return self.encode_many(column.to_pylist())
        flat, lengths = self.fast.encode_arrow(column)
        self._check(flat, lengths, sizes, lambda i: column[int(i)].as_py())
        return flat, lengths

    def _check(self, flat: np.ndarray, lengths: np.ndarray, sizes: np.ndarray, text) -> None:
        ends = np.cumsum(lengths)
        for i in spot_check_sample(sizes):
            doc = text(i)
            want = self.reference.encode_one(doc)
            if not np.array_equal(flat[ends[i] - lengths[i]:ends[i]], want):
                fix = "tiktoken" if self.reference.name == "tiktoken" else "reference"
                raise BackendMismatch(f"backend {self.name} disagrees with {self.reference.name} on a document starting "
                                      f"{doc[:40]!r}; rerun with --backend {fix}")

    def _with_huge(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The reference for documents over HUGE_CHARS (tiktoken: same ids, a third less peak memory
        than splintr's measured here), the fast backend for the rest, in the original order."""
        small = [i for i, text in enumerate(texts) if len(text) <= HUGE_CHARS]
        flat, lengths = self.encode_many([texts[i] for i in small]) if small else (np.zeros(0, np.uint32), [])
        ends = np.cumsum(lengths).tolist()
        pieces, all_lengths, k = [], np.empty(len(texts), dtype=np.int64), 0
        for i, text in enumerate(texts):
            if k < len(small) and small[k] == i:
                pieces.append(flat[ends[k] - lengths[k]:ends[k]])
                k += 1
            else:
                pieces.append(self.reference.encode_one(text))
            all_lengths[i] = len(pieces[-1])
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.uint32)), all_lengths


def spot_check_sample(sizes: Sequence[int]) -> np.ndarray:
    """Positions to re-check, ascending: in the order of a fixed hash of the position (the same
    documents on every run), those no longer than the batch's budget (``SPOT_CHECK_CHARS``, or a
    ``SPOT_CHECK_SHARE`` of a small batch's text), while their sum fits it; when none does, the
    shortest document if it is at most ``CHECK_MAX_CHARS`` long."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if not len(sizes):
        return np.zeros(0, dtype=np.int64)
    budget = min(SPOT_CHECK_CHARS, int(sizes.sum()) // SPOT_CHECK_SHARE)
    order = np.argsort((np.arange(len(sizes), dtype=np.uint64) * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF), kind="stable")
    fits = order[sizes[order] <= budget]
    picked = fits[np.cumsum(sizes[fits]) <= budget]
    if len(picked):
        return np.sort(picked)
    shortest = int(np.argmin(sizes))
    return np.array([shortest] if sizes[shortest] <= CHECK_MAX_CHARS else [], dtype=np.int64)


class BackendMismatch(RuntimeError):
    pass


def backend_version(name: str) -> str:
    return f"{name} {importlib.metadata.version(DISTRIBUTIONS[name])}"


def build_backend(name: str, encoding: tiktoken.Encoding, params: TiktokenParams, *, verified: Backend | None = None) -> Backend:
    """The backend a worker uses (``name`` already resolved by ``choose``; ``verified``, the
    instance ``choose`` checked, is used as it is)."""
    reference = TiktokenBackend(encoding)
    if name in ("tiktoken", "reference"):
        return reference
    if name in FAST_BACKENDS:
        return CheckedBackend(verified if verified is not None else _fast_backend(name, params), reference)
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


def _fast_backend(name: str, params: TiktokenParams) -> Backend:
    return {"gigatoken": GigatokenBackend, "splintr": SplintrBackend, "riptoken": RiptokenBackend}[name](params)


def _verified(name: str, params: TiktokenParams, texts: list[str], want: np.ndarray) -> tuple[Backend | None, str | None]:
    """(the built backend, None) when ``name`` reproduces ``want`` on ``texts``, else (None, why not)."""
    return verified_against(lambda: _fast_backend(name, params), texts, want, reference="tiktoken")


def verified_against(make, texts: list[str], want: np.ndarray, *, reference: str) -> tuple[Backend | None, str | None]:
    """(``make()``, None) when the backend it builds gives ``want`` for ``texts``, else (None, why not)."""
    try:
        fast = make()
        ids, _ = fast.encode_many(texts)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a pattern it cannot compile; a Rust panic (pyo3's PanicException is no Exception)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return (fast, None) if np.array_equal(ids, want) else (None, f"its ids differ from {reference}'s on the verification sample")


@dataclass(frozen=True)
class Choice:
    """What ``choose`` decided: the backend's name, one line saying why, and the fast backend it
    verified (None for tiktoken), so that whoever builds the worker's backend need not build it twice."""

    name: str
    note: str
    verified: Backend | None = None


def check_request(requested: str) -> None:
    """The errors ``choose`` would raise before it builds anything: cheap, so a run checks them
    before its cluster starts."""
    if requested not in BACKENDS:
        raise UserError(f"--backend {requested!r} not supported, expected one of {', '.join(BACKENDS)}")
    if requested not in ("auto", "reference", "tiktoken") and not _installed(requested):
        raise UserError(f"--backend {requested}: {requested} is not installed; "
                        f"pip install {DISTRIBUTIONS[requested]} (or tokenshards[fast])")


def choose(requested: str, encoding: tiktoken.Encoding, params: TiktokenParams) -> Choice:
    """``auto`` takes the fastest installed backend that reproduces tiktoken on the verification
    sample, else tiktoken; a named fast backend must reproduce it or the run stops."""
    check_request(requested)
    if requested in ("tiktoken", "reference"):
        return Choice("tiktoken", backend_version("tiktoken"))
    candidates = [requested] if requested != "auto" else [name for name in FAST_BACKENDS if _installed(name)]
    if not candidates:
        return Choice("tiktoken", backend_version("tiktoken"))
    texts = verification_texts()
    want, _ = TiktokenBackend(encoding).encode_many(texts)
    refused = []
    for name in candidates:
        fast, why = _verified(name, params, texts, want)
        if fast is not None:
            return Choice(name, f"{backend_version(name)} (verified against tiktoken; spot-checked in every partition)", fast)
        if requested == name:
            raise UserError(f"--backend {name} cannot be used for {encoding.name}: {why}; use --backend tiktoken")
        refused.append(f"{name} not used: {why}")
    return Choice("tiktoken", f"{backend_version('tiktoken')} ({'; '.join(refused)})")
