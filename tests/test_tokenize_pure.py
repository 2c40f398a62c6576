"""The pure core: texts → tokens, compared with tiktoken's encode_ordinary directly."""
import numpy as np
import pytest

from tokenshards.encoding.backends import (FAST_BACKENDS, BackendMismatch, TiktokenBackend, build_backend, choose_backend,
                                  without_possessive_quantifiers)
from tokenshards.errors import UserError
from tokenshards.encoding.encoders import load_encoding
from tokenshards.tokenize.plan import InputFile, plan_pieces
from tokenshards.tokenize.core import tokenize_texts

AWKWARD = [
    "plain English text, with punctuation!",
    None,
    "",
    " ",
    "\n\t  \n",
    "<|endoftext|> is ordinary text here, and so is <|fim_prefix|><|endofprompt|>",
    "emoji 🙂👍🏽 and a ZWJ family 👨‍👩‍👧‍👦 and a flag 🇺🇦",
    "右から左: שלום עולם مرحبا بالعالم",
    "中文、日本語、한국어のテキスト",
    "NUL\x00inside\x00text",
    "a" * 300_000,
    "combining e\u0301 and \ufeffBOM and \u200b zero width",
]


@pytest.fixture(scope="module", params=["tiktoken", *FAST_BACKENDS])
def backend(request):
    loaded = load_encoding("gpt2")
    return build_backend(request.param, loaded.encoding, loaded.params)


@pytest.mark.parametrize("eot_position", ["prefix", "suffix", "none"])
def test_tokens_equal_encode_ordinary_with_eot_placed(gpt2, backend, eot_position):
    batch = tokenize_texts(AWKWARD, backend, eot_position=eot_position, dtype="uint16")
    assert batch.tokens.dtype == np.uint16
    assert (batch.skipped_null, batch.skipped_empty) == (1, 1)
    kept = [t for t in AWKWARD if t]
    assert batch.kept.tolist() == [i for i, t in enumerate(AWKWARD) if t]
    assert len(batch.lengths) == len(kept)
    for text, start, length in zip(kept, batch.starts, batch.lengths):
        body = gpt2.encode_ordinary(text)
        want = {"prefix": [gpt2.eot_token] + body, "suffix": body + [gpt2.eot_token], "none": body}[eot_position]
        assert batch.tokens[start:start + length].tolist() == want
    assert batch.lengths.sum() == len(batch.tokens)


def test_special_token_strings_are_never_special(gpt2, backend):
    batch = tokenize_texts(["<|endoftext|>"], backend, eot_position="none", dtype="uint16")
    assert batch.tokens.tolist() == gpt2.encode_ordinary("<|endoftext|>")
    assert gpt2.eot_token not in batch.tokens.tolist()


def test_cl100k_needs_uint32(cl100k):
    batch = tokenize_texts(AWKWARD, TiktokenBackend(cl100k), eot_position="prefix", dtype="uint32")
    assert batch.tokens.dtype == np.uint32
    assert batch.tokens.max() > 65535 or cl100k.eot_token > 65535
    with pytest.raises(ValueError, match="does not fit uint16"):
        tokenize_texts(["<|endoftext|>"], TiktokenBackend(cl100k), eot_position="prefix", dtype="uint16")


def test_all_skipped_gives_empty_arrays(backend):
    batch = tokenize_texts([None, "", None], backend, eot_position="prefix", dtype="uint16")
    assert len(batch.tokens) == 0 and len(batch.lengths) == 0 and len(batch.starts) == 0
    assert (batch.skipped_null, batch.skipped_empty) == (2, 1)


def _file(url, sizes, rows=10):
    return InputFile(url=url, name=url, rows=rows * len(sizes), bytes=sum(sizes), row_group_rows=(rows,) * len(sizes),
                     row_group_text_bytes=tuple(sizes), id_column="id")


def test_plan_groups_row_groups_up_to_target_and_never_splits_one():
    files = [_file("b.parquet", [40, 40, 40, 200, 10]), _file("a.parquet", [5, 5])]
    pieces = plan_pieces(files, target_bytes=100)
    assert [(p.input, p.row_groups, p.first_row, p.rows) for p in pieces] == [
        ("a.parquet", (0, 2), 0, 20),
        ("b.parquet", (0, 2), 0, 20),
        ("b.parquet", (2, 3), 20, 10),
        ("b.parquet", (3, 4), 30, 10),
        ("b.parquet", (4, 5), 40, 10),
    ]
    assert [p.index for p in pieces] == list(range(5))
    assert plan_pieces(list(reversed(files)), target_bytes=100) == pieces


def test_auto_backend_takes_the_fastest_that_matches_tiktoken(gpt2):
    loaded = load_encoding("gpt2")
    name, why = choose_backend("auto", loaded.encoding, loaded.params)
    assert name == "splintr" and "verified against tiktoken" in why
    assert choose_backend("riptoken", loaded.encoding, loaded.params)[0] == "riptoken"
    assert choose_backend("tiktoken", loaded.encoding, loaded.params)[0] == "tiktoken"
    wrong = dict(loaded.params, pat_str=r"\S+|\s+")  # same ranks, other split: other ids
    name, why = choose_backend("auto", loaded.encoding, wrong)
    assert name == "tiktoken" and "splintr not used" in why and "riptoken not used" in why
    for fast in FAST_BACKENDS:
        with pytest.raises(UserError, match=f"--backend {fast} cannot be used for gpt2"):
            choose_backend(fast, loaded.encoding, wrong)


@pytest.mark.parametrize("encoding", ["gpt2", "cl100k_base"])
def test_fast_backends_match_tiktoken_on_real_prose(encoding):
    """Beyond the awkward rows: the start-up sample (Unicode spaces, astral letters) and every
    CPython doc topic, in both vocabulary sizes."""
    from pydoc_data.topics import topics

    from tokenshards.encoding.backends import verification_texts

    loaded = load_encoding(encoding)
    texts = verification_texts() + [topics[k] for k in sorted(topics)]
    want, want_lengths = TiktokenBackend(loaded.encoding).encode_many(texts)
    for fast in FAST_BACKENDS:
        got, lengths = build_backend(fast, loaded.encoding, loaded.params).encode_many(texts)
        assert got.dtype == np.uint32 and np.array_equal(got, want) and np.array_equal(lengths, want_lengths), fast


def test_possessive_quantifiers_are_dropped_outside_escapes_and_classes():
    gpt2 = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
    assert without_possessive_quantifiers(gpt2) == r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+$|\s+(?!\S)|\s"""
    cl100k = r"""[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s*[\r\n]"""
    assert without_possessive_quantifiers(cl100k) == r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]"""
    for untouched in [r"\++", r"[+]+", r"a+?", r"(?:x)+", r"\p{L}+"]:
        assert without_possessive_quantifiers(untouched) == untouched


@pytest.mark.parametrize("fast", FAST_BACKENDS)
def test_a_disagreeing_fast_backend_fails_the_batch(gpt2, fast):
    loaded = load_encoding("gpt2")
    backend = build_backend(fast, gpt2, dict(loaded.params, pat_str=r"\S+|\s+"))
    with pytest.raises(BackendMismatch, match="disagrees with tiktoken"):
        backend.encode_many(["hello world, this is text"])


def test_huge_documents_go_to_tiktoken_under_a_fast_backend_with_equal_ids(gpt2, monkeypatch):
    """Documents over HUGE_CHARS are encoded by tiktoken (lower peak memory), the rest by the fast
    backend: the ids and their order are the same either way."""
    from tokenshards.encoding import backends

    loaded = load_encoding("gpt2")
    for name in FAST_BACKENDS:
        fast = build_backend(name, loaded.encoding, loaded.params)
        monkeypatch.setattr(backends, "HUGE_CHARS", 40)
        monkeypatch.setattr(backends, "CHECK_MAX_CHARS", 40)
        texts = [t for t in AWKWARD if t][:8] + ["short", "x" * 41 + " huge enough"]
        flat, lengths = fast.encode_many(texts)
        want = [gpt2.encode_ordinary(t) for t in texts]
        assert lengths.tolist() == [len(w) for w in want]
        assert flat.tolist() == [i for w in want for i in w]
