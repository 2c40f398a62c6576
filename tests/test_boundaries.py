"""Boundaries and the tokenizer registry, without a cluster: pure functions and small tokenizers
trained here with Hugging Face ``tokenizers`` (the real files are in test_tokenizers.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Regex

from tokenshards.encoding import registry
from tokenshards.encoding.boundaries import Boundaries, resolve
from tokenshards.encoding.backends import verification_texts
from tokenshards.errors import UserError
from tokenshards.tokenize.core import tokenize_texts

TEXTS = [t for t in verification_texts() if len(t) < 2000] * 3 + ["<|endoftext|> is text", "<s>[INST] hi [/INST]</s>"]


LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
"""Llama 3.1's tokenizer.json split pattern: one gigatoken knows."""


class _Listed:
    """A backend that gives each text its characters' code points (ids below 1000 here)."""

    name = "listed"
    eot_token = None

    def encode_many(self, texts):
        ids = [[ord(c) % 1000 for c in t] for t in texts]
        return (np.array([i for x in ids for i in x], dtype=np.uint32), np.array([len(x) for x in ids], dtype=np.int64))


@pytest.mark.parametrize("prefix,suffix", [((), ()), ((7,), ()), ((), (9,)), ((7,), (9,)), ((5, 6), (8, 9, 10))])
def test_documents_are_prefix_ids_suffix(prefix, suffix):
    texts = ["abc", None, "", "d", "éèê 中文"]
    batch = tokenize_texts(texts, _Listed(), dtype="uint16", boundaries=Boundaries(prefix=prefix, suffix=suffix))
    assert batch.kept.tolist() == [0, 3, 4] and (batch.skipped_null, batch.skipped_empty) == (1, 1)
    docs = [batch.tokens[s:s + n].tolist() for s, n in zip(batch.starts, batch.lengths)]
    assert docs == [[*prefix, *(ord(c) % 1000 for c in texts[i]), *suffix] for i in (0, 3, 4)]


def test_eot_position_still_places_one_eot():
    backend = _Listed()
    backend.eot_token = 999
    batch = tokenize_texts(["ab"], backend, dtype="uint16", eot_position="suffix")
    assert batch.tokens.tolist() == [97, 98, 999]


def test_boundary_id_past_dtype_is_refused():
    with pytest.raises(ValueError, match="does not fit uint16"):
        tokenize_texts(["a"], _Listed(), dtype="uint16", boundaries=Boundaries(prefix=(70_000,)))


def test_resolve_each_request():
    natural = Boundaries(prefix=(1,), why="its own")
    assert resolve("auto", natural=natural, bos=1, eos=2, tokenizer="t") == natural
    assert resolve("bos", natural=natural, bos=1, eos=2, tokenizer="t").prefix == (1,)
    assert resolve("eos", natural=natural, bos=1, eos=2, tokenizer="t").suffix == (2,)
    both = resolve("both", natural=natural, bos=1, eos=2, tokenizer="t")
    assert (both.prefix, both.suffix, both.eot_position, both.eot(0)) == ((1,), (2,), "prefix", 1)
    assert resolve("none", natural=natural, bos=1, eos=2, tokenizer="t").eot_position == "none"
    with pytest.raises(UserError, match="--boundary bos: tokenizer qwen has no beginning-of-text token"):
        resolve("bos", natural=natural, bos=None, eos=2, tokenizer="qwen")


def _train(tmp_path, *, template: str | None, pre="bytelevel", config: dict | None = None, model="BPE"):
    """A small tokenizer.json (+ tokenizer_config.json) trained on Python's docs."""
    from pydoc_data.topics import topics

    specials = ["<|endoftext|>", "<s>", "</s>", "<|im_start|>"]
    if model == "WordPiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(vocab_size=500, special_tokens=["[UNK]", *specials])
    else:
        tok = Tokenizer(models.BPE())
        trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    if pre == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(list(topics.values()), trainer=trainer)
    if template:
        tok.post_processor = processors.TemplateProcessing(single=template, pair=f"{template} $B",
                                                           special_tokens=[(s, tok.token_to_id(s)) for s in specials])
    folder = tmp_path / "tok"
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_hf_boundaries_from_post_processor_or_end_of_text(tmp_path):
    with_bos = registry.load(str(_train(tmp_path / "a", template="<s> $A")))
    assert with_bos.kind == "hf" and with_bos.natural.prefix == (with_bos.bos,) and with_bos.natural.suffix == ()
    # Nothing added by the tokenizer (Qwen): its end-of-text token after each document, not the
    # config's eos_token (a chat's end of turn).
    plain = registry.load(str(_train(tmp_path / "b", template=None, config={"eos_token": "<|im_start|>"})))
    eot = plain._tokenizer.token_to_id("<|endoftext|>")
    assert plain.natural.suffix == (eot,) and plain.natural.prefix == () and plain.eos == eot


def test_hf_manifest_block_and_choice(tmp_path):
    folder = _train(tmp_path, template="<s> $A </s>", config={"bos_token": "<s>"})
    loaded = registry.load(str(folder))
    boundaries = loaded.natural
    block = loaded.block(boundaries)
    assert block["kind"] == "hf" and block["prefix"] == [loaded.bos] and block["suffix"] == [loaded._tokenizer.token_to_id("</s>")]
    assert [f["name"] for f in block["files"]] == ["tokenizer.json", "tokenizer_config.json"]
    assert block["dtype"] == "uint16" and block["eot"] == loaded.bos
    choice = loaded.choose("auto")
    assert choice.name == "gigatoken", choice.note
    backend = loaded.build(choice.name, verified=choice.verified)
    reference = loaded.reference()
    got, lengths = backend.encode_many(TEXTS)
    want, want_lengths = reference.encode_many(TEXTS)
    assert np.array_equal(got, want) and np.array_equal(lengths, want_lengths)
    # The special-token strings of a document stay text.
    ids = reference.encode_one("x <|endoftext|> <s>").tolist()
    assert loaded._tokenizer.token_to_id("<|endoftext|>") not in ids and loaded.bos not in ids


def test_hf_gigatoken_cannot_load_falls_back_to_reference_in_one_line(tmp_path):
    loaded = registry.load(str(_train(tmp_path, template=None, pre="metaspace")))
    choice = loaded.choose("auto")
    assert choice.name == "tokenizers" and "one thread per worker" in choice.note and "\n" not in choice.note
    with pytest.raises(UserError, match="--backend gigatoken cannot encode"):
        loaded.choose("gigatoken")
    with pytest.raises(UserError, match="encodes tiktoken encodings only"):
        loaded.choose("splintr")


def test_registry_refusals_are_one_line(tmp_path):
    with pytest.raises(UserError, match="not BERT-style WordPiece"):
        registry.load(str(_train(tmp_path / "w", template=None, model="WordPiece") / "tokenizer.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds neither tokenizer.json nor tokenizer.model"):
        registry.load(str(tmp_path / "empty"))
    ranks = tmp_path / "tokenizer.model"
    ranks.write_text("IQ== 0\nIg== 1\n")
    with pytest.raises(UserError, match="name its family: llama3:"):
        registry.load(str(ranks))
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"\x00\x01not a model")
    with pytest.raises(UserError, match="not a SentencePiece model"):
        registry.load(str(junk))
    with pytest.raises(UserError, match="no such file or folder"):
        registry.load(str(tmp_path / "missing" / "tokenizer.json"))
    with pytest.raises(UserError, match="^unknown encoding 'gpt5': expected one of"):
        registry.load("gpt5")
    with pytest.raises(UserError, match="give the rank file after the colon"):
        registry.load("llama3:")


def test_llama3_is_metas_tokenizer():
    from llama_models.llama3.tokenizer import Tokenizer as Meta

    loaded = registry.load("llama3")
    meta = Meta.get_instance()
    assert loaded.kind == "tiktoken-file" and loaded.n_vocab == meta.n_words and loaded.dtype == "uint32"
    assert loaded.natural.prefix == (meta.bos_id,) and loaded.eos == meta.eos_id
    for text in TEXTS[:40]:
        assert loaded.reference().encode_one(text).tolist() == meta.encode(text, bos=False, eos=False) or len(text) > 25_000
    block = loaded.block(loaded.natural)
    assert block["prefix"] == [128000] and block["eot"] == 128000 and block["files"][0]["name"] == "tokenizer.model"
