"""Export: every file is read back with code written here from each format's published layout
(llm.c's ``write_datafile`` header, ``np.load``, nanoGPT's ``np.memmap``, Megatron's MMIDIDX
index), never with the exporter's helpers; the validation set is recomputed independently
from the documents' ids.
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import random
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from readback import read_documents

from tokenshards.cli import main
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.errors import UserError
from tokenshards.export import ExportConfig, run_export
from tokenshards.tokenize.command import run_tokenize

WORDS = ("the cat sat on a mat; Straße naïve café 東京 🙂 <|endoftext|> 1234567 tab\there "
         "\n\nnew paragraph — dashes – and ‘quotes’ ").split(" ")
VAL = 1500
SHARD = 4000


def write_corpus(folder: Path) -> None:
    """Two files, one with ids and one without (ids become FILE:ROW), several row groups each."""
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)

    def texts(n):
        return [None if i % 19 == 3 else " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 120))) for i in range(n)]

    a, b = texts(150), texts(110)
    pq.write_table(pa.table({"id": [f"doc-{i:04d}" for i in range(len(a))], "text": pa.array(a, pa.string())}),
                   folder / "a.parquet", row_group_size=20)
    pq.write_table(pa.table({"text": pa.array(b, pa.string())}), folder / "b.parquet", row_group_size=25)


def tokenize_to(cluster, inputs: Path, out: Path, **options) -> Path:
    run_tokenize(TokenizeConfig(inputs=(str(inputs / "*.parquet"),), out=str(out), scheduler=cluster.scheduler_address,
                                progress="none", **options), announce=lambda msg: None)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("export")
    write_corpus(root / "in")
    return {"root": root, "gpt2": tokenize_to(cluster, root / "in", root / "out", partition_bytes=6000)}


def export(cluster, out, to, **options) -> Path:
    run_export(ExportConfig(out=str(out), to=str(to), scheduler=cluster.scheduler_address, **options), announce=lambda m: None)
    return Path(to)


# -- the expectation, computed from the docs alone -----------------------------------------------
def manifest_docs(out: Path) -> list[tuple[str, int, str, list[int]]]:
    """(input, row, id, tokens) of every document, in manifest order."""
    return [(inp, row, doc_id, tokens) for (inp, row), (doc_id, tokens) in read_documents(out).items()]


def expected_split(out: Path, val_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """(val docs, train docs) in manifest order: val = smallest (blake2b-64(id), input, row) until val_tokens."""
    docs = manifest_docs(out)
    inputs = [i["path"] for i in json.loads((out / "manifest.json").read_text())["inputs"]]

    def key(d):
        return int.from_bytes(hashlib.blake2b(d[2].encode(), digest_size=8).digest(), "big"), inputs.index(d[0]), d[1]

    chosen, total = set(), 0
    for d in sorted(docs, key=key):
        if total >= val_tokens:
            break
        chosen.add((d[0], d[1]))
        total += len(d[3])
    val = [d[3] for d in docs if (d[0], d[1]) in chosen]
    train = [d[3] for d in docs if (d[0], d[1]) not in chosen]
    return val, train


def flat(docs: list[list[int]]) -> list[int]:
    return [t for d in docs for t in d]


# -- independent readers, from each format's spec ------------------------------------------------
def read_llmc(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """llm.c: 256 int32 header (magic, version, count), then uint16 (v1) or uint32 (v7) tokens."""
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    magic, version, count = (int(x) for x in header[:3])
    assert not header[3:].any()
    assert (magic, version) in ((20240520, 1), (20240801, 7))
    dtype = "<u2" if version == 1 else "<u4"
    assert len(raw) == 1024 + count * np.dtype(dtype).itemsize
    return header, np.frombuffer(raw[1024:], dtype=dtype)


def read_megatron(stem: Path) -> tuple[int, list[np.ndarray]]:
    """Megatron MMIDIDX: magic, <Q version, <B dtype code, <Q sequences, <Q document index length,
    int32 lengths, int64 byte pointers, int64 document indices."""
    idx = stem.with_suffix(".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", idx[9:17])
    (code,) = struct.unpack("<B", idx[17:18])
    n_seq, n_doc_idx = struct.unpack("<QQ", idx[18:34])
    assert version == 1
    dtype = {8: np.uint16, 4: np.int32}[code]
    pos = 34
    lengths = np.frombuffer(idx, "<i4", n_seq, pos)
    pos += 4 * n_seq
    pointers = np.frombuffer(idx, "<i8", n_seq, pos)
    pos += 8 * n_seq
    doc_idx = np.frombuffer(idx, "<i8", n_doc_idx, pos)
    assert pos + 8 * n_doc_idx == len(idx)
    assert n_doc_idx == n_seq + 1 and doc_idx.tolist() == list(range(n_seq + 1))
    bin_ = np.memmap(stem.with_suffix(".bin"), dtype=dtype, mode="r")
    size = np.dtype(dtype).itemsize
    assert pointers[0] == 0 and (np.diff(pointers) == lengths[:-1] * size).all()
    assert pointers[-1] + lengths[-1] * size == len(bin_) * size
    return code, [np.asarray(bin_[p // size:p // size + n]) for p, n in zip(pointers.tolist(), lengths.tolist())]


# -- formats ---------------------------------------------------------------------------------------
def test_llmc_shards_headers_sizes_and_split(cluster, corpus, tmp_path):
    out = corpus["gpt2"]
    # 777-byte chunks: tasks own ranges that cut tokens and the header in half.
    dest = export(cluster, out, tmp_path / "llmc", format="llmc", shard_tokens=SHARD, val_tokens=VAL, chunk_bytes=777)
    val, train = expected_split(out, VAL)
    names = sorted((p.name for p in dest.glob("*.bin")), key=lambda n: n[-10:])  # by shard number
    n_train = -(-len(flat(train)) // SHARD)
    assert names == ["fineweb_val_000000.bin"] + [f"fineweb_train_{i:06d}.bin" for i in range(1, n_train + 1)]
    _, val_tokens = read_llmc(dest / names[0])
    assert val_tokens.tolist() == flat(val)
    assert VAL <= len(val_tokens) < VAL + max(len(d) for d in val)
    train_shards = [read_llmc(dest / n)[1] for n in names[1:]]
    assert all(len(s) == SHARD for s in train_shards[:-1]) and 0 < len(train_shards[-1]) <= SHARD
    assert np.concatenate(train_shards).tolist() == flat(train)
    # Every document of the manifest exactly once across val and train.
    assert sorted(map(tuple, val + train)) == sorted(tuple(d[3]) for d in manifest_docs(out))
    record = json.loads((dest / "fineweb_export.json").read_text())
    assert record["splits"]["val"]["docs"] == len(val) and [f["name"] for f in record["files"]] == names


def test_npy_shards_are_np_save_uint16(cluster, corpus, tmp_path):
    out = corpus["gpt2"]
    dest = export(cluster, out, tmp_path / "npy", format="npy", shard_tokens=SHARD, val_tokens=VAL, prefix="edufineweb")
    val, train = expected_split(out, VAL)
    shards = sorted(dest.glob("edufineweb_*.npy"), key=lambda p: p.name[-10:])
    assert shards[0].name == "edufineweb_val_000000.npy" and shards[1].name == "edufineweb_train_000001.npy"
    arrays = [np.load(p) for p in shards]
    assert all(a.dtype == np.uint16 and a.ndim == 1 for a in arrays)
    assert arrays[0].tolist() == flat(val)
    assert np.concatenate(arrays[1:]).tolist() == flat(train)
    for path, array in zip(shards, arrays):  # byte for byte what np.save writes
        buf = __import__("io").BytesIO()
        np.save(buf, array)
        assert path.read_bytes() == buf.getvalue()


def test_nanogpt_train_and_val_bin(cluster, corpus, tmp_path):
    out = corpus["gpt2"]
    dest = export(cluster, out, tmp_path / "nanogpt", format="nanogpt", val_tokens=VAL)
    val, train = expected_split(out, VAL)
    assert np.memmap(dest / "val.bin", dtype=np.uint16, mode="r").tolist() == flat(val)
    assert np.memmap(dest / "train.bin", dtype=np.uint16, mode="r").tolist() == flat(train)


def test_megatron_indexed_dataset(cluster, corpus, tmp_path):
    out = corpus["gpt2"]
    dest = export(cluster, out, tmp_path / "megatron", format="megatron", val_tokens=VAL, chunk_bytes=997)
    val, train = expected_split(out, VAL)
    code, train_docs = read_megatron(dest / "fineweb_text_document")
    assert code == 8 and [d.tolist() for d in train_docs] == train
    code, val_docs = read_megatron(dest / "fineweb_val_text_document")
    assert [d.tolist() for d in val_docs] == val


def test_no_validation_set(cluster, corpus, tmp_path):
    out = corpus["gpt2"]
    dest = export(cluster, out, tmp_path / "all", format="megatron", val_tokens=0)
    assert sorted(p.name for p in dest.iterdir()) == ["fineweb_export.json", "fineweb_text_document.bin", "fineweb_text_document.idx"]
    _, docs = read_megatron(dest / "fineweb_text_document")
    assert [d.tolist() for d in docs] == [d[3] for d in manifest_docs(out)]


def test_deterministic_across_chunking_and_partitioning(cluster, corpus, tmp_path):
    """Same OUT → identical files whatever the chunk size; another partitioning of the same
    inputs → the same validation documents and identical files."""
    out = corpus["gpt2"]
    other = tokenize_to(cluster, corpus["root"] / "in", tmp_path / "out-big-partitions", partition_bytes=50_000)
    assert len(json.loads((other / "manifest.json").read_text())["partitions"]) < len(json.loads((out / "manifest.json").read_text())["partitions"])
    runs = [export(cluster, o, tmp_path / name, format="llmc", shard_tokens=SHARD, val_tokens=VAL, chunk_bytes=c)
            for o, name, c in ((out, "a", 64 * 2**20), (out, "b", 2333), (other, "c", 4001))]
    names = sorted(p.name for p in runs[0].glob("*.bin"))
    for run in runs[1:]:
        assert sorted(p.name for p in run.glob("*.bin")) == names
        for n in names:
            assert (run / n).read_bytes() == (runs[0] / n).read_bytes(), n


def test_wide_vocabulary_llama3_layout_megatron_int32_and_nanogpt_refused(cluster, corpus, tmp_path):
    out = tokenize_to(cluster, corpus["root"] / "in", tmp_path / "cl100k", encoding="cl100k_base", partition_bytes=20_000)
    val, train = expected_split(out, VAL)
    dest = export(cluster, out, tmp_path / "llmc", format="llmc", val_tokens=VAL)
    header, tokens = read_llmc(dest / "fineweb_train_000001.bin")
    assert header[:3].tolist() == [20240801, 7, len(flat(train))] and tokens.tolist() == flat(train)
    dest = export(cluster, out, tmp_path / "megatron", format="megatron", val_tokens=VAL)
    code, docs = read_megatron(dest / "fineweb_text_document")
    assert code == 4 and [d.tolist() for d in docs] == train
    with pytest.raises(UserError, match=r"nanoGPT's train.py reads train.bin/val.bin as uint16.*llmc"):
        export(cluster, out, tmp_path / "nanogpt", format="nanogpt", val_tokens=VAL)


# -- refusals and the command line ------------------------------------------------------------------
def test_earlier_export_refused_then_overwritten_without_stale_shards(cluster, corpus, tmp_path):
    out = corpus["gpt2"]
    dest = export(cluster, out, tmp_path / "d", format="llmc", shard_tokens=1000, val_tokens=VAL)
    many = len(list(dest.glob("*.bin")))
    with pytest.raises(UserError, match=r"already holds an export \(fineweb_.*pass --overwrite"):
        export(cluster, out, dest, format="llmc", shard_tokens=SHARD, val_tokens=VAL)
    export(cluster, out, dest, format="llmc", shard_tokens=SHARD, val_tokens=VAL, overwrite=True)
    assert len(list(dest.glob("*.bin"))) < many
    assert not list(dest.glob("*.tmp"))


@pytest.mark.parametrize("options, message", [
    ({"format": "parquet"}, r"--format 'parquet' not supported, expected one of \('llmc'"),
    ({"format": "nanogpt", "prefix": "x"}, r"--prefix does not apply to nanogpt"),
    ({"format": "megatron", "shard_tokens": 10}, r"--shard-tokens applies to llmc, npy and hf"),
    ({"format": "llmc", "shard_tokens": 2**31}, r"over llm.c's limit of 2,147,483,647"),
    ({"format": "llmc", "prefix": "a/b"}, r"--prefix 'a/b': expected a plain file name prefix"),
    ({"format": "llmc", "val_tokens": -1}, r"--val-tokens -1 must be 0"),
])
def test_bad_options(options, message):
    with pytest.raises(UserError, match=message):
        ExportConfig(out="o", to="d", **options)


def test_val_tokens_larger_than_corpus(cluster, corpus, tmp_path):
    with pytest.raises(UserError, match=r"--val-tokens 100,000,000 is not less than the [\d,]+ tokens in .*pass a smaller"):
        export(cluster, corpus["gpt2"], tmp_path / "d", format="llmc", val_tokens=100_000_000)


def test_cli_export_and_its_errors(cluster, corpus, tmp_path, capsys):
    dest = tmp_path / "cli"
    code = main(["export", str(corpus["gpt2"]), "--format", "nanogpt", "--to", str(dest), "--val-tokens", str(VAL),
                 "--scheduler", cluster.scheduler_address])
    assert code == 0 and (dest / "train.bin").exists()
    assert "done: 2 files" in capsys.readouterr().out
    code = main(["export", str(tmp_path / "nothing"), "--format", "llmc", "--to", str(tmp_path / "x"),
                 "--scheduler", cluster.scheduler_address])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("tokenshards: error: ") and "no manifest.json" in err and "Traceback" not in err


def test_from_s3_to_s3_matches_local(cluster, corpus, s3, tmp_path):  # noqa: F811
    """OUT copied to S3 (a finished folder may move), exported to S3 as multipart uploads."""
    out = corpus["gpt2"]
    fs = s3.fs()
    bucket = s3.make_bucket()
    for path in sorted(out.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{bucket}/out/{path.relative_to(out).as_posix()}")
    local = export(cluster, out, tmp_path / "local", format="megatron", val_tokens=VAL)
    for key in ("megatron/fineweb_text_document.bin", "megatron/other.bin"):  # as a killed export leaves them
        fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    run_export(ExportConfig(out=f"s3://{bucket}/out", to=f"s3://{bucket}/megatron", format="megatron", val_tokens=VAL,
                            storage_options=s3.storage_options, scheduler=cluster.scheduler_address), announce=lambda m: None)
    for name in ("fineweb_text_document.bin", "fineweb_text_document.idx", "fineweb_val_text_document.bin",
                 "fineweb_val_text_document.idx"):
        assert fs.cat_file(f"{bucket}/megatron/{name}") == (local / name).read_bytes(), name
    assert [u["Key"] for u in fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])] == ["megatron/other.bin"]
    with pytest.raises(UserError, match=r"export destination s3://no-such-bucket-x/d: bucket 'no-such-bucket-x' does not exist"):
        run_export(ExportConfig(out=str(out), to="s3://no-such-bucket-x/d", format="llmc", val_tokens=VAL,
                                storage_options=s3.storage_options, scheduler=cluster.scheduler_address), announce=lambda m: None)


def test_killed_exports_temporaries_are_cleared(cluster, corpus, tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "fineweb_train_000001.bin.0123abcd.tmp").write_bytes(b"half")
    (dest / "notes.txt.0123abcd.tmp").write_bytes(b"someone else's")
    export(cluster, corpus["gpt2"], dest, format="llmc", val_tokens=VAL)
    assert sorted(p.name for p in dest.glob("*.tmp")) == ["notes.txt.0123abcd.tmp"]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_targets_assemble_parts_written_out_of_order(where, s3, tmp_path):  # noqa: F811
    """Three ranges of one file (two of S3's 5 MiB minimum, one short), written last-first."""
    from tokenshards.export.layout import Chunk
    from tokenshards.export.write import S3_MIN_PART, Source, abort_target, commit_target, open_target, write_chunk
    from tokenshards.storage.location import Location
    from tokenshards.storage.store import filesystem

    options = s3.storage_options if where == "s3" else {}
    url = f"s3://{s3.make_bucket()}/dest/f.bin" if where == "s3" else str(tmp_path / "f.bin")
    fs, path = filesystem(url, options)
    rng = np.random.default_rng(0)
    pieces = [rng.bytes(S3_MIN_PART), rng.bytes(S3_MIN_PART), rng.bytes(1234)]
    target = open_target(fs, path, sum(map(len, pieces)))
    etags, offset, chunks = {}, 0, []
    for number, data in enumerate(pieces, start=1):
        chunks.append(Chunk(file="f.bin", number=number, offset=offset, nbytes=len(data),
                            segments=((0, len(data), (("literal", data),)),)))
        offset += len(data)
    source = Source(out=Location.at(str(tmp_path / "unused")), dtype="uint16")  # never read: literal chunks
    for c in reversed(chunks):
        _, number, etag = write_chunk(c, target, source=source, parts={}, threshold=None, dest_storage_options=options)
        etags[number] = etag
    assert not fs.exists(path)  # nothing visible before the commit
    commit_target(fs, target, etags)
    assert fs.cat_file(path) == b"".join(pieces)
    abort_target(fs, open_target(fs, path + ".2", 10))  # an aborted file leaves nothing
    assert not fs.exists(path + ".2") and [p for p in fs.ls(posixpath.dirname(path)) if p.endswith(".tmp")] == []


def test_val_threshold_from_any_merge_tree_equals_a_global_sort():
    """Pure: partition candidates merged in any grouping pick what sorting every document picks."""
    from tokenshards.export import valsplit

    rng = np.random.default_rng(1)
    parts = []
    for k in range(40):
        n = int(rng.integers(0, 30))
        ids = [f"p{k}-{i}" if i % 7 else "duplicate-id" for i in range(n)]  # equal ids: ties by (input, row)
        parts.append((ids, k % 3, np.arange(n, dtype=np.int64) + 100 * k, rng.integers(1, 50, n)))
    for val_tokens in (1, 37, 500, 5000):
        cands = [valsplit.candidates(hashes=valsplit.id_hashes(ids), input_ordinal=inp, rows=rows, lengths=lengths, part=k,
                                     val_tokens=val_tokens) for k, (ids, inp, rows, lengths) in enumerate(parts)]
        flat_merge = valsplit.merge(*cands, val_tokens=val_tokens)
        tree = cands
        while len(tree) > 1:
            tree = [valsplit.merge(*tree[i:i + 3], val_tokens=val_tokens) for i in range(0, len(tree), 3)]
        assert (tree[0] == flat_merge).all()
        everything = sorted(
            (int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "big"), inp, int(r), int(n), k)
            for k, (ids, inp, rows, lengths) in enumerate(parts) for i, r, n in zip(ids, rows, lengths))
        total, chosen = 0, []
        for doc in everything:
            if total >= val_tokens:
                break
            chosen.append(doc)
            total += doc[3]
        assert [tuple(int(x) for x in c) for c in flat_merge] == chosen
        threshold, docs, tokens = valsplit.choose(flat_merge, n_parts=len(parts))
        for k, (ids, inp, rows, lengths) in enumerate(parts):
            mask = valsplit.is_val(hashes=valsplit.id_hashes(ids), input_ordinal=inp, rows=rows, threshold=threshold)
            assert mask.sum() == docs[k] and lengths[mask].sum() == tokens[k]


def test_shard_names_one_running_number_val_first():
    """Pure: a validation set larger than a shard takes several numbers before train starts."""
    from tokenshards.export.formats import shard_files
    from tokenshards.export.layout import Streams

    def names(val_tokens):
        streams = Streams.from_counts(docs=np.array([10, 10]), tokens=np.array([100, 150]),
                                      val_docs=np.array([3, 0]), val_tokens=np.array([val_tokens, 0]))
        return [(f.name, f.tokens) for f in shard_files(fmt="llmc", prefix="x", streams=streams, shard_tokens=40, dtype="<u2")]

    assert names(90) == [("x_val_000000.bin", 40), ("x_val_000001.bin", 40), ("x_val_000002.bin", 10),
                         ("x_train_000003.bin", 40), ("x_train_000004.bin", 40), ("x_train_000005.bin", 40),
                         ("x_train_000006.bin", 40)]
    assert names(0)[0] == ("x_train_000000.bin", 40) and sum(t for _, t in names(0)) == 250
