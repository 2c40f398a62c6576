"""``--format olmo`` read by OLMo-core's own ``olmo_core.data`` (``NumpyFSLDataset``,
``load_array_slice``, ``iter_document_indices`` on the ``.csv.gz``), never by our code: the same
streams and documents as our ``npy`` export with the same options.

OLMo-core cannot be installed beside tokenshards (its cached-path needs ``huggingface_hub<2``, we
need ``>=2.4``), and trainers run it in their own environment anyway: the reader runs in a venv of
its own (``readervenv.py``: torch 2.13.0's CPU build, then ``OLMO_CORE``), as the script
``READER``, which writes what OLMo-core read as ``.npy`` and JSON for the test to compare.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from formatcheck import CASES, case_options, eot_of, expected_docs, export_with_summary, npy_streams, runs  # noqa: F401  (fixture)
from readervenv import TEST_TIMEOUT, reader_python, run_reader

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)  # the first test builds the reader venv

OLMO_CORE = ("ai2-olmo-core==3.0.0",)

READER = r'''
import json, sys
from pathlib import Path

import numpy as np
from olmo_core.data.numpy_dataset import NumpyFSLDataset
from olmo_core.data.utils import iter_document_indices, load_array_slice

for a in json.loads(sys.argv[1]):  # one per split
    path, dtype, got = Path(a["path"]), np.dtype(a["dtype"]).type, Path(a["got"])
    np.save(got / "whole.npy", load_array_slice(path, 0, a["tokens"], dtype))
    ds = NumpyFSLDataset(path, sequence_length=a["seq"], pad_token_id=a["eot"], eos_token_id=a["eot"],
                         vocab_size=a["n_vocab"], dtype=dtype)
    ds.work_dir = got / "work"
    ds.prepare()
    instances = [ds[i]["input_ids"].numpy() for i in range(len(ds))]
    np.save(got / "instances.npy", np.concatenate(instances) if instances else np.empty(0, dtype))
    docs = [load_array_slice(path, s, e, dtype).tolist()
            for s, e in iter_document_indices(path, use_array_if_local=False, dtype=dtype)]
    (got / "read.json").write_text(json.dumps({"len": len(ds), "docs": docs}))
'''


@pytest.fixture(scope="module")
def olmo_python():
    return reader_python("olmo-core", OLMO_CORE)


@pytest.mark.parametrize("case", CASES)
def test_olmo_reader_gives_the_npy_streams_and_documents(case, cluster, runs, olmo_python, tmp_path, monkeypatch):  # noqa: F811
    from tokenshards.export.formats import olmo

    out, options = case_options(case, runs)
    if case != "plain":  # many gzip members (the client plans them), cut across 777-byte chunks
        monkeypatch.setattr(olmo, "STORED_MAX", 200)
        options = {**options, "chunk_bytes": 777}
    encoding = json.loads((out / "manifest.json").read_text())["encoding"]
    dtype = np.uint32 if case == "wide" else np.uint16
    reference = npy_streams(cluster, out, tmp_path / "npy", **options)
    dest, summary = export_with_summary(cluster, out, tmp_path / "olmo", format="olmo", **options)
    said = "\n".join(summary.lines())
    assert f"dtype={np.dtype(dtype).name}, eos_token_id={eot_of(out)};" in said
    assert "this run's eot is at the start of each document" in said and "use_array_if_local=False" in said
    seq = 64  # training instances: sequence_length tokens each, back to back; the tail under one is not read
    jobs = []
    for split in ("train", "val"):
        folder = dest / split
        assert sorted(p.name for p in folder.iterdir()) == ["fineweb.csv.gz", "fineweb.npy"]
        path = folder / "fineweb.npy"
        with pytest.raises(ValueError):  # headerless: never taken for a real .npy
            np.load(path)
        (tmp_path / f"read-{split}").mkdir()
        jobs.append({"path": str(path), "dtype": np.dtype(dtype).name, "tokens": len(reference[split]), "seq": seq,
                     "eot": eot_of(out), "n_vocab": encoding["n_vocab"], "got": str(tmp_path / f"read-{split}")})
    run_reader(olmo_python, READER, jobs)
    for split in ("train", "val"):
        ref = reference[split]
        got = tmp_path / f"read-{split}"
        whole = np.load(got / "whole.npy")
        assert whole.dtype == dtype and whole.tolist() == ref.tolist()
        read = json.loads((got / "read.json").read_text())
        assert read["len"] == len(ref) // seq
        instances = np.load(got / "instances.npy")
        assert len(instances) == read["len"] * seq
        assert instances.tolist() == ref[:len(instances)].tolist()
        # Documents from the .csv.gz, each whole with its eot.
        assert [tuple(d) for d in read["docs"]] == expected_docs(case, out, reference, split)
        if case != "plain" and split == "train":
            assert (dest / split / "fineweb.csv.gz").read_bytes().count(olmo.GZIP_HEADER) > 1
