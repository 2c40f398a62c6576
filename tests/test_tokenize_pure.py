"""The pure core: texts → tokens, compared with tiktoken's encode_ordinary directly."""
import dataclasses

import numpy as np
import pyarrow as pa
import psutil
import pytest

from tokenshards.encoding.backends import (FAST_BACKENDS, SPOT_CHECK_CHARS, SPOT_CHECK_SHARE, BackendMismatch, TiktokenBackend,
                                           build_backend, choose, spot_check_sample)
from tokenshards.encoding.patterns import without_possessive_quantifiers
from tokenshards.errors import UserError
from tokenshards.encoding.encoders import load_encoding
from tokenshards.corpus.plan import InputFile, plan_pieces
from tokenshards.tokenize.core import tokenize_column, tokenize_texts

CL100K_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
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
    """Ids past 65,535 survive whole, the documents' own as well as the eot (100,257). The check
    was ``tokens.max() > 65535 or eot > 65535``, true whatever the tokens: ids wrapped to 16 bits
    inside a uint32 array passed it."""
    batch = tokenize_texts(AWKWARD, TiktokenBackend(cl100k), eot_position="prefix", dtype="uint32")
    assert batch.tokens.dtype == np.uint32
    want = [[cl100k.eot_token, *cl100k.encode_ordinary(text)] for text in AWKWARD if text]
    assert sum(token > 65535 for doc in want for token in doc[1:]) > 1000  # the texts' own ids reach past uint16
    assert [batch.tokens[start:start + length].tolist() for start, length in zip(batch.starts, batch.lengths)] == want
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
    choice = choose("auto", loaded.encoding, loaded.params)
    assert choice.name == FAST_BACKENDS[0] == "gigatoken" and "verified against tiktoken" in choice.note
    assert choice.verified is not None and choice.verified.name == "gigatoken"
    assert choose("splintr", loaded.encoding, loaded.params).name == "splintr"
    assert choose("riptoken", loaded.encoding, loaded.params).name == "riptoken"
    assert choose("tiktoken", loaded.encoding, loaded.params).name == "tiktoken"
    wrong = dataclasses.replace(loaded.params, pat_str=r"\S+|\s+")  # same ranks, other split: other ids
    choice = choose("auto", loaded.encoding, wrong)
    name, why = choice.name, choice.note
    assert name == "tiktoken" and choice.verified is None and all(f"{fast} not used" in why for fast in FAST_BACKENDS)
    assert "gigatoken not used: ValueError: gigatoken has no pretokenizer for this encoding's split pattern" in why
    for fast in FAST_BACKENDS:
        with pytest.raises(UserError, match=f"--backend {fast} cannot be used for gpt2"):
            choose(fast, loaded.encoding, wrong)


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
    # gigatoken knows only the patterns it has a pretokenizer for: give it cl100k's split instead.
    other = CL100K_PATTERN if fast == "gigatoken" else r"\S+|\s+"
    backend = build_backend(fast, gpt2, dataclasses.replace(loaded.params, pat_str=other))
    with pytest.raises(BackendMismatch, match="disagrees with tiktoken"):
        backend.encode_many(["hello world, this is text: 1234567 DON'T"])


def test_the_spot_check_is_bounded_in_characters_and_fixed():
    sizes = [100] * 10_000
    picked = spot_check_sample(sizes)
    assert sum(sizes[i] for i in picked) <= SPOT_CHECK_CHARS and len(picked) == SPOT_CHECK_CHARS // 100
    assert picked.tolist() == sorted(set(picked.tolist())) and np.array_equal(picked, spot_check_sample(sizes))
    assert picked.max() > 9_000  # spread over the batch, not its first documents
    # Long documents are skipped while shorter ones fit; a batch of only long ones checks its shortest.
    assert spot_check_sample([10**6, 50, 10**7]).tolist() == [1]
    assert spot_check_sample([10**6, 10**7, 5 * 10**5]).tolist() == [2]
    assert spot_check_sample([]).tolist() == []
    assert spot_check_sample([2 * 10**6, 3 * 10**6]).tolist() == []  # never a document over CHECK_MAX_CHARS


def test_a_small_batch_checks_a_share_of_its_text_and_never_nothing():
    """A partition of a few KB re-encodes a sixteenth of its text with tiktoken, not 16 K characters
    (most of it); one whose documents are all longer than that still checks its shortest."""
    picked = spot_check_sample([100] * 50)
    assert 0 < sum(100 for _ in picked) <= 50 * 100 // SPOT_CHECK_SHARE
    assert spot_check_sample([3_000, 2_000, 4_000]).tolist() == [1]
    assert spot_check_sample([7]).tolist() == [0]
    # From SPOT_CHECK_CHARS x SPOT_CHECK_SHARE of text on, the budget is SPOT_CHECK_CHARS.
    big = [1_000] * (SPOT_CHECK_CHARS * SPOT_CHECK_SHARE // 1_000 + 1)
    assert len(spot_check_sample(big)) == SPOT_CHECK_CHARS // 1_000


@pytest.mark.parametrize("padded_max_cells", [0, 10**9], ids=["awkward output", "padded output"])
def test_gigatoken_gives_the_same_ids_from_bytes_strs_and_arrow_buffers(gpt2, monkeypatch, padded_max_cells):
    """Small columns go to gigatoken as Python bytes, larger ones as awkward arrays over Arrow's
    buffers, Python inputs as strs; small batches come back as a padded matrix, the others as an awkward array: every
    way, the ids are tiktoken's, awkward text and a long document included."""
    from tokenshards.encoding import backends

    loaded = load_encoding("gpt2")
    fast = backends.GigatokenBackend(loaded.params)
    monkeypatch.setattr(backends, "PADDED_MAX_CELLS", padded_max_cells)
    texts = [t for t in AWKWARD if t]
    want = [gpt2.encode_ordinary(t) for t in texts]
    for below in (0, 10**9):
        monkeypatch.setattr(backends, "BYTES_BELOW_BYTES", below)
        for column in (pa.array(texts), pa.array(texts[:-2] + texts[-1:], pa.large_string())):
            expected = want if len(column) == len(texts) else want[:-2] + want[-1:]
            flat, lengths = fast.encode_arrow(column)
            assert lengths.tolist() == [len(w) for w in expected]
            assert flat.tolist() == [i for w in expected for i in w]
    for batch in (texts, texts[:1], texts[-1:]):
        flat, lengths = fast.encode_many(batch)
        assert lengths.tolist() == [len(gpt2.encode_ordinary(t)) for t in batch]
        assert flat.tolist() == [i for t in batch for i in gpt2.encode_ordinary(t)]


def test_a_disagreement_in_any_sampled_document_is_caught(gpt2):
    """The check compares the documents it samples, wherever they sit in the flat array."""
    loaded = load_encoding("gpt2")
    backend = build_backend("splintr", gpt2, loaded.params)
    texts = [f"document {i} text" for i in range(500)]
    sampled = spot_check_sample([len(t) for t in texts])
    flat, lengths = backend.fast.encode_many(texts)

    class OneWrong:
        name = "one-wrong"

        def encode_many(self, batch):
            bad = flat.copy()
            bad[int(np.cumsum(lengths)[sampled[-1]]) - 1] += 1  # the last token of the last sampled document
            return bad, lengths

    backend.fast = OneWrong()
    with pytest.raises(BackendMismatch, match="disagrees with tiktoken on a document starting 'document"):
        backend.encode_many(texts)


@pytest.mark.parametrize("proc", ["linux", "no /proc"])
def test_gigatoken_cache_is_bounded_and_rebuilding_keeps_ids_exact(gpt2, proc, monkeypatch, tmp_path):
    """gigatoken's pretoken cache grows with every new word; past the bound the tokenizer starts
    afresh, also where there is no /proc to read the process's memory from (macOS, Windows)."""
    pytest.importorskip("gigatoken")
    from tokenshards.encoding import backends
    from tokenshards.encoding.backends import GigatokenBackend

    if proc == "no /proc":
        monkeypatch.setattr(backends, "STATM", str(tmp_path / "absent"))
        assert abs(backends._rss() - psutil.Process().memory_info().rss) < 64 * 2**20

    loaded = load_encoding("gpt2")
    backend = GigatokenBackend(loaded.params, cache_bound=2 * 2**20)
    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", np.uint8)
    for _ in range(4):  # ~4 MB of words that never repeat: nothing a cache can reuse
        raw = letters[rng.integers(0, len(letters), 1_000_000)]
        raw[rng.integers(0, len(raw), 120_000)] = ord(" ")
        text = raw.tobytes().decode()
        texts = [text[i:i + 5000] for i in range(0, len(text), 5000)]
        flat, lengths = backend.encode_many(texts)
        want, want_lengths = TiktokenBackend(gpt2).encode_many(texts)
        assert np.array_equal(flat, want) and np.array_equal(lengths, want_lengths)
    assert backend.rebuilds >= 1


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string(), pa.string_view()])
@pytest.mark.parametrize("eot_position", ["prefix", "suffix", "none"])
def test_an_arrow_column_tokenizes_as_its_python_strings_do(backend, arrow_type, eot_position):
    """Backends that read Arrow buffers in place (gigatoken) and the others give the same batch,
    whatever the string type, chunking or slicing, nulls and empty rows included."""
    want = tokenize_texts(AWKWARD, backend, eot_position=eot_position, dtype="uint16")
    padded = pa.array(["pad"] + AWKWARD + ["pad"], arrow_type)
    for column in (pa.array(AWKWARD, arrow_type), pa.chunked_array([pa.array(AWKWARD[:5], arrow_type), pa.array(AWKWARD[5:], arrow_type)]),
                   padded.slice(1, len(AWKWARD)), pa.array(["pad"] + [t for t in AWKWARD if t], arrow_type).slice(1)):
        got = tokenize_column(column, backend, eot_position=eot_position, dtype="uint16")
        texts = column.to_pylist()
        if len(texts) != len(AWKWARD):  # the all-kept column
            assert (got.skipped_null, got.skipped_empty) == (0, 0) and got.kept.tolist() == list(range(len(texts)))
            assert np.array_equal(got.tokens, want.tokens)
            continue
        for field in ("tokens", "lengths", "kept"):
            assert np.array_equal(getattr(got, field), getattr(want, field)), field
        assert (got.skipped_null, got.skipped_empty) == (want.skipped_null, want.skipped_empty)
    empty = tokenize_column(pa.array([None, ""], arrow_type), backend, eot_position=eot_position, dtype="uint16")
    assert len(empty.tokens) == 0 and (empty.skipped_null, empty.skipped_empty) == (1, 1)


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
        # The same from an Arrow column (gigatoken reads those in place, huge documents aside).
        got = tokenize_column(pa.array(texts), fast, eot_position="none", dtype="uint16")
        assert got.tokens.tolist() == [i for w in want for i in w]


def test_tiktoken_encodings_are_kept_parsed_and_a_damaged_copy_is_ignored(monkeypatch, tmp_path, gpt2):
    """The second start reads GPT-2's ranks back from a parsed copy (not tiktoken's data-gym
    parse); the encoding is the same, and a copy whose hash fails is parsed afresh and replaced."""
    from tokenshards.encoding import encoders

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = load_encoding("gpt2")
    kept = encoders._parsed_path("gpt2")
    assert kept.is_relative_to(tmp_path) and kept.exists()
    second = load_encoding("gpt2")
    assert second.source.startswith("tokenshards' parsed copy")
    assert second.params == first.params and second.fingerprint == first.fingerprint
    assert second.encoding.encode_ordinary(AWKWARD[5]) == gpt2.encode_ordinary(AWKWARD[5])
    kept.write_text(kept.read_text().replace("IQ== 0", "Ig== 0"))  # rank 0 now names b'"'
    third = load_encoding("gpt2")
    assert not third.source.startswith("tokenshards' parsed copy") and third.fingerprint == first.fingerprint
    assert load_encoding("gpt2").source.startswith("tokenshards' parsed copy")
