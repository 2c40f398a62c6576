"""The pure core: texts → tokens, compared with tiktoken's encode_ordinary directly."""
import numpy as np
import pytest

from tokenshards.backends import BackendMismatch, TiktokenBackend, build_backend, choose_backend
from tokenshards.errors import UserError
from tokenshards.encoders import load_encoding
from tokenshards.plan import InputFile, plan_pieces
from tokenshards.tokenize import tokenize_texts

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


@pytest.fixture(scope="module", params=["tiktoken", "riptoken"])
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


def test_auto_backend_takes_riptoken_only_when_it_matches_tiktoken(gpt2):
    loaded = load_encoding("gpt2")
    name, why = choose_backend("auto", loaded.encoding, loaded.params)
    assert name == "riptoken" and "verified against tiktoken" in why
    assert choose_backend("tiktoken", loaded.encoding, loaded.params)[0] == "tiktoken"
    wrong = dict(loaded.params, pat_str=r"\S+|\s+")  # same ranks, other split: other ids
    assert choose_backend("auto", loaded.encoding, wrong)[0] == "tiktoken"
    with pytest.raises(UserError, match="--backend riptoken cannot be used for gpt2"):
        choose_backend("riptoken", loaded.encoding, wrong)


def test_a_disagreeing_fast_backend_fails_the_batch(gpt2):
    loaded = load_encoding("gpt2")
    backend = build_backend("riptoken", gpt2, dict(loaded.params, pat_str=r"\S+|\s+"))
    with pytest.raises(BackendMismatch, match="disagrees with tiktoken"):
        backend.encode_many(["hello world, this is text"])
