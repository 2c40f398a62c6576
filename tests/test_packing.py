"""Packing (export/pack.py) as pure functions: every token accounted for, boundaries equal to the
documents', padding bounded at FineWeb-like lengths, the same sequences for the same lengths;
then packed exports through the cluster: ids equal the run's documents, shuffles permute whole
sequences, npy's files. (What trainers' collators and models make of the rows: test_packed_collators.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_export import tokenize_to, write_corpus

from tokenshards.errors import UserError
from tokenshards.export import ExportConfig, run_export
from tokenshards.export import pack as P

N = 64


def fineweb_like(n: int, seed: int = 0) -> np.ndarray:
    """Token counts shaped like FineWeb's documents (log-normal, mean ~1,000, ~11% over 2,048)."""
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(6.3, 1.1, n)).astype(np.int64)


def pieces_of(p: P.Packing) -> list[list[tuple[int, int, int]]]:
    return [list(zip(p.doc[a:b].tolist(), p.offset[a:b].tolist(), p.length[a:b].tolist()))
            for a, b in zip(p.bounds[:-1].tolist(), p.bounds[1:].tolist())]


def covered(p: P.Packing, lengths) -> np.ndarray:
    """How many times each token of each document is in some sequence."""
    seen = [np.zeros(n, np.int64) for n in lengths]
    for d, o, n in zip(p.doc.tolist(), p.offset.tolist(), p.length.tolist()):
        seen[d][o:o + n] += 1
    return np.concatenate(seen) if seen else np.zeros(0)


@pytest.mark.parametrize("seq_len", [1, 7, 64, 2048])
def test_concat_windows_are_the_stream_cut_every_seq_len(seq_len):
    lengths = fineweb_like(300, seed=seq_len)
    p = P.concat(lengths, seq_len)
    total = int(lengths.sum())
    assert p.sequences == total // seq_len
    assert (p.filled() == seq_len).all()
    seen = covered(p, lengths)
    assert (seen[:p.sequences * seq_len] == 1).all() and (seen[p.sequences * seq_len:] == 0).all()  # only the tail is left
    cum = np.concatenate([[0], np.cumsum(lengths)])
    for i, seq in enumerate(pieces_of(p)):  # pieces are consecutive stream ranges, cut at document boundaries
        at = i * seq_len
        for d, o, n in seq:
            assert cum[d] + o == at and o + n <= lengths[d]
            at += n


def test_concat_of_pieces_equals_concat_of_the_whole_stream():
    """What export/packed.py does per partition (first, own, the next partitions' lengths) gives
    the same windows as one pass over the whole stream."""
    lengths = fineweb_like(120, seed=3)
    parts = np.array_split(np.arange(len(lengths)), 7)
    whole = P.concat(lengths, 300)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    got = []
    for idx in parts:
        if not len(idx):
            continue
        b0, b1 = int(cum[idx[0]]), int(cum[idx[-1] + 1])
        first = -b0 % 300
        p = P.concat(lengths[idx[0]:], 300, first=first, own=b1 - b0)
        got += [[(d + int(idx[0]), o, n) for d, o, n in s] for s in pieces_of(p)]
    assert got == pieces_of(whole)


def test_bos_aligned_concat_starts_every_sequence_at_a_document():
    lengths = np.array([5, 3, 10, 2, 7, 1, 4, 4])
    p = P.concat_aligned(lengths, 4)
    assert (p.offset[p.bounds[:-1]] == 0).all() and (p.filled() == 4).all()
    assert p.tokens + p.dropped == lengths.sum()
    assert pieces_of(p)[:2] == [[(0, 0, 4)], [(1, 0, 3), (2, 0, 1)]]


@pytest.mark.parametrize("bos_align", [False, True])
def test_best_fit_keeps_every_token_within_seq_len(bos_align):
    lengths = fineweb_like(3000, seed=1)
    p = P.best_fit(lengths, 2048, window=500, bos_align=bos_align)
    assert (p.filled() <= 2048).all() and (p.filled() > 0).all()
    seen = covered(p, lengths)
    if bos_align:  # the first 2,048 tokens of every document, once; every sequence starts at a document
        want = np.concatenate([np.arange(n) < 2048 for n in lengths]).astype(int)
        assert (seen == want).all() and (p.offset == 0).all()
        assert p.dropped == int(np.maximum(lengths - 2048, 0).sum())
    else:
        assert (seen == 1).all() and p.dropped == 0
    for seq in pieces_of(p):  # a document at most once per sequence, in stream order
        docs = [d for d, _, _ in seq]
        assert docs == sorted(set(docs))


def test_best_fit_padding_under_one_percent_at_fineweb_lengths():
    lengths = fineweb_like(40_000, seed=2)
    p = P.best_fit(lengths, 2048)
    padding = 1 - p.tokens / (p.sequences * 2048)
    assert padding < 0.01, padding


def test_best_fit_window_bounds_what_it_mixes():
    lengths = fineweb_like(1000, seed=4)
    p = P.best_fit(lengths, 512, window=100)
    for seq in pieces_of(p):
        assert len({d // 100 for d, _, _ in seq}) == 1


def test_packers_are_deterministic():
    lengths = fineweb_like(5000, seed=5)
    for make in (lambda: P.best_fit(lengths, 2048, window=1000), lambda: P.concat(lengths, 2048),
                 lambda: P.concat_aligned(lengths, 2048)):
        a, b = make(), make()
        assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("doc", "offset", "length", "bounds"))


def test_position_ids_restart_at_each_document_and_at_the_padding():
    lengths = np.array([3, 2, 4], np.int64)
    bounds = np.array([0, 2, 3])
    assert P.position_ids(lengths, bounds, 6).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    seg, seg_bounds = P.segments(lengths, bounds, 6)  # the padding is a segment of its own: they cover the rows
    assert seg.tolist() == [3, 2, 1, 4, 2] and seg_bounds.tolist() == [0, 3, 5]
    seg, seg_bounds = P.segments(np.array([6, 2]), np.array([0, 1, 1, 2]), 6)  # full, empty, padded
    assert seg.tolist() == [6, 6, 2, 4] and seg_bounds.tolist() == [0, 1, 2, 4]


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1000, 4097])
def test_permute_is_a_seeded_bijection(n):
    x = P.permute(np.arange(n), n, np.uint64(12345))
    assert sorted(x.tolist()) == list(range(n))
    assert np.array_equal(x, P.permute(np.arange(n), n, np.uint64(12345)))
    if n > 10:
        assert not np.array_equal(x, P.permute(np.arange(n), n, np.uint64(1)))


def test_sequence_order_gives_each_copy_once():
    copies = [P.Copies(sequences=5, epochs=2, extra=3, salt=9), P.Copies(sequences=4)]
    run, seq = P.sequence_order(0, 17, copies, salt=np.uint64(3))
    pairs = sorted(zip(run.tolist(), seq.tolist()))
    from collections import Counter

    count = Counter(pairs)
    assert all(count[(1, s)] == 1 for s in range(4))
    assert sum(count[(0, s)] for s in range(5)) == 13 and all(2 <= count[(0, s)] <= 3 for s in range(5))
    a = P.sequence_order(0, 17, copies, salt=np.uint64(3))
    b = [P.sequence_order(i, i + 1, copies, salt=np.uint64(3)) for i in range(17)]  # any range alone
    assert a[1].tolist() == [int(s[1][0]) for s in b]


# -- through the export ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("packing")
    write_corpus(root / "in")
    return {"root": root, "out": tokenize_to(cluster, root / "in", root / "out", partition_bytes=6000)}


def export(cluster, run, name, **options) -> Path:
    to = run["root"] / name
    options.setdefault("val_tokens", 0)
    run_export(ExportConfig(out=str(run["out"]), to=str(to), scheduler=cluster.scheduler_address, progress="none",
                            **options), announce=lambda m: None)
    return to


def manifest_order(out: Path) -> list[list[int]]:
    """The run's documents in the export's stream order (manifest order of partitions, row order)."""
    import pyarrow.parquet as pq

    manifest = json.loads((out / "manifest.json").read_text())
    docs = []
    for e in sorted(manifest["partitions"], key=lambda e: e["index"]):
        ids = np.load(out / e["tokens_file"])
        t = pq.read_table(out / e["docs_file"]).to_pydict()
        docs += [ids[s:s + n].tolist() for s, n in zip(t["start"], t["length"])]
    return docs


def npy_rows(folder: Path, split: str = "train"):
    """(ids, document lengths per row, position ids) of a packed npy export's shards (of a text run),
    in order. A row's segments (``.seq_lengths.npy``) cover its N tokens; where its loss mask
    (``.mask.npy``, best-fit's) leaves tokens out, they are the row's last segment, its padding, which
    is no document."""
    ids, lens, pos = [], [], []
    for f in sorted(folder.glob(f"fineweb_{split}_*[0-9].npy")):
        stem = str(f)[:-4]
        a = np.load(f)
        lengths, index = np.load(stem + ".seq_lengths.npy"), np.load(stem + ".seq_index.npy")
        mask = np.load(stem + ".mask.npy") if Path(stem + ".mask.npy").exists() else np.ones(a.shape, np.uint8)
        assert mask.shape == a.shape
        ids.append(a)
        for i, j, m in zip(index[:-1], index[1:], mask):
            row = lengths[i:j].tolist()
            assert sum(row) == a.shape[1] and min(row) > 0  # the segments cover the row
            pad = a.shape[1] - int(m.sum())
            if pad:
                assert row[-1] == pad and m[:-pad].all() and not m[-pad:].any()
                row = row[:-1]
            lens.append(row)
        if Path(stem + ".position_ids.npy").exists():
            pos.append(np.load(stem + ".position_ids.npy"))
    return np.concatenate(ids), lens, (np.concatenate(pos) if pos else None)


def test_packed_npy_concat_is_the_run_stream_cut_into_rows(cluster, run):
    to = export(cluster, run, "npy-concat", format="npy", seq_len=N, shard_tokens=N * 100)
    stream = [t for d in manifest_order(run["out"]) for t in d]
    ids, lens, pos = npy_rows(to)
    assert ids.shape == (len(stream) // N, N) and ids.dtype == np.uint16
    assert ids.reshape(-1).tolist() == stream[:ids.size]  # only the tail is left over
    assert all(sum(x) == N for x in lens)
    for row, lengths in zip(pos, lens):  # position ids restart where the row's documents do
        assert row.tolist() == [i for n in lengths for i in range(n)]
    record = json.loads((to / "fineweb_export.json").read_text())
    assert record["splits"]["train"]["dropped"] == len(stream) % N
    assert len(list(to.glob("fineweb_train_*[0-9].npy"))) == -(-ids.shape[0] // 100)  # 100 rows each, the rest last


def test_packed_best_fit_rows_hold_whole_documents_and_shuffle_moves_whole_rows(cluster, run):
    plain = export(cluster, run, "npy-bf", format="npy", seq_len=N, pack="best-fit", bos_align=False)
    ids, lens, _ = npy_rows(plain)
    docs = manifest_order(run["out"])
    got = []
    for row, lengths in zip(ids.tolist(), lens):
        at = 0
        for n in lengths:
            got.append(tuple(row[at:at + n]))
            at += n
        assert all(t == 50256 for t in row[at:])  # padding is the eot id
    # every document, whole or split at N into consecutive pieces, in some row
    want = sorted(tuple(d[i:i + N]) for d in docs for i in range(0, len(d), N))
    assert sorted(got) == want
    shuffled = export(cluster, run, "npy-bf-shuffled", format="npy", seq_len=N, pack="best-fit", shuffle=True, seed=4)
    ids2, lens2, _ = npy_rows(shuffled)
    assert sorted(map(tuple, ids2.tolist())) == sorted(map(tuple, ids.tolist()))
    assert ids2.tolist() != ids.tolist()
    again = export(cluster, run, "npy-bf-shuffled-again", format="npy", seq_len=N, pack="best-fit", shuffle=True, seed=4,
                   chunk_bytes=1000)
    assert all((shuffled / f.name).read_bytes() == f.read_bytes() for f in again.glob("*.npy"))


def test_packed_mixture_weighs_runs_by_sequences(cluster, run):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = run["root"] / "in2"
    folder.mkdir(exist_ok=True)
    texts = [" ".join(["ALPHA BETA GAMMA"] * (i % 40 + 1)) for i in range(60)]
    pq.write_table(pa.table({"id": [f"o-{i}" for i in range(60)], "text": texts}), folder / "c.parquet", row_group_size=20)
    other = tokenize_to(cluster, folder, run["root"] / "out2", partition_bytes=3000)
    to = export(cluster, run, "npy-mix", format="npy", seq_len=N, pack="best-fit", mix_with=(str(other),),
                weights=(3.0, 1.0), tokens=N * 200)
    ids, _, _ = npy_rows(to)
    assert ids.shape == (200, N)
    record = json.loads((to / "fineweb_export.json").read_text())
    assert [s["sequences"] * s["epochs"] + s["extra"] for s in record["sources"]] == [150, 50]


@pytest.mark.parametrize(("options", "message"), [
    (dict(format="llmc", seq_len=N), "flat token stream"),
    (dict(format="hf", pack="best-fit"), "add --seq-len"),
    (dict(format="npy", seq_len=N, columns=("labels",)), "hf's"),
    (dict(format="hf", seq_len=N, columns=("cu_seqlens",)), "expected some of"),
    (dict(format="hf", seq_len=1), "at least 2"),
])
def test_packing_mistakes_are_one_line(options, message):
    with pytest.raises(UserError, match=message):
        ExportConfig(out="run", to="dest", **options)
