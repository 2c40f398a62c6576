"""``--format olmo`` read by OLMo-core's own ``olmo_core.data`` (``NumpyFSLDataset``,
``load_array_slice``, ``iter_document_indices`` on the ``.csv.gz``), never by our code: the same
streams and documents as our ``npy`` export with the same options."""
from __future__ import annotations

import json

import numpy as np
import pytest
from formatcheck import CASES, case_options, eot_of, expected_docs, export_with_summary, npy_streams, runs  # noqa: F401  (fixture)

numpy_dataset = pytest.importorskip(
    "olmo_core.data.numpy_dataset",
    reason="ai2-olmo-core is not in the test extra: it needs cached-path, which needs huggingface_hub<2 (we need >=2.4)")


@pytest.mark.parametrize("case", CASES)
def test_olmo_reader_gives_the_npy_streams_and_documents(case, cluster, runs, tmp_path, monkeypatch):  # noqa: F811
    from olmo_core.data.utils import iter_document_indices, load_array_slice

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
    for split in ("train", "val"):
        ref = reference[split]
        folder = dest / split
        assert sorted(p.name for p in folder.iterdir()) == ["fineweb.csv.gz", "fineweb.npy"]
        path = folder / "fineweb.npy"
        with pytest.raises(ValueError):  # headerless: never taken for a real .npy
            np.load(path)
        assert load_array_slice(path, 0, len(ref), dtype).tolist() == ref.tolist()
        # Training instances: sequence_length tokens each, back to back; the tail under one is not read.
        seq = 64
        ds = numpy_dataset.NumpyFSLDataset(path, sequence_length=seq, pad_token_id=eot_of(out), eos_token_id=eot_of(out),
                                           vocab_size=encoding["n_vocab"], dtype=dtype)
        ds.work_dir = tmp_path / "work"
        ds.prepare()
        assert len(ds) == len(ref) // seq
        got = np.concatenate([ds[i]["input_ids"].numpy() for i in range(len(ds))])
        assert got.tolist() == ref[:len(got)].tolist()
        # Documents from the .csv.gz, each whole with its eot.
        docs = [tuple(load_array_slice(path, a, b, dtype).tolist())
                for a, b in iter_document_indices(path, use_array_if_local=False, dtype=dtype)]
        assert docs == expected_docs(case, out, reference, split)
        if case != "plain" and split == "train":
            assert (folder / "fineweb.csv.gz").read_bytes().count(olmo.GZIP_HEADER) > 1
