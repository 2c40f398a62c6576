"""Shuffled and mixed exports, read back with the format readers of test_export.py and checked
against documents read from the part files with plain numpy/pyarrow (readback.py)."""
from __future__ import annotations

import collections
import json
import math
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from readback import read_documents
from test_export import expected_split, read_llmc, read_megatron, tokenize_to, write_corpus

from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.export import ExportConfig, run_export

EOT = 50256
VAL = 1500
SHARD = 4000


def write_other_corpus(folder: Path) -> None:
    """Another source for mixtures: upper-case words, so no document equals one of write_corpus's."""
    rng = random.Random(11)
    folder.mkdir(parents=True, exist_ok=True)
    words = "ALPHA BETA GAMMA DELTA Ωμέγα ЖУК 42 ... ZETA".split(" ")
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 60))) for _ in range(90)]
    pq.write_table(pa.table({"id": [f"other-{i}" for i in range(len(texts))], "text": texts}), folder / "c.parquet",
                   row_group_size=30)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("shuffle")
    write_corpus(root / "in")
    write_other_corpus(root / "in2")
    return {
        "root": root,
        "a": tokenize_to(cluster, root / "in", root / "a", partition_bytes=6000),
        "a_big": tokenize_to(cluster, root / "in", root / "a-big", partition_bytes=50_000),
        "b": tokenize_to(cluster, root / "in2", root / "b", partition_bytes=3000),
    }


def export(cluster, out, to, **options) -> Path:
    options.setdefault("scheduler", cluster.scheduler_address)
    run_export(ExportConfig(out=str(out), to=str(to), **options), announce=lambda m: None)
    return Path(to)


def split_docs(tokens) -> list[tuple[int, ...]]:
    """A prefix-eot stream cut into documents (text never encodes to the eot id: it is ordinary text)."""
    tokens = np.asarray(tokens)
    starts = np.flatnonzero(tokens == EOT).tolist()
    assert not len(tokens) or starts[0] == 0
    return [tuple(tokens[a:b].tolist()) for a, b in zip(starts, starts[1:] + [len(tokens)])]


def llmc_split(dest: Path, split: str) -> np.ndarray:
    names = sorted(dest.glob(f"fineweb_{split}_*.bin"), key=lambda p: p.name[-10:])
    return np.concatenate([read_llmc(p)[1] for p in names]) if names else np.empty(0, np.uint16)


def all_docs(out: Path) -> list[tuple[int, ...]]:
    return [tuple(tokens) for _, tokens in read_documents(out).values()]


def neighbours_kept(source_order: list[tuple], output_order: list[tuple]) -> int:
    """How many adjacent pairs of the output were adjacent, in that order, in the source."""
    pairs = set(zip(source_order, source_order[1:]))
    return sum(1 for p in zip(output_order, output_order[1:]) if p in pairs)


# -- one run, shuffled ----------------------------------------------------------------------------
def test_shuffled_llmc_every_document_once_and_the_same_validation_set(cluster, runs, tmp_path):
    out = runs["a"]
    # Small chunks: many buckets, and ranges that cut documents, tokens and the header.
    dest = export(cluster, out, tmp_path / "s", format="llmc", shard_tokens=SHARD, val_tokens=VAL, shuffle=True,
                  chunk_bytes=777)
    val, train = expected_split(out, VAL)
    got_val, got_train = split_docs(llmc_split(dest, "val")), split_docs(llmc_split(dest, "train"))
    assert sorted(got_val) == sorted(map(tuple, val))
    assert sorted(got_train) == sorted(map(tuple, train))
    assert got_train != [tuple(d) for d in train]
    assert neighbours_kept([tuple(d) for d in train], got_train) <= max(3, len(train) // 50)
    # Shards: one running number, train shards full but the last.
    shards = sorted(dest.glob("fineweb_train_*.bin"))
    assert all(len(read_llmc(p)[1]) == SHARD for p in shards[:-1])
    record = json.loads((dest / "fineweb_export.json").read_text())
    assert record["order"]["seed"] == 0 and record["splits"]["train"]["docs"] == len(train)
    assert record["sources"][0]["epochs"] == 1 and record["sources"][0]["documents"] == len(train)


def test_byte_identical_across_workers_chunks_and_partitioning_other_seed_other_order(cluster, runs, tmp_path):
    """The order depends on the seed and the documents only: a run tokenized with another
    --partition-mb, exported by a one-worker cluster in other chunks, gives the same bytes."""
    a = export(cluster, runs["a"], tmp_path / "a", format="npy", shard_tokens=SHARD, val_tokens=VAL, shuffle=True,
               seed=7, chunk_bytes=999)
    b = export(cluster, runs["a_big"], tmp_path / "b", format="npy", shard_tokens=SHARD, val_tokens=VAL, shuffle=True,
               seed=7, scheduler=None, workers=1, dashboard_address=":0")
    names = sorted(p.name for p in a.glob("*.npy"))
    assert names == sorted(p.name for p in b.glob("*.npy")) and len(names) > 2
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    c = export(cluster, runs["a"], tmp_path / "c", format="npy", shard_tokens=SHARD, val_tokens=VAL, shuffle=True, seed=8)
    train = lambda d: np.concatenate([np.load(p) for p in sorted(d.glob("*_train_*.npy"))])  # noqa: E731
    docs_a, docs_c = split_docs(train(a)), split_docs(train(c))
    assert sorted(docs_a) == sorted(docs_c) and docs_a != docs_c
    assert neighbours_kept(docs_a, docs_c) <= max(3, len(docs_a) // 50)


def test_dasks_shuffle_and_the_direct_path_give_the_same_bytes(cluster, runs, tmp_path, monkeypatch):
    """Small frames skip Dask's shuffle; large ones take it: the order is the same."""
    from tokenshards.export import shuffle

    options = dict(format="megatron", val_tokens=VAL, shuffle=True, seed=2, chunk_bytes=3000)
    direct = export(cluster, runs["a"], tmp_path / "direct", **options)
    monkeypatch.setattr(shuffle, "DIRECT_TASKS", 0)
    dask_shuffle = export(cluster, runs["a"], tmp_path / "dask", **options)
    names = sorted(p.name for p in direct.glob("*_document.*"))
    assert len(names) == 4
    for n in names:
        assert (direct / n).read_bytes() == (dask_shuffle / n).read_bytes(), n


def test_shuffled_megatron_and_nanogpt(cluster, runs, tmp_path):
    out = runs["a"]
    val, train = expected_split(out, VAL)
    dest = export(cluster, out, tmp_path / "m", format="megatron", val_tokens=VAL, shuffle=True, chunk_bytes=1001)
    _, docs = read_megatron(dest / "fineweb_text_document")
    assert sorted(tuple(d.tolist()) for d in docs) == sorted(map(tuple, train))
    _, docs = read_megatron(dest / "fineweb_val_text_document")
    assert sorted(tuple(d.tolist()) for d in docs) == sorted(map(tuple, val))
    dest = export(cluster, out, tmp_path / "n", format="nanogpt", val_tokens=0, shuffle=True)
    got = split_docs(np.memmap(dest / "train.bin", dtype=np.uint16, mode="r"))
    assert sorted(got) == sorted(all_docs(out)) and not (dest / "val.bin").exists()


def test_shuffled_from_s3_to_s3_matches_local(cluster, runs, s3, tmp_path):  # noqa: F811
    out = runs["a"]
    fs = s3.fs()
    bucket = s3.make_bucket()
    for path in sorted(out.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{bucket}/a/{path.relative_to(out).as_posix()}")
    local = export(cluster, out, tmp_path / "local", format="llmc", val_tokens=VAL, shuffle=True, seed=3)
    run_export(ExportConfig(out=f"s3://{bucket}/a", to=f"s3://{bucket}/llmc", format="llmc", val_tokens=VAL, shuffle=True,
                            seed=3, storage_options=s3.storage_options, scheduler=cluster.scheduler_address),
               announce=lambda m: None)
    names = sorted(p.name for p in local.iterdir())
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/llmc")) == names
    for name in names:
        if name.endswith(".bin"):
            assert fs.cat_file(f"{bucket}/llmc/{name}") == (local / name).read_bytes(), name


def test_a_failed_export_leaves_nothing_and_a_rerun_gives_the_same_bytes(cluster, runs, tmp_path):
    """A part file that cannot be read fails the writers: no shard, temporary or record remains
    (files are committed only once every chunk of every file is in); the same command then works."""
    out = tmp_path / "copy"
    import shutil

    shutil.copytree(runs["a"], out)
    reference = export(cluster, out, tmp_path / "ref", format="llmc", shard_tokens=SHARD, val_tokens=VAL, shuffle=True)
    victim = out / json.loads((out / "manifest.json").read_text())["partitions"][3]["tokens_file"]
    good = victim.read_bytes()
    victim.write_bytes(good[:200])
    dest = tmp_path / "d"
    with pytest.raises(UserError, match=r"writing .* failed|damaged|part-00003"):
        export(cluster, out, dest, format="llmc", shard_tokens=SHARD, val_tokens=VAL, shuffle=True, chunk_bytes=20000)
    assert not dest.exists()  # the folder it made went too
    victim.write_bytes(good)
    export(cluster, out, dest, format="llmc", shard_tokens=SHARD, val_tokens=VAL, shuffle=True, chunk_bytes=20000)
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in reference.iterdir())
    for p in reference.glob("*.bin"):
        assert (dest / p.name).read_bytes() == p.read_bytes()


# -- mixtures ---------------------------------------------------------------------------------------
def test_mixture_shares_epochs_and_record(cluster, runs, tmp_path):
    """B is smaller than its 0.6 share: repeated whole, then topped up; A gives a prefix of its
    order. Each source's train tokens reach weight x N, overshooting by less than one document."""
    a, b = runs["a"], runs["b"]
    val_a, train_a = expected_split(a, 1000)  # 0.4 x 2500 validation tokens
    val_b, train_b = expected_split(b, 1500)
    n = 30_000
    dest = tmp_path / "mix"
    run_export(ExportConfig(out=str(a), mix_with=(str(b),), weights=(0.4, 0.6), tokens=n, val_tokens=2500, format="llmc",
                            to=str(dest), scheduler=cluster.scheduler_address, chunk_bytes=3001), announce=lambda m: None)
    docs_a, docs_b = collections.Counter(map(tuple, train_a)), collections.Counter(map(tuple, train_b))
    assert not set(docs_a) & set(docs_b)
    got = split_docs(llmc_split(dest, "train"))
    from_a = collections.Counter(d for d in got if d in docs_a)
    from_b = collections.Counter(d for d in got if d in docs_b)
    assert sum(from_a.values()) + sum(from_b.values()) == len(got)
    for counter, docs, w in ((from_a, docs_a, Fraction(2, 5)), (from_b, docs_b, Fraction(3, 5))):
        tokens = sum(len(d) * c for d, c in counter.items())
        target = math.ceil(w * n)
        assert target <= tokens < target + max(map(len, docs)), (tokens, target)
    total_b = sum(len(d) * c for d, c in docs_b.items())
    epochs = math.ceil(Fraction(3, 5) * n) // total_b
    assert epochs >= 2 and set(from_b) == set(docs_b)
    assert all(epochs * docs_b[d] <= c <= (epochs + 1) * docs_b[d] for d, c in from_b.items())
    assert all(c <= docs_a[d] for d, c in from_a.items()) and sum(from_a.values()) < sum(docs_a.values())
    # The two sources are interleaved through the whole stream, not one after the other.
    first_half = got[:len(got) // 2]
    assert 0.25 < sum(d in docs_a for d in first_half) / max(1, sum(d in docs_a for d in got)) < 0.75
    # Validation: each source's own set, by weight of --val-tokens.
    assert sorted(split_docs(llmc_split(dest, "val"))) == sorted(map(tuple, val_a + val_b))
    record = json.loads((dest / "fineweb_export.json").read_text())
    src = record["sources"]
    assert [s["path"] for s in src] == [str(a), str(b)] and [s["weight"] for s in src] == [0.4, 0.6]
    assert src[1]["full_epochs"] == epochs and src[1]["epochs"] > epochs
    assert src[0]["tokens"] == sum(len(d) * c for d, c in from_a.items()) and src[1]["documents"] == sum(from_b.values())
    assert src[0]["val_tokens"] == sum(map(len, val_a))


def test_mixture_bytes_do_not_depend_on_partitioning_or_chunks(cluster, runs, tmp_path):
    """The cut of a partial epoch and every copy's place depend on the documents only."""
    options = dict(weights=(0.3, 0.7), tokens=12_345, val_tokens=800, seed=9, format="megatron")
    x = export(cluster, runs["a"], tmp_path / "x", mix_with=(str(runs["b"]),), chunk_bytes=1500, **options)
    y = export(cluster, runs["a_big"], tmp_path / "y", mix_with=(str(runs["b"]),), **options)
    names = sorted(p.name for p in x.glob("*_document.*"))
    assert len(names) == 4
    for n in names:
        assert (x / n).read_bytes() == (y / n).read_bytes(), n


def test_mixture_default_total_takes_no_run_twice(cluster, runs, tmp_path, capsys):
    a, b = runs["a"], runs["b"]
    dest = tmp_path / "cli"
    code = main(["export", str(a), str(b), "--weights", "1", "1", "--val-tokens", "0", "--format", "nanogpt",
                 "--to", str(dest), "--seed", "5", "--scheduler", cluster.scheduler_address])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert f"{a}: weight 0.5, " in printed.out and " epochs)" in printed.out
    got = collections.Counter(split_docs(np.memmap(dest / "train.bin", dtype=np.uint16, mode="r")))
    docs_a, docs_b = collections.Counter(all_docs(a)), collections.Counter(all_docs(b))
    assert all(got[d] == c for d, c in docs_b.items())  # B, the smaller, whole; A up to as many tokens
    assert all(c <= docs_a[d] for d, c in got.items() if d not in docs_b)
    tokens_b = sum(len(d) * c for d, c in docs_b.items())
    tokens_a = sum(len(d) * c for d, c in got.items() if d not in docs_b)
    assert tokens_b <= tokens_a < tokens_b + max(len(d) for d in all_docs(a))


def test_mixture_refuses_other_encodings_and_bad_options(cluster, runs, tmp_path):
    wide = tokenize_to(cluster, runs["root"] / "in2", tmp_path / "wide", encoding="cl100k_base")
    with pytest.raises(UserError, match=r"a\b.* and .*wide differ in encoding .*same encoding and --eot"):
        export(cluster, runs["a"], tmp_path / "d", mix_with=(str(wide),), format="llmc", val_tokens=0)
    with pytest.raises(UserError, match=r"--weights has 1 values for 2 runs"):
        ExportConfig(out="x", mix_with=("y",), weights=(1.0,), format="llmc", to="d")
    with pytest.raises(UserError, match=r"--seed orders a shuffled export; add --shuffle"):
        ExportConfig(out="x", seed=1, format="llmc", to="d")
    with pytest.raises(UserError, match=r"weight -1.0 for y must be a positive number"):
        ExportConfig(out="x", mix_with=("y",), weights=(1.0, -1.0), format="llmc", to="d")
    with pytest.raises(UserError, match=r"a run is given twice \(x, x\); to weigh it more, use --weights"):
        ExportConfig(out="x", mix_with=("x",), format="llmc", to="d")


# -- pure parts ---------------------------------------------------------------------------------------
def test_mix_arithmetic():
    from tokenshards.export import mix

    w = mix.weights_of((0.7, 0.3), [0, 0], ["a", "b"])
    assert w == [Fraction(7, 10), Fraction(3, 10)]
    assert mix.split_val(10, w) == [7, 3] and mix.split_val(11, w) == [8, 3] and sum(mix.split_val(99_999, w)) == 99_999
    assert mix.default_total([700, 1000], w) == 1000 and mix.default_total([1400, 300], w) == 1000
    shares = mix.shares(available=[700, 100], weights=w, total=1001, runs=["a", "b"])
    assert [(s.target, s.epochs, s.remainder) for s in shares] == [(701, 1, 1), (301, 3, 1)]
    assert mix.weights_of(None, [300, 100], ["a", "b"]) == [Fraction(3, 4), Fraction(1, 4)]


def test_order_keys_and_coalescing():
    from tokenshards.export import order
    from tokenshards.export.shuffle import coalesce

    h = np.arange(1000, dtype=np.uint64)
    k1 = order.keyed(h, order.salt(seed=1, purpose="train"))
    k2 = order.keyed(h, order.salt(seed=2, purpose="train"))
    assert len(set(k1.tolist())) == 1000 and not (np.argsort(k1) == np.argsort(k2)).all()
    s = order.sort_keys(k1, "train")
    assert (s >= 2**62).all() and (order.sort_keys(k1, "val") < 2**62).all()
    divs = order.divisions(val_buckets=2, train_buckets=3)
    assert divs[0] == 0 and divs[2] == 2**62 and divs[-1] == 2**63 - 1 and divs == sorted(set(divs))
    assert order.divisions(val_buckets=0, train_buckets=1) == [2**62, 2**63 - 1]
    starts, ends, group = coalesce(np.array([0, 5, 100, 103]), np.array([4, 9, 102, 110]), gap=2)
    assert starts.tolist() == [0, 100] and ends.tolist() == [9, 110] and group.tolist() == [0, 0, 1, 1]


KILLED_EXPORT = """
import sys, time
from tokenshards.export import ExportConfig, common, run_export

def stall(*args, **kwargs):  # every chunk is written, no file committed yet: the moment to be killed
    print("committing", flush=True)
    time.sleep(600)

common.commit_target = stall
out, to, scheduler = sys.argv[1:]
run_export(ExportConfig(out=out, to=to, format="npy", shard_tokens=2000, val_tokens=1500, shuffle=True, seed=4,
                        chunk_bytes=2000, scheduler=scheduler, progress="none"), announce=lambda m: None)
"""


def test_a_killed_export_leaves_nothing_finished_and_the_rerun_gives_the_same_bytes(cluster, runs, tmp_path):
    """The client is killed (SIGKILL) once every chunk is written, before any file is committed
    (the subprocess stalls there): DEST holds temporaries only, each already complete (files are
    committed after all are written), and the same export run again clears them and writes the
    same bytes as one never interrupted."""
    import os
    import signal
    import subprocess
    import sys

    import tokenshards

    out, dest = runs["a"], tmp_path / "d"
    options = dict(format="npy", shard_tokens=2000, val_tokens=1500, shuffle=True, seed=4, chunk_bytes=2000)
    reference = export(cluster, out, tmp_path / "ref", **options)
    env = {**os.environ, "PYTHONPATH": str(Path(tokenshards.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_EXPORT, str(out), str(dest), cluster.scheduler_address],
                            stdout=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if line.startswith("committing"):
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    # The killed export's lease stays (its process is gone, so the rerun takes it over at once), and
    # the note of the files it was about to commit (export.common.begin_commits).
    assert (dest / ".tokenshards-lease.json").exists()
    note = json.loads((dest / ".fineweb_export.json.unfinished").read_text())
    assert sorted(note["files"]) == sorted(p.name for p in reference.glob("*.npy"))
    left = sorted(p.name for p in dest.iterdir() if p.name not in (".tokenshards-lease.json", ".fineweb_export.json.unfinished"))
    assert left and all(name.endswith(".tmp") for name in left), left
    assert sorted(name.rsplit(".", 2)[0] for name in left) == sorted(p.name for p in reference.glob("*.npy"))
    for name in left:
        assert (dest / name).read_bytes() == (reference / name.rsplit(".", 2)[0]).read_bytes(), name
    export(cluster, out, dest, **options)
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in reference.iterdir())  # no .tmp left
    for p in reference.glob("*.npy"):
        assert (dest / p.name).read_bytes() == p.read_bytes(), p.name


@pytest.mark.parametrize("argv, message", [
    (["A", "--seed", "1"], "--seed orders a shuffled export; add --shuffle"),
    (["A", "--shuffle", "--tokens", "0"], "--tokens 0 must be at least 1"),
    (["A", "B", "--weights", "1"], "--weights has 1 values for 2 runs; give one weight per run, in the same order"),
    (["A", "B", "--weights", "1", "0"], "weight 0.0 for B must be a positive number"),
    (["A", "A"], "a run is given twice (A, A); to weigh it more, use --weights"),
])
def test_cli_errors_name_the_flag(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["export", *argv, "--format", "llmc", "--to", "D"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"tokenshards: error: {message}"
