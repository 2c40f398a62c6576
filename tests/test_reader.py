"""TokenDataset against what plain json/numpy/pyarrow read (``readback``), locally and on S3."""
from __future__ import annotations

import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from readback import read_documents

from tokenshards import TokenDataset
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.errors import UserError
from tokenshards.tokenize.command import run_tokenize

WORDS = "one two three Straße naïve 東京 🙂 <|endoftext|> 42 \n\n — ‘quoted’".split(" ")


@pytest.fixture(scope="module")
def out(tmp_path_factory, cluster) -> Path:
    """~200 documents over a dozen partitions, one input with ids and one without, a null row."""
    root = tmp_path_factory.mktemp("reader")
    rng = random.Random(3)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 80))) for _ in range(200)]
    texts[17] = None
    (root / "in").mkdir()
    pq.write_table(pa.table({"id": [f"id-{i}" for i in range(120)], "text": texts[:120]}), root / "in" / "a.parquet",
                   row_group_size=15)
    pq.write_table(pa.table({"text": texts[120:]}), root / "in" / "b.parquet", row_group_size=20)
    run_tokenize(TokenizeConfig(inputs=(str(root / "in" / "*.parquet"),), out=str(root / "out"), partition_bytes=3000,
                                scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
    return root / "out"


def expected(out: Path) -> list[tuple[tuple[str, int], str, list[int]]]:
    return [(key, doc_id, tokens) for key, (doc_id, tokens) in read_documents(out).items()]


def check_dataset(ds: TokenDataset, docs) -> None:
    assert len(ds) == ds.n_docs == len(docs) == 199
    stream = np.array([t for _, _, tokens in docs for t in tokens])
    assert ds.n_tokens == len(stream) and ds.dtype == np.uint16 and ds.encoding["name"] == "gpt2"
    for i in (0, 1, 57, 118, 119, len(docs) - 1, -1):
        key, doc_id, tokens = docs[i]
        assert ds.doc(i).tolist() == tokens and ds[i].tolist() == tokens
        assert ds.doc_id(i) == doc_id and ds.doc_source(i) == key
    assert ds.index_of("id-42") == 41  # row 17 is null, so row 42 is document 41
    assert ds.by_id("id-42").tolist() == docs[41][2]
    name_b = docs[-1][1].rsplit(":", 1)[0]
    assert ds.by_id(f"{name_b}:5").tolist() == next(t for k, i, t in docs if i == f"{name_b}:5")
    # A token range across several partitions, and random windows.
    assert ds.tokens(100, len(stream) - 100).tolist() == stream[100:-100].tolist()
    batch = ds.sample_windows(batch_size=8, seq_len=64, rng=5)
    assert batch.shape == (8, 65) and batch.dtype == np.int64
    windows = sliding_window_view(stream, 65)
    for row in batch:
        assert (windows == row).all(axis=1).any()
    assert (ds.sample_windows(batch_size=8, seq_len=64, rng=5) == batch).all()


def test_local_dataset_matches_plain_reads(out):
    docs = expected(out)
    ds = TokenDataset(str(out))
    check_dataset(ds, docs)
    assert "199 documents" in repr(ds)
    copy = pickle.loads(pickle.dumps(ds))  # e.g. into DataLoader worker processes: maps reopen there
    assert len(pickle.dumps(ds)) < 100_000 and copy.doc(5).tolist() == docs[5][2]


def test_s3_dataset_uses_range_reads(out, s3):  # noqa: F811
    fs = s3.fs()
    bucket = s3.make_bucket()
    for path in sorted(out.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{bucket}/out/{path.relative_to(out).as_posix()}")
    check_dataset(TokenDataset(f"s3://{bucket}/out", storage_options=s3.storage_options), expected(out))


def test_errors_name_the_problem(out, tmp_path):
    ds = TokenDataset(str(out))
    with pytest.raises(IndexError, match=r"document 199 out of range: the dataset holds 199 documents"):
        ds.doc(199)
    with pytest.raises(KeyError, match=r"no document with id 'nope'"):
        ds.by_id("nope")
    with pytest.raises(UserError, match=r"seq_len=100000 needs 100,001 tokens per window, the dataset holds"):
        ds.sample_windows(batch_size=1, seq_len=100_000)
    with pytest.raises(UserError, match=r"no manifest.json; not a finished tokenshards run"):
        TokenDataset(str(tmp_path))
    (tmp_path / "manifest.json").write_text('{"format": "tokenshards/9"}')
    with pytest.raises(UserError, match=r"format 'tokenshards/9', expected 'tokenshards/1'"):
        TokenDataset(str(tmp_path))


def test_import_is_lazy():
    code = "import sys, tokenshards; assert 'tokenshards.format.reader' not in sys.modules; tokenshards.TokenDataset"
    subprocess.run([sys.executable, "-c", code], check=True)
