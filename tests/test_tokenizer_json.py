"""tokenizer.json from tiktoken ranks: transformers gives tiktoken's encode_ordinary ids (gpt2,
cl100k_base, freshly trained vocabularies) and decodes back to the text; train-bpe writes the
folder AutoTokenizer loads, locally and on S3."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import tiktoken
from pydoc_data.topics import topics
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from conftest import write_parquet
from tokenshards.bpe.merge import train_merges
from tokenshards.bpe.train import TrainBpeConfig, hf_folder, run_train_bpe, write_hf_folder
from tokenshards.encoding.backends import verification_texts
from tokenshards.encoding.encoders import load_encoding
from tokenshards.encoding.meta import load as load_meta
from tokenshards.encoding.patterns import onig_pattern
from tokenshards.encoding.tojson import kept_tokenizer_json, tokenizer_config_json, tokenizer_json
from tokenshards.errors import UserError

SPECIAL_AS_TEXT = ["<|endoftext|>", "a<|endoftext|>b", " <|endoftext|>\n", "<|pad|><|fim_prefix|>", "<|endofprompt|>x"]
DOCUMENTS = sorted(p for text in topics.values() for p in text.split("\n\n") if p.strip())[::4]
"""A few hundred real paragraphs (Python's own docs), besides the whole topics verification_texts takes."""
TEXTS = verification_texts() + SPECIAL_AS_TEXT + DOCUMENTS


def _folder(root: Path, params: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_text(tokenizer_json(params.mergeable_ranks, params.pat_str, params.special_tokens))
    (root / "tokenizer_config.json").write_text(tokenizer_config_json(params.special_tokens, eos="<|endoftext|>"))
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Python's docs as a parquet corpus: real prose, code and punctuation to train on."""
    texts = [topics[k] for k in sorted(topics)]
    return write_parquet(tmp_path_factory.mktemp("hf-corpus") / "docs.parquet", {"text": texts * 2})


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory, cluster, corpus) -> dict:
    """name → (tiktoken encoding, folder with tokenizer.json + tokenizer_config.json), built once."""
    found = {}
    for name in ("gpt2", "cl100k_base"):
        loaded = load_encoding(name)
        found[name] = (loaded.encoding, _folder(tmp_path_factory.mktemp(name), loaded.params))
    for pattern in ("gpt2", "cl100k"):  # train-bpe writes its own folder
        out = tmp_path_factory.mktemp(f"trained-{pattern}") / f"{pattern}.tiktoken"
        summary = run_train_bpe(TrainBpeConfig(inputs=(str(corpus),), out=str(out), vocab_size=3000, pattern=pattern,
                                               specials=("<|pad|>",), scheduler=cluster.scheduler_address,
                                               progress="none"), announce=lambda msg: None)
        assert summary.hf_folder == str(out)[: -len(".tiktoken")] + ".hf", summary
        found[f"trained-{pattern}"] = (load_encoding(str(out)).encoding, Path(summary.hf_folder))
    return found


NAMES = ["gpt2", "cl100k_base", "trained-gpt2", "trained-cl100k"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("load", ["PreTrainedTokenizerFast", "AutoTokenizer"])
def test_ids_equal_tiktoken_and_decode_round_trips(vocabularies, name, load):
    encoding, folder = vocabularies[name]
    tok = (PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")) if load == "PreTrainedTokenizerFast"
           else AutoTokenizer.from_pretrained(str(folder)))
    got = tok(TEXTS, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    for text, ids in zip(TEXTS, got):
        assert ids == encoding.encode_ordinary(text), text[:80]
    decoded = tok.batch_decode(got)
    assert [i for i, (a, b) in enumerate(zip(decoded, TEXTS)) if a != b] == []


@pytest.mark.parametrize("name", NAMES)
def test_special_tokens_keep_tiktokens_ids_and_are_special(vocabularies, name):
    encoding, folder = vocabularies[name]
    tok = AutoTokenizer.from_pretrained(str(folder))
    specials = {token: encoding.encode_single_token(token) for token in encoding.special_tokens_set}
    assert {t: tok.convert_tokens_to_ids(t) for t in specials} == specials  # cl100k_base's have gaps
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == encoding.eot_token
    # Without split_special_tokens they are matched in the text, as tiktoken's encode(allowed_special="all").
    text = "a<|endoftext|>b"
    assert tok(text, add_special_tokens=False)["input_ids"] == encoding.encode(text, allowed_special="all")
    assert tok.decode(encoding.encode(text, allowed_special="all"), skip_special_tokens=True) == "ab"


def test_merges_replay_tiktoken_on_a_tiny_alphabet():
    """Two letters and a space: almost every pre-token is split, so the merge order decides every id."""
    rng = random.Random(3)
    words = {}
    for _ in range(400):
        word = (" " if rng.random() < 0.5 else "") + "".join(rng.choices("ab", k=rng.randint(1, 12)))
        words[word.encode()] = words.get(word.encode(), 0) + rng.randint(1, 5)
    ranks = train_merges(words.items(), n_ranks=330).ranks
    pat = r""" ?\p{L}++| ?[^\s\p{L}]++|\s++$|\s+(?!\S)|\s"""
    encoding = tiktoken.Encoding(name="tiny", pat_str=pat, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)})
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json(ranks, pat, {"<|endoftext|>": len(ranks)}))
    texts = [" ".join("".join(rng.choices("ab", k=rng.randint(1, 40))) for _ in range(5)) for _ in range(300)]
    assert [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)] == [encoding.encode_ordinary(t) for t in texts]


def test_pattern_rewritten_for_oniguruma():
    """Oniguruma reads ``{1,3}+`` as "one or more of {1,3}" and ``$`` as the end of a line."""
    assert onig_pattern(r"\p{N}{1,3}+|\s++$|[$]|\$| ?\p{L}++|[^\s]?+x") == r"\p{N}{1,3}|\s+\z|[$]|\$| ?\p{L}+|[^\s]?x"


def test_mistakes_are_named():
    ranks = {bytes([b]): b for b in range(256)}
    with pytest.raises(UserError, match=r"lack single byte\(s\) 0x41"):
        tokenizer_json({t: r for t, r in ranks.items() if t != b"A"}, r"\s|\S+", {})
    with pytest.raises(UserError, match=r"special token '<x>' has id 7, which a mergeable token .* already has"):
        tokenizer_json(ranks, r"\s|\S+", {"<x>": 7})
    with pytest.raises(UserError, match=r"special token '<x>' is also an ordinary token of the ranks \(id 256\)"):
        tokenizer_json({**ranks, b"<x>": 256}, r"\s|\S+", {"<x>": 257})
    with pytest.raises(UserError, match=r"Oniguruma\) cannot compile the split pattern '\(\?s\)\.'"):
        tokenizer_json(ranks, r"(?s).", {})
    with pytest.raises(UserError, match=r"gives other ids than tiktoken"):  # tiktoken drops what no branch matches
        tokenizer_json(ranks, r"[[:alpha:]]+|.", {})
    with pytest.raises(UserError, match=r"eos='<\|end\|>' is not one of the special tokens \(<\|endoftext\|>\)"):
        tokenizer_config_json({"<|endoftext|>": 256}, eos="<|end|>")


def test_train_bpe_says_where_the_folder_is(vocabularies):
    _, folder = vocabularies["trained-cl100k"]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|endoftext|>" and config["clean_up_tokenization_spaces"] is False
    assert sorted(p.name for p in folder.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]  # no temporaries left


def test_a_pattern_hugging_face_cannot_read_still_writes_the_ranks(cluster, corpus, tmp_path):
    """The training is kept; the summary says why there is no tokenizer.json and an earlier run's is removed."""
    out = tmp_path / "dotall.tiktoken"
    stale = Path(hf_folder(str(out)))
    stale.mkdir()
    (stale / "tokenizer.json").write_text("{}")
    messages = []
    summary = run_train_bpe(TrainBpeConfig(inputs=(str(corpus),), out=str(out), vocab_size=300, pattern=r"(?s)\p{L}+|.",
                                           scheduler=cluster.scheduler_address, progress="none"), announce=messages.append)
    assert out.exists() and Path(str(out) + ".json").exists()
    assert summary.hf_folder is None and "Oniguruma" in summary.hf_problem
    assert any(m.startswith(f"not writing {stale}/: ") for m in messages)
    assert any(line.startswith("      Hugging Face: no tokenizer.json written: ") for line in summary.lines())
    assert not (stale / "tokenizer.json").exists()


def test_writes_to_s3(s3, vocabularies, tmp_path):
    bucket = s3.make_bucket()
    params = load_encoding("gpt2").params
    folder = write_hf_folder(f"s3://{bucket}/v/gpt2.tiktoken", params, s3.storage_options)
    assert folder == f"s3://{bucket}/v/gpt2.hf"
    fs = s3.fs()
    assert sorted(fs.ls(f"{bucket}/v/gpt2.hf")) == [f"{bucket}/v/gpt2.hf/tokenizer.json", f"{bucket}/v/gpt2.hf/tokenizer_config.json"]
    fs.get(f"{bucket}/v/gpt2.hf/", str(tmp_path / "copy"), recursive=True)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "copy"))
    assert tok("héllo <|endoftext|>", add_special_tokens=False, split_special_tokens=True)["input_ids"] == \
        vocabularies["gpt2"][0].encode_ordinary("héllo <|endoftext|>")


def test_llama3_ranks_convert_to_the_same_ids():
    """Meta's Llama 3 ranks: tiktoken merges any adjacent pair whose join is a token, whatever the
    parts' ranks (" první", rank 104,909, from " pr" + "vní", rank 110,114); a converter that listed
    only lower-ranked parts gave other ids on ~3% of web documents."""
    llama3 = load_meta("llama3")
    tok = Tokenizer.from_str(tokenizer_json(llama3.params.mergeable_ranks, llama3.params.pat_str, {}))
    texts = [*verification_texts(), " prvního existující Související", "、単一のシートのセルの内容が入っているテキストファイル",
             *DOCUMENTS[:300]]
    for text in texts:
        assert tok.encode(text, add_special_tokens=False).ids == llama3.encoding.encode_ordinary(text), text[:60]


def test_a_kept_conversion_is_the_conversion_and_a_damaged_one_is_made_again(monkeypatch, tmp_path):
    """Llama 3's gigatoken path converts Meta's ranks once per machine (``kept_tokenizer_json``):
    read back, it is exactly ``tokenizer_json``'s text; a file whose bytes no longer match its name
    is never used, and is made again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    params = load_encoding("gpt2").params
    fresh = tokenizer_json(params.mergeable_ranks, params.pat_str, {})
    assert kept_tokenizer_json(params.mergeable_ranks, params.pat_str) == fresh
    [kept] = (tmp_path / "tokenshards" / "tokenizer-json").glob("*.json")
    assert kept_tokenizer_json(params.mergeable_ranks, params.pat_str) == fresh  # read back
    kept.write_bytes(kept.read_bytes()[:-100])
    assert kept_tokenizer_json(params.mergeable_ranks, params.pat_str) == fresh
    assert [p.read_bytes() == fresh.encode() for p in kept.parent.glob("*.json")] == [True]  # made again in its place
