"""Generated texts through every fast backend's every path give their reference library's ids (issue 57).

The fast backends are exact only where they were checked. Their input and output paths change with
a batch's size: gigatoken takes Python bytes up to ``BYTES_BELOW_BYTES`` and an awkward array past it,
and returns a padded matrix up to ``PADDED_MAX_CELLS``. So each generated batch goes through each
path (the thresholds are forced to either side), as Arrow columns of both offset widths and as
Python strs. The ids are judged by tiktoken's ``encode_ordinary`` of each document, and by nothing
of ours. A special token's text in a document is ordinary text.

The tokenizers models are trained with (Llama 3 and 4's rank files, Qwen3's, Llama 3.1's and Gemma 3's
``tokenizer.json``, Mistral's SentencePiece models) go through gigatoken the same way, judged by
their own libraries as ``tokenizerfiles.py`` builds them (Meta's ``Tokenizer``, ``tokenizers``,
``sentencepiece``), on generated text that holds each one's own special-token strings.
"""
from __future__ import annotations

from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tokenshards.encoding import backends, registry
from tokenshards.encoding.encoders import load_encoding

FRAGMENTS = ["<|endoftext|>", "<|fim_prefix|>", " 's", "'ll", "\r\n", "\n\n", "  ", "\t", "123456", "🙂", "👨‍👩‍👧",
             "e\u0301", "\ufeff", "\u200b", "\x00", "日本語", "שלום", " the", "A" * 40]
"""Pieces that split or merge at the pattern's edges (contractions, runs of spaces and digits,
line ends, joiners), special tokens' text, and scripts without spaces."""

SENTENCEPIECE_FRAGMENTS = ["▁", "▁▁x", "ﬁ", "\u3000", "\ue000", "\U0010fffd", "\u1100\u1161", " \n ", "<0x0A>"]
"""What SentencePiece models and Gemma's normalizer treat apart: the meta-space itself, compatibility
forms, the ideographic space, code points only byte fallback can spell, Hangul jamo."""


def texts_of(fragments: list[str]):
    return st.lists(st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40), st.sampled_from(fragments)),
                    max_size=8).map("".join)


def batches_of(fragments: list[str]):
    return st.lists(texts_of(fragments).filter(bool), min_size=1, max_size=12)


batches = batches_of(FRAGMENTS)


@pytest.fixture(scope="module")
def reference():
    return load_encoding("gpt2").encoding


@pytest.fixture(scope="module", params=backends.FAST_BACKENDS)
def fast(request):
    loaded = load_encoding("gpt2")
    return backends.build_backend(request.param, loaded.encoding, loaded.params).fast


@settings(max_examples=150, deadline=None)
@given(batch=batches)
@example(batch=["<|endoftext|>"])
@example(batch=["a" * 5_000, " 's 'll\r\n\r\n", "🙂" * 300])
def test_every_path_gives_tiktokens_ids(fast, reference, batch):
    want = [reference.encode_ordinary(t) for t in batch]
    flat_want = [i for w in want for i in w]
    lengths_want = [len(w) for w in want]
    columns = [pa.array(batch, pa.string()), pa.array(batch, pa.large_string()),
               pa.array(["x", *batch], pa.string()).slice(1)] if hasattr(fast, "encode_arrow") else []  # a slice: offsets not from 0
    # The thresholds choose gigatoken's paths; the other backends have one path each.
    paths = [(bytes_below, cells) for bytes_below in (0, 2**40) for cells in (0, 2**40)] \
        if isinstance(fast, backends.GigatokenBackend) else [(backends.BYTES_BELOW_BYTES, backends.PADDED_MAX_CELLS)]
    for bytes_below, cells in paths:
        with mock.patch.object(backends, "BYTES_BELOW_BYTES", bytes_below), \
                mock.patch.object(backends, "PADDED_MAX_CELLS", cells):
            for column in columns:
                flat, lengths = fast.encode_arrow(column)
                assert lengths.tolist() == lengths_want, (bytes_below, cells, column.type)
                assert flat.tolist() == flat_want, (bytes_below, cells, column.type)
            flat, lengths = fast.encode_many(batch)
            assert lengths.tolist() == lengths_want and flat.tolist() == flat_want, (bytes_below, cells, "strs")


TRAINED = ["llama3", "llama4", "hf-qwen3", "hf-llama3_1", "hf-gemma3", "sp-mistral-v1", "sp-mistral-v3"]


@pytest.fixture(scope="module", params=TRAINED)
def trained(request, tokenizer_files, references):
    """(gigatoken as a run builds it for this tokenizer file, the file's own library, fragments)."""
    key = request.param
    loaded = registry.load(key if key in ("llama3", "llama4") else str(tokenizer_files[key]))
    reference = references[key]
    return loaded.build("gigatoken").fast, reference, FRAGMENTS + SENTENCEPIECE_FRAGMENTS + list(reference.specials[:300])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_trained_tokenizer_gives_its_librarys_ids(trained, data):
    """1,000 random batches per tokenizer were explored before this was kept (29 Nov): all equal."""
    fast, reference, fragments = trained
    batch = data.draw(batches_of(fragments), label="batch")
    want = [reference.encode(t) for t in batch]
    paths = [(bytes_below, cells) for bytes_below in (0, 2**40) for cells in (0, 2**40)] \
        if hasattr(fast, "encode_arrow") else []  # Mistral v3's routed backend reads Python strs only
    for bytes_below, cells in paths:
        with mock.patch.object(backends, "BYTES_BELOW_BYTES", bytes_below), \
                mock.patch.object(backends, "PADDED_MAX_CELLS", cells):
            for column in (pa.array(batch, pa.string()), pa.array(batch, pa.large_string())):
                assert documents(*fast.encode_arrow(column)) == want, (bytes_below, cells, column.type)
    assert documents(*fast.encode_many(batch)) == want, "strs"


def documents(flat, lengths) -> list[list[int]]:
    ends = lengths.cumsum()
    return [flat[end - n:end].tolist() for end, n in zip(ends, lengths)]
