"""train-bpe: hand-worked merges, a brute-force reference, determinism, Unicode round trips, and
a trained vocabulary going through tokenize (real LocalCluster, real tiktoken)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import corrupt_data_pages, not_utf8, write_parquet
from readback import expected_tokens, read_documents
from tokenshards.encoding import ranks as ranks_io
from tokenshards.bpe.count import PATTERNS, combine_tables, count_piece, count_texts, resolve_pattern
from tokenshards.bpe.merge import _order_key, train_merges
from tokenshards.bpe.train import TrainBpeConfig, run_train_bpe, select_sample
from tokenshards.encoding.encoders import load_encoding
from tokenshards.errors import UserError
from tokenshards.corpus.plan import plan_pieces, read_input_metadata

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
WORDS = ["the", "tokenizer", "data", "river", "Straße", "über", "Grüße", "мир", "данные", "слово", "数据", "集合",
         "データ", "🙂", "naïve", "café", "x=1;", "def", "return", "2026", "3.14159", "<|endoftext|>", "\t", "  "]


def _naive(words: dict[bytes, int], n_ranks: int) -> tuple[dict[bytes, int], list[tuple[int, int]]]:
    """The textbook loop: recount every pair after every merge; pick (count, bytes a, bytes b) max."""
    vocab = [bytes([i]) for i in range(256)]
    ranks = {t: i for i, t in enumerate(vocab)}
    seqs = [(list(w), n) for w, n in words.items()]
    merges = []
    while len(vocab) < n_ranks:
        counts: Counter = Counter()
        for s, n in seqs:
            for pair in zip(s, s[1:]):
                counts[pair] += n
        if not counts:
            break
        a, b = max(counts, key=lambda p: (counts[p], vocab[p[0]], vocab[p[1]]))
        c = ranks.setdefault(vocab[a] + vocab[b], len(vocab))
        if c == len(vocab):
            vocab.append(vocab[a] + vocab[b])
        merges.append((a, b))
        new = []
        for s, n in seqs:
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(c)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            new.append((out, n))
        seqs = new
    return ranks, merges


SYLLABLES = ["ka", "to", "ri", "en", "qu", "st", "ph", "ü", "ß", "ста", "ни", "ро", "数", "据", "デ", "ー", "42", "7"]


def _doc(rng: random.Random) -> str:
    """Real-looking words and made-up ones (thousands of distinct pre-tokens in a few kB)."""
    words = [rng.choice(WORDS) if rng.random() < 0.5 else "".join(rng.choices(SYLLABLES, k=rng.randint(1, 4)))
             for _ in range(rng.randint(3, 40))]
    return " ".join(words) + rng.choice([".", "!\n", "\n\n", "?"])


def _unicode_text(rng: random.Random) -> str:
    """Arbitrary code points (surrogates excluded: they cannot be UTF-8), weighted toward odd corners."""
    ranges = [(0, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF), (0x1F300, 0x1FAFF)]
    chars = []
    for _ in range(rng.randint(0, 60)):
        lo, hi = rng.choice(ranges)
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two files of 250 rows (so rows 99, 199, 249.. exist for holding back), small row groups."""
    root = tmp_path_factory.mktemp("bpe-corpus")
    rng = random.Random(7)
    for n in range(2):
        texts = [_doc(rng) for _ in range(250)]
        texts[10] = None
        texts[11] = ""
        write_parquet(root / f"00{n}.parquet", {"text": texts, "id": [f"{n}-{i}" for i in range(250)]}, row_group_size=25)
    return root


@pytest.fixture(scope="module")
def trained(cluster, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe-out") / "small.tiktoken"
    config = TrainBpeConfig(inputs=(str(corpus),), out=str(out), vocab_size=600, scheduler=cluster.scheduler_address,
                            progress="none")
    summary = run_train_bpe(config, announce=lambda msg: None)
    return summary, out


# -- the merge loop (pure) --

def test_hand_worked_merges():
    # Pre-tokens " low" x5, " lower" x2, " widest" x3, " newest" x6. Pair counts: es 9, st 9: the tie
    # goes to the greater pair, (s, t); then e+st 9; lo 7 and ow 7: ow; l+ow 7; ' '+low 7. Then four
    # pairs at 6: ' '+n, n+e, e+w, w+est: 'w' is the greatest first element, so west; then ' '+n,
    # n+e, e+west: ne; then ' '+ne and ne+west: newest; then ' '+newest.
    words = {b" low": 5, b" lower": 2, b" widest": 3, b" newest": 6}
    result = train_merges(words.items(), n_ranks=256 + 9)
    tokens = sorted(result.ranks, key=result.ranks.get)[256:]
    assert tokens == [b"st", b"est", b"ow", b"low", b" low", b"west", b"ne", b"newest", b" newest"]
    assert result.merges[0] == (ord("s"), ord("t")) and not result.exhausted and result.duplicates == 0


def test_runs_of_one_byte_merge_left_to_right():
    # "aaaa" x1: aa has count 3 but merges non-overlapping from the left → [aa, aa], then aa+aa.
    result = train_merges([(b"aaaa", 1), (b"aaa", 1)], n_ranks=258)
    assert sorted(result.ranks, key=result.ranks.get)[256:] == [b"aa", b"aaaa"]


def test_stops_when_no_pair_is_left():
    result = train_merges([(b"ab", 3)], n_ranks=1000)
    assert result.exhausted and len(result.ranks) == 257


def test_order_key_sorts_bytes_in_reverse():
    rng = random.Random(1)
    strings = {bytes(rng.choice(b"\x00ab\xff") for _ in range(rng.randint(1, 4))) for _ in range(300)}
    assert sorted(strings, key=_order_key) == sorted(strings, reverse=True)


def test_matches_the_brute_force_reference():
    rng = random.Random(0)
    for _ in range(200):
        alphabet = rng.choice([b"ab", b"abc", b"a", b"ab\xff\x00"])
        words = {bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 9))): rng.randint(1, 5)
                 for _ in range(rng.randint(1, 12))}
        n_ranks = 256 + rng.randint(1, 25)
        want_ranks, want_merges = _naive(words, n_ranks)
        got = train_merges(list(words.items()), n_ranks=n_ranks)
        assert (got.ranks, got.merges) == (want_ranks, want_merges), words


def test_same_ranks_whatever_the_word_order():
    rng = random.Random(3)
    table = count_texts([_doc(rng) for _ in range(300)], pat_str=PATTERNS["gpt2"])
    words = list(zip(table.column("pretoken").to_pylist(), table.column("count").to_pylist()))
    first = train_merges(words, n_ranks=700).ranks
    rng.shuffle(words)
    assert train_merges(words, n_ranks=700).ranks == first


# -- counting (pure, and one piece as a worker runs it) --

def test_count_tables_combine_and_prune():
    a = count_texts(["hello world hello", "x"], pat_str=PATTERNS["gpt2"])
    b = count_texts(["hello there"], pat_str=PATTERNS["gpt2"])
    combined = combine_tables([a, b])
    assert dict(zip(*combined.to_pydict().values())) == {b"hello": 2, b" world": 1, b" hello": 1, b"x": 1, b" there": 1}
    assert combine_tables([a, b], min_count=2).to_pydict() == {"pretoken": [b"hello"], "count": [2]}
    assert combined.schema == pa.schema([("pretoken", pa.large_binary()), ("count", pa.int64())])


def test_patterns_split_like_tiktoken(gpt2, cl100k):
    """Encoding each of our pre-tokens alone gives tiktoken's tokens for the whole text only if
    the split is tiktoken's own."""
    import regex

    text = "Hello  world's 1234567 données\r\n\tend  DON'T 🙂🙂 x\n\n  "
    for name, enc in (("gpt2", gpt2), ("cl100k", cl100k)):
        pieces = regex.findall(PATTERNS[name], text)
        assert "".join(pieces) == text
        assert [t for p in pieces for t in enc.encode_ordinary(p)] == enc.encode_ordinary(text)
        table = count_texts([text], pat_str=PATTERNS[name])
        assert sum(table.column("count").to_pylist()) == len(pieces)
    assert resolve_pattern("cl100k") == ("cl100k", PATTERNS["cl100k"])
    assert resolve_pattern(r"\w+|\W") == ("custom", r"\w+|\W")
    with pytest.raises(UserError, match=r"--pattern '\(unclosed' is neither gpt2 nor cl100k nor a valid regex"):
        resolve_pattern("(unclosed")


def test_every_hundredth_row_is_held_back_not_counted(tmp_path):
    texts = [f"common words {i}" for i in range(200)]
    texts[99] = "zyzzyva held back"
    path = write_parquet(tmp_path / "h.parquet", {"text": texts}, row_group_size=50)
    meta = read_input_metadata(str(path), "h.parquet", text_column="text", id_column=None)
    (piece,) = plan_pieces([meta], target_bytes=10**9)
    counted = count_piece(piece, pat_str=PATTERNS["gpt2"], text_column="text", storage_options={},
                          holdout_every=100, heldout_budget=10**6)
    assert counted.heldout == ("zyzzyva held back", "common words 199")
    assert b" zyzzyva" not in counted.table.column("pretoken").to_pylist()
    assert counted.docs == 198


def test_sample_takes_whole_pieces_spread_over_the_plan(tmp_path):
    path = write_parquet(tmp_path / "s.parquet", {"text": ["x" * 100] * 100}, row_group_size=10)
    meta = read_input_metadata(str(path), "s.parquet", text_column="text", id_column=None)
    pieces = plan_pieces([meta], target_bytes=1)
    assert len(pieces) == 10
    assert [p.index for p in select_sample(pieces, 3 * pieces[0].text_bytes)] == [0, 3, 6]
    assert select_sample(pieces, None) == pieces == select_sample(pieces, 10**12)


# -- the ranks file --

def test_problems_names_what_is_wrong():
    good = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"abc": 257}
    assert ranks_io.problems(good) == []
    assert ranks_io.problems(good | {b"xyz": 258}) == ["rank 258 (b'xyz') is not two earlier tokens joined"]
    assert ranks_io.problems({**good, b"ab": 257, b"abc": 256}) == ["rank 256 (b'abc') is not two earlier tokens joined"]
    missing = dict(good)
    del missing[b"a"]
    assert "ranks are not 0..256 each once" in ranks_io.problems(missing)
    assert ranks_io.parse_ranks(ranks_io.dump_ranks(good), source="x") == good


def test_loader_refuses_a_sidecar_from_another_run(trained, tmp_path):
    _, out = trained
    copy = tmp_path / "copy.tiktoken"
    copy.write_bytes(out.read_bytes().rsplit(b"\n", 2)[0] + b"\n")  # the last rank dropped
    (tmp_path / "copy.tiktoken.json").write_text(Path(str(out) + ".json").read_text())
    with pytest.raises(UserError, match=r"copy\.tiktoken: sha256 .* differs from the one its sidecar .* records"):
        load_encoding(str(copy))
    with pytest.raises(UserError, match=r"encoding sidecar '.*nothere\.tiktoken\.json' not found; train one with "
                                         r"`tokenshards train-bpe --out .*nothere\.tiktoken`"):
        load_encoding(str(tmp_path / "nothere.tiktoken"))


def test_loads_from_a_url(trained):
    """--encoding https://.../NAME.tiktoken: read through fsspec, never through tiktoken's path cache."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    _, out = trained
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(out.parent))
    handler.log_message = lambda *args: None
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/{out.name}"
            loaded = load_encoding(url)
            assert loaded.params.mergeable_ranks == load_encoding(str(out)).params.mergeable_ranks
            assert loaded.encoding.name == url
        finally:
            server.shutdown()


# -- the whole job on the cluster --

def test_trained_file_is_consistent_and_round_trips_any_unicode(trained):
    summary, out = trained
    loaded = load_encoding(str(out))
    enc = loaded.encoding
    assert enc.n_vocab == summary.n_vocab == 600
    assert enc.eot_token == 599 and loaded.spec.dtype == "uint16"
    assert ranks_io.problems(loaded.params.mergeable_ranks) == []
    meta = json.loads(Path(str(out) + ".json").read_text())
    assert meta["special_tokens"] == {"<|endoftext|>": 599} and meta["pattern"] == "gpt2"
    rng = random.Random(11)
    texts = [_unicode_text(rng) for _ in range(300)] + [ranks_io.ROUND_TRIP_PROBE, "", " ", "\n" * 5]
    for text in texts:
        assert enc.decode(enc.encode_ordinary(text)) == text
    assert summary.heldout_tokens > 0 and summary.bytes_per_token > 2.0  # well above 1 byte/token: merges pay off
    assert summary.docs == 2 * (250 - 2 - 2)  # null/empty rows skipped, rows 99 and 199 held back (249 is not)


def test_same_ranks_for_any_partitioning(trained, cluster, corpus, tmp_path):
    """Many small partitions (a two-level combining tree) give the same file as one per input."""
    _, out = trained
    other = tmp_path / "tree.tiktoken"
    config = TrainBpeConfig(inputs=(str(corpus / "*.parquet"),), out=str(other), vocab_size=600, partition_bytes=1,
                            scheduler=cluster.scheduler_address, progress="none")
    summary = run_train_bpe(config, announce=lambda msg: None)
    assert summary.partitions == 20  # > 8: the tree has an inner level
    assert other.read_bytes() == out.read_bytes()


def test_trained_encoding_drives_tokenize(trained, tokenize, corpus):
    _, out = trained
    enc = load_encoding(str(out)).encoding
    summary, result = tokenize([str(corpus)], encoding=str(out))
    manifest = json.loads((result / "manifest.json").read_text())
    assert manifest["encoding"] == {"name": str(out), "n_vocab": 600, "eot": 599, "dtype": "uint16"}
    docs = read_documents(result)
    texts = {}
    for n in range(2):
        for row, text in enumerate(pq.read_table(corpus / f"00{n}.parquet").column("text").to_pylist()):
            if text:
                texts[(str(corpus / f"00{n}.parquet"), row)] = text
    assert docs.keys() == texts.keys()
    for key, (_, tokens) in docs.items():
        assert tokens == expected_tokens(enc, texts[key])


def test_verify_accepts_the_output(trained, tokenize, corpus, cluster):
    verify = pytest.importorskip("tokenshards.verify.command")
    _, out = trained
    _, result = tokenize([str(corpus)], encoding=str(out))
    report = verify.run_verify(verify.VerifyConfig(out=str(result), deep=20, scheduler=cluster.scheduler_address),
                               announce=lambda msg: None)
    assert report.ok, report.lines()


def test_trains_on_a_hub_sample(trained, cluster, corpus, tmp_path):
    """--dataset/--size: the real huggingface_hub client against the stand-in Hub; same ranks as local."""
    from hubserver import HubServer
    from tokenshards.storage.hub import HubDataset

    root = tmp_path / "repo"
    for path in sorted(corpus.glob("*.parquet")):
        target = root / "sample/10BT" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    _, local = trained
    out = tmp_path / "hub.tiktoken"
    with HubServer(root, repo="HuggingFaceFW/fineweb") as server:
        ds = HubDataset(repo="HuggingFaceFW/fineweb", size="10B", endpoint=server.url, cache_dir=str(tmp_path / "hf"),
                        keep_free=0, backoff=0.05)
        run_train_bpe(TrainBpeConfig(inputs=(), hub=ds, out=str(out), vocab_size=600,
                                     scheduler=cluster.scheduler_address, progress="none"), announce=lambda msg: None)
    assert out.read_bytes() == local.read_bytes()


def test_no_text_is_a_user_error(cluster, tmp_path):
    path = write_parquet(tmp_path / "nulls.parquet", {"text": pa.array([None, ""], pa.string())})
    config = TrainBpeConfig(inputs=(str(path),), out=str(tmp_path / "x.tiktoken"), scheduler=cluster.scheduler_address,
                            progress="none")
    with pytest.raises(UserError, match=r"no text to train on: every row of the 1 partitions counted was null, empty"):
        run_train_bpe(config, announce=lambda msg: None)
    assert not (tmp_path / "x.tiktoken").exists()


def _with_bad_rows(path: Path, texts: list[str], bad_rows: set[int]) -> Path:
    """``texts`` as a parquet file of 25-row groups, whose ``bad_rows`` hold bytes that are not UTF-8."""
    raw = [b"caf\xe9 \xff" if i in bad_rows else t.encode() for i, t in enumerate(texts)]
    return write_parquet(path, {"text": not_utf8(raw)}, row_group_size=25)


def test_an_unreadable_partition_stops_the_count_and_leaves_the_cluster_idle(cluster, tmp_path):
    """A leaf that fails (page data destroyed, footer intact) ends the run in one line naming the
    file and row groups; no leaf, tree node or root is left running on the cluster."""
    import time
    from distributed import Client

    path = corrupt_data_pages(write_parquet(tmp_path / "in" / "bad.parquet",
                                            {"text": [f"document {i} with words" for i in range(400)]}, row_group_size=20))
    config = TrainBpeConfig(inputs=(str(path),), out=str(tmp_path / "x.tiktoken"), scheduler=cluster.scheduler_address,
                            partition_bytes=1_000, progress="none")
    with pytest.raises(UserError, match=r"bad\.parquet: row groups \d+\.\.\d+ unreadable \(.*\); re-download the "
                                        r"file, or pass --on-bad-file skip$"):
        run_train_bpe(config, announce=lambda msg: None)
    with Client(cluster.scheduler_address) as client:
        deadline = time.monotonic() + 10
        while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0
    assert not (tmp_path / "x.tiktoken").exists()


def test_text_that_is_not_utf8_is_a_one_line_error_naming_the_row(cluster, tmp_path):
    rng = random.Random(3)
    path = _with_bad_rows(tmp_path / "latin1.parquet", [_doc(rng) for _ in range(60)], {37})
    config = TrainBpeConfig(inputs=(str(path),), out=str(tmp_path / "x.tiktoken"), scheduler=cluster.scheduler_address,
                            progress="none")
    with pytest.raises(UserError, match=r"^\S*latin1\.parquet: partition 0, row 37: column 'text' is not valid UTF-8; "
                                        r"fix the file, or pass --on-bad-file skip to skip such rows$"):
        run_train_bpe(config, announce=lambda msg: None)
    assert not (tmp_path / "x.tiktoken").exists()


def test_skipping_bad_input_trains_on_the_rest_as_if_it_were_absent(cluster, tmp_path):
    """--on-bad-file skip: an unreadable file, a file whose partitions cannot be read and rows that
    are not UTF-8 are left out, said, and recorded; the ranks are those of the readable text alone
    (the bad rows as nulls, so the held-back rows stay the same)."""
    rng = random.Random(5)
    good = [_doc(rng) for _ in range(250)]
    mixed = [_doc(rng) for _ in range(250)]
    bad_rows = {3, 120, 121}
    (tmp_path / "in").mkdir()
    write_parquet(tmp_path / "in" / "0-good.parquet", {"text": good}, row_group_size=25)
    _with_bad_rows(tmp_path / "in" / "1-mixed.parquet", mixed, bad_rows)
    corrupt_data_pages(write_parquet(tmp_path / "in" / "2-pages.parquet", {"text": [_doc(rng) for _ in range(250)]},
                                     row_group_size=25))
    (tmp_path / "in" / "3-footer.parquet").write_bytes(b"PAR1 not a parquet file at all")
    (tmp_path / "want").mkdir()
    write_parquet(tmp_path / "want" / "0-good.parquet", {"text": good}, row_group_size=25)
    write_parquet(tmp_path / "want" / "1-mixed.parquet",
                  {"text": [None if i in bad_rows else t for i, t in enumerate(mixed)]}, row_group_size=25)

    said: list[str] = []
    out, want = tmp_path / "skip.tiktoken", tmp_path / "want.tiktoken"
    run_train_bpe(TrainBpeConfig(inputs=(str(tmp_path / "in"),), out=str(out), vocab_size=500, on_bad_file="skip",
                                 partition_bytes=5_000, scheduler=cluster.scheduler_address, progress="none"),
                  announce=said.append)
    run_train_bpe(TrainBpeConfig(inputs=(str(tmp_path / "want"),), out=str(want), vocab_size=500,
                                 partition_bytes=5_000, scheduler=cluster.scheduler_address, progress="none"),
                  announce=lambda msg: None)
    assert out.read_bytes() == want.read_bytes()
    skipped = json.loads(out.with_name(out.name + ".json").read_text())["training"]["skipped"]
    assert [i["url"].rsplit("/", 1)[-1] for i in skipped["inputs"]] == ["3-footer.parquet"]
    assert skipped["invalid_rows"] == len(bad_rows) and skipped["partitions"] > 1
    assert any(line.startswith("skipping unreadable input: ") and "3-footer.parquet" in line for line in said), said
    partitions = [line for line in said if line.startswith("skipped an unreadable partition: ")]
    assert len(partitions) == skipped["partitions"] and all("2-pages.parquet: row groups" in p for p in partitions)
    assert not any("--on-bad-file skip" in line for line in said), said  # never suggests the flag already given
    assert "skipped 3 rows whose text is not valid UTF-8" in said


def test_skipping_every_input_is_a_user_error(cluster, tmp_path):
    (tmp_path / "broken.parquet").write_bytes(b"garbage")
    config = TrainBpeConfig(inputs=(str(tmp_path / "broken.parquet"),), out=str(tmp_path / "x.tiktoken"),
                            on_bad_file="skip", scheduler=cluster.scheduler_address, progress="none")
    with pytest.raises(UserError, match=r"^every input was skipped as unreadable \(--on-bad-file skip\): nothing is "
                                        r"left to read$"):
        run_train_bpe(config, announce=lambda msg: None)
    assert not (tmp_path / "x.tiktoken").exists()


# -- the command line --

def test_cli_trains_and_prints_summary(corpus, cluster, tmp_path):
    out = tmp_path / "cli.tiktoken"
    config = tmp_path / "cluster.yaml"  # --cluster, as tokenize takes it, pointing at the session's scheduler
    config.write_text(f"kind: scheduler\naddress: {cluster.scheduler_address}\n")
    proc = subprocess.run([TOKENSHARDS, "train-bpe", "--input", str(corpus), "--out", str(out), "--vocab-size", "400",
                           "--special", "<|pad|>", "--pattern", "cl100k", "--cluster", str(config),
                           "--progress", "log", "--on-bad-file", "skip"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "skipped" not in proc.stderr  # nothing to skip in a clean corpus
    assert "counting: partitions 2/2" in proc.stderr and "merges/s" in proc.stderr
    assert f"done: {out}, n_vocab 400" in proc.stdout and "bytes/token on" in proc.stdout
    meta = json.loads(Path(str(out) + ".json").read_text())
    assert meta["special_tokens"] == {"<|endoftext|>": 398, "<|pad|>": 399} and meta["pattern"] == "cl100k"


@pytest.mark.parametrize("args, message", [
    (["--out", "x.bpe"], "tokenshards: error: --out 'x.bpe' must end in .tiktoken"),
    (["--out", "OUT/x.tiktoken", "--vocab-size", "100"], "tokenshards: error: --vocab-size 100 is too small"),
    (["--out", "OUT/x.tiktoken", "--pattern", "(?<"], "tokenshards: error: --pattern '(?<' is neither gpt2 nor cl100k"),
    (["--out", "OUT/x.tiktoken", "--pattern", "cl100k", "--merger", "gigatoken"],
     "tokenshards: error: --merger gigatoken needs --pattern gpt2"),
])
def test_cli_mistakes_are_one_line(corpus, tmp_path, capsys, args, message):
    """In-process ``main``: the same code path as the command, without paying for a new interpreter."""
    from tokenshards.cli import main

    args = [a.replace("OUT", str(tmp_path)) for a in args]
    assert main(["train-bpe", "--input", str(corpus), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err
