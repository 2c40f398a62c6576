"""train-bpe's gigatoken merger: the counted pre-tokens merged by gigatoken's Rust trainer give
Hugging Face BpeTrainer's merges on the same text, whatever the table's order or the threads; its
GPT-2 split is checked against ours; the Python loop takes over when it cannot be trusted."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("gigatoken")

from conftest import write_parquet  # noqa: E402
from tokenshards.bpe import gigamerge  # noqa: E402
from tokenshards.bpe.count import PATTERNS, SCHEMA, count_texts  # noqa: E402
from tokenshards.bpe.merge import train_merges  # noqa: E402
from tokenshards.bpe.train import TrainBpeConfig, _merge, run_train_bpe  # noqa: E402
from tokenshards.encoding import ranks as ranks_io  # noqa: E402
from tokenshards.encoding.backends import verification_texts  # noqa: E402
from tokenshards.encoding.encoders import load_encoding  # noqa: E402
from tokenshards.errors import UserError  # noqa: E402


def _prose() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)[:80]]


def _table(words: dict[bytes, int]) -> pa.Table:
    return pa.table([pa.array(list(words), pa.large_binary()), pa.array(list(words.values()), pa.int64())], schema=SCHEMA)


def _hf_merges(texts: list[str], vocab_size: int) -> list[tuple[bytes, bytes]]:
    """BpeTrainer's merges as bytes (the set-up of bench/bpe_vs_tokenizers.py, no special token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    # GPT-2's byte-to-character table, inverted
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    chars |= {b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in printable)}
    byte_of = {c: b for b, c in chars.items()}
    merges = json.loads(tok.to_str())["model"]["merges"]
    pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]
    return [(bytes(byte_of[c] for c in a), bytes(byte_of[c] for c in b)) for a, b in pairs]


# -- pure: the counts in, ranks out --

def test_merges_the_counts_as_bpetrainer_merges_the_text():
    texts = _prose()
    outcome = gigamerge.merge_counted(count_texts(texts, pat_str=PATTERNS["gpt2"]), n_ranks=1500)
    result = outcome.result
    assert result is not None and outcome.resplit == 0 and not result.exhausted
    assert len(result.ranks) == 1500 and ranks_io.problems(result.ranks) == []
    tokens = sorted(result.ranks, key=result.ranks.get)
    assert tokens[:256] == [bytes([b]) for b in range(256)]
    by_id = {i: t for t, i in result.ranks.items()}
    assert [(by_id[a], by_id[b]) for a, b in result.merges] == _hf_merges(texts, 1500)


def test_same_ranks_whatever_the_table_order_or_the_threads(tmp_path):
    table = count_texts(_prose()[:40], pat_str=PATTERNS["gpt2"])
    first = gigamerge.merge_counted(table, n_ranks=900).result.ranks
    shuffled = table.take(pa.array(random.Random(2).sample(range(table.num_rows), table.num_rows)))
    assert gigamerge.merge_counted(shuffled, n_ranks=900).result.ranks == first
    words = tmp_path / "words.json"
    words.write_text(json.dumps([[p.hex(), n] for p, n in zip(*table.to_pydict().values())]))
    script = ("import json, sys, pyarrow as pa\n"
              "from tokenshards.bpe import gigamerge\n"
              "from tokenshards.bpe.count import SCHEMA\n"
              "w = json.load(open(sys.argv[1]))\n"
              "t = pa.table([pa.array([bytes.fromhex(p) for p, _ in w], pa.large_binary()), "
              "pa.array([n for _, n in w], pa.int64())], schema=SCHEMA)\n"
              "r = gigamerge.merge_counted(t, n_ranks=900).result.ranks\n"
              "print(json.dumps(sorted((t.hex(), i) for t, i in r.items())))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(words)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAYON_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert {bytes.fromhex(t): i for t, i in json.loads(proc.stdout)} == first


def test_gigatoken_splits_like_our_gpt2_pattern():
    """Awkward text (Unicode spaces, astral letters, contractions, NUL, long runs) and random mixtures
    of the characters regex engines disagree on: gigatoken's split is ours, except that it drops
    ``<|endoftext|>``, which no GPT-2 pre-token holds."""
    import regex
    from gigatoken.gigatoken_rs import pretokenized_counts

    rng = random.Random(5)
    alphabet = list(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2028\u2029\u3000\u180e\u200b"
                    "'sdmtlvreSLDVxé\u0301€1²½①٣!?.,-_<|>😀中ǅ\x00")
    texts = [t for t in verification_texts() if "<|endoftext|>" not in t]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(2000)]
    with gigamerge._quiet():
        for text in texts:
            ours = Counter(m.encode() for m in regex.findall(PATTERNS["gpt2"], text))
            assert Counter(dict(pretokenized_counts(text.encode(), None))) == ours, text
        assert dict(pretokenized_counts(b"a <|endoftext|> b", None)) == {b"a": 1, b" ": 1, b" b": 1}


def test_a_pretoken_gigatoken_cuts_is_counted_its_way_and_too_many_fall_back():
    words = {b" the": 5000, b" cat": 3000, b" sat": 3000, b"ab cd": 1}  # "ab cd" is not one GPT-2 pre-token
    outcome = gigamerge.merge_counted(_table(words), n_ranks=270)
    assert (outcome.resplit, outcome.resplit_occurrences) == (1, 1)
    as_cut = {b" the": 5000, b" cat": 3000, b" sat": 3000, b"ab": 1, b" cd": 1}
    assert outcome.result.ranks == gigamerge.merge_counted(_table(as_cut), n_ranks=270).result.ranks
    words[b"ab cd"] = 10
    outcome = gigamerge.merge_counted(_table(words), n_ranks=270)
    assert outcome.result is None
    assert outcome.why_not == "gigatoken's GPT-2 split would cut 1 pre-tokens differently (10 of 11,010 occurrences)"


def test_separator_bytes_and_control_characters_in_pretokens():
    """0xFF separates the documents: UTF-8 never holds it; the ASCII separators are ordinary bytes."""
    table = count_texts(["x\x1e\x1e\x1e y\x1f\x1fz \x00\x00\x00 é€€"] * 5, pat_str=PATTERNS["gpt2"])
    outcome = gigamerge.merge_counted(table, n_ranks=1000)
    result = outcome.result
    assert outcome.resplit == 0 and result.exhausted  # every pre-token became one token
    assert set(table.column("pretoken").to_pylist()) <= set(result.ranks)
    assert ranks_io.problems(result.ranks) == []


def test_ranks_from_merges_duplicates_and_the_size_limit():
    merges = [(b"b", b"c"), (b"a", b"b"), (b"ab", b"c"), (b"a", b"bc"), (b"x", b"y")]
    ranks, ids, duplicates = gigamerge.ranks_from_merges(merges, n_ranks=259)
    assert [t for t in sorted(ranks, key=ranks.get)[256:]] == [b"bc", b"ab", b"abc"]
    assert duplicates == 1 and ids == [(98, 99), (97, 98), (257, 99), (97, 256)]  # (x, y) would be the 260th
    assert ranks_io.problems(ranks) == []
    with pytest.raises(AssertionError, match=r"merge 0 \(b'ab', b'c'\) joins a token no earlier merge made"):
        gigamerge.ranks_from_merges([(b"ab", b"c")], n_ranks=300)


def test_stops_when_no_pair_is_left_and_trains_nothing_from_single_bytes():
    result = gigamerge.merge_counted(_table({b"ab": 3, b"x": 9}), n_ranks=1000).result
    assert result.exhausted and sorted(result.ranks, key=result.ranks.get)[256:] == [b"ab"]
    result = gigamerge.merge_counted(_table({b"x": 9}), n_ranks=300).result
    assert result.exhausted and len(result.ranks) == 256


def test_a_temporary_folder_it_cannot_write_is_a_reason_not_a_traceback(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    outcome = gigamerge.merge_counted(_table({b"ab": 3}), n_ranks=300, temp_dir=str(tmp_path / "file"))
    assert outcome.result is None
    assert outcome.why_not.startswith(f"cannot write its input file in {tmp_path / 'file'} (NotADirectoryError: ")


def test_prints_nothing_of_its_own(capfd):
    gigamerge.merge_counted(count_texts(_prose()[:5], pat_str=PATTERNS["gpt2"]), n_ranks=300)
    out, err = capfd.readouterr()
    assert out == err == ""


def test_the_python_loop_when_gigatoken_cannot_or_may_not(monkeypatch):
    table = count_texts(_prose()[:10], pat_str=PATTERNS["gpt2"])
    python = train_merges(zip(*table.to_pydict().values()), n_ranks=400).ranks
    said: list[str] = []
    config = TrainBpeConfig(inputs=("x",), out="v.tiktoken", progress="none")
    monkeypatch.setattr(gigamerge, "SPARE_DISK", 1 << 60)
    result, record = _merge(table, n_ranks=400, pattern_name="gpt2", config=config, announce=said.append)
    assert result.ranks == python and record == {"name": "python", "ties": "greatest byte pair"}
    assert said[-1].startswith("merging in Python, on one core: its input file needs ") and "set TMPDIR" in said[-1]
    with pytest.raises(UserError, match=r"^--merger gigatoken: its input file needs .* free \(set TMPDIR to a larger "
                                        r"disk\); use --merger auto to merge in Python instead$"):
        _merge(table, n_ranks=400, pattern_name="gpt2", config=config.replace(merger="gigatoken"), announce=said.append)
    monkeypatch.setattr(gigamerge, "version", lambda: None)
    result, _ = _merge(table, n_ranks=400, pattern_name="gpt2", config=config, announce=said.append)
    assert result.ranks == python
    assert said[-1] == "merging in Python, on one core: gigatoken is not installed (pip install 'tokenshards[fast]')"


@pytest.mark.parametrize("changes, message", [
    ({"merger": "rust"}, r"^--merger 'rust' not supported, expected one of auto, gigatoken, python$"),
    ({"merger": "gigatoken", "pattern": "cl100k"}, r"^--merger gigatoken needs --pattern gpt2 .* not 'cl100k'; use "
                                                   r"--merger auto or python$"),
])
def test_merger_mistakes_are_one_line(changes, message):
    with pytest.raises(UserError, match=message):
        TrainBpeConfig(inputs=("x",), out="v.tiktoken", **changes)


# -- the whole job --

def test_job_records_the_merger_and_python_stays_available(cluster, tmp_path):
    """Same corpus, both mergers: each records itself; gigatoken's ranks are BpeTrainer's merges of
    the counted text, the Python loop's those of ``train_merges``; compression about the same."""
    rng = random.Random(4)
    texts = [" ".join(rng.sample(t.split(" "), min(60, len(t.split(" "))))) for t in _prose() for _ in range(3)]
    write_parquet(tmp_path / "in.parquet", {"text": texts}, row_group_size=50)
    runs = {}
    for merger in ("auto", "python"):
        out = tmp_path / f"{merger}.tiktoken"
        said: list[str] = []
        summary = run_train_bpe(TrainBpeConfig(inputs=(str(tmp_path / "in.parquet"),), out=str(out), vocab_size=1000,
                                               merger=merger, scheduler=cluster.scheduler_address, progress="none"),
                                announce=said.append)
        runs[merger] = (summary, json.loads(Path(str(out) + ".json").read_text())["training"]["merger"],
                        load_encoding(str(out)).params.mergeable_ranks, said)
    summary, record, ranks, said = runs["auto"]
    version = gigamerge.version().split()[-1]
    assert record == {"name": "gigatoken", "version": version, "ties": "huggingface"}
    assert summary.merger == f"gigatoken {version}" and f"(gigatoken {version})" in summary.lines()[2]
    assert any(line.startswith("merging with gigatoken ") for line in said), said
    kept = [t for row, t in enumerate(texts) if row % 100 != 99]
    hf = _hf_merges(kept, 999)
    joined = [a + b for a, b in hf]
    assert sorted(ranks, key=ranks.get)[256:] == list(dict.fromkeys(joined))[:999 - 256]
    python_summary, python_record, python_ranks, _ = runs["python"]
    assert python_record == {"name": "python", "ties": "greatest byte pair"} and python_summary.merger == "python"
    assert python_ranks != ranks
    assert python_summary.bytes_per_token == pytest.approx(summary.bytes_per_token, rel=0.02)
