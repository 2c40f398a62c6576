"""``export --format hf`` read by the real ``datasets``: ``load_dataset(PATH)`` through the card's
``configs`` and ``load_dataset("parquet", data_files=...)``, ids equal to the run's documents
(readback.py, through test_export's expectations), packed and not, shuffled, and published to the
stand-in Hub then loaded from a snapshot of the repo."""
from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from huggingface_hub import snapshot_download
from test_export import expected_split, flat, tokenize_to, write_corpus
from test_publish import REPO, hub  # noqa: F401 - hub: the stand-in Hub fixture

from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.export import ExportConfig, run_export

pytestmark = pytest.mark.filterwarnings(
    "ignore:Use 'content=<...>' to upload raw bytes/text content.:DeprecationWarning")  # as test_publish.py

VAL = 1500
N = 64


@pytest.fixture(scope="module")
def run(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("hf")
    write_corpus(root / "in")
    out = tokenize_to(cluster, root / "in", root / "out", partition_bytes=6000)
    return {"root": root, "out": out, "split": expected_split(out, VAL)}


def export(cluster, run, name, **options) -> Path:
    to = run["root"] / name
    run_export(ExportConfig(out=str(run["out"]), to=str(to), scheduler=cluster.scheduler_address, progress="none",
                            val_tokens=VAL, **options), announce=lambda m: None)
    return to


def load(path: Path, tmp_path: Path, **kw):
    return datasets.load_dataset(str(path), cache_dir=str(tmp_path / "cache"), **kw)


def pieces_of(ids: list[int], lengths: list[int], mask: list[int]) -> list[tuple[int, ...]]:
    """A packed row's documents (or pieces of documents): its segments (``seq_lengths``) cover its N
    tokens; where ``attention_mask`` marks padding (0s at the end), the last segment is that padding."""
    assert sum(lengths) == N and min(lengths) > 0
    filled = sum(mask)
    assert mask == [1] * filled + [0] * (N - filled)
    if filled < N:
        assert lengths[-1] == N - filled
        lengths = lengths[:-1]
    at = np.cumsum([0] + lengths).tolist()
    return [tuple(ids[a:b]) for a, b in zip(at[:-1], at[1:])]


def test_document_rows_load_with_datasets_and_equal_the_run(cluster, run, tmp_path):
    to = export(cluster, run, "docs", format="hf", shard_tokens=5000)
    val, train = run["split"]
    ds = load(to, tmp_path)
    assert set(ds) == {"train", "validation"}
    assert ds["train"]["input_ids"] == train and ds["validation"]["input_ids"] == val
    assert ds["train"].column_names == ["input_ids"]
    assert len(list((to / "train").glob("*.parquet"))) > 1  # sharded by --shard-tokens
    by_files = datasets.load_dataset("parquet", data_files={"train": str(to / "train" / "*.parquet")},
                                     cache_dir=str(tmp_path / "cache2"), split="train")
    assert by_files["input_ids"] == train
    record = json.loads((to / "fineweb_export.json").read_text())
    assert {f["name"] for f in record["files"]} == {str(p.relative_to(to)) for p in to.rglob("*.parquet")}
    assert record["splits"]["train"]["tokens"] == len(flat(train))


def test_packed_rows_are_the_stream_in_seq_len_windows_with_boundaries(cluster, run, tmp_path):
    to = export(cluster, run, "packed", format="hf", seq_len=N, columns=("position_ids", "attention_mask", "labels"))
    _, train = run["split"]
    ds = load(to, tmp_path, split="train")
    stream = flat(train)
    ids = np.array(ds["input_ids"])
    assert ids.shape == (len(stream) // N, N)
    assert ids.reshape(-1).tolist() == stream[:ids.size]
    starts = np.cumsum([0] + [len(d) for d in train])
    for i, (lengths, pos, mask, labels) in enumerate(zip(ds["seq_lengths"], ds["position_ids"], ds["attention_mask"],
                                                         ds["labels"])):
        # the documents' boundaries inside window i, from the run's own document lengths
        cuts = sorted({0, N, *(int(s) - i * N for s in starts if i * N < s < (i + 1) * N)})
        assert lengths == np.diff(cuts).tolist()
        assert pos == [j for n in lengths for j in range(n)] and mask == [1] * N
        firsts = set(np.cumsum([0] + lengths[:-1]).tolist())
        assert labels == [-100 if j in firsts else t for j, t in enumerate(ids[i].tolist())]


def test_best_fit_shuffled_rows_pad_and_load(cluster, run, tmp_path):
    to = export(cluster, run, "best-fit", format="hf", seq_len=N, pack="best-fit", shuffle=True, seed=3,
                columns=("attention_mask",))
    _, train = run["split"]
    ds = load(to, tmp_path, split="train")
    assert ds.column_names == ["input_ids", "seq_lengths", "attention_mask", "labels"]  # labels: padding is no target
    pieces = []
    for ids, lengths, mask, labels in zip(ds["input_ids"], ds["seq_lengths"], ds["attention_mask"], ds["labels"]):
        mine = pieces_of(ids, lengths, mask)
        at = 0
        for piece in mine:
            assert labels[at:at + len(piece)] == [-100, *piece[1:]]  # no target across a document's start
            at += len(piece)
        assert labels[at:] == [-100] * (N - at)  # nor on the padding
        pieces += mine
    assert sorted(pieces) == sorted(tuple(d[i:i + N]) for d in train for i in range(0, len(d), N))


def test_shuffled_document_rows_are_a_permutation(cluster, run, tmp_path):
    to = export(cluster, run, "docs-shuffled", format="hf", shuffle=True, seed=1)
    val, train = run["split"]
    ds = load(to, tmp_path)
    got = ds["train"]["input_ids"]
    assert sorted(map(tuple, got)) == sorted(map(tuple, train)) and got != train
    again = export(cluster, run, "docs-shuffled-again", format="hf", shuffle=True, seed=1, chunk_bytes=777)
    assert all((again / p.relative_to(to)).read_bytes() == p.read_bytes() for p in to.rglob("*.parquet"))


def test_row_groups_are_bounded(cluster, tmp_path):
    """A shard is written row group by row group; each holds at most ~ROW_GROUP_TOKENS tokens (a
    row longer than that alone). The run holds 1.1 M tokens in one train shard, past the bound, so a
    shard written as one row group fails (the module's run, ~15,000 tokens, never reached it)."""
    from tokenshards.export.packed import ROW_GROUP_TOKENS

    rng = np.random.default_rng(5)
    words = np.array("the cat sat on a mat while dogs ran far away into green hills".split())
    texts = [" ".join(rng.choice(words, 100_000)) for _ in range(11)]  # 100,000 gpt2 tokens each, one per word
    pq.write_table(pa.table({"text": texts}), tmp_path / "big.parquet", row_group_size=1)
    out = tokenize_to(cluster, tmp_path, tmp_path / "out")
    tokens = json.loads((out / "manifest.json").read_text())["totals"]["tokens"]
    assert tokens > ROW_GROUP_TOKENS
    for seq_len in (N, None):  # packed rows, document rows
        to = tmp_path / f"hf-{seq_len}"
        run_export(ExportConfig(out=str(out), to=str(to), format="hf", seq_len=seq_len, val_tokens=0,
                                scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
        [shard] = to.rglob("*.parquet")
        parquet = pq.ParquetFile(shard)
        for g in range(parquet.metadata.num_row_groups):
            lengths = pc.list_value_length(parquet.read_row_group(g, columns=["input_ids"])["input_ids"]).to_numpy()
            assert lengths.sum() <= max(ROW_GROUP_TOKENS, lengths.max()), (seq_len, g, lengths.sum())
        assert parquet.metadata.num_row_groups >= 2


def test_hf_mistakes_are_one_line(cluster, run, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "README.md").write_text("my notes\n")
    with pytest.raises(UserError, match="README.md of its own"):
        run_export(ExportConfig(out=str(run["out"]), to=str(tmp_path / "mine"), format="hf", val_tokens=VAL,
                                scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
    assert (tmp_path / "mine" / "README.md").read_text() == "my notes\n"
    with pytest.raises(UserError, match="needs --seq-len"):
        ExportConfig(out="a", mix_with=("b",), to="dest", format="hf")


def test_publish_to_the_hub_then_load_the_repo(cluster, run, hub, tmp_path, capsys):  # noqa: F811
    code = main(["export", str(run["out"]), "--format", "hf", "--seq-len", str(N), "--pack", "best-fit",
                 "--columns", "position_ids,attention_mask",  # attention_mask: where each row's padding is
                 "--to", f"hf://datasets/{REPO}", "--val-tokens", str(VAL), "--create-repo",
                 "--scheduler", cluster.scheduler_address, "--progress", "none"])
    out = capsys.readouterr()
    assert code == 0, out.err
    snap = Path(snapshot_download(repo_id=REPO, repo_type="dataset", endpoint=hub.url,
                                  cache_dir=str(tmp_path / "snap-cache")))
    card = (snap / "README.md").read_text()
    assert "configs:" in card and "viewer: false" not in card
    ds = load(snap, tmp_path)
    val, train = run["split"]
    for split, docs in (("train", train), ("validation", val)):
        rows = zip(ds[split]["input_ids"], ds[split]["seq_lengths"], ds[split]["attention_mask"])
        got = [piece for ids, lengths, mask in rows for piece in pieces_of(ids, lengths, mask)]
        assert sorted(got) == sorted(tuple(d[i:i + N]) for d in docs for i in range(0, len(d), N))


def test_publish_into_a_sub_folder_loads_from_the_root_and_from_the_folder(cluster, run, hub, tmp_path, capsys):  # noqa: F811
    """Into ``hf://datasets/ORG/NAME/sub/folder``: the card beside the shards names them relative to
    its own folder and the root card relative to the root, so ``load_dataset`` reads the same rows
    from a copy of the repo and from a copy of the folder alone."""
    code = main(["export", str(run["out"]), "--format", "hf", "--to", f"hf://datasets/{REPO}/sub/folder",
                 "--val-tokens", str(VAL), "--create-repo", "--scheduler", cluster.scheduler_address, "--progress", "none"])
    assert code == 0, capsys.readouterr().err
    snap = Path(snapshot_download(repo_id=REPO, repo_type="dataset", endpoint=hub.url,
                                  cache_dir=str(tmp_path / "snap-cache")))
    inner, root = (snap / "sub" / "folder" / "README.md").read_text(), (snap / "README.md").read_text()
    assert 'path: "train/*.parquet"' in inner and "sub/folder/" not in inner.split("---")[1]
    assert 'path: "sub/folder/train/*.parquet"' in root and "(sub/folder/fineweb_export.json)" in root
    val, train = run["split"]
    for at in (snap, snap / "sub" / "folder"):
        ds = load(at, tmp_path / at.name)
        assert sorted(map(tuple, ds["train"]["input_ids"])) == sorted(map(tuple, train))
        assert sorted(map(tuple, ds["validation"]["input_ids"])) == sorted(map(tuple, val))
