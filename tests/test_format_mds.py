"""``--format mds`` read by MosaicML streaming's own ``StreamingDataset`` (what llm-foundry's
``StreamingTextDataset`` builds on), never by our code: one sample per document, the same
documents in the same order as our ``npy`` export with the same options.

mosaicml-streaming cannot be installed beside tokenshards (it pulls transformers and
``huggingface_hub<1``; we need ``>=2.4``): it runs in a venv of its own (``readervenv.py``: torch
2.13.0's CPU build, then ``STREAMING``), as the script ``READER``, which writes every sample's
tokens for the test to compare. That venv's ``torchvision`` is a stub (``TORCHVISION_STUB``): no
working CPU torchvision exists here (PyPI's 0.28 fails to load with the CPU torch: "operator
torchvision::nms does not exist"), and ``import streaming`` imports it only for
``streaming.vision`` (``VisionDataset``, ``to_tensor``), which the token path never uses.
Streaming itself is the real package.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from formatcheck import CASES, case_options, eot_of, expected_docs, export_with_summary, npy_streams, runs  # noqa: F401  (fixture)
from readervenv import TEST_TIMEOUT, reader_python, run_reader

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)  # the first test builds the reader venv

STREAMING = ("mosaicml-streaming==0.13.0",)
TORCHVISION_STUB = {
    "torchvision/__init__.py": '"""Stub (tokenshards tests): no working CPU torchvision here; only streaming.vision imports it."""\n',
    "torchvision/datasets/__init__.py": (
        "class VisionDataset:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise RuntimeError('stub torchvision: no vision datasets in this reader venv')\n"),
    "torchvision/transforms/__init__.py": "",
    "torchvision/transforms/functional.py": (
        "def to_tensor(*args, **kwargs):\n"
        "    raise RuntimeError('stub torchvision: no to_tensor in this reader venv')\n"),
}

LIMITS = {"shuffled": 1000, "mixed": 1000, "wide": 50_000}
"""Shard size limits: a few of a shuffled export's buckets (777 // itemsize tokens each) per shard,
and two of the wide run's partitions (a shard over its limit is one piece): some shards of every
case hold several pieces, and are compared with what streaming's MDSWriter writes."""

READER = r'''
import json, sys, tempfile
from pathlib import Path

import numpy as np
from streaming import MDSWriter, StreamingDataset

a = json.loads(sys.argv[1])
same = {}
for split, folder in a["folders"].items():
    ds = StreamingDataset(local=folder, shuffle=False, batch_size=1)
    lengths, tokens, samples = [], [], []
    for i in range(len(ds)):
        sample = ds[i]
        assert sorted(sample) == ["tokens"], sorted(sample)
        assert isinstance(sample["tokens"], bytes), type(sample["tokens"])
        t = np.frombuffer(sample["tokens"], dtype=a["dtype"])  # llm-foundry's token_encoding_type
        lengths.append(len(t))
        tokens.append(t)
        samples.append(sample)
    # Each shard within its size limit, written again by streaming's own MDSWriter from the
    # samples read: the same bytes and index entry (a shard over it is one piece of ours, which
    # MDSWriter would have cut elsewhere).
    index = json.loads((Path(folder) / "index.json").read_text())
    first, same[split] = 0, []
    for shard in index["shards"]:
        n = shard["samples"]
        if shard["raw_data"]["bytes"] <= shard["size_limit"]:
            with tempfile.TemporaryDirectory() as tmp:
                with MDSWriter(columns={"tokens": "bytes"}, out=tmp, size_limit=shard["size_limit"]) as w:
                    for sample in samples[first:first + n]:
                        w.write(sample)
                theirs = json.loads((Path(tmp) / "index.json").read_text())["shards"]
                entry = dict(theirs[0], raw_data=dict(theirs[0]["raw_data"], basename=shard["raw_data"]["basename"]))
                same[split].append([shard["raw_data"]["basename"], len(theirs) == 1 and entry == shard and
                                    (Path(tmp) / "shard.00000.mds").read_bytes() == (Path(folder) / shard["raw_data"]["basename"]).read_bytes()])
        first += n
    out = Path(a["got"]) / split
    np.save(f"{out}.tokens.npy", np.concatenate(tokens) if tokens else np.empty(0, a["dtype"]))
    np.save(f"{out}.lengths.npy", np.array(lengths, np.int64))
    # Every sample again in one pass, as a training loop iterates (one worker, no shuffle).
    np.save(f"{out}.iter.npy", np.concatenate([np.frombuffer(s["tokens"], dtype=a["dtype"]) for s in ds]))
(Path(a["got"]) / "same.json").write_text(json.dumps(same))
'''


@pytest.fixture(scope="module")
def mds_python():
    return reader_python("mosaicml-streaming", STREAMING, stubs=TORCHVISION_STUB, remove=("torchvision",))


@pytest.mark.parametrize("case", CASES)
def test_mds_reader_gives_the_npy_documents(case, cluster, runs, mds_python, tmp_path, monkeypatch):  # noqa: F811
    from tokenshards.export.formats import mds

    out, options = case_options(case, runs)
    limit = LIMITS.get(case, mds.SIZE_LIMIT)
    if case != "plain":  # several shards per split (the client groups pieces), cut across 777-byte chunks
        monkeypatch.setattr(mds, "SIZE_LIMIT", limit)
        options = {**options, "chunk_bytes": 777}
    dtype = np.uint32 if case == "wide" else np.uint16
    reference = npy_streams(cluster, out, tmp_path / "npy", **options)
    dest, summary = export_with_summary(cluster, out, tmp_path / "mds", format="mds", **options)
    assert f"token_encoding_type='{np.dtype(dtype).name}'" in "\n".join(summary.lines())
    for split in ("train", "val"):
        index = json.loads((dest / split / "index.json").read_text())
        names = [s["raw_data"]["basename"] for s in index["shards"]]
        assert sorted(p.name for p in (dest / split).iterdir()) == sorted(["index.json", *names])
        assert names == [f"shard.{i:05d}.mds" for i in range(len(names))]
        assert all(s["raw_data"]["bytes"] == (dest / split / s["raw_data"]["basename"]).stat().st_size
                   for s in index["shards"])
        assert all(s["size_limit"] == limit for s in index["shards"])
        sizes = [s["raw_data"]["bytes"] for s in index["shards"]]
        assert (len(names) > 1) == (sum(sizes) > limit), (split, sizes)  # one shard when all fits
        if case != "plain" and split == "train":
            assert len(names) > 1, sizes
    got = tmp_path / "read"
    got.mkdir()
    run_reader(mds_python, READER, {"folders": {s: str(dest / s) for s in ("train", "val")},
                                    "dtype": np.dtype(dtype).name, "got": str(got)})
    for split in ("train", "val"):
        ref = reference[split]
        tokens = np.load(got / f"{split}.tokens.npy")
        lengths = np.load(got / f"{split}.lengths.npy")
        assert tokens.dtype == dtype and tokens.tolist() == ref.tolist()
        assert np.load(got / f"{split}.iter.npy").tolist() == ref.tolist()
        # One sample per document, each whole with its eot, in export order.
        bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        samples = [tuple(tokens[a:b].tolist()) for a, b in zip(bounds, bounds[1:])]
        assert samples == expected_docs(case, out, reference, split)
        assert all(s[0] == eot_of(out) for s in samples)
    # streaming's MDSWriter, given the samples read, writes the same shards and index entries.
    same = json.loads((got / "same.json").read_text())
    assert same["train"] and same["val"] and all(ok for split in same.values() for _, ok in split), same
